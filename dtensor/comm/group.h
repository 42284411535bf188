// dtensor/comm/group.h
//
// The communication interface the rest of dtensor-cpp talks to (DESIGN.md D2).
//
//   auto g = dtensor::comm::default_group();
//   at::Tensor t = at::ones({4}) * g->rank();
//   g->all_reduce(t, dtensor::comm::ReduceOp::SUM);   // collective
//
// A Group is a fixed set of `size()` ranks. Every call marked "collective" must be made
// by every rank of the group, in the same order, with matching arguments (the same
// contract as c10d's ProcessGroup). Two implementations exist:
//   - C10dGroup (c10d_group.h): Gloo on CPU, NCCL when libtorch has CUDA.
//   - ThreadGroup (thread_group.h): ranks are threads of one process, in memory.
// Each collective is blocking (when it returns, output tensors hold the result) or issued
// asynchronously with its `_async` spelling (NOTE: [Async collectives] in work.h).
#pragma once

#include "dtensor/comm/work.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtensor {
namespace comm {

// Default timeout of one blocking collective (c10d's default is 30 minutes; a test harness
// wants failures sooner, and every harness fixture overrides it with the test's timeout).
constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::minutes(5);

enum class ReduceOp { SUM, AVG, PRODUCT, MIN, MAX };

// "sum", "avg", ... ; the parse accepts either case and throws naming the bad value.
std::string to_string(ReduceOp op);
ReduceOp reduce_op_from_string(const std::string& name);

// Raised by a collective that could not complete: a peer aborted, the collective timed out,
// or ranks called different collectives. `what()` names the op, the group and the rank.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo", "nccl", "threads", "cpu:gloo,cuda:nccl", ...
  virtual std::string backend() const = 0;
  // Ranks of this group in the world (the group's global ranks), index = group rank.
  virtual const std::vector<int>& global_ranks() const = 0;

  // Every collective has a blocking spelling and an `_async` one (PyTorch's async_op=True)
  // that issues it and returns at once with a Work: NOTE: [Async collectives] (work.h). The
  // blocking spelling is issue-then-wait. Implementations override the `_async` ones.

  // Collective. In place: every rank ends with the reduction of all ranks' `tensor`.
  // AVG is supported for floating dtypes only.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM) { all_reduce_async(tensor, op)->wait(); }
  virtual WorkPtr all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::SUM) = 0;
  // Collective. `output` is `size()` inputs concatenated along dim 0:
  // output.size(0) == size() * input.size(0), other dims equal.
  void all_gather_into(at::Tensor& output, const at::Tensor& input) { all_gather_into_async(output, input)->wait(); }
  virtual WorkPtr all_gather_into_async(const at::Tensor& output, const at::Tensor& input) = 0;
  // Collective. `input` holds `size()` equal blocks along dim 0; rank r receives the
  // reduction of every rank's block r into `output`.
  void reduce_scatter_into(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::SUM) {
    reduce_scatter_into_async(output, input, op)->wait();
  }
  virtual WorkPtr reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input,
                                            ReduceOp op = ReduceOp::SUM) = 0;
  // Collective. Rank r sends input block j (along dim 0, `input_splits[j]` rows, equal
  // blocks when empty) to rank j and receives `output_splits[i]` rows from rank i.
  void all_to_all_single(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_splits = {},
                         const std::vector<int64_t>& input_splits = {}) {
    all_to_all_single_async(output, input, output_splits, input_splits)->wait();
  }
  virtual WorkPtr all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                          const std::vector<int64_t>& output_splits = {},
                                          const std::vector<int64_t>& input_splits = {}) = 0;
  // Collective. Every rank's `tensor` ends equal to rank `src`'s.
  void broadcast(at::Tensor& tensor, int src) { broadcast_async(tensor, src)->wait(); }
  virtual WorkPtr broadcast_async(const at::Tensor& tensor, int src) = 0;
  // Collective.
  void barrier() { barrier_async()->wait(); }
  virtual WorkPtr barrier_async() = 0;
  // Point to point; `tag` distinguishes concurrent messages between the same pair. Messages
  // between a pair with one tag are received in the order they were sent.
  void send(const at::Tensor& tensor, int dst, int tag = 0) { send_async(tensor, dst, tag)->wait(); }
  virtual WorkPtr send_async(const at::Tensor& tensor, int dst, int tag = 0) = 0;
  void recv(at::Tensor& tensor, int src, int tag = 0) { recv_async(tensor, src, tag)->wait(); }
  virtual WorkPtr recv_async(const at::Tensor& tensor, int src, int tag = 0) = 0;
  // Collective. On `dst`, `outputs` is resized to size() tensors shaped like `input`;
  // elsewhere it is left untouched.
  void gather(const at::Tensor& input, std::vector<at::Tensor>& outputs, int dst);
  // As gather; on `dst`, `outputs` are size() tensors shaped like `input` (allocated by the
  // caller, as c10d's gather), written by the time wait() returns. Ignored elsewhere.
  virtual WorkPtr gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) = 0;
  // Collective. On `src`, `inputs` holds size() tensors shaped like `output`; rank r
  // receives inputs[r]. Elsewhere `inputs` is ignored.
  void scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
    scatter_async(output, inputs, src)->wait();
  }
  virtual WorkPtr scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) = 0;

  // Collective over THIS group: every rank must call it with the same `ranks` (group
  // ranks of this group, sorted or not, no duplicates). Members get the new group,
  // other ranks get nullptr.
  virtual std::shared_ptr<Group> new_subgroup(const std::vector<int>& ranks) = 0;

  // Position of `global_rank` in this group, or -1.
  int group_rank_of(int global_rank) const;
  // "gloo group of 4 (ranks 0,1,2,3), rank 1": used in every error message.
  std::string describe() const;
  // describe(), made at the first call and kept (the group's ranks do not change after its
  // first collective): the name every Work of this group shares (GroupName in work.h).
  const GroupName& name() const;

 private:
  mutable std::once_flag name_once_;
  mutable GroupName name_;
};

