// dtensor/comm/async_work.h: communication issued now and waited for later (c10d's Work,
// PyTorch's async_op=True), on an ordered per-thread stream.
//
//   auto work = dtensor::comm::launch_async([g, t]() mutable { g->all_reduce(t); });
//   at::Tensor y = compute_something_else();   // overlaps with the all_reduce
//   work->wait();                              // t holds the sum; rethrows its error
//
// NOTE: [Async collectives]
// comm::Group's collectives block. launch_async(fn) queues `fn` (collectives and the local
// work around them) on the calling thread's comm stream: one worker thread per issuing thread,
// started on first use, running what that thread launched in launch order. So that every rank
// still issues its collectives in program order (the contract of Group, which c10d keeps by
// enqueueing work in call order), every blocking collective called on the issuing thread first
// waits until the work it launched has finished (wait_launched_work(), called at the top of
// the ThreadGroup and C10dGroup collectives). Communication launched and then overlapped with
// local computation therefore runs concurrently with it; the next blocking collective on the
// same thread is the latest point at which it completes.
//
// `fn` runs with the launching thread's ATen thread-local state (grad mode, dispatch key
// guards) and comm default group as of the launch. It must not wait on work launched after
// it. A Work dropped without wait() is waited for by its destructor (a rank that drops an
// unused result still takes part in the collective, so peers and group teardown never hang);
// an error then is reported with TORCH_WARN. The stream's worker is joined when the issuing
// thread exits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace dtensor {
namespace comm {

// The handle of one launched function. Share it (WorkPtr) between the holders of its result.
class Work {
 public:
  struct State;
  explicit Work(std::shared_ptr<State> state);
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  // Waits for the function if nobody did (an error is then reported with TORCH_WARN).
  ~Work();

  // Blocks until the function has run; rethrows its exception (every call does).
  void wait();
  // The function has run (successfully or not). Never blocks.
  bool is_completed() const;
  // wait() has been called.
  bool was_waited() const { return waited_; }

 private:
  std::shared_ptr<State> state_;
  bool waited_ = false;
};

using WorkPtr = std::shared_ptr<Work>;

// Queues `fn` on this thread's comm stream and returns at once (see NOTE: [Async collectives]).
WorkPtr launch_async(std::function<void()> fn);

// Blocks until every function this thread launched has run (not an error if one failed: its
// Work reports it). Called first by every blocking collective; cheap when nothing is pending.
void wait_launched_work();

// Number of functions this thread launched that have not finished yet (tests, diagnostics).
int64_t launched_work_pending();

}  // namespace comm
}  // namespace dtensor
