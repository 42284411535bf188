// dtensor/comm/work.h: the handle of a collective issued asynchronously (c10d's Work,
// PyTorch's `async_op=True`).
//
//   comm::WorkPtr work = group->all_reduce_async(t);   // issued: returns at once
//   at::Tensor y = compute_something_else();            // overlaps with the all_reduce
//   work->wait();                                       // t holds the sum; rethrows its error
//
// NOTE: [Async collectives]
// Every collective of comm::Group has an `_async` spelling that issues it and returns a
// WorkPtr; the blocking spelling is issue-then-wait. Collectives run in issue order: every
// rank must issue the same collectives in the same order on a group (c10d's contract), mixing
// async and blocking calls freely, and they complete in that order on every rank. Until
// wait() returns, the caller must not read an output nor write an input of the collective.
// The caller need not keep the tensors alive: the group holds what the collective reads and
// writes until it no longer needs them (ThreadGroup: until the round ran; C10dGroup: c10d's
// work holds them until this Work is destroyed, and NCCL records its inputs on its stream for
// the caching allocator). An input dropped right after the issue is thus freed as soon as the
// collective allows (FSDP's reduce-scatter input).
//
// What runs where:
//   - C10dGroup (Gloo, NCCL): the backend's own Work. Gloo runs the collective on its
//     worker threads; NCCL on the process group's communication stream, with the CUDA caching
//     allocator told about the tensors it uses there (c10d records them on that stream), and
//     wait() makes the *current* stream wait on the collective's event instead of blocking the
//     host (ProcessGroupNCCL's own wait). Copies c10d needs around the call (a non-contiguous
//     output, a CPU tensor staged through the GPU, a CUDA tensor staged through host memory
//     for Gloo) and the division of an emulated AVG are the Work's *finish* step, run once, on
//     the thread that first waits.
//   - ThreadGroup: the rank that completes a round (the last to issue it) computes every
//     rank's result and writes their outputs; wait() waits for that round.
// With the call check on (c10d_guard.h, the harness's default), issuing on a C10dGroup first
// exchanges every rank's call description, blocking: issuing is then a rendezvous of the ranks,
// and the collective itself runs asynchronously after it.
// A Work dropped without wait() is waited for by its destructor, so a rank that ignores a
// result still takes part in the collective and peers never hang; an error then is reported
// with TORCH_WARN. A failed collective's error reaches every wait() of every rank (as
// CollectiveError naming the op and the group).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dtensor {
namespace comm {

class Work;
using WorkPtr = std::shared_ptr<Work>;

// The name of the group a collective runs on, as every message spells it ("gloo group of 4
// (ranks 0,1,2,3), rank 1": Group::describe()). A group makes it once (Group::name()) and its
// Works share it, so issuing a collective formats nothing; only an error, a warning or a
// query reads it.
using GroupName = std::shared_ptr<const std::string>;

class Work {
 public:
  using Clock = std::chrono::steady_clock;

  // What completes asynchronously: a backend's operation, a ThreadGroup round, another Work.
  class Source {
   public:
    virtual ~Source() = default;
    // Waits until the operation completed (successfully or not) or `deadline` passed; true
    // when it completed. Must not throw: errors are reported by error().
    virtual bool wait_until(Clock::time_point deadline) = 0;
    // Never blocks.
    virtual bool is_completed() = 0;
    // After completion: the operation's error, or nullptr.
    virtual std::exception_ptr error() = 0;
    // When the operation completed, where the source knows it (otherwise the Work records
    // when it saw the completion).
    virtual std::optional<Clock::time_point> completed_at() { return std::nullopt; }
  };

  // `op` (a string with static storage, e.g. a literal) and `where` name the collective in
  // errors ("all_reduce", "gloo group of 4 ..."); `finish` (may be empty) runs once after a
  // successful completion, on the waiting thread; wait() without a timeout gives up after
  // `timeout`.
  Work(const char* op, GroupName where, std::unique_ptr<Source> source, std::function<void()> finish,
       std::chrono::milliseconds timeout);
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  // Waits if nobody did (an error is then reported with TORCH_WARN).
  ~Work();

  // An operation that already ran (synchronously) with this outcome.
  static WorkPtr completed(const char* op, GroupName where, std::exception_ptr error = nullptr);
  static WorkPtr completed(const char* op, std::string where, std::exception_ptr error = nullptr);
  // A Work that completes when `inner` does, after `then` ran (once, on the waiting thread,
  // after inner's own finish step). Waiting on it waits on `inner`.
  static WorkPtr chain(WorkPtr inner, std::function<void()> then);

  // Blocks until the collective completed and its finish step ran; rethrows its error (as
  // CollectiveError or the error the finish step raised) on every call. Gives up with
  // CollectiveError after the group's collective timeout.
  void wait();
  // As wait(), but throws CollectiveError when the collective has not completed within
  // `timeout`; the collective then stays in flight and may be waited for again.
  void wait(std::chrono::milliseconds timeout);
  // The collective completed (successfully or not). Never blocks. Outputs are valid once
  // wait() returned (a finish step may still have to copy them).
  bool is_completed();
  // The error of a completed collective, or nullptr (also while in flight).
  std::exception_ptr exception();
  // wait() was called and returned or threw.
  bool was_waited() const;

  std::string op() const { return op_; }
  // When the collective was issued and when it completed (nullopt while in flight): tests use
  // them to observe overlap.
  Clock::time_point issued_at() const { return issued_at_; }
  std::optional<Clock::time_point> completed_at();

 private:
  void wait_until(Clock::time_point deadline, bool throw_on_timeout);
  void note_completion();  // mu_ held

  const char* op_;
  GroupName where_;
  std::unique_ptr<Source> source_;
  std::function<void()> finish_;
  std::chrono::milliseconds timeout_;
  Clock::time_point issued_at_;
  std::mutex wait_mu_;      // serializes waiters (the finish step runs once)
  mutable std::mutex mu_;   // the fields below
  bool finished_ = false;
  bool waited_ = false;
  std::exception_ptr error_;
  std::optional<Clock::time_point> completed_at_;
};

// Waits on every Work in order (nullptr entries are skipped); rethrows the first error after
// waiting on all of them.
void wait_all(const std::vector<WorkPtr>& works);

}  // namespace comm
}  // namespace dtensor
