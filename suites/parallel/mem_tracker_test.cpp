// MemTracker (NOTE: [MemTracker] in dtensor/debug/mem_tracker.h) on one process, against sizes
// computed from the shapes: what a scope allocates and frees, per-module forward figures, what
// a model and its optimizer hold, one tracker per thread, and the errors. Its figures on a
// fake world against real ranks are in fake_world_test.cpp.
#include "dtensor/debug/mem_tracker.h"
#include "dtensor/nn/nn.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <string>
#include <thread>

namespace dtensor {
namespace {

using debug::MemTracker;
using testing::contains;
using testing::error_of;

struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() {
    a = register_module("a", torch::nn::Linear(8, 16));
    b = register_module("b", torch::nn::Linear(16, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return nn::call(b, at::relu(nn::call(a, x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoLayer);

constexpr int64_t kFloat = 4;
constexpr int64_t kTwoLayerParams = (8 * 16 + 16 + 16 * 4 + 4) * kFloat;

TEST(MemTracker, CountsWhatItsScopeAllocatesUntilFreed) {
  MemTracker mem;
  at::Tensor earlier = at::empty({500}, at::kFloat);
  at::Tensor kept;
  {
    auto active = mem.enter();
    EXPECT_TRUE(mem.active());
    kept = at::empty({1000}, at::kFloat);
    { at::Tensor freed = at::empty({3000}, at::kFloat); }
    earlier = at::Tensor();  // allocated before the scope: not in its figures
    std::thread([] { at::Tensor other_thread = at::empty({7000}, at::kFloat); }).join();
    EXPECT_EQ(mem.current(), 1000 * kFloat);
    EXPECT_EQ(mem.peak(), 4000 * kFloat);
  }
  EXPECT_FALSE(mem.active());
  at::Tensor outside = at::empty({2000}, at::kFloat);
  EXPECT_EQ(mem.current(), 1000 * kFloat) << "allocated after exit: not counted";
  std::thread([&] { kept = at::Tensor(); }).join();  // freed on another thread: refunded
  EXPECT_EQ(mem.current(), 0);
  EXPECT_EQ(mem.peak(), 4000 * kFloat);
  {
    auto active = mem.enter();  // a second scope starts the peak over
    at::Tensor t = at::empty({10}, at::kFloat);
    EXPECT_EQ(mem.peak(), 10 * kFloat);
    mem.reset_peak();
    EXPECT_EQ(mem.peak(), 10 * kFloat);
  }
}

TEST(MemTracker, PerModuleForwardFiguresAndWhatTheModelAndAdamHold) {
  MemTracker mem;
  TwoLayer model;
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  mem.track_external(*model);
  mem.track_external(opt);
  EXPECT_EQ(mem.held().parameters, kTwoLayerParams);
  EXPECT_EQ(mem.held().gradients, 0);
  EXPECT_EQ(mem.held().optimizer_state, 0);
  const at::Tensor x = at::randn({4, 8});
  {
    auto active = mem.enter();
    at::Tensor y = nn::call(model, x);
    at::Tensor again = nn::call(model, x);
    (y.sum() + again.sum()).backward();
    opt.step();
  }
  const auto stats = mem.module_stats();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_EQ(stats[0].fqn, "TwoLayer");
  EXPECT_EQ(stats[1].fqn, "TwoLayer.a");
  EXPECT_EQ(stats[2].fqn, "TwoLayer.b");
  EXPECT_EQ(stats[0].depth, 0);
  EXPECT_EQ(stats[1].depth, 1);
  for (const auto& s : stats) EXPECT_EQ(s.calls, 2) << s.fqn;
  // What a call leaves allocated: a's output [4, 16]; b's [4, 4]; the root's, relu's [4, 16]
  // (b saved it for backward) and b's (a's output, a temporary of the root's expression, is freed
  // when the root returns). Its peak holds all three; the second call's comes on top of what the
  // first left.
  EXPECT_EQ(stats[1].post_forward - stats[1].pre_forward, 4 * 16 * kFloat);
  EXPECT_EQ(stats[2].post_forward - stats[2].pre_forward, 4 * 4 * kFloat);
  constexpr int64_t kLeft = (4 * 16 + 4 * 4) * kFloat, kHeld = (4 * 16 * 2 + 4 * 4) * kFloat;
  EXPECT_EQ(stats[0].pre_forward, 0);
  EXPECT_EQ(stats[0].post_forward, kLeft);
  EXPECT_EQ(stats[0].peak_forward, kLeft + kHeld);
  EXPECT_EQ(stats[1].peak_forward, kLeft + 4 * 16 * kFloat);
  for (const auto& s : stats) EXPECT_GE(s.peak_forward, s.post_forward) << s.fqn;
  EXPECT_GE(mem.peak(), stats[0].peak_forward);
  const debug::HeldMemory held = mem.held();
  EXPECT_EQ(held.parameters, kTwoLayerParams);
  EXPECT_EQ(held.buffers, 0);
  EXPECT_EQ(held.gradients, kTwoLayerParams);
  EXPECT_EQ(held.optimizer_state, 2 * kTwoLayerParams) << "Adam: exp_avg and exp_avg_sq";
  EXPECT_EQ(held.total(), 4 * kTwoLayerParams);
  const std::string table = mem.display_modulewise_stats();
  EXPECT_PRED2(contains, table, "  TwoLayer.a");
  EXPECT_PRED2(contains, table, "256 B");
}

// Backward per module, delimited as PyTorch's ModTracker delimits it: from the gradient of the
// output (read here by a hook of the test's own on it) to the gradients of the inputs (a hook on
// x), the root's and b's beginning on the same gradient, the root's and a's ending on the same.
// A module whose input needs no gradient ends with the backward; a second backward in the scope
// leaves the first one's figures.
TEST(MemTracker, PerModuleBackwardFigures) {
  MemTracker mem;
  TwoLayer model;
  mem.track_external(*model);
  const at::Tensor x = at::randn({4, 8}).requires_grad_();
  int64_t at_output_gradient = -1, at_input_gradient = -1;
  debug::ModuleMemoryStats root, a, b;
  int64_t backward_peak = 0;
  {
    auto active = mem.enter();
    at::Tensor y = nn::call(model, x);
    y.register_hook([&](const at::Tensor&) { at_output_gradient = mem.current(); });
    x.register_hook([&](const at::Tensor&) {
      if (at_input_gradient < 0) at_input_gradient = mem.current();  // the first backward's
    });
    for (const auto& s : mem.module_stats()) EXPECT_FALSE(s.backward) << s.fqn << ": no backward yet";
    mem.reset_peak();
    y.sum().backward();
    backward_peak = mem.peak();
    const auto stats = mem.module_stats();
    ASSERT_EQ(stats.size(), 3u);
    root = stats[0], a = stats[1], b = stats[2];
    // Another backward through the same modules: the figures stay the first one's.
    nn::call(model, x).sum().backward();
    const auto again = mem.module_stats();
    EXPECT_EQ(again[0].pre_backward, root.pre_backward);
    EXPECT_EQ(again[0].post_backward, root.post_backward);
    EXPECT_GE(again[0].peak_backward, root.peak_backward);
  }
  ASSERT_GE(at_output_gradient, 0);
  ASSERT_GE(at_input_gradient, 0);
  for (const auto* s : {&root, &a, &b}) {
    EXPECT_TRUE(s->backward) << s->fqn;
    EXPECT_GE(s->peak_backward, std::max(s->pre_backward, s->post_backward)) << s->fqn;
    EXPECT_LE(s->peak_backward, root.peak_backward) << s->fqn << ": inside the root's backward";
  }
  EXPECT_EQ(root.pre_backward, at_output_gradient);
  EXPECT_EQ(b.pre_backward, at_output_gradient);
  EXPECT_EQ(root.post_backward, at_input_gradient);
  EXPECT_EQ(a.post_backward, at_input_gradient);
  EXPECT_LE(root.peak_backward, backward_peak);
  // The gradient b computes for its input, [4, 16] floats, is held when b's backward ends.
  EXPECT_GE(b.post_backward - b.pre_backward, 4 * 16 * kFloat);
  EXPECT_PRED2(contains, mem.display_modulewise_stats(), "module (backward)");

  // Without an input that needs a gradient, the root ends with the backward, when its
  // parameters' gradients are all there.
  MemTracker tokens_mem;
  TwoLayer tokens_model;
  tokens_mem.track_external(*tokens_model);
  {
    auto active = tokens_mem.enter();
    nn::call(tokens_model, at::randn({4, 8})).sum().backward();
  }
  const auto stats = tokens_mem.module_stats();
  ASSERT_EQ(stats.size(), 3u);
  EXPECT_TRUE(stats[0].backward);
  EXPECT_EQ(stats[0].post_backward, stats[1].post_backward) << "a's input needs no gradient either";
  EXPECT_GE(stats[0].post_backward, kTwoLayerParams) << "every parameter's gradient is held";
}

// A module that returns its input (dropout with p = 0) has an empty backward: both its hooks are
// on one tensor, the input's first.
struct PassImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) { return x; }
};
TORCH_MODULE(Pass);
struct LinearThenPassImpl : torch::nn::Module {
  LinearThenPassImpl() {
    a = register_module("a", torch::nn::Linear(8, 16));
    pass = register_module("pass", Pass());
  }
  at::Tensor forward(const at::Tensor& x) { return nn::call(pass, nn::call(a, x)); }
  torch::nn::Linear a{nullptr};
  Pass pass{nullptr};
};
TORCH_MODULE(LinearThenPass);

TEST(MemTracker, AModuleReturningItsInputHasAnEmptyBackward) {
  MemTracker mem;
  LinearThenPass model;
  mem.track_external(*model);
  const at::Tensor x = at::randn({4, 8}).requires_grad_();
  int64_t at_output_gradient = -1;
  {
    auto active = mem.enter();
    at::Tensor y = nn::call(model, x);
    y.register_hook([&](const at::Tensor&) { at_output_gradient = mem.current(); });
    y.sum().backward();
  }
  const auto stats = mem.module_stats();
  ASSERT_EQ(stats.size(), 3u);
  const auto& pass = stats[2];
  EXPECT_EQ(pass.fqn, "LinearThenPass.pass");
  EXPECT_TRUE(pass.backward);
  EXPECT_EQ(pass.pre_backward, at_output_gradient);
  EXPECT_EQ(pass.post_backward, at_output_gradient);
  EXPECT_EQ(pass.peak_backward, at_output_gradient);
  // a's backward begins on the same gradient and holds at least the gradient it computes.
  EXPECT_EQ(stats[1].pre_backward, at_output_gradient);
  EXPECT_GE(stats[1].post_backward, stats[1].pre_backward + 4 * 8 * kFloat) << "x's gradient";
}

// By use: the forward's blocks are activations (at its peak, all of it), the gradients are
// backward's, Adam's moments (made in the step, outside any module) other; totals agree.
TEST(MemTracker, BytesByUse) {
  MemTracker mem;
  TwoLayer model;
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  mem.track_external(*model);
  const at::Tensor x = at::randn({4, 8});
  auto active = mem.enter();
  at::Tensor y = nn::call(model, x);
  at::Tensor again = nn::call(model, x);
  // The second call's peak: the first call's relu and b outputs, then the second's a, relu and b
  // outputs (a's is freed when the root returns).
  constexpr int64_t kLeft = (4 * 16 + 4 * 4) * kFloat, kHeld = (4 * 16 * 2 + 4 * 4) * kFloat;
  debug::MemoryByUse at_peak = mem.peak_by_use();
  EXPECT_EQ(at_peak.activations, kLeft + kHeld);
  EXPECT_EQ(at_peak.total(), mem.peak());
  EXPECT_EQ(mem.current_by_use().activations, 2 * kLeft);
  EXPECT_EQ(mem.current_by_use().total(), mem.current());
  (y.sum() + again.sum()).backward();
  // Backward freed what b saved (the relu outputs); y and `again` remain; the gradients are new.
  EXPECT_EQ(mem.current_by_use().activations, 2 * 4 * 4 * kFloat);
  EXPECT_EQ(mem.current_by_use().backward, kTwoLayerParams);
  opt.step();
  EXPECT_EQ(mem.current_by_use().other, 2 * kTwoLayerParams) << "Adam's exp_avg and exp_avg_sq";
  EXPECT_EQ(mem.current_by_use().unsharded_parameters + mem.current_by_use().all_gather_buffers +
                mem.current_by_use().reduce_scatter_buffers,
            0);
  EXPECT_EQ(mem.current_by_use().total(), mem.current());
}

// Each known optimizer's state after a step, against its kind: a momentum or a running sum per
// parameter (SGD with momentum, RMSprop, Adagrad), two moments (AdamW).
TEST(MemTracker, HeldCountsEachKnownOptimizersState) {
  using namespace torch::optim;
  auto state_bytes = [](auto make) {
    MemTracker mem;
    TwoLayer model;
    auto opt = make(model->parameters());
    model->forward(at::randn({2, 8})).sum().backward();
    opt.step();
    mem.track_external(opt);
    return mem.held().optimizer_state;
  };
  EXPECT_EQ(state_bytes([](auto p) { return SGD(p, SGDOptions(0.1).momentum(0.9)); }), kTwoLayerParams);
  EXPECT_EQ(state_bytes([](auto p) { return RMSprop(p, RMSpropOptions(0.01)); }), kTwoLayerParams);
  EXPECT_EQ(state_bytes([](auto p) { return Adagrad(p, AdagradOptions(0.01)); }), kTwoLayerParams);
  EXPECT_EQ(state_bytes([](auto p) { return AdamW(p, AdamWOptions(0.01)); }), 2 * kTwoLayerParams);
}

TEST(MemTracker, EachThreadCountsItsOwn) {
  int64_t counted[2] = {0, 0};
  auto body = [&](int i) {
    MemTracker mem;
    auto active = mem.enter();
    at::Tensor t = at::empty({100 * (i + 1)}, at::kFloat);
    counted[i] = mem.current();
  };
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(counted[0], 100 * kFloat);
  EXPECT_EQ(counted[1], 200 * kFloat);
}

TEST(MemTracker, ErrorsNameWhatWasWrong) {
  MemTracker mem, other;
  {
    auto active = mem.enter();
    EXPECT_PRED2(contains, error_of([&] { auto again = mem.enter(); }),
                 "MemTracker::enter: this tracker is already active");
    EXPECT_PRED2(contains, error_of([&] { auto second = other.enter(); }),
                 "another MemTracker is active on this thread");
  }
  auto later = other.enter();  // the first one's exit freed the thread
  torch::nn::LinearImpl on_stack(2, 2);
  EXPECT_PRED2(contains, error_of([&] { mem.track_external(on_stack); }),
               "the Linear module is not owned by a std::shared_ptr");
  TwoLayer model;
  torch::optim::LBFGS lbfgs(model->parameters());
  const at::Tensor x = at::randn({2, 8});
  lbfgs.step([&] {
    lbfgs.zero_grad();
    at::Tensor loss = model->forward(x).pow(2).sum();
    loss.backward();
    return loss;
  });
  EXPECT_PRED2(contains, error_of([&] { mem.track_external(lbfgs); }), "the state of torch::optim::LBFGS is not known");
  // A parameter whose storage did not come from the accounting allocator (here: memory of our
  // own; in a program: a model built before the first MemTracker).
  std::vector<float> outside(16 * 8, 0.0f);
  at::NoGradGuard no_grad;
  model->a->weight.set_data(at::from_blob(outside.data(), {16, 8}));
  EXPECT_PRED2(contains, error_of([&] { mem.track_external(*model); }),
               "parameter TwoLayer.a.weight was allocated before the memory accounting was installed");
}

}  // namespace
}  // namespace dtensor
