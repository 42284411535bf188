// DTensor core as a user drives it: distribute, redistribute every transition (1-D and 2-D,
// even and uneven, forward and backward), from_local/to_local, ops through the dispatcher,
// errors, and an MLP whose gradients equal the plain ones.
#include "dtensor/comm/comm.h"
#include "dtensor/comm/device.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <sstream>

namespace dtensor {
namespace {

using testing::error_of;
// The same global tensor on every rank (seeded), so results can be checked locally.
at::Tensor global_input(std::vector<int64_t> shape, int64_t seed = 0) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) * 0.37 + seed).sin().reshape(shape).to(at::kFloat);
}

// PyTorch's repr of the ranks 0..n-1: "[0, 1, 2, 3]".
std::string py_ranks(int64_t n) {
  std::string s = "[";
  for (int64_t r = 0; r < n; ++r) s += (r ? ", " : "") + std::to_string(r);
  return s + "]";
}

std::vector<Placement> all_placements_1d() {
  return {Shard{0}, Shard{1}, Replicate{}, Partial{}};
}

class DTensorThreads : public testing::MultiThreadedTest {};
class DTensorGloo : public testing::MultiProcessTest {};

void check_every_1d_transition(testing::MultiRankTest& t) {
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  for (std::vector<int64_t> shape : {std::vector<int64_t>{8, 4}, std::vector<int64_t>{5, 3}, std::vector<int64_t>{2, 6}}) {
    at::Tensor g = global_input(shape);
    for (const auto& from : all_placements_1d()) {
      for (const auto& to : all_placements_1d()) {
        SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << " " << to_string(from) << " -> " << to_string(to));
        at::Tensor x = distribute_tensor(g, mesh, {from});
        // Every transition of the engine, Partial targets included (the public redistribute
        // refuses those: RedistributeRefusesPartialTargets).
        at::Tensor y = detail::redistribute_to_any(x, {to});
        EXPECT_EQ(get_spec(y).placements, std::vector<Placement>{to});
        EXPECT_EQ(y.sizes(), g.sizes());
        EXPECT_EQ(local_tensor(y).sizes().vec(), compute_local_shape(shape, mesh, {to}));
        EXPECT_TRUE(at::allclose(full_tensor(y).cpu(), g, 1e-5, 1e-5));
      }
    }
  }
}
DTENSOR_TEST_F(DTensorThreads, RedistributeEveryTransition1D) { check_every_1d_transition(*this); }
DTENSOR_TEST_F(DTensorGloo, RedistributeEveryTransition1D) { check_every_1d_transition(*this); }

DTENSOR_TEST_F(DTensorThreads, RedistributeEveryTransition2D) {
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d());
  std::vector<std::vector<Placement>> ps;
  for (const auto& a : all_placements_1d())
    for (const auto& b : all_placements_1d()) ps.push_back({a, b});
  for (std::vector<int64_t> shape : {std::vector<int64_t>{8, 4}, std::vector<int64_t>{3, 5}}) {
    at::Tensor g = global_input(shape, 1);
    for (const auto& from : ps) {
      at::Tensor x = distribute_tensor(g, mesh, from);
      ASSERT_TRUE(at::allclose(full_tensor(x), g, 1e-5, 1e-5)) << to_string(from);
      for (const auto& to : ps) {
        SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << " " << to_string(from) << " -> " << to_string(to));
        at::Tensor y = detail::redistribute_to_any(x, to);
        EXPECT_EQ(local_tensor(y).sizes().vec(), compute_local_shape(shape, mesh, to));
        EXPECT_TRUE(at::allclose(full_tensor(y), g, 1e-5, 1e-5));
      }
    }
  }
}

