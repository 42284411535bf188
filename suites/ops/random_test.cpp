// suites/ops/random_test.cpp: random numbers on DTensors (dtensor/tensor/random.h): the
// factories and random ops give the single-device values for Shard(0), Shard(1), Replicate and
// 2-D placements, even and uneven, with ranks as threads and as gloo processes; the tracker's
// seeding, its first-use sync from rank 0, explicit generators, and the errors.
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/random.h"
#include "harness/dtensor_test_base.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <functional>
#include <mutex>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;

class RandomThreads : public testing::DTensorOpTestBase {};
// Random numbers on DTensors are drawn on the CPU (dtensor/tensor/random.h: the mesh's device
// must be the CPU): the process suite skips when its backend puts meshes on another device.
class RandomGloo : public testing::DTensorTestBase {
 protected:
  void SetUpRank() override {
    if (device_type() != "cpu")
      GTEST_SKIP() << "DTensor random numbers need a CPU mesh; backend " << effective_backend() << " builds "
                   << device_type() << " meshes";
  }
};

// The meshes the value checks run on: 1-D over all ranks, and (n/2, 2).
std::vector<std::vector<int64_t>> mesh_shapes(const testing::MultiRankTest& t) {
  return {{t.ranks()}, t.mesh_shape_2d()};
}

// The placements tried on each mesh.
std::vector<std::vector<Placement>> placements_of(const DeviceMesh& mesh) {
  if (mesh.ndim() == 1) return {{Shard{0}}, {Shard{1}}, {Replicate{}}};
  return {{Shard{0}, Shard{1}}, {Replicate{}, Shard{0}}, {Shard{1}, Replicate{}}, {Shard{0}, Shard{0}},
          {Replicate{}, Replicate{}}};
}

const std::vector<std::vector<int64_t>> kShapes = {{8, 4}, {5, 6}};  // even and uneven

// Runs `fn` on plain tensors from the default generator seeded with `seed`. Rank threads
// share that generator: the lock makes seeding and drawing one step.
void with_default_seed(uint64_t seed, const std::function<void()>& fn) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lk(mu);
  at::manual_seed(seed);
  fn();
}

// randn / rand under a mesh: the single-device values from the same seed; consecutive calls
// continue the same stream (every rank draws the whole tensor, whatever its shard).
void check_factories(const testing::MultiRankTest& t) {
  for (const std::vector<int64_t>& mesh_shape : mesh_shapes(t)) {
    auto mesh = init_device_mesh(t.device_type(), mesh_shape);
    manual_seed(7, mesh);
    at::Generator expected = at::detail::createCPUGenerator(7);
    for (const auto& ps : placements_of(mesh)) {
      for (const auto& shape : kShapes) {
        SCOPED_TRACE(::testing::Message() << mesh.to_string() << " " << to_string(ps) << " " << c10::IntArrayRef(shape));
        at::Tensor a = randn(shape, mesh, ps);
        at::Tensor b = rand(shape, mesh, ps, at::TensorOptions().dtype(at::kDouble));
        EXPECT_EQ(local_tensor(a).sizes().vec(), compute_local_shape(shape, mesh, ps));
        EXPECT_EQ(get_spec(b).placements, ps);
        EXPECT_TRUE(at::equal(full_tensor(a), at::randn(shape, expected)));
        EXPECT_TRUE(at::equal(full_tensor(b), at::rand(shape, expected, at::TensorOptions().dtype(at::kDouble))));
      }
    }
  }
}
DTENSOR_TEST_F(RandomThreads, FactoriesMatchSingleDeviceForEveryPlacement) { check_factories(*this); }
DTENSOR_TEST_F(RandomGloo, FactoriesMatchSingleDeviceForEveryPlacement) { check_factories(*this); }

// In-place and functional random ops and dropout on DTensors: the values the same ops give on
// one device after at::manual_seed with the same seed.
void check_random_ops(const testing::MultiRankTest& t) {
  for (const std::vector<int64_t>& mesh_shape : mesh_shapes(t)) {
    auto mesh = init_device_mesh(t.device_type(), mesh_shape);
    for (const auto& ps : placements_of(mesh)) {
      for (const auto& shape : kShapes) {
        SCOPED_TRACE(::testing::Message() << mesh.to_string() << " " << to_string(ps) << " " << c10::IntArrayRef(shape));
        const at::Tensor ones = at::ones(shape);
        std::vector<at::Tensor> expected;
        with_default_seed(11, [&] {
          expected.push_back(at::zeros(shape).uniform_(-1, 1));
          expected.push_back(at::zeros(shape).normal_(2, 3));
          expected.push_back(at::dropout(ones, 0.3, /*train=*/true));
          expected.push_back(at::randn_like(ones));
          expected.push_back(at::bernoulli(ones * 0.5));
        });
        manual_seed(11, mesh);
        std::vector<at::Tensor> got;
        got.push_back(distribute_tensor(at::zeros(shape), mesh, ps).uniform_(-1, 1));
        got.push_back(distribute_tensor(at::zeros(shape), mesh, ps).normal_(2, 3));
        const at::Tensor x = distribute_tensor(ones, mesh, ps);
        got.push_back(at::dropout(x, 0.3, /*train=*/true));
        got.push_back(at::randn_like(x));
        got.push_back(at::bernoulli(x * 0.5));
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(get_spec(got[i]).placements, ps) << "op " << i;
          EXPECT_TRUE(at::equal(full_tensor(got[i]), expected[i])) << "op " << i;
        }
      }
    }
  }
}
DTENSOR_TEST_F(RandomThreads, OpsMatchSingleDeviceForEveryPlacement) { check_random_ops(*this); }
DTENSOR_TEST_F(RandomGloo, OpsMatchSingleDeviceForEveryPlacement) { check_random_ops(*this); }

