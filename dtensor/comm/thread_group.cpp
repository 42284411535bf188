// dtensor/comm/thread_group.cpp
//
// NOTE: [ThreadGroup collective protocol]
// Every collective is one "round" of the world:
//   1. Each rank publishes a Call (op, signature, arguments) and waits at barrier A.
//   2. After A every Call is visible. Each rank checks that all ranks called the same op
//      with the same signature (else every rank throws the same CollectiveError), then
//      computes ITS OWN result into a fresh tensor, reading the others' inputs.
//   3. Barrier B: nobody writes an output before every rank has finished reading inputs
//      (in-place all_reduce reads and writes the same tensor).
//   4. Each rank copies its result into its output.
// Barriers are generation-counted; a timeout or abort() wakes everybody with an error.
//
// NOTE: [Calls outlive an aborted round]
// Between barriers A and B a rank reads the other ranks' Calls (their op names, signatures
// and input tensors). After abort() a rank may leave the round early, throwing at barrier B
// (or at the mismatch barrier) while its peers are still in step 2; a Call on the caller's
// stack would then be freed under the peers, which read freed memory (a SIGSEGV while
// formatting the mismatch message, when 8 thread ranks ran a test whose mesh held only 4 of
// them and the 4 outside threw). So the world holds each rank's Call by shared_ptr, and every
// rank keeps the Calls it reads alive until it leaves the round.
#include "dtensor/comm/thread_group.h"

#include "dtensor/comm/async_work.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

namespace dtensor {
namespace comm {

namespace {

struct Call {
  std::string op;
  std::string signature;  // must match across ranks
  std::vector<at::Tensor> tensors;
  ReduceOp reduce = ReduceOp::SUM;
  std::vector<int64_t> out_splits, in_splits;
  std::vector<int> ranks;  // new_subgroup
};

std::string sig_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

}  // namespace

struct ThreadWorld::State {
  int size;
  std::chrono::milliseconds timeout;
  mutable std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;
  int arrived = 0;
  std::vector<bool> present;
  std::vector<std::shared_ptr<const Call>> calls;  // NOTE: [Calls outlive an aborted round]
  bool aborted = false;
  std::string reason;
  std::map<std::tuple<int, int, int>, std::deque<at::Tensor>> mail;  // (src, dst, tag)
  std::vector<uint64_t> subgroup_calls;                               // per rank
  std::map<std::pair<uint64_t, std::vector<int>>, std::shared_ptr<ThreadWorld>> children;