DTENSOR_TEST_F(DTensorThreads, GradientFlowsBackThroughRedistribute) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor g = global_input({8, 6});
  at::Tensor w = global_input({8, 6}, 3);
  for (const auto& from : all_placements_1d()) {
    for (const auto& to : all_placements_1d()) {
      SCOPED_TRACE(to_string(from) + " -> " + to_string(to));
      at::Tensor x = distribute_tensor(g.clone().requires_grad_(true), mesh, {from});
      ASSERT_TRUE(x.requires_grad());
      at::Tensor y = full_tensor(detail::redistribute_to_any(x, {to}));
      (y * w).sum().backward();
      ASSERT_TRUE(x.grad().defined());
      // d/dx sum(x * w) = w; a Partial input gets a Replicate gradient.
      EXPECT_EQ(get_spec(x.grad()).placements[0], is_partial(from) ? Placement(Replicate{}) : from);
      EXPECT_TRUE(at::allclose(full_tensor(x.grad()), w, 1e-5, 1e-5));
    }
  }
}

DTENSOR_TEST_F(DTensorThreads, FromLocalAndToLocalAreDifferentiable) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor local = at::full({2, 3}, rank() + 1.0).requires_grad_(true);
  at::Tensor dt = from_local(local, mesh, {Shard{0}});
  EXPECT_EQ(dt.sizes(), (c10::IntArrayRef{2 * ranks(), 3}));
  EXPECT_TRUE(at::equal(to_local(dt), local));
  at::Tensor out = to_local(dt * 3);
  out.sum().backward();
  EXPECT_TRUE(at::allclose(local.grad(), at::full({2, 3}, 3.0)));
  // Uneven global shape given explicitly: 2n - 1 rows are 2 per rank, 1 on the last.
  const int64_t rows = 2 * ranks() - 1;
  at::Tensor piece = at::ones({rank() < ranks() - 1 ? 2 : 1, 2});
  at::Tensor uneven = from_local(piece, mesh, {Shard{0}}, FromLocalOptions::contiguous({rows, 2}));
  EXPECT_EQ(full_tensor(uneven).sum().item<float>(), 2.0f * rows);
}

DTENSOR_TEST_F(DTensorThreads, FromLocalRunCheckFailsOnEveryRank) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  const int last = ranks() - 1;
  at::Tensor local = at::ones({2, rank() == last ? 5 : 4});
  std::string err = error_of([&] { from_local(local, mesh, {Shard{0}}, /*run_check=*/true); });
  EXPECT_NE(err.find("dim 1 is not sharded by (Shard(dim=0),) but rank " + std::to_string(last) +
                     " has size 5 where rank 0 has 4"),
            std::string::npos)
      << err;
  at::Tensor typed = at::ones({2, 4}, rank() == 1 ? at::kDouble : at::kFloat);
  err = error_of([&] { from_local(typed, mesh, {Replicate{}}, true); });
  EXPECT_NE(err.find("rank 1 passed a local tensor of dtype Double"), std::string::npos) << err;
  err = error_of([&] { from_local(at::ones({3}), mesh, {Shard{0}}, FromLocalOptions::contiguous({8})); });
  EXPECT_NE(err.find("is not this rank's shard of [8]"), std::string::npos) << err;
}