// Without manual_seed, the first random op copies world rank 0's default generator state to
// every rank (the processes' default generators differ here; the threads share one, which only
// rank 0 touches).
void check_first_use_syncs_from_rank_zero(const testing::MultiRankTest& t, bool threads) {
  const int rank = t.rank();
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  EXPECT_FALSE(rng_tracker_initialized(mesh));
  at::Tensor mine;
  if (rank == 0 || !threads) {
    at::manual_seed(100 + static_cast<uint64_t>(rank));
    at::Generator next = at::detail::getDefaultCPUGenerator().clone();
    mine = at::randn({5, 6}, next);
  } else {
    mine = at::zeros({5, 6});
  }
  t.group().barrier();  // rank 0's default generator is set before anyone syncs from it
  const at::Tensor rank0 = local_tensor(distribute_tensor(mine, mesh, {Replicate{}}));  // rank 0's values
  at::Tensor a = randn({5, 6}, mesh, {Shard{0}});
  EXPECT_TRUE(rng_tracker_initialized(mesh));
  EXPECT_TRUE(at::equal(full_tensor(a), rank0));
}
DTENSOR_TEST_F(RandomThreads, FirstUseSyncsFromRankZero) { check_first_use_syncs_from_rank_zero(*this, true); }
DTENSOR_TEST_F(RandomGloo, FirstUseSyncsFromRankZero) { check_first_use_syncs_from_rank_zero(*this, false); }

// An explicit generator is drawn from instead of the tracker (which stays untouched).
DTENSOR_TEST_F(RandomThreads, ExplicitGeneratorIsUsedOnEveryRank) {
  auto mesh = build_device_mesh();
  at::Generator mine = at::detail::createCPUGenerator(3);
  at::Tensor x = distribute_tensor(at::zeros({5, 6}), mesh, {Shard{1}});
  x.uniform_(0, 1, mine);
  at::Tensor p = distribute_tensor(at::full({5, 6}, 0.5), mesh, {Shard{0}});
  at::Tensor b = at::bernoulli(p, mine);
  EXPECT_FALSE(rng_tracker_initialized(mesh));
  at::Generator one_device = at::detail::createCPUGenerator(3);
  EXPECT_TRUE(at::equal(full_tensor(x), at::zeros({5, 6}).uniform_(0, 1, one_device)));
  EXPECT_TRUE(at::equal(full_tensor(b), at::bernoulli(at::full({5, 6}, 0.5), one_device)));
}

// Dropout keeps a Partial input Partial: every rank applies the same mask to its share.
DTENSOR_TEST_F(RandomThreads, DropoutOfAPartialTensorStaysPartial) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor x = detail::redistribute_to_any(distribute_tensor(g, mesh, {Replicate{}}), {Partial{}});
  manual_seed(5, mesh);
  auto [out, mask] = at::native_dropout(x, 0.5, true);
  EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{Partial{}});
  EXPECT_EQ(get_spec(mask).placements, std::vector<Placement>{Replicate{}});
  at::Generator one_device = at::detail::createCPUGenerator(5);
  at::Tensor expected_mask = at::empty({8, 4}, at::kBool).bernoulli_(0.5, one_device);
  EXPECT_TRUE(at::equal(full_tensor(mask), expected_mask));
  EXPECT_TRUE(at::allclose(full_tensor(out), g * expected_mask * 2));
}

// PyTorch's repr of a 1-D mesh over all ranks: "DeviceMesh('cpu', [0, 1, 2, 3])".
std::string mesh_repr(const testing::MultiRankTest& t) {
  std::string s = "DeviceMesh('" + t.device_type() + "', [";
  for (int r = 0; r < t.ranks(); ++r) s += (r ? ", " : "") + std::to_string(r);
  return s + "])";
}

DTENSOR_TEST_F(RandomThreads, ManualSeedRefusesDifferentSeedsOnEveryRank) {
  auto mesh = build_device_mesh();
  const int odd_one = ranks() - 1;  // the last rank passes 5, the others 4
  std::string seeds;
  for (int r = 0; r < ranks(); ++r)
    seeds += (r ? ", rank " : "rank ") + std::to_string(r) + ": " + (r == odd_one ? "5" : "4");
  EXPECT_PRED2(contains, error_of([&] { manual_seed(rank() == odd_one ? 5 : 4, mesh); }),
               "manual_seed: the ranks of " + mesh_repr(*this) + " passed different seeds (" + seeds +
                   "); every rank of the mesh's world must pass the same seed");
  EXPECT_FALSE(rng_tracker_initialized(mesh));
}

DTENSOR_TEST_F(RandomThreads, BadFactoryAndInPlaceCallsFailWithTheReason) {
  auto mesh = build_device_mesh();
  manual_seed(1, mesh);
  EXPECT_PRED2(contains, error_of([&] { randn({8, 4}, mesh, {Partial{}}); }),
               "dtensor::randn: placements (Partial(sum),) on " + mesh_repr(*this) +
                   " hold a Partial; a random tensor is not a sum of per-rank values: use Shard or Replicate");
  EXPECT_PRED2(contains, error_of([&] { rand({8, 4}, mesh, {Shard{0}, Shard{1}}); }),
               "dtensor::rand: 2 placements for the 1-D mesh");
  at::Tensor partial = detail::redistribute_to_any(distribute_tensor(at::ones({8, 4}), mesh, {Replicate{}}), {Partial{}});
  EXPECT_PRED2(contains, error_of([&] { partial.normal_(); }),
               "no valid sharding for aten::normal_ with inputs (Partial(sum),)[8, 4] (an in-place op keeps the "
               "placements of the tensor it writes; redistribute that tensor first)");
}

}  // namespace
}  // namespace dtensor