  // Waits at a generation-counted barrier; `lk` holds `mu`.
  void arrive_and_wait(std::unique_lock<std::mutex>& lk, int rank, const std::string& what,
                       const std::string& group_desc) {
    if (aborted) throw CollectiveError(what + " on " + group_desc + ": aborted: " + reason);
    const uint64_t gen = generation;
    present[rank] = true;
    if (++arrived == size) {
      arrived = 0;
      std::fill(present.begin(), present.end(), false);
      ++generation;
      cv.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (generation == gen && !aborted) {
      if (cv.wait_until(lk, deadline) == std::cv_status::timeout && generation == gen &&
          !aborted) {
        std::ostringstream os;
        os << what << " on " << group_desc << " timed out after " << timeout.count()
           << " ms; ranks that had not arrived:";
        for (int r = 0; r < size; ++r)
          if (!present[r]) os << " " << r;
        aborted = true;
        reason = os.str();
        cv.notify_all();
      }
    }
    if (generation == gen) throw CollectiveError(what + " on " + group_desc + ": " + reason);
  }
};

ThreadWorld::ThreadWorld(int size, std::chrono::milliseconds timeout)
    : state_(std::make_unique<State>()) {
  state_->size = size;
  state_->timeout = timeout;
  state_->present.assign(size, false);
  state_->calls.assign(size, nullptr);
  state_->subgroup_calls.assign(size, 0);
}

ThreadWorld::~ThreadWorld() = default;

std::shared_ptr<ThreadWorld> ThreadWorld::create(int size, std::chrono::milliseconds timeout) {
  TORCH_CHECK(size >= 1, "ThreadWorld::create: size must be >= 1, got ", size);
  TORCH_CHECK(timeout.count() > 0, "ThreadWorld::create: timeout must be positive");
  return std::shared_ptr<ThreadWorld>(new ThreadWorld(size, timeout));
}

int ThreadWorld::size() const { return state_->size; }
std::chrono::milliseconds ThreadWorld::timeout() const { return state_->timeout; }

void ThreadWorld::abort(const std::string& reason) {
  std::vector<std::shared_ptr<ThreadWorld>> kids;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (!state_->aborted) {
      state_->aborted = true;
      state_->reason = reason;
    }
    for (auto& kv : state_->children) kids.push_back(kv.second);
    state_->cv.notify_all();
  }
  for (auto& k : kids) k->abort(reason);
}

bool ThreadWorld::aborted() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->aborted;
}

ThreadGroup::ThreadGroup(std::shared_ptr<ThreadWorld> world, int rank, std::vector<int> global_ranks)
    : world_(std::move(world)), rank_(rank), global_ranks_(std::move(global_ranks)) {
  TORCH_CHECK(world_ != nullptr, "ThreadGroup: world is null");
  TORCH_CHECK(rank >= 0 && rank < world_->size(), "ThreadGroup: rank ", rank,
              " out of range for a world of ", world_->size());
  if (global_ranks_.empty()) {
    for (int r = 0; r < world_->size(); ++r) global_ranks_.push_back(r);
  }
  TORCH_CHECK(static_cast<int>(global_ranks_.size()) == world_->size(),
              "ThreadGroup: global_ranks has ", global_ranks_.size(), " entries for a world of ",
              world_->size());
}

int ThreadGroup::size() const { return world_->size(); }

namespace {

// Runs one round of NOTE: [ThreadGroup collective protocol]. `compute` sees every rank's
// Call and returns this rank's results; `finish` writes them into the outputs.
template <class Compute, class Finish>
void run_round(ThreadWorld& world, int rank, const std::string& group_desc, const Call& call,
               Compute compute, Finish finish) {
  wait_launched_work();  // NOTE: [Async collectives]
  auto& s = world.state();
  auto mine = std::make_shared<const Call>(call);  // NOTE: [Calls outlive an aborted round]
  std::unique_lock<std::mutex> lk(s.mu);
  s.calls[rank] = mine;
  s.arrive_and_wait(lk, rank, call.op, group_desc);
  // A peer that left an aborted round early may already have published its next Call: report
  // the abort, not a mismatch with that Call (barrier B would throw anyway).
  if (s.aborted) throw CollectiveError(call.op + " on " + group_desc + ": aborted: " + s.reason);
  // Step 2: all Calls are published and stay alive until barrier B.
  bool same = true;
  for (int r = 0; r < s.size; ++r) {
    same = same && s.calls[r]->op == call.op && s.calls[r]->signature == s.calls[0]->signature;
  }
  if (!same) {
    std::ostringstream os;
    os << "ranks called different collectives (or the same one with mismatched arguments) on "
       << group_desc << ":";
    for (int r = 0; r < s.size; ++r)
      os << " [rank " << r << ": " << s.calls[r]->op << "(" << s.calls[r]->signature << ")]";
    const std::string msg = os.str();
    // Every rank reaches this point with the same view, so every rank throws; a second
    // barrier keeps the Calls alive until all have read them.
    s.arrive_and_wait(lk, rank, call.op, group_desc);
    throw CollectiveError(msg);
  }
  const std::vector<std::shared_ptr<const Call>> held = s.calls;  // alive until we leave
  std::vector<const Call*> calls;
  for (const auto& k : held) calls.push_back(k.get());
  lk.unlock();
  auto result = compute(calls);
  lk.lock();
  s.arrive_and_wait(lk, rank, call.op, group_desc);  // barrier B
  s.calls[rank].reset();  // everybody has read it; do not hold the caller's tensors longer
  lk.unlock();
  finish(result);
}

at::Tensor reduce_tensors(const std::vector<at::Tensor>& xs, ReduceOp op) {
  at::Tensor acc = xs[0].clone(at::MemoryFormat::Contiguous);
  for (size_t i = 1; i < xs.size(); ++i) {
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG: acc.add_(xs[i]); break;
      case ReduceOp::PRODUCT: acc.mul_(xs[i]); break;
      case ReduceOp::MIN: acc = at::minimum(acc, xs[i]); break;
      case ReduceOp::MAX: acc = at::maximum(acc, xs[i]); break;
    }
  }
  if (op == ReduceOp::AVG) acc.div_(static_cast<double>(xs.size()));
  return acc;
}

void check_avg(const Group& g, const char* op, const at::Tensor& t, ReduceOp r) {
  TORCH_CHECK(r != ReduceOp::AVG || at::isFloatingType(t.scalar_type()) ||
                  at::isComplexType(t.scalar_type()),
              op, " on ", g.describe(), ": ReduceOp::AVG needs a floating dtype, got ",
              t.scalar_type(), "; use SUM and divide");
}

}  // namespace

void ThreadGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  check_avg(*this, "all_reduce", tensor, op);
  Call c{"all_reduce", sig_of(tensor) + "," + to_string(op), {tensor}, op};
  run_round(
      *world_, rank_, describe(), c,
      [&](const std::vector<const Call*>& calls) {
        std::vector<at::Tensor> xs;
        for (auto* k : calls) xs.push_back(k->tensors[0]);
        return reduce_tensors(xs, op);
      },
      [&](const at::Tensor& r) { tensor.copy_(r); });
}

void ThreadGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  detail::check_all_gather_shapes(*this, output, input);
  Call c{"all_gather_into", sig_of(input), {input}};
  run_round(
      *world_, rank_, describe(), c,
      [&](const std::vector<const Call*>& calls) {
        std::vector<at::Tensor> xs;
        for (auto* k : calls) xs.push_back(k->tensors[0]);
        return at::cat(xs, 0);
      },
      [&](const at::Tensor& r) { output.copy_(r); });
}

void ThreadGroup::reduce_scatter_into(at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  detail::check_reduce_scatter_shapes(*this, output, input);
  check_avg(*this, "reduce_scatter_into", input, op);
  Call c{"reduce_scatter_into", sig_of(input) + "," + to_string(op), {input}, op};
  const int me = rank_, n = size();
  run_round(
      *world_, rank_, describe(), c,
      [&](const std::vector<const Call*>& calls) {
        std::vector<at::Tensor> xs;
        for (auto* k : calls) xs.push_back(k->tensors[0].chunk(n, 0)[me]);
        return reduce_tensors(xs, op);
      },
      [&](const at::Tensor& r) { output.copy_(r); });
}

void ThreadGroup::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                    const std::vector<int64_t>& output_splits,
                                    const std::vector<int64_t>& input_splits) {
  auto splits = detail::resolve_all_to_all_splits(*this, output, input, output_splits, input_splits);
  Call c{"all_to_all_single", std::string(c10::toString(input.scalar_type())), {input}};
  c.out_splits = splits.first;
  c.in_splits = splits.second;
  const int me = rank_;
  run_round(
      *world_, rank_, describe(), c,
      [&](const std::vector<const Call*>& calls) {
        std::vector<at::Tensor> parts;
        for (size_t i = 0; i < calls.size(); ++i) {
          const Call& k = *calls[i];
          int64_t off = 0;
          for (int j = 0; j < me; ++j) off += k.in_splits[j];
          TORCH_CHECK(k.in_splits[me] == c.out_splits[i], "all_to_all_single on ", describe(),
                      ": rank ", i, " sends ", k.in_splits[me], " rows to rank ", me,
                      " but rank ", me, " expects ", c.out_splits[i]);
          parts.push_back(k.tensors[0].narrow(0, off, k.in_splits[me]));
        }
        return at::cat(parts, 0);
      },
      [&](const at::Tensor& r) { output.copy_(r); });
}

void ThreadGroup::broadcast(at::Tensor& tensor, int src) {
  detail::check_rank_arg(*this, "broadcast", "src", src);
  Call c{"broadcast", sig_of(tensor) + ",src=" + std::to_string(src), {tensor}};
  run_round(
      *world_, rank_, describe(), c,
      [&](const std::vector<const Call*>& calls) { return calls[src]->tensors[0].clone(); },
      [&](const at::Tensor& r) {
        if (rank_ != src) tensor.copy_(r);
      });
}

void ThreadGroup::barrier() {
  Call c{"barrier", ""};
  run_round(
      *world_, rank_, describe(), c, [](const std::vector<const Call*>&) { return 0; },
      [](int) {});
}

void ThreadGroup::send(const at::Tensor& tensor, int dst, int tag) {
  detail::check_rank_arg(*this, "send", "dst", dst);
  TORCH_CHECK(dst != rank_, "send on ", describe(), ": a rank cannot send to itself");
  auto& s = world_->state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.aborted) throw CollectiveError("send on " + describe() + ": aborted: " + s.reason);
  s.mail[{rank_, dst, tag}].push_back(tensor.clone());
  s.cv.notify_all();
}