// The mesh decides where local tensors live (DeviceMesh::device, NOTE: [Rank devices]).
DTENSOR_TEST_F(DTensorThreads, LocalTensorsLiveOnTheMeshDevice) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  EXPECT_EQ(mesh.device(), at::Device(at::kCPU));
  EXPECT_TRUE(to_local(distribute_tensor(at::ones({8}), mesh, {Shard{0}})).is_cpu());
  EXPECT_TRUE(to_local(dtensor::zeros({8}, mesh, {Shard{0}})).is_cpu());
  EXPECT_TRUE(to_local(dtensor::arange(0, 8, 1, mesh, {Shard{0}})).is_cpu());
  // A factory asked for another device type than its mesh's says so.
  std::string err = error_of(
      [&] { dtensor::ones({8}, mesh, {Shard{0}}, at::TensorOptions().device(at::kCUDA, 0)); });
  EXPECT_NE(err.find("dtensor::ones: the options ask for device cuda:0 but DeviceMesh('cpu', " + py_ranks(ranks()) +
                     ") keeps local tensors on cpu"),
            std::string::npos)
      << err;

  auto cuda = init_device_mesh("cuda", {ranks()});
  if (testing::gpu_count() == 0) {
    // Every entry point names the mesh instead of building CPU tensors for a "cuda" mesh.
    const std::string none =
        "DeviceMesh('cuda', " + py_ranks(ranks()) + "): local tensors go on a CUDA device, but this machine has none";
    for (const auto& [what, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
             {"device", [&] { cuda.device(); }},
             {"distribute_tensor", [&] { distribute_tensor(at::ones({8}), cuda, {Shard{0}}); }},
             {"from_local", [&] { from_local(at::ones({2}), cuda, {Shard{0}}); }},
             {"zeros", [&] { dtensor::zeros({8}, cuda, {Shard{0}}); }}}) {
      err = error_of(fn);
      EXPECT_NE(err.find(none), std::string::npos) << what << ": " << err;
    }
  } else {
    const int index = comm::use_rank_cuda_device(rank());  // threads: each rank its own GPU
    const at::Device dev = cuda.device();
    EXPECT_EQ(dev.index(), index);
    at::Tensor d = distribute_tensor(at::arange(8, at::kFloat), cuda, {Shard{0}});
    EXPECT_EQ(to_local(d).device(), dev);
    EXPECT_TRUE(at::equal(full_tensor(d).cpu(), at::arange(8, at::kFloat)));
    EXPECT_EQ(to_local(from_local(at::ones({2}), cuda, {Shard{0}})).device(), dev);  // moved, as PyTorch
    EXPECT_EQ(to_local(dtensor::zeros({8}, cuda, {Shard{0}})).device(), dev);
  }
}

DTENSOR_TEST_F(DTensorThreads, MixingPlainTensorsNamesTheOp) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor x = distribute_tensor(global_input({8, 4}), mesh, {Shard{0}});
  std::string err = error_of([&] { (void)(x + at::ones({8, 4})); });
  EXPECT_NE(err.find("aten::add.Tensor got a plain tensor of shape [8, 4]"), std::string::npos) << err;
  // A 0-dim plain tensor is a scalar.
  EXPECT_TRUE(at::allclose(full_tensor(x * at::scalar_tensor(2.0)), global_input({8, 4}) * 2));
  {
    ImplicitReplicationGuard implicit;
    at::Tensor y = x + at::ones({8, 4});
    EXPECT_TRUE(at::allclose(full_tensor(y), global_input({8, 4}) + 1));
  }
}

DTENSOR_TEST_F(DTensorThreads, OpWithoutRuleNamesTheOp) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor x = distribute_tensor(global_input({8, 4}), mesh, {Shard{0}});
  std::string err = error_of([&] { (void)at::glu(x, 0); });
  EXPECT_NE(err.find("operator aten::glu has no sharding rule"), std::string::npos) << err;
  EXPECT_NE(err.find("(Shard(dim=0),)[8, 4]"), std::string::npos) << err;
}