using GroupPtr = std::shared_ptr<Group>;

// Checks shared by implementations; throw c10::Error (TORCH_CHECK) naming the op and group.
namespace detail {
void check_rank_arg(const Group& g, const char* op, const char* what, int r);
void check_all_gather_shapes(const Group& g, const at::Tensor& out, const at::Tensor& in);
void check_reduce_scatter_shapes(const Group& g, const at::Tensor& out, const at::Tensor& in);
// Returns {output_splits, input_splits}, filled with equal blocks where the caller gave none.
std::pair<std::vector<int64_t>, std::vector<int64_t>> resolve_all_to_all_splits(
    const Group& g, const at::Tensor& out, const at::Tensor& in,
    const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits);
void check_subgroup_ranks(const Group& g, const std::vector<int>& ranks);
// ReduceOp::AVG on an integer tensor.
void check_avg(const Group& g, const char* op, const at::Tensor& t, ReduceOp r);
}  // namespace detail

// NOTE: [Collective observers]
// What a debugging or accounting tool (dtensor::debug::CommDebugMode) sees of communication:
// every public collective of a Group implementation (C10dGroup, ThreadGroup) opens an
// ObservedCollective first, which tells the observer installed on the calling thread, if any,
// which collective is issued, on which group, with which tensors. Calls made inside one (a
// composed reduce_scatter's all_reduce, the call check's exchange) are not told again, so one
// call is one record. A rank's collectives are issued on its thread (autograd's backward on
// CPU runs on the thread that called backward()). Costs one thread-local load when no
// observer is installed.
struct CollectiveCall {
  const char* op;        // the Group method: "all_reduce", "all_gather_into", "send", ...
  const Group& group;
  int64_t input_bytes;   // what this rank passes in (0 where it passes nothing: recv, barrier)
  int64_t output_bytes;  // what this rank receives (0 for send and barrier)
};
class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  virtual void on_collective(const CollectiveCall& call) = 0;
};
// The calling thread's observer (nullptr: none); set returns the previous one.
CollectiveObserver* collective_observer();
CollectiveObserver* set_collective_observer(CollectiveObserver* observer);

namespace detail {
class ObservedCollective {
 public:
  ObservedCollective(const Group& g, const char* op, int64_t input_bytes, int64_t output_bytes);
  ~ObservedCollective();
  ObservedCollective(const ObservedCollective&) = delete;
  ObservedCollective& operator=(const ObservedCollective&) = delete;
};
int64_t nbytes(const at::Tensor& t);
int64_t nbytes(const std::vector<at::Tensor>& ts);
}  // namespace detail

// ---- Process-wide default group (PyTorch's default process group) ----------------------
// A thread may install its own default group (the threaded harness gives each rank thread
// one); default_group() returns the thread's if set, else the process-wide one, else throws
// "no default group: call init_process_group ...".
GroupPtr default_group();
bool is_initialized();
void set_default_group(GroupPtr group);          // process-wide
void set_thread_default_group(GroupPtr group);   // this thread only; nullptr clears
// Collective over the default group: see Group::new_subgroup (ranks are default-group ranks).
GroupPtr new_group(const std::vector<int>& ranks);
// Drops the default group of this thread if set, else the process-wide one.
void destroy_process_group();

}  // namespace comm
}  // namespace dtensor