void ThreadGroup::recv(at::Tensor& tensor, int src, int tag) {
  detail::check_rank_arg(*this, "recv", "src", src);
  TORCH_CHECK(src != rank_, "recv on ", describe(), ": a rank cannot receive from itself");
  auto& s = world_->state();
  std::unique_lock<std::mutex> lk(s.mu);
  auto key = std::make_tuple(src, rank_, tag);
  const auto deadline = std::chrono::steady_clock::now() + s.timeout;
  while (!s.aborted && s.mail[key].empty()) {
    if (s.cv.wait_until(lk, deadline) == std::cv_status::timeout && s.mail[key].empty()) {
      throw CollectiveError("recv from rank " + std::to_string(src) + " (tag " +
                            std::to_string(tag) + ") on " + describe() + " timed out after " +
                            std::to_string(s.timeout.count()) + " ms");
    }
  }
  if (s.mail[key].empty()) throw CollectiveError("recv on " + describe() + ": aborted: " + s.reason);
  at::Tensor msg = s.mail[key].front();
  s.mail[key].pop_front();
  lk.unlock();
  TORCH_CHECK(msg.sizes() == tensor.sizes() && msg.scalar_type() == tensor.scalar_type(),
              "recv on ", describe(), ": rank ", src, " sent ", sig_of(msg), " but the receive buffer is ",
              sig_of(tensor));
  tensor.copy_(msg);
}

void ThreadGroup::gather(const at::Tensor& input, std::vector<at::Tensor>& outputs, int dst) {
  detail::check_rank_arg(*this, "gather", "dst", dst);
  Call c{"gather", sig_of(input) + ",dst=" + std::to_string(dst), {input}};
  run_round(
      *world_, rank_, describe(), c,
      [&](const std::vector<const Call*>& calls) {
        std::vector<at::Tensor> xs;
        if (rank_ == dst)
          for (auto* k : calls) xs.push_back(k->tensors[0].clone());
        return xs;
      },
      [&](std::vector<at::Tensor>& xs) {
        if (rank_ == dst) outputs = std::move(xs);
      });
}

void ThreadGroup::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
  detail::check_rank_arg(*this, "scatter", "src", src);
  if (rank_ == src) {
    TORCH_CHECK(static_cast<int>(inputs.size()) == size(), "scatter on ", describe(), ": src rank passed ",
                inputs.size(), " tensors, expected ", size());
    for (auto& t : inputs)
      TORCH_CHECK(t.sizes() == output.sizes() && t.scalar_type() == output.scalar_type(),
                  "scatter on ", describe(), ": input ", sig_of(t), " does not match output ",
                  sig_of(output));
  }
  Call c{"scatter", sig_of(output) + ",src=" + std::to_string(src), inputs};
  run_round(
      *world_, rank_, describe(), c,
      [&](const std::vector<const Call*>& calls) { return calls[src]->tensors[rank_].clone(); },
      [&](const at::Tensor& r) { output.copy_(r); });
}

std::shared_ptr<Group> ThreadGroup::new_subgroup(const std::vector<int>& ranks) {
  detail::check_subgroup_ranks(*this, ranks);
  std::ostringstream sig;
  for (int r : ranks) sig << r << ",";
  Call c{"new_subgroup", sig.str()};
  c.ranks = ranks;
  auto& s = world_->state();
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    seq = s.subgroup_calls[rank_]++;
  }
  std::shared_ptr<ThreadWorld> child;
  run_round(
      *world_, rank_, describe(), c, [](const std::vector<const Call*>&) { return 0; },
      [&](int) {
        std::lock_guard<std::mutex> lk(s.mu);
        auto& slot = s.children[{seq, ranks}];
        if (!slot) slot = std::shared_ptr<ThreadWorld>(ThreadWorld::create(ranks.size(), s.timeout));
        child = slot;
        if (s.aborted) child->abort(s.reason);
      });
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  std::vector<int> globals;
  for (int r : ranks) globals.push_back(global_ranks_[r]);
  return std::make_shared<ThreadGroup>(child, static_cast<int>(it - ranks.begin()), globals);
}

}  // namespace comm
}  // namespace dtensor