DTENSOR_TEST_F(DTensorThreads, OpsMatchPlainResults) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor a = global_input({8, 4}), b = global_input({8, 4}, 2), m = global_input({4, 6}, 5);
  struct Case {
    const char* name;
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> fn;
  };
  std::vector<Case> cases = {
      {"add", [](auto& x, auto& y, auto&) { return x + y; }},
      {"sub_alpha", [](auto& x, auto& y, auto&) { return at::sub(x, y, 2); }},
      {"mul_div", [](auto& x, auto& y, auto&) { return x * y / 3; }},
      {"relu_gelu_tanh_exp", [](auto& x, auto&, auto&) { return at::relu(x).add(at::gelu(x)).add(at::tanh(x)).add(at::exp(x)); }},
      {"neg", [](auto& x, auto&, auto&) { return -x; }},
      {"mm", [](auto& x, auto&, auto& w) { return at::mm(x, w); }},
      {"addmm", [](auto& x, auto& y, auto& w) { return at::addmm(y.sum(1, true).expand({8, 6}), x, w); }},
      {"bmm", [](auto& x, auto& y, auto&) { return at::bmm(x.view({2, 4, 4}), y.view({2, 4, 4}).transpose(1, 2)); }},
      {"t", [](auto& x, auto&, auto&) { return x.t().contiguous(); }},
      {"sum", [](auto& x, auto&, auto&) { return x.sum(); }},
      {"sum_dim", [](auto& x, auto&, auto&) { return x.sum({0}); }},
      {"sum_keepdim", [](auto& x, auto&, auto&) { return x.sum({1}, true); }},
      {"mean", [](auto& x, auto&, auto&) { return x.mean(); }},
      {"mean_dim", [](auto& x, auto&, auto&) { return x.mean({0}); }},
      {"view_flatten", [](auto& x, auto&, auto&) { return x.reshape({32}); }},
      {"view_split", [](auto& x, auto&, auto&) { return x.view({4, 2, 4}); }},
      {"permute", [](auto& x, auto&, auto&) { return x.view({2, 4, 4}).permute({2, 0, 1}); }},
      {"unsqueeze_squeeze", [](auto& x, auto&, auto&) { return x.unsqueeze(1).squeeze(1); }},
      {"broadcast", [](auto& x, auto& y, auto&) { return x + y.sum(0); }},
      {"clone_detach", [](auto& x, auto&, auto&) { return x.clone().detach(); }},
      {"ones_like", [](auto& x, auto&, auto&) { return at::ones_like(x) + x; }},
      {"inplace", [](auto& x, auto& y, auto&) {
         at::Tensor z = x.clone();
         z.mul_(2).add_(y);
         return z;
       }},
  };
  const std::vector<std::vector<Placement>> layouts = {{Shard{0}}, {Shard{1}}, {Replicate{}}, {Partial{}}};
  for (auto& c : cases) {
    at::Tensor expected = c.fn(a, b, m);
    for (auto& pa : layouts)
      for (auto& pb : layouts) {
        SCOPED_TRACE(std::string(c.name) + " a=" + to_string(pa) + " b=" + to_string(pb));
        at::Tensor da = distribute_tensor(a, mesh, pa), db = distribute_tensor(b, mesh, pb),
                   dm = distribute_tensor(m, mesh, {Replicate{}});
        at::Tensor got;
        try {
          got = c.fn(da, db, dm);
        } catch (const c10::Error& e) {
          ADD_FAILURE() << e.what_without_backtrace();
          continue;
        }
        ASSERT_TRUE(is_dtensor(got));
        EXPECT_TRUE(at::allclose(full_tensor(got), expected, 1e-4, 1e-5)) << full_tensor(got) << expected;
      }
  }
  // item() of a sharded scalar reduction
  at::Tensor da = distribute_tensor(a, mesh, {Shard{0}});
  EXPECT_NEAR(da.sum().item<float>(), a.sum().item<float>(), 1e-4);
}

// An MLP (Linear 10->16, ReLU, Linear 16->10) with column- then row-sharded weights: forward
// output, loss and every gradient equal the single-device model's.
void check_mlp(testing::MultiRankTest& t) {
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  at::Tensor w1 = global_input({16, 10}, 1) * 0.3, b1 = global_input({16}, 2) * 0.1;
  at::Tensor w2 = global_input({10, 16}, 3) * 0.3, b2 = global_input({10}, 4) * 0.1;
  at::Tensor x = global_input({4, 10}, 5);
  auto forward = [&](const at::Tensor& w1_, const at::Tensor& b1_, const at::Tensor& w2_, const at::Tensor& b2_,
                     const at::Tensor& x_) { return at::linear(at::relu(at::linear(x_, w1_, b1_)), w2_, b2_); };
  std::vector<at::Tensor> plain = {w1.clone().requires_grad_(true), b1.clone().requires_grad_(true),
                                   w2.clone().requires_grad_(true), b2.clone().requires_grad_(true)};
  at::Tensor ref = forward(plain[0], plain[1], plain[2], plain[3], x);
  at::Tensor ref_loss = (ref * ref).sum();
  ref_loss.backward();
  std::vector<std::vector<Placement>> layout = {{Shard{0}}, {Shard{0}}, {Shard{1}}, {Replicate{}}};
  std::vector<at::Tensor> dist;
  for (size_t i = 0; i < plain.size(); ++i)
    dist.push_back(distribute_tensor(plain[i].detach().clone().requires_grad_(true), mesh, layout[i]));
  at::Tensor dx = distribute_tensor(x, mesh, {Replicate{}});
  at::Tensor out = forward(dist[0], dist[1], dist[2], dist[3], dx);
  EXPECT_TRUE(at::allclose(full_tensor(out).cpu(), ref, 1e-4, 1e-5));
  at::Tensor loss = (out * out).sum();
  EXPECT_NEAR(full_tensor(loss).item<float>(), ref_loss.item<float>(), 1e-3);
  loss.backward();
  for (size_t i = 0; i < plain.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    ASSERT_TRUE(dist[i].grad().defined());
    EXPECT_TRUE(at::allclose(full_tensor(dist[i].grad()).cpu(), plain[i].grad(), 1e-3, 1e-4));
  }
}
DTENSOR_TEST_F(DTensorThreads, MlpForwardBackwardMatchesPlain) { check_mlp(*this); }
DTENSOR_TEST_F(DTensorGloo, MlpForwardBackwardMatchesPlain) { check_mlp(*this); }

