// Fused collective matmuls (dtensor/parallel/fused_matmul.h) and the styles' async_tp, as
// PyTorch's test/distributed/test_symmetric_memory.py checks fused_all_gather_matmul and
// fused_matmul_reduce_scatter against all_gather + mm and mm + reduce_scatter: every rank's
// result and gradients against the single-device matmul of the whole operands, ranks as threads
// and as Gloo processes; the collectives a fused layer issues (no all-gather, no
// reduce-scatter: one broadcast or one gather per rank's block); and the errors.
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "harness/harness.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives

using testing::contains;
using testing::error_of;
using testing::gathered;
using testing::values;

// Block r of n of `t` along `dim`.
at::Tensor part(const at::Tensor& t, int64_t dim, int64_t r, int64_t n) {
  const int64_t len = t.size(dim) / n;
  return t.narrow(dim, r * len, len);
}

// A fresh leaf copy of `t` that requires grad.
at::Tensor leaf(const at::Tensor& t) { return t.clone().detach().requires_grad_(true); }

// Column-parallel: a (`a_shape` whole, sharded along `dim`) gathered along `dim` times this
// rank's columns of b. The reference is the
// single-device a_full @ b_full with the loss every rank's piece of the output contributes to.
void check_all_gather_matmul(testing::MultiRankTest& t, const std::vector<int64_t>& a_shape, int64_t dim) {
  SCOPED_TRACE(::testing::Message() << "a " << c10::IntArrayRef(a_shape) << " gather_dim " << dim);
  const int64_t n = t.ranks(), r = t.rank();
  const int64_t wrapped = dim < 0 ? dim + static_cast<int64_t>(a_shape.size()) : dim;
  const at::Tensor a_full = values(a_shape, 1), b_full = values({a_shape.back(), 2 * n}, 2);
  const at::Tensor a_ref = leaf(a_full), b_ref = leaf(b_full);
  const at::Tensor y_ref = at::matmul(a_ref, b_ref);
  const at::Tensor w = values(y_ref.sizes().vec(), 3);
  (y_ref * w).sum().backward();

  const at::Tensor a = leaf(part(a_full, wrapped, r, n)), b = leaf(part(b_full, 1, r, n));
  const at::Tensor y = fused_all_gather_matmul(a, b, dim, t.group_ptr());
  EXPECT_TRUE(testing::tensors_close(part(y_ref, -1, r, n), y, 1e-5, 1e-6)) << "output";
  (y * part(w, -1, r, n)).sum().backward();
  EXPECT_TRUE(testing::tensors_close(part(a_ref.grad(), wrapped, r, n), a.grad(), 1e-4, 1e-5)) << "gradient of a";
  EXPECT_TRUE(testing::tensors_close(part(b_ref.grad(), 1, r, n), b.grad(), 1e-4, 1e-5)) << "gradient of b";
}

// Row-parallel: this rank's features of a times its rows of b, reduce-scattered along `dim`.
void check_matmul_reduce_scatter(testing::MultiRankTest& t, const std::vector<int64_t>& a_shape, int64_t dim) {
  SCOPED_TRACE(::testing::Message() << "a " << c10::IntArrayRef(a_shape) << " scatter_dim " << dim);
  const int64_t n = t.ranks(), r = t.rank();
  const int64_t wrapped = dim < 0 ? dim + static_cast<int64_t>(a_shape.size()) : dim;
  const at::Tensor a_full = values(a_shape, 4), b_full = values({a_shape.back(), 5}, 5);
  const at::Tensor a_ref = leaf(a_full), b_ref = leaf(b_full);
  const at::Tensor z_ref = at::matmul(a_ref, b_ref);
  const at::Tensor w = values(z_ref.sizes().vec(), 6);
  (z_ref * w).sum().backward();

  const at::Tensor a = leaf(part(a_full, -1, r, n)), b = leaf(part(b_full, 0, r, n));
  const at::Tensor z = fused_matmul_reduce_scatter(a, b, dim, t.group_ptr());
  EXPECT_TRUE(testing::tensors_close(part(z_ref, wrapped, r, n), z, 1e-5, 1e-6)) << "output";
  (z * part(w, wrapped, r, n)).sum().backward();
  EXPECT_TRUE(testing::tensors_close(part(a_ref.grad(), -1, r, n), a.grad(), 1e-4, 1e-5)) << "gradient of a";
  EXPECT_TRUE(testing::tensors_close(part(b_ref.grad(), 0, r, n), b.grad(), 1e-4, 1e-5)) << "gradient of b";
}

