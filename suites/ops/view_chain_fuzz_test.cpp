// suites/ops/view_chain_fuzz_test.cpp: random chains of view ops (view, reshape, transpose,
// permute, flatten, unflatten, narrow, select, squeeze, unsqueeze) on sharded DTensors, each
// step compared with the same chain on the plain tensor: the shape, every rank's local shape
// against what its spec implies, and (gathered) the values. A view whose rule keeps a
// placement the local pieces do not have (PyTorch has shipped such view rules) shows as
// wrong values or a wrong local shape at the step that made it.
//
// Inputs: 1 to 4 dims of 1 to 9 elements (uneven shards and one-element dims included), laid
// out on a 1-D, a 2-D and a 3-D mesh of the test's ranks, each mesh dim Replicate or Shard of a
// random dim (two mesh dims sharding one dim included, the first then _StridedShard as FSDP
// over TP lays it out, or plain Shard for the nested order). Chains are seeded by their index:
// the same index gives the same chain at the same world size. DTENSOR_VIEW_FUZZ_CASES sets the
// number of chains per mesh (default 150; a longer run: DTENSOR_VIEW_FUZZ_CASES=5000), and a
// failure names the index and the chain so far.
#include "dtensor/tensor/dtensor.h"
#include "harness/dtensor_test_base.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace dtensor {
namespace {

int cases_per_mesh() {
  const char* v = std::getenv("DTENSOR_VIEW_FUZZ_CASES");
  return v && std::atoi(v) > 0 ? std::atoi(v) : 150;
}

// One step of a chain: applied alike to the plain tensor and to the DTensor.
struct Step {
  std::string text;
  std::function<at::Tensor(const at::Tensor&)> apply;
};

std::vector<int64_t> factor_pair(int64_t n, std::mt19937& rng) {
  std::vector<int64_t> divisors;
  for (int64_t d = 2; d < n; ++d)
    if (n % d == 0) divisors.push_back(d);
  if (divisors.empty()) return {n, 1};
  const int64_t d = divisors[rng() % divisors.size()];
  return {d, n / d};
}

std::string shape_text(c10::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// A random step valid on a tensor of `shape` (the plain tensor's; `contiguous`: whether it is).
Step random_step(const std::vector<int64_t>& shape, bool contiguous, std::mt19937& rng) {
  const auto nd = static_cast<int64_t>(shape.size());
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  for (;;) {
    switch (rng() % 10) {
      case 0:
      case 1: {  // view / reshape to a new shape: merge two adjacent dims, or split one
        if (nd == 0) break;
        std::vector<int64_t> to = shape;
        if (nd >= 2 && rng() % 2 == 0) {
          const int64_t d = pick(nd - 1);
          to[static_cast<size_t>(d)] *= to[static_cast<size_t>(d) + 1];
          to.erase(to.begin() + d + 1);
        } else {
          const int64_t d = pick(nd);
          const auto f = factor_pair(shape[static_cast<size_t>(d)], rng);
          to[static_cast<size_t>(d)] = f[0];
          to.insert(to.begin() + d + 1, f[1]);
        }
        if (to.size() > 5) break;
        // view only where the plain tensor allows it (a non-contiguous one may not be viewed).
        const bool view = contiguous && rng() % 2 == 0;
        return {(view ? "view" : "reshape") + shape_text(to),
                [to, view](const at::Tensor& t) { return view ? t.view(to) : t.reshape(to); }};
      }
      case 2: {
        if (nd < 2) break;
        const int64_t a = pick(nd), b = pick(nd);
        return {"transpose(" + std::to_string(a) + ", " + std::to_string(b) + ")",
                [a, b](const at::Tensor& t) { return t.transpose(a, b); }};
      }
      case 3: {
        if (nd < 2) break;
        std::vector<int64_t> perm(static_cast<size_t>(nd));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        return {"permute" + shape_text(perm), [perm](const at::Tensor& t) { return t.permute(perm); }};
      }
      case 4: {
        if (nd < 2) break;
        const int64_t s = pick(nd - 1), e = s + 1 + pick(nd - 1 - s);
        return {"flatten(" + std::to_string(s) + ", " + std::to_string(e) + ")",
                [s, e](const at::Tensor& t) { return t.flatten(s, e); }};
      }
      case 5: {
        if (nd == 0 || nd >= 5) break;
        const int64_t d = pick(nd);
        const auto f = factor_pair(shape[static_cast<size_t>(d)], rng);
        if (f[1] == 1) break;
        return {"unflatten(" + std::to_string(d) + ", " + shape_text(f) + ")",
                [d, f](const at::Tensor& t) { return t.unflatten(d, f); }};
      }
      case 6: {
        if (nd == 0) break;
        const int64_t d = pick(nd), n = shape[static_cast<size_t>(d)];
        if (n < 2) break;
        const int64_t start = pick(n), len = 1 + pick(n - start);
        return {"narrow(" + std::to_string(d) + ", " + std::to_string(start) + ", " + std::to_string(len) + ")",
                [d, start, len](const at::Tensor& t) { return t.narrow(d, start, len); }};
      }
      case 7: {
        if (nd == 0) break;
        const int64_t d = pick(nd), i = pick(shape[static_cast<size_t>(d)]);
        return {"select(" + std::to_string(d) + ", " + std::to_string(i) + ")",
                [d, i](const at::Tensor& t) { return t.select(d, i); }};
      }
      case 8: {
        std::vector<int64_t> ones;
        for (int64_t d = 0; d < nd; ++d)
          if (shape[static_cast<size_t>(d)] == 1) ones.push_back(d);
        if (ones.empty()) break;
        if (rng() % 2 == 0) return {"squeeze()", [](const at::Tensor& t) { return t.squeeze(); }};
        const int64_t d = ones[rng() % ones.size()];
        return {"squeeze(" + std::to_string(d) + ")", [d](const at::Tensor& t) { return t.squeeze(d); }};
      }
      case 9: {
        if (nd >= 5) break;
        const int64_t d = pick(nd + 1);
        return {"unsqueeze(" + std::to_string(d) + ")", [d](const at::Tensor& t) { return t.unsqueeze(d); }};
      }
    }
  }
}

// Placements for a tensor of `shape` on a mesh of `mesh_shape`: per mesh dim Replicate or
// Shard of a random dim; where exactly two mesh dims shard one dim, the first becomes a strided
// shard split by the second's size (FSDP over TP) in half the cases.
std::vector<Placement> random_placements(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh_shape,
                                         std::mt19937& rng) {
  std::vector<Placement> ps;
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    if (shape.empty() || rng() % 4 == 0) {
      ps.push_back(Replicate{});
    } else {
      ps.push_back(Shard{static_cast<int64_t>(rng() % shape.size())});
    }
  }
  if (rng() % 2 == 0) {
    for (size_t m = 0; m < ps.size(); ++m) {
      const auto* s = std::get_if<Shard>(&ps[m]);
      if (!s) continue;
      std::vector<size_t> same;  // the mesh dims sharding this dim
      for (size_t k = 0; k < ps.size(); ++k) {
        const auto* t = std::get_if<Shard>(&ps[k]);
        if (t && t->split_factor == 1 && t->dim == s->dim) same.push_back(k);
      }
      if (same.size() == 2 && same[0] == m) ps[m] = StridedShard(s->dim, mesh_shape[same[1]]);
    }
  }
  return ps;
}

class ViewChainFuzz : public testing::DTensorOpTestBase {
 protected:
  // Collective: `cases` chains on `mesh`; the same seeds on every rank.
  void fuzz(const DeviceMesh& mesh, uint64_t seed_base) {
    const std::vector<int64_t> mesh_shape = mesh.shape();
    const int cases = cases_per_mesh();
    int failures = 0;
    for (int c = 0; c < cases && failures < 5; ++c) {
      std::mt19937 rng(static_cast<uint32_t>(seed_base * 100003 + static_cast<uint64_t>(c)));
      std::vector<int64_t> shape(1 + rng() % 4);
      for (auto& s : shape) s = 1 + static_cast<int64_t>(rng() % 9);
      at::Tensor plain = at::arange(c10::multiply_integers(shape), at::kFloat).view(shape);
      const std::vector<Placement> ps = random_placements(shape, mesh_shape, rng);
      at::Tensor d = distribute_tensor(plain, mesh, ps);
      std::ostringstream chain;
      chain << "chain " << c << " on mesh " << c10::IntArrayRef(mesh_shape) << ": arange" << c10::IntArrayRef(shape)
            << " as " << to_string(ps);
      const int steps = 1 + static_cast<int>(rng() % 6);
      for (int k = 0; k < steps; ++k) {
        const Step step = random_step(plain.sizes().vec(), plain.is_contiguous(), rng);
        chain << " ." << step.text;
        plain = step.apply(plain);
        try {
          d = step.apply(d);
        } catch (const std::exception& e) {
          ADD_FAILURE() << chain.str() << ": the DTensor raised: " << e.what();
          ++failures;
          break;
        }
        const DTensorSpec& spec = get_spec(d);
        ASSERT_EQ(d.sizes(), plain.sizes()) << chain.str();
        const auto expected_local = compute_local_shape_and_global_offset(plain.sizes().vec(), mesh, spec.placements).first;
        // Agreed by every rank before gathering: a rank whose piece is wrong ends the chain on all.
        const bool local_ok = to_local(d).sizes() == c10::IntArrayRef(expected_local);
        if (!all_ranks(local_ok)) {
          if (!local_ok)
            ADD_FAILURE() << chain.str() << ": local shape " << to_local(d).sizes() << ", but "
                          << to_string(spec.placements) << " implies " << c10::IntArrayRef(expected_local);
          ++failures;
          break;
        }
        const at::Tensor gathered = full_tensor(d);
        if (!at::equal(gathered, plain)) {
          ADD_FAILURE() << chain.str() << ": values differ, placements " << to_string(spec.placements);
          ++failures;
          break;
        }
      }
    }
  }

  // Collective: whether `ok` holds on every rank.
  bool all_ranks(bool ok) {
    at::Tensor flag = at::full({1}, ok ? 0 : 1, at::kLong);
    group().all_reduce(flag, comm::ReduceOp::MAX);
    return flag.item<int64_t>() == 0;
  }

  std::vector<int64_t> mesh_shape_3d() const {
    const int64_t n = group().size();
    const int64_t a = n % 2 == 0 ? 2 : 1, b = n % 4 == 0 ? 2 : 1;
    return {a, b, n / (a * b)};
  }
};

DTENSOR_TEST_F(ViewChainFuzz, OnA1DMesh) { fuzz(build_device_mesh(), 1); }

DTENSOR_TEST_F(ViewChainFuzz, OnA2DMesh) { fuzz(init_device_mesh(device_type(), mesh_shape_2d(), {}, group_ptr()), 2); }

DTENSOR_TEST_F(ViewChainFuzz, OnA3DMesh) { fuzz(init_device_mesh(device_type(), mesh_shape_3d(), {}, group_ptr()), 3); }

}  // namespace
}  // namespace dtensor