// test_op over every op with a rule: the op on every sharding of its inputs (DTensorConverter)
// gathers back to the plain result. 1-D mesh with Partial and uneven inputs, and an (n/2, 2)
// mesh with per-mesh-dim placements.
class EveryRuledOp : public testing::DTensorOpTestBase {};

struct OpSample {
  const char* op;
  const char* overload;
  std::vector<c10::IValue> args;
};

std::vector<OpSample> op_samples() {
  at::Tensor a = global_input({8, 4}), b = global_input({8, 4}, 2), m = global_input({4, 6}, 5);
  at::Tensor x3 = global_input({2, 4, 4}, 3), y3 = global_input({2, 4, 4}, 4), col = global_input({8, 1}, 6);
  const c10::IValue none;
  using IL = std::vector<int64_t>;
  return {
      {"aten::add", "Tensor", {a, b, 1}},
      {"aten::sub", "Tensor", {a, b, 2}},
      {"aten::mul", "Tensor", {a, b}},
      {"aten::div", "Tensor", {a, b + 3}},
      {"aten::mul", "Scalar", {a, 1.5}},
      {"aten::neg", "", {a}},
      {"aten::relu", "", {a}},
      {"aten::gelu", "", {a, std::string("none")}},
      {"aten::tanh", "", {a}},
      {"aten::exp", "", {a}},
      {"aten::threshold_backward", "", {b, a, 0.0}},
      {"aten::mm", "", {a, m}},
      {"aten::addmm", "", {global_input({8, 6}, 7), a, m, 1, 1}},
      {"aten::bmm", "", {x3, y3}},
      {"aten::t", "", {a}},
      {"aten::transpose", "int", {a, 0, 1}},
      {"aten::permute", "", {x3, IL{2, 0, 1}}},
      {"aten::unsqueeze", "", {a, 1}},
      {"aten::squeeze", "dim", {col, 1}},
      {"aten::expand", "", {col, IL{8, 4}, false}},
      {"aten::view", "", {a, IL{32}}},
      {"aten::view", "", {a, IL{4, 2, 4}}},
      {"aten::sum", "", {a, none}},
      {"aten::sum", "dim_IntList", {a, IL{0}, false, none}},
      {"aten::sum", "dim_IntList", {x3, IL{1}, true, none}},
      {"aten::mean", "", {a, none}},
      {"aten::mean", "dim", {a, IL{1}, false, none}},
      {"aten::clone", "", {a, none}},
      {"aten::detach", "", {a}},
      {"aten::zeros_like", "", {a, none, none, none, none, none}},
      {"aten::ones_like", "", {a, none, none, none, none, none}},
      {"aten::add_", "Tensor", {a, b, 1}},
      {"aten::mul_", "Tensor", {a, b}},
  };
}

