// dtensor/debug/mem_tracker.h: MemTracker, after PyTorch's
// torch.distributed._tools.mem_tracker.MemTracker: how much CPU memory one rank allocates in a
// scope (a training step), its peak, the peak inside each module's forward, and what the
// model's parameters, buffers, gradients and the optimizer's state hold.
//
//   dtensor::debug::MemTracker mem;   // before the model is built
//   /* build the model, fully_shard or parallelize it, make the optimizer */
//   mem.track_external(*model);       // its modules (per-module figures) and tensors
//   mem.track_external(optimizer);    // its state (Adam's moments, SGD's momentum, ...)
//   {
//     auto active = mem.enter();      // PyTorch: `with mem_tracker:`
//     at::Tensor loss = dtensor::nn::call(model, x).sum();
//     loss.backward();
//     optimizer.step();
//   }
//   mem.peak();                       // bytes
//   mem.held().optimizer_state;       // bytes
//   std::cout << mem.display_modulewise_stats();
//
// NOTE: [MemTracker]
// - What is counted: every block libtorch's CPU allocator hands out on the thread that entered
//   the tracker, while it is entered (NOTE: [Per-rank memory accounting] in
//   dtensor/debug/tracking_allocator_internal.h), until the block is freed, on whatever thread.
//   current() is what those blocks hold now, peak() the most they held at once; memory the
//   thread held before enter() (the model's parameters, say) is not in them. Allocations outside
//   the CPU allocator (a GPU's, Gloo's own buffers) are not seen.
// - Make the tracker before the model: the first MemTracker installs the accounting allocator
//   (for the rest of the process), and a storage made before that re-allocates outside it
//   (fully_shard's unshard resizes its parameters' storages each step). track_external refuses a
//   module with such a parameter or buffer, naming it.
// - Per module: a tracked module called through nn::call (NOTE: [Module path] in
//   dtensor/nn/hooks.h) gets, for its first call inside the scope, current() when its forward
//   began and when it returned (the difference is what its forward left allocated: its
//   activations, and its output), and the peak during any of its calls. The figures are taken
//   in the module's own forward hooks, which run after hooks registered before them: with
//   fully_shard applied first, a module's "pre" already holds the parameters FSDP gathered for
//   it, and its "post" comes after FSDP freed them. The same for its first backward, delimited
//   by hooks on the gradients of its outputs and inputs as PyTorch's ModTracker delimits it.
// - By use (current_by_use, peak_by_use: the bytes at the moment of the peak): each block is
//   put, when it is allocated, under what it is for: fully_shard's unsharded parameters, its
//   all-gather outputs, its reduce-scatter inputs and outputs; otherwise, by where the thread
//   is: in backward (gradients and backward's temporaries), in a tracked module's forward
//   (activations, and the forward's temporaries), or neither (other: the optimizer step, code
//   outside the modules). PyTorch's FSDPMemTracker tags the same kinds by following each
//   tensor; here a block keeps the use it was allocated for (a reduce-scatter output that
//   becomes a gradient stays a reduce-scatter buffer).
// - held(): what the tracked modules' parameters, buffers and gradients and the tracked
//   optimizers' state tensors hold now, each storage counted once (a DTensor by its local
//   tensor), wherever and whenever they were allocated. PyTorch's MemTracker tags every storage
//   as it is made; here the kinds are found by walking the module and the optimizer when asked.
// - Ranks as threads: each rank thread enters its own tracker. One tracker per thread is active
//   at a time; a tracker is entered and exited on one thread.
// - The same figures for rank r of a world that is not there: run the step on a comm::FakeGroup
//   (NOTE: [Fake world] in dtensor/comm/fake_group.h); tools/comm_plan prints them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace dtensor {
namespace debug {

// What a tracked module's forward did to the tracker's figures (bytes).
struct ModuleMemoryStats {
  std::string fqn;           // "Transformer.layers.0" (the root by its class, as CommDebugMode names it)
  int depth = 0;             // 0: the root
  int64_t calls = 0;         // forward calls inside the scope
  int64_t pre_forward = 0;   // current() when the first call began
  int64_t post_forward = 0;  // current() when the first call returned
  int64_t peak_forward = 0;  // the most current() reached during any call
  // Its first backward inside the scope (NOTE: [Per-module backward] in mem_tracker.cpp), as
  // PyTorch's ModTracker delimits it: from when the gradient of an output arrives to when the
  // gradients of its inputs are complete (or the backward ends, for a module none of whose
  // inputs needs a gradient: the root taking tokens, an embedding). All 0 without a backward.
  bool backward = false;      // a backward of it ran inside the scope
  int64_t pre_backward = 0;   // current() when the first backward began
  int64_t post_backward = 0;  // current() when it ended
  int64_t peak_backward = 0;  // the most current() reached during any of its backwards
};

// What the tracked modules and optimizers hold now (bytes; each storage once).
struct HeldMemory {
  int64_t parameters = 0;
  int64_t buffers = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t total() const { return parameters + buffers + gradients + optimizer_state; }
};

// The tracker's bytes by what they were allocated for (NOTE: [MemTracker]).
struct MemoryByUse {
  int64_t activations = 0;             // in a tracked module's forward, not in a buffer below
  int64_t backward = 0;                // in backward: gradients and backward's temporaries
  int64_t unsharded_parameters = 0;    // fully_shard's unsharded parameters
  int64_t all_gather_buffers = 0;      // fully_shard's all-gather outputs
  int64_t reduce_scatter_buffers = 0;  // fully_shard's reduce-scatter inputs and outputs
  int64_t other = 0;                   // anywhere else: the optimizer step, code outside modules
  int64_t total() const {
    return activations + backward + unsharded_parameters + all_gather_buffers + reduce_scatter_buffers + other;
  }
};

class MemTracker {
 public:
  MemTracker();
  ~MemTracker();
  MemTracker(const MemTracker&) = delete;
  MemTracker& operator=(const MemTracker&) = delete;

