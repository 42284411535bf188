// The sharding rules tensor parallelism needs (embedding_rules.cpp, norm_rules.cpp,
// softmax_loss_rules.cpp, triu/tril in tensor_rules.cpp), each checked with test_op on every
// DTensorConverter combination: a 1-D mesh with Partial and uneven inputs, and a 2x2 mesh with
// per-mesh-dim placements. Backward ops whose many tensor arguments would multiply the
// combinations beyond reason are driven through their forward: the converter varies the
// forward's inputs and the backward receives the forward's DTensor outputs.
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace {

using c10::IValue;
using IL = std::vector<int64_t>;

// Deterministic values (ranks as threads share the global generator).
at::Tensor values(const IL& shape, double offset = 0.0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::arange(numel, at::kDouble) * 0.37 + offset).sin().to(at::kFloat).reshape(shape);
}

at::Tensor indices(const IL& shape, int64_t vocab, int64_t stride = 3) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::arange(numel, at::kLong) * stride + 1).remainder(vocab).reshape(shape);
}

// A plain tensor for a plain run, replicated for a DTensor run on `like`'s mesh.
at::Tensor like_args(const at::Tensor& like, const at::Tensor& t) {
  if (!is_dtensor(like)) return t;
  const DeviceMesh& mesh = get_spec(like).mesh;
  return distribute_tensor(t, mesh, std::vector<Placement>(static_cast<size_t>(mesh.ndim()), Replicate{}));
}

struct Sample {
  std::string what;
  std::string op, overload;        // name-based
  testing::TensorOpFn fn;          // or a function of the args
  std::vector<IValue> args;
};

std::vector<Sample> samples() {
  const IValue none;
  std::vector<Sample> s;
  // embedding (row-, column- and batch-sharded, Partial tables) and its backward.
  s.push_back({"embedding", "aten::embedding", "", {}, {values({10, 4}), indices({2, 3}, 10), -1, false, false}});
  for (int64_t padding : {-1, 3})
    for (bool scale : {false, true})
      s.push_back({"embedding_dense_backward padding=" + std::to_string(padding) + " scale=" + std::to_string(scale),
                   "aten::embedding_dense_backward", "", {},
                   {values({2, 3, 4}), indices({2, 3}, 10), 10, padding, scale}});
  // native_layer_norm with and without affine parameters, 2-D and 3-D.
  s.push_back({"native_layer_norm 2-D", "aten::native_layer_norm", "", {},
               {values({4, 6}), IL{6}, values({6}, 1), values({6}, 2), 1e-5}});
  s.push_back({"native_layer_norm 3-D no affine", "aten::native_layer_norm", "", {},
               {values({2, 4, 6}), IL{6}, none, none, 1e-5}});
  for (int k = 0; k < 3; ++k) {
    s.push_back({"native_layer_norm_backward output " + std::to_string(k), "", "",
                 [k](const std::vector<IValue>& a) {
                   const at::Tensor g = a[0].toTensor(), x = a[1].toTensor();
                   const at::Tensor w = like_args(x, values({6}, 1)), b = like_args(x, values({6}, 2));
                   auto fwd = at::native_layer_norm(x, {6}, w, b, 1e-5);
                   auto bwd = at::native_layer_norm_backward(g, x, {6}, std::get<1>(fwd), std::get<2>(fwd), w, b,
                                                             {true, true, true});
                   return k == 0 ? std::get<0>(bwd) : k == 1 ? std::get<1>(bwd) : std::get<2>(bwd);
                 },
                 {values({4, 6}, 3), values({4, 6})}});
  }
  // softmax / log_softmax and their backwards.
  for (const char* op : {"aten::_softmax", "aten::_log_softmax"})
    for (int64_t dim : {1, 0})
      s.push_back({std::string(op) + " dim=" + std::to_string(dim), op, "", {}, {values({4, 6}), dim, false}});
  for (const char* op : {"aten::_softmax_backward_data", "aten::_log_softmax_backward_data"})
    s.push_back({op, op, "", {}, {values({4, 6}), values({4, 6}, 1).softmax(1), int64_t{1}, IValue(at::kFloat)}});
  // nll_loss (every reduction, class weights, ignore_index) and its backward.
  const at::Tensor scores = values({8, 5}).log_softmax(1);
  const at::Tensor target = indices({8}, 5, 2);
  for (int64_t reduction : {0, 1, 2}) {
    for (int64_t ignore : {-100, 2}) {
      const std::string tag = "reduction=" + std::to_string(reduction) + " ignore_index=" + std::to_string(ignore);
      s.push_back({"nll_loss_forward " + tag, "aten::nll_loss_forward", "", {},
                   {scores, target, none, reduction, ignore}});
      s.push_back({"nll_loss_forward weighted " + tag, "aten::nll_loss_forward", "", {},
                   {scores, target, values({5}, 1).abs(), reduction, ignore}});
      s.push_back({"nll_loss_backward " + tag, "", "",
                   [reduction, ignore](const std::vector<IValue>& a) {
                     const at::Tensor g = a[0].toTensor(), x = a[1].toTensor();
                     const at::Tensor t = like_args(x, indices({8}, 5, 2)), w = like_args(x, values({5}, 1).abs());
                     auto fwd = at::nll_loss_forward(x, t, w, reduction, ignore);
                     return at::nll_loss_backward(g, x, t, w, reduction, ignore, std::get<1>(fwd));
                   },
                   {reduction == 0 ? values({8}, 4) : values({}, 4), scores}});
    }
  }
  // Views through size-1 dims (a bias gradient summed with keepdim, then viewed).
  s.push_back({"view [1, 1, 8] -> [8]", "aten::view", "", {}, {values({1, 1, 8}), IL{8}}});
  s.push_back({"view [8] -> [1, 8, 1]", "aten::view", "", {}, {values({8}), IL{1, 8, 1}}});
  // triu / tril (causal masks).
  for (const char* op : {"aten::triu", "aten::tril"})
    for (int64_t diagonal : {0, 1})
      s.push_back({std::string(op) + " diagonal=" + std::to_string(diagonal), op, "", {},
                   {values({2, 4, 4}), diagonal}});
  return s;
}