DTENSOR_TEST_F(EveryRuledOp, MatchesPlainOn1DMeshWithPartialAndUnevenInputs) {
  auto mesh = build_device_mesh();
  testing::TestOpOptions o;
  o.rtol = 1e-4;
  o.atol = 1e-5;
  o.converter.partial = true;
  o.converter.uneven = true;
  for (auto& s : op_samples()) {
    SCOPED_TRACE(std::string(s.op) + "." + s.overload);
    test_op(mesh, s.op, s.overload, s.args, o);
  }
}

DTENSOR_TEST_F(EveryRuledOp, MatchesPlainOn2DMesh) {
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d());
  testing::TestOpOptions o;
  o.rtol = 1e-4;
  o.atol = 1e-5;
  o.converter.mesh_2d = true;
  for (auto& s : op_samples()) {
    SCOPED_TRACE(std::string(s.op) + "." + s.overload);
    test_op(mesh, s.op, s.overload, s.args, o);
  }
}

DTENSOR_TEST_F(DTensorThreads, MismatchedMeshesAndBadPlacementsFailOnEveryRank) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  auto mesh2 = init_device_mesh(device_type(), mesh_shape_2d());
  at::Tensor x = distribute_tensor(global_input({8, 4}), mesh, {Shard{0}});
  at::Tensor y = distribute_tensor(global_input({8, 4}), mesh2, {Shard{0}, Replicate{}});
  std::string err = error_of([&] { (void)(x + y); });
  EXPECT_NE(err.find("aten::add.Tensor got DTensors on different meshes"), std::string::npos) << err;
  err = error_of([&] { distribute_tensor(global_input({8, 4}), mesh, {Shard{2}}); });
  EXPECT_NE(err.find("2"), std::string::npos) << err;
  EXPECT_NE(err, "<no error>");
  err = error_of([&] { distribute_tensor(global_input({8, 4}), mesh, {Shard{0}, Replicate{}}); });
  EXPECT_NE(err.find("2 placements for the 1-D mesh"), std::string::npos) << err;
  err = error_of([&] { redistribute(x, {Replicate{}, Replicate{}}); });
  EXPECT_NE(err, "<no error>");
  // The group is still usable: nobody is left in a collective.
  at::Tensor ok = full_tensor(x);
  EXPECT_EQ(ok.size(0), 8);
}

DTENSOR_TEST_F(DTensorThreads, PartialAvgMinMaxRedistribute) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor g = global_input({8, 3});
  for (auto op : {comm::ReduceOp::AVG, comm::ReduceOp::MIN, comm::ReduceOp::MAX}) {
    SCOPED_TRACE(comm::to_string(op));
    // Each rank holds g + (rank - (n - 1) / 2) * s: the avg is g; min/max come from the first /
    // the last rank.
    const double spread = (ranks() - 1) / 2.0 * 0.25;
    const double shift = rank() * 0.25 - spread;
    at::Tensor local = g + shift;
    at::Tensor expected = op == comm::ReduceOp::AVG ? g : op == comm::ReduceOp::MIN ? g - spread : g + spread;
    for (const Placement& to : std::vector<Placement>{Replicate{}, Shard{0}, Shard{1}}) {
      at::Tensor p = from_local(local, mesh, {Partial(op)});
      EXPECT_TRUE(at::allclose(full_tensor(redistribute(p, {to})), expected, 1e-5, 1e-5)) << to_string(to);
    }
    // Replicate -> Partial(op) -> Replicate gives the value back.
    at::Tensor r = distribute_tensor(g, mesh, {Replicate{}});
    EXPECT_TRUE(at::allclose(full_tensor(detail::redistribute_to_any(r, {Partial(op)})), g, 1e-5, 1e-5));
  }
}

DTENSOR_TEST_F(DTensorThreads, PrintsSpecAndLocalValues) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor x = distribute_tensor(at::arange(8, at::kFloat), mesh, {Shard{0}});
  std::string s = to_string(x);
  EXPECT_NE(s.find("DTensor(local_tensor="), std::string::npos) << s;
  EXPECT_NE(s.find("placements=(Shard(dim=0),), shape=[8]"), std::string::npos) << s;
}

}  // namespace
}  // namespace dtensor