void check_both(testing::MultiRankTest& t) {
  const int64_t n = t.ranks();
  check_all_gather_matmul(t, {2, 2 * n, 6}, 1);   // [batch, seq, features]
  check_all_gather_matmul(t, {3 * n, 6}, 0);      // 2-D, sequence first
  check_all_gather_matmul(t, {2, 3 * n, 6}, -2);  // a negative dim
  check_all_gather_matmul(t, {2 * n, 3, 6}, 0);   // the batch dim
  check_matmul_reduce_scatter(t, {2, 2 * n, 2 * n}, 1);
  check_matmul_reduce_scatter(t, {3 * n, 2 * n}, 0);
  check_matmul_reduce_scatter(t, {n, 2, 2 * n}, -3);
  // Without autograd: the same values, no graph.
  at::NoGradGuard no_grad;
  const at::Tensor a = values({2, 4}, 7).requires_grad_(true), b = values({4, 3}, 8);
  const at::Tensor y = fused_all_gather_matmul(a, b, 0, t.group_ptr());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(testing::tensors_close(at::matmul(a.repeat({n, 1}), b), y, 1e-5, 1e-6));
}

class FusedMatmulThreads : public testing::DTensorOpTestBase {};
class FusedMatmulThreads2 : public testing::DTensorOpTestBase {
 public:
  int world_size() const override { return 2; }
};
class FusedMatmulGloo : public testing::DTensorTestBase {};

DTENSOR_TEST_F(FusedMatmulThreads, MatchSingleDeviceMatmulAndGradients) { check_both(*this); }
DTENSOR_TEST_F(FusedMatmulThreads2, MatchSingleDeviceMatmulAndGradients) { check_both(*this); }
DTENSOR_TEST_F(FusedMatmulGloo, MatchSingleDeviceMatmulAndGradients) { check_both(*this); }

// Every rank raises the same error before anything is issued (the checks are local).
DTENSOR_TEST_F(FusedMatmulThreads, ErrorsNameTheOperand) {
  const auto g = group_ptr();
  const int64_t n = ranks(), odd = 2 * n + 1;
  const at::Tensor a = values({2, 4}), b = values({4, 3});
  EXPECT_PRED2(contains, error_of([&] { fused_all_gather_matmul(values({4}), b, 0, g); }),
               "fused_all_gather_matmul: a must have at least 2 dims, got a of shape [4]");
  EXPECT_PRED2(contains, error_of([&] { fused_all_gather_matmul(a, values({4, 3, 1}), 0, g); }),
               "fused_all_gather_matmul: b must be 2-D [k, n], got b of shape [4, 3, 1]");
  EXPECT_PRED2(contains, error_of([&] { fused_all_gather_matmul(a, values({5, 3}), 0, g); }),
               "fused_all_gather_matmul: a's last dim (4) must equal b's first (5); a is [2, 4], b is [5, 3]");
  EXPECT_PRED2(contains, error_of([&] { fused_all_gather_matmul(a, b, 1, g); }),
               "fused_all_gather_matmul: gather_dim 1 is a's last dim, the one the matmul contracts");
  EXPECT_PRED2(contains, error_of([&] { fused_all_gather_matmul(a, b, -3, g); }),
               "fused_all_gather_matmul: gather_dim -3 is out of range for a of 2 dims");
  EXPECT_PRED2(contains, error_of([&] { fused_all_gather_matmul(a, b.to(at::kDouble), 0, g); }),
               "fused_all_gather_matmul: a is Float but b is Double");
  EXPECT_PRED2(contains, error_of([&] { fused_all_gather_matmul(a, b, 0, nullptr); }),
               "fused_all_gather_matmul: the group is null");
  EXPECT_PRED2(contains, error_of([&] { fused_matmul_reduce_scatter(values({odd, 4}), b, 0, g); }),
               c10::str("fused_matmul_reduce_scatter: a.size(0) = ", odd, " is not divisible by the group size ", n,
                        " (a is [", odd, ", 4])"));
  EXPECT_PRED2(contains, error_of([&] { fused_matmul_reduce_scatter(a, b, -1, g); }),
               "fused_matmul_reduce_scatter: scatter_dim -1 is a's last dim");
  // The group still works: nothing was left half-issued.
  EXPECT_TRUE(testing::tensors_close(at::matmul(a.repeat({n, 1}), b), fused_all_gather_matmul(a, b, 0, g)));
}

// ---- the styles' async_tp ------------------------------------------------------------------------

torch::nn::Linear make_linear(bool bias, int64_t out_features = 12) {
  torch::nn::Linear l(torch::nn::LinearOptions(8, out_features).bias(bias));
  testing::set_parameters(*l, 0);
  return l;
}