  // Per-module figures for `module` and every module below it, and its tensors in held(). The
  // module must be owned by a std::shared_ptr (its hooks need it: NOTE: [Hook registry]), and its
  // parameters and buffers made after the first MemTracker (see above).
  void track_external(torch::nn::Module& module);
  // Its state tensors in held(). Adam, AdamW, SGD, RMSprop and Adagrad are known; another
  // optimizer's state is refused here, naming its class. The optimizer must outlive held() calls.
  void track_external(const torch::optim::Optimizer& optimizer);

  // Active while alive: this thread's allocations are counted (RAII for `with mem_tracker:`).
  class Active {
   public:
    Active(Active&& o) noexcept : tracker_(o.tracker_) { o.tracker_ = nullptr; }
    Active& operator=(Active&&) = delete;
    ~Active();

   private:
    friend class MemTracker;
    explicit Active(MemTracker* tracker) : tracker_(tracker) {}
    MemTracker* tracker_;
  };
  // Clears the per-module figures and starts counting on this thread (current() goes on from
  // what earlier scopes left allocated); throws when this tracker or another is active here.
  [[nodiscard]] Active enter();
  bool active() const { return active_; }

  int64_t current() const;
  int64_t peak() const;
  // Starts peak() over from current() (to take one phase's peak: forward, backward, the step).
  void reset_peak();
  // current() by use; and by use at the moment peak() was reached. Their totals are current()
  // and peak() (to a block, when another thread frees one of the tracker's blocks meanwhile).
  MemoryByUse current_by_use() const;
  MemoryByUse peak_by_use() const;
  HeldMemory held() const;
  // Tracked modules in the order they were first called inside the scope.
  std::vector<ModuleMemoryStats> module_stats() const;
  // A table of module_stats(), indented by depth, bytes in KiB/MiB/GiB: the forward figures,
  // then the backward ones of the modules that had a backward.
  std::string display_modulewise_stats() const;

 private:
  struct State;
  void exit();
  std::unique_ptr<State> state_;
  bool active_ = false;
};

// "12.50 MiB" (B, KiB, MiB, GiB, TiB).
std::string format_bytes(double bytes);

}  // namespace debug
}  // namespace dtensor