class TpOpRules : public testing::DTensorOpTestBase {
 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(240); }

  void run_all(const DeviceMesh& mesh, testing::TestOpOptions o) {
    o.rtol = 1e-4;
    o.atol = 1e-5;
    for (auto& s : samples()) {
      SCOPED_TRACE(s.what);
      o.op_name = s.what;
      if (s.fn) test_op(mesh, s.fn, s.args, o);
      else test_op(mesh, s.op, s.overload, s.args, o);
    }
  }
};

DTENSOR_TEST_F(TpOpRules, MatchPlainOn1DMeshWithPartialAndUnevenInputs) {
  testing::TestOpOptions o;
  o.converter.partial = true;
  o.converter.uneven = true;
  run_all(build_device_mesh(), o);
}

DTENSOR_TEST_F(TpOpRules, MatchPlainOn2DMesh) {
  if (group().size() != 4) GTEST_SKIP() << "the 2x2 mesh needs 4 ranks";
  testing::TestOpOptions o;
  o.converter.mesh_2d = true;
  run_all(init_device_mesh("cpu", {2, 2}, {}, group_ptr()), o);
}

// The strategies that avoid communication are the ones chosen.
DTENSOR_TEST_F(TpOpRules, ChoosesCommunicationFreeLayouts) {
  auto mesh = build_device_mesh();
  const at::Tensor w = values({10, 4}), idx = indices({2, 3}, 10);
  auto placements = [](const at::Tensor& t) { return to_string(get_spec(t).placements); };
  at::Tensor rep_idx = distribute_tensor(idx, mesh, {Replicate{}});
  // Row-sharded table: Partial output; its gradient comes back Shard(0).
  at::Tensor row_w = distribute_tensor(w, mesh, {Shard{0}}).requires_grad_(true);
  at::Tensor out = at::embedding(row_w, rep_idx);
  EXPECT_EQ(placements(out), "(Partial(sum),)");
  redistribute(out, {Replicate{}}).sum().backward();
  EXPECT_EQ(placements(row_w.grad()), "(Shard(dim=0),)");
  // Column-sharded table: output sharded on its last dim.
  EXPECT_EQ(placements(at::embedding(distribute_tensor(w, mesh, {Shard{1}}), rep_idx)), "(Shard(dim=2),)");
  // Sequence-sharded LayerNorm input keeps its layout; weight gradients are Partial.
  at::Tensor x = distribute_tensor(values({2, 8, 6}), mesh, {Shard{1}}).requires_grad_(true);
  at::Tensor ln_w = distribute_tensor(values({6}, 1), mesh, {Replicate{}}).requires_grad_(true);
  at::Tensor y = at::layer_norm(x, {6}, ln_w, {});
  EXPECT_EQ(placements(y), "(Shard(dim=1),)");
  y.sum().backward();
  EXPECT_EQ(placements(x.grad()), "(Shard(dim=1),)");
  EXPECT_EQ(placements(ln_w.grad()), "(Partial(sum),)");
  // Viewing through size-1 dims keeps the shard.
  at::Tensor b = distribute_tensor(values({1, 1, 8}), mesh, {Shard{2}});
  EXPECT_EQ(placements(b.view({8})), "(Shard(dim=0),)");
  EXPECT_EQ(placements(b.view({8}).view({1, 8, 1})), "(Shard(dim=1),)");
  // Softmax over the sharded dim gathers; over another dim it does not.
  at::Tensor s = distribute_tensor(values({4, 8}), mesh, {Shard{0}});
  EXPECT_EQ(placements(s.softmax(1)), "(Shard(dim=0),)");
  EXPECT_EQ(placements(s.softmax(0)), "(Replicate(),)");
}

}  // namespace
}  // namespace dtensor