// A Linear parallelized with `style` on a mesh of this rank's world, called on this rank's
// sequence shard (or the whole input for Rowwise's feature shard): the output and every gradient
// match the plain Linear, and forward and backward issue `forward` and `backward` collectives.
template <class Style>
void check_async_style(testing::MultiRankTest& t, const Style& style, const Placement& in_layout, bool bias,
                       const std::map<std::string, int64_t>& forward, const std::map<std::string, int64_t>& backward,
                       int64_t out_features = 12) {
  testing::CommCounter counting;
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
  torch::nn::Linear ref = make_linear(bias, out_features), tp = make_linear(bias, out_features);
  parallelize_module(tp, mesh, style);
  const at::Tensor x = values({2, 8, 8}, 2);
  at::Tensor x_ref = leaf(x), x_tp = leaf(local_tensor(distribute_tensor(x, mesh, {in_layout})));
  const at::Tensor y_ref = nn::call(ref, x_ref);
  counting.reset();
  at::Tensor y = nn::call(tp, x_tp);
  EXPECT_EQ(counting.counts(), forward) << "forward";
  ASSERT_TRUE(is_dtensor(y));  // use_local_output(false) in every case below
  // The loss is a sum over this rank's piece of the output, so no collective enters backward.
  const at::Tensor w = values(y_ref.sizes().vec(), 9);
  (y_ref * w).sum().backward();
  const at::Tensor w_piece = local_tensor(distribute_tensor(w, mesh, get_spec(y).placements));
  counting.reset();
  (to_local(y) * w_piece).sum().backward();
  EXPECT_EQ(counting.counts(), backward) << "backward";
  EXPECT_TRUE(testing::tensors_close(y_ref, full_tensor(y), 1e-5, 1e-6)) << "output";
  for (const auto& kv : ref->named_parameters()) {
    SCOPED_TRACE(kv.key());
    const at::Tensor& g = tp->named_parameters()[kv.key()].grad();
    ASSERT_TRUE(g.defined());
    EXPECT_TRUE(testing::tensors_close(kv.value().grad(), gathered(g), 1e-4, 1e-5));
  }
  EXPECT_TRUE(testing::tensors_close(local_tensor(distribute_tensor(x_ref.grad(), mesh, {in_layout})), x_tp.grad(),
                                     1e-4, 1e-5))
      << "input gradient";
}

DTENSOR_TEST_F(FusedMatmulThreads, ColwiseAsyncTpGathersInsideTheMatmul) {
  const int64_t n = ranks();
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    // One broadcast per rank's block forward; one gather per block for the input's gradient.
    check_async_style(*this, ColwiseParallel().input_layouts(Shard{1}).use_local_output(false).async_tp(true),
                      Shard{1}, bias, {{funcol::broadcast, n}}, {{debug::c10d::gather_, n}});
    // n + 1 output features: uneven column shards, the last rank's empty.
    check_async_style(*this, ColwiseParallel().input_layouts(Shard{1}).use_local_output(false).async_tp(true),
                      Shard{1}, bias, {{funcol::broadcast, n}}, {{debug::c10d::gather_, n}}, n + 1);
  }
}

DTENSOR_TEST_F(FusedMatmulThreads, RowwiseAsyncTpScattersInsideTheMatmul) {
  const int64_t n = ranks();
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    check_async_style(*this, RowwiseParallel().output_layouts(Shard{1}).use_local_output(false).async_tp(true),
                      Shard{-1}, bias, {{debug::c10d::gather_, n}}, {{funcol::broadcast, n}});
  }
}

DTENSOR_TEST_F(FusedMatmulThreads, AsyncTpErrors) {
  auto mesh = build_device_mesh();
  torch::nn::Embedding emb(12, 8);
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(emb, mesh, ColwiseParallel().async_tp(true)); }),
               "ColwiseParallel: the root module is a torch::nn::EmbeddingImpl; async_tp fuses a collective with a "
               "Linear's matmul and supports torch::nn::Linear only");
  torch::nn::Linear lin = make_linear(true);
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(lin, mesh, ColwiseParallel().async_tp(true)); }),
               "ColwiseParallel at the root module: async_tp needs input_layouts Shard(d) on a dim other than the "
               "last (features), got Replicate(); a replicated input has no all-gather to overlap");
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(lin, mesh, RowwiseParallel().async_tp(true)); }),
               "RowwiseParallel at the root module: async_tp needs output_layouts Shard(d) on a dim other than the "
               "last (features), got Replicate(); a replicated output has no reduce-scatter to overlap");
  EXPECT_FALSE(is_dtensor(lin->weight));  // nothing was applied
  // A sequence the mesh does not divide is refused when the module is called.
  parallelize_module(lin, mesh, ColwiseParallel().input_layouts(Shard{0}).async_tp(true));
  const int64_t n = ranks(), odd = 2 * n + 1;
  const at::Tensor x = distribute_tensor(values({odd, 8}), mesh, {Shard{0}});
  EXPECT_PRED2(contains, error_of([&] { nn::call(lin, x); }),
               c10::str("ColwiseParallel at the root module: async_tp needs dim 0 (length ", odd,
                        ") divisible by the mesh size ", n));
  EXPECT_EQ(ColwiseParallel().input_layouts(Shard{1}).async_tp(true).to_string(),
            "ColwiseParallel(input_layouts=Shard(dim=1), output_layouts=Shard(dim=-1), use_local_output=true, "
            "async_tp=true)");
}

}  // namespace
}  // namespace dtensor
