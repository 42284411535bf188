// DTensor behaviours users rely on: no collective on a mesh dim of one rank,
// distribute_tensor of a meta tensor without communication, ranks that pass different
// placements to distribute_tensor named on every rank. As Gloo processes and as threads.
#include "dtensor/comm/comm.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/registry.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace {

DTENSOR_RANK_FIXTURES(TrustGloo, TrustThreads);

DTENSOR_TEST_BOTH(TrustGloo, TrustThreads, SizeOneMeshDimIssuesNoCollective) {
  const int64_t n = t.ranks();
  testing::CommCounter counting;
  DeviceMesh mesh = init_device_mesh(t.device_type(), {1, n}, {}, t.group_ptr());
  at::Tensor full = at::arange(8 * n, at::kFloat).view({4 * n, 2});
  at::Tensor x = distribute_tensor(full, mesh, {Shard{0}, Shard{1}});
  counting.reset();
  // Every change is on the size-1 dim 0.
  at::Tensor r = redistribute(x, mesh, {Replicate{}, Shard{1}});
  at::Tensor s = redistribute(r, mesh, {Shard{1}, Shard{1}});
  at::Tensor back = redistribute(s, mesh, {Shard{0}, Shard{1}});
  // Partial over one rank is the whole sum already.
  at::Tensor p = from_local(to_local(s), mesh, {Partial{}, Shard{1}}, /*run_check=*/false);
  at::Tensor pr = redistribute(p, mesh, {Replicate{}, Shard{1}});
  EXPECT_EQ(counting.collectives(), 0) << "collectives on a mesh dim of one rank";
  EXPECT_TRUE(to_local(back).equal(to_local(x)));
  EXPECT_TRUE(to_local(pr).equal(to_local(r)));
}

DTENSOR_TEST_BOTH(TrustGloo, TrustThreads, MetaTensorIsDistributedWithoutCommunication) {
  const int64_t n = t.ranks();
  testing::CommCounter counting;
  DeviceMesh mesh = init_device_mesh(t.device_type(), {n}, {}, t.group_ptr());
  counting.reset();
  at::Tensor meta = at::empty({2 * n, 3}, at::TensorOptions().device(at::kMeta));
  at::Tensor x = distribute_tensor(meta, mesh, {Shard{0}});
  EXPECT_EQ(counting.collectives(), 0);
  EXPECT_TRUE(to_local(x).is_meta());
  EXPECT_EQ(to_local(x).sizes(), at::IntArrayRef({2, 3}));
  EXPECT_EQ(x.sizes(), at::IntArrayRef({2 * n, 3}));
}

DTENSOR_TEST_BOTH(TrustGloo, TrustThreads, DifferentPlacementsAreNamedOnEveryRank) {
  const int64_t n = t.ranks();
  DeviceMesh mesh = init_device_mesh(t.device_type(), {n});
  at::Tensor full = at::ones({n, n});
  try {
    distribute_tensor(full, mesh, {t.rank() == 1 ? Placement{Shard{1}} : Placement{Shard{0}}});
    ADD_FAILURE() << "different placements were not detected";
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    const auto r0 = what.find("[rank 0: distribute_tensor("), r1 = what.find("[rank 1: distribute_tensor(");
    ASSERT_NE(r0, std::string::npos) << what;
    ASSERT_NE(r1, std::string::npos) << what;
    EXPECT_NE(what.substr(r0, r1 - r0).find("Shard(dim=0)"), std::string::npos) << what;
    EXPECT_NE(what.substr(r1).find("Shard(dim=1)"), std::string::npos) << what;
  }
}

// The propagation cache is bounded and drops the least recently used strategy first: with a
// capacity of 3, calls on five shapes leave at most 3 entries, a repeated recent call hits, and
// the first shape's call misses again, with the same result. Processes: the cache is
// process-wide, so thread ranks would share it.
DTENSOR_TEST_F(TrustGloo, PropagationCacheIsBoundedLeastRecentlyUsedFirst) {
  struct Restore {
    size_t capacity;
    ~Restore() {
      ops::set_propagation_cache_capacity(capacity);
      ops::clear_propagation_cache();
    }
  } restore{ops::set_propagation_cache_capacity(3)};
  ops::clear_propagation_cache();
  const int64_t n = ranks();
  DeviceMesh mesh = init_device_mesh(device_type(), {n});
  auto call = [&](int64_t cols) {
    at::Tensor full = at::arange(4 * n * cols, at::kFloat).view({4 * n, cols});
    at::Tensor x = distribute_tensor(full, mesh, {Shard{0}});
    at::Tensor y = x.mul(2);
    EXPECT_TRUE(full_tensor(y).equal(full.mul(2))) << cols << " columns";
  };
  for (int64_t cols = 1; cols <= 5; ++cols) call(cols);
  ops::CacheStats s = ops::propagation_cache_stats();
  EXPECT_EQ(s.capacity, 3u);
  EXPECT_LE(s.size, 3u);
  EXPECT_GE(s.evictions, 2);
  const int64_t misses = s.misses, hits = s.hits;
  call(5);  // the most recent shape: its strategies are cached
  s = ops::propagation_cache_stats();
  EXPECT_EQ(s.misses, misses);
  EXPECT_GT(s.hits, hits);
  call(1);  // the least recent: evicted, propagated again
  EXPECT_GT(ops::propagation_cache_stats().misses, misses);
  EXPECT_THROW(ops::set_propagation_cache_capacity(0), c10::Error);
}

}  // namespace
}  // namespace dtensor
