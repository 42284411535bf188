// dtensor/comm/thread_group.cpp
//
// NOTE: [ThreadGroup rounds]
// The n-th collective a rank issues on a world belongs to round n of that world (a per-rank
// issue counter; the world keeps the rounds not yet running by sequence number), so the
// ranks' n-th calls meet whatever mix of async and blocking spellings they used.
//   1. Issuing publishes the rank's Call (op, signature, copies of its tensor handles) into
//      its round and returns at once with a Work whose Source waits for that round.
//   2. The rank whose Call completes the round (the last to issue it) runs it, outside the
//      world's lock: it checks that all Calls have the same op and signature (else the round
//      fails with a message naming every rank's call), computes every rank's result from the
//      inputs into fresh tensors and only then writes every rank's outputs (in-place
//      all_reduce reads and writes the same tensors), under at::NoGradGuard; all_gather and
//      reduce_scatter write directly when no output shares memory with an input (NOTE:
//      [ThreadGroup results written in place]). Reductions run in rank order, one per
//      element, so all ranks get bit-identical results.
//   3. Rounds run one at a time, in sequence order: a rank completing round n+1 while round n
//      is still running leaves it to round n's runner, which goes on with every fully issued
//      round after its own. Collectives thus complete in issue order (NOTE: [Async
//      collectives]) and one may read what the previous one wrote.
//   4. The runner marks the round done and wakes the waiters. An error raised while running
//      (a split mismatch in all_to_all_single, ...) is the round's: every rank's wait()
//      rethrows it.
// A waiter waits on the world's condition variable until its round is done, the world is
// aborted, or its deadline. When the world's timeout has passed since it issued and some rank
// still has not issued the round, it aborts the world naming those ranks. A round already
// running when the world is aborted still completes (it needs no peer), so no output is
// written after its wait() returned; rounds not yet running fail with the abort's reason.
// The world forgets a round when it starts running, the runner drops the Calls (the callers'
// tensors) when it is done, and each rank's Source drops the round when it observes the
// completion: memory stays bounded by the Works alive.
//
// NOTE: [Calls outlive an aborted round]
// The runner reads every rank's Call (op names, signatures, tensors) without the world's
// lock, and after abort() the waiters leave while peers may still be issuing or running. With
// Calls on the callers' stacks a rank leaving early freed them under its peers (a SIGSEGV
// while formatting the mismatch message, when 8 thread ranks ran a test whose mesh held only 4
// of them and the 4 outside threw). So a Call holds copies of the tensor handles (never
// references to the caller's variables), a round owns its Calls by shared_ptr, and the
// world's round table, the runner and every rank's Source own the round by shared_ptr: a rank
// leaving drops only its own reference.
//
// NOTE: [ThreadGroup point to point]
// Each (src, dst, tag) is a channel numbering its messages and its receives. send_async
// queues a copy of the tensor under the next message number and completes at once;
// recv_async takes the next receive number (its ticket) at issue time, so receives posted in
// order get messages in send order whatever order they are waited in. The receiver's Source
// takes message `ticket` out of the channel when it has arrived; the Work's finish step (on
// the waiting thread) checks its shape and dtype and copies it into the receive buffer. A
// receive unanswered for the world's timeout fails alone (as before): it blocks no peer, so
// it does not abort the world.
#include "dtensor/comm/thread_group.h"
#include "dtensor/comm/group_checks_internal.h"
#include "dtensor/comm/thread_rounds_internal.h"
#include "dtensor/debug/tracking_allocator_internal.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

namespace dtensor {
namespace comm {

using namespace thread_rounds;

namespace {

using Clock = Work::Clock;

struct Round {
  explicit Round(int size) : calls(size) {}
  Calls calls;  // nullptr: that rank has not issued yet; cleared when done
  int issued = 0;
  bool started = false;  // a runner took it: it completes without peers
  bool done = false;
  // Outcome, as text: each rank raises its own CollectiveError (rank threads never share one
  // exception object).
  std::string mismatch;  // the Calls, when they differ
  std::optional<std::string> failure;  // the message of an error raised while running
  Clock::time_point completed_at;
};

// The messages of one (src, dst, tag): NOTE: [ThreadGroup point to point].
struct Channel {
  std::map<uint64_t, at::Tensor> messages;  // by send number, until received
  uint64_t sent = 0;
  uint64_t tickets = 0;  // receives posted
};
using ChannelKey = std::tuple<int, int, int>;  // (src, dst, tag)

std::string sig_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

std::string aborted_error(const std::string& op, const std::string& where, const std::string& reason) {
  return op + " on " + where + ": aborted: " + reason;
}

}  // namespace

struct ThreadWorld::State {
  int size = 0;
  std::chrono::milliseconds timeout{0};
  mutable std::mutex mu;       // everything below
  std::condition_variable cv;  // a round done, a message sent, the world aborted
  bool aborted = false;
  std::string reason;
  std::vector<uint64_t> issued;                        // per rank: collectives issued
  std::map<uint64_t, std::shared_ptr<Round>> rounds;  // by sequence number, until running
  uint64_t next_to_run = 0;
  bool running = false;  // a thread is running round next_to_run
  std::map<ChannelKey, Channel> channels;
  std::map<std::pair<uint64_t, std::vector<int>>, std::shared_ptr<ThreadWorld>> children;

  // Steps 2-4 of NOTE: [ThreadGroup rounds] for every round ready to run; `lk` holds `mu`.
  void run_ready_rounds(std::unique_lock<std::mutex>& lk);
};

namespace {

std::string describe_calls(const Calls& calls) {
  std::ostringstream os;
  for (size_t r = 0; r < calls.size(); ++r)
    os << " [rank " << r << ": " << calls[r]->op << "(" << calls[r]->signature << ")]";
  return os.str();
}

// Step 2, without the world's lock: the round is ours and its Calls are complete.
void run_round(Round& round) {
  const Calls& calls = round.calls;
  for (const auto& c : calls) {
    if (std::strcmp(c->op, calls[0]->op) != 0 || c->signature != calls[0]->signature) {
      round.mismatch = describe_calls(calls);
      return;
    }
  }
  try {
    at::NoGradGuard no_grad;
    const debug::detail::UntrackedScope untracked;  // the round's temporaries: no rank's
    calls[0]->run(calls);
  } catch (const c10::Error& e) {
    round.failure = e.what_without_backtrace();
  } catch (const std::exception& e) {
    round.failure = e.what();
  } catch (...) {
    round.failure = "unknown error";
  }
}

}  // namespace

void ThreadWorld::State::run_ready_rounds(std::unique_lock<std::mutex>& lk) {
  // One runner at a time keeps rounds in issue order (step 3); an aborted world runs nothing
  // new, so the waiters of rounds not yet running can leave.
  while (!running && !aborted) {
    auto it = rounds.find(next_to_run);
    if (it == rounds.end() || it->second->issued < size) return;
    std::shared_ptr<Round> round = std::move(it->second);
    rounds.erase(it);  // every rank issued it: nobody looks it up again
    round->started = true;
    running = true;
    lk.unlock();
    run_round(*round);
    lk.lock();
    round->calls.clear();  // release the callers' tensors
    round->completed_at = Clock::now();
    round->done = true;
    running = false;
    ++next_to_run;
    cv.notify_all();
  }
}

ThreadWorld::ThreadWorld(int size, std::chrono::milliseconds timeout) : state_(std::make_unique<State>()) {
  state_->size = size;
  state_->timeout = timeout;
  state_->issued.assign(size, 0);
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

namespace {

// What RoundSource and RecvSource share: the world whose mutex guards every member (Work may
// call is_completed() while another thread waits), the deadline of the world's timeout, and the
// outcome once settled.
class WorldSource : public Work::Source {
 public:
  bool is_completed() override {
    std::lock_guard<std::mutex> lk(world_->state().mu);
    return settle();
  }

  std::exception_ptr error() override {
    std::lock_guard<std::mutex> lk(world_->state().mu);
    return error_;
  }

 protected:
  WorldSource(std::shared_ptr<ThreadWorld> world, GroupName where)
      : world_(std::move(world)), where_(std::move(where)), give_up_at_(Clock::now() + world_->timeout()) {}
  // The world's mutex is held. Records the outcome once it is known; true then.
  virtual bool settle() = 0;

  std::shared_ptr<ThreadWorld> world_;
  GroupName where_;  // for errors only
  Clock::time_point give_up_at_;  // issued + the world's timeout
  bool settled_ = false;
  std::exception_ptr error_;
};

// One rank's view of one round: NOTE: [ThreadGroup rounds].
class RoundSource final : public WorldSource {
 public:
  RoundSource(std::shared_ptr<ThreadWorld> world, std::shared_ptr<Round> round, const char* op, GroupName where)
      : WorldSource(std::move(world), std::move(where)), round_(std::move(round)), op_(op) {}

  bool wait_until(Clock::time_point deadline) override {
    auto& s = world_->state();
    std::unique_lock<std::mutex> lk(s.mu);
    while (!settle()) {
      // A fully issued round runs without peers: the world's timeout no longer applies.
      const bool may_time_out = round_->issued < s.size;
      s.cv.wait_until(lk, may_time_out ? std::min(deadline, give_up_at_) : deadline);
      if (settle()) break;
      const auto now = Clock::now();
      if (round_->issued < s.size && now >= give_up_at_) {
        const std::string reason = timeout_reason();
        lk.unlock();
        world_->abort(reason);  // wakes the peers and sub-worlds; settle() then reports it
        lk.lock();
      } else if (now >= deadline) {
        return false;
      }
    }
    return true;
  }

  std::optional<Clock::time_point> completed_at() override {
    std::lock_guard<std::mutex> lk(world_->state().mu);
    return completed_at_;
  }

 private:
  // Settled once the round is done or can no longer run; drops the round then (the last rank
  // to observe it frees it).
  bool settle() override {
    if (settled_) return true;
    const auto& s = world_->state();
    if (round_->done) {
      completed_at_ = round_->completed_at;
      if (!round_->mismatch.empty()) {
        error_ = std::make_exception_ptr(CollectiveError(
            "ranks called different collectives (or the same one with mismatched arguments) on " + *where_ + ":" +
            round_->mismatch));
      } else if (round_->failure) {
        error_ = std::make_exception_ptr(
            CollectiveError(std::string(op_) + " on " + *where_ + " failed: " + *round_->failure));
      }
    } else if (s.aborted && !round_->started) {
      error_ = std::make_exception_ptr(CollectiveError(aborted_error(op_, *where_, s.reason)));
    } else {
      return false;
    }
    settled_ = true;
    round_.reset();
    return true;
  }

  std::string timeout_reason() const {
    std::ostringstream os;
    os << op_ << " on " << *where_ << " timed out after " << world_->timeout().count()
       << " ms; ranks that had not arrived:";
    for (size_t r = 0; r < round_->calls.size(); ++r)
      if (!round_->calls[r]) os << " " << r;
    return os.str();
  }

  std::shared_ptr<Round> round_;  // until settled
  const char* op_;
  std::optional<Clock::time_point> completed_at_;
};

// Step 1 of NOTE: [ThreadGroup rounds]: publishes `call` into this rank's next round, runs
// what became ready, and returns the rank's Work. `seq`, when given, receives the round's
// sequence number.
WorkPtr issue(const std::shared_ptr<ThreadWorld>& world, int rank, const GroupName& where,
              std::shared_ptr<Call> call, uint64_t* seq = nullptr) {
  auto& s = world->state();
  const char* op = call->op;
  std::unique_lock<std::mutex> lk(s.mu);
  if (s.aborted) throw CollectiveError(aborted_error(op, *where, s.reason));
  const uint64_t n = s.issued[rank]++;
  if (seq) *seq = n;
  std::shared_ptr<Round>& slot = s.rounds[n];
  if (!slot) slot = std::make_shared<Round>(s.size);
  std::shared_ptr<Round> round = slot;
  round->calls[rank] = std::move(call);
  ++round->issued;
  auto work = std::make_shared<Work>(op, where, std::make_unique<RoundSource>(world, round, op, where), nullptr,
                                     s.timeout);
  s.run_ready_rounds(lk);
  return work;
}

std::shared_ptr<Call> make_call(const char* op, std::string signature, RunFn run) {
  auto c = std::make_shared<Call>();
  c->op = op;
  c->signature = std::move(signature);
  c->run = run;
  return c;
}

}  // namespace

ThreadGroup::ThreadGroup(std::shared_ptr<ThreadWorld> world, int rank, std::vector<int> global_ranks)
    : world_(std::move(world)), rank_(rank), global_ranks_(std::move(global_ranks)) {
  TORCH_CHECK(world_ != nullptr, "ThreadGroup: world is null");
  TORCH_CHECK(rank >= 0 && rank < world_->size(), "ThreadGroup: rank ", rank, " out of range for a world of ",
              world_->size());
  if (global_ranks_.empty()) {
    for (int r = 0; r < world_->size(); ++r) global_ranks_.push_back(r);
  }
  TORCH_CHECK(static_cast<int>(global_ranks_.size()) == world_->size(), "ThreadGroup: global_ranks has ",
              global_ranks_.size(), " entries for a world of ", world_->size());
}

int ThreadGroup::size() const { return world_->size(); }

WorkPtr ThreadGroup::all_reduce_async(const at::Tensor& tensor, ReduceOp op) {
  const detail::ObservedCollective observed(*this, "all_reduce", detail::nbytes(tensor), detail::nbytes(tensor));
  detail::check_avg(*this, "all_reduce", tensor, op);
  auto c = make_call("all_reduce", sig_of(tensor) + "," + to_string(op), run_all_reduce);
  c->inputs = {tensor};
  c->outputs = {tensor};
  c->reduce = op;
  return issue(world_, rank_, name(), std::move(c));
}

WorkPtr ThreadGroup::all_gather_into_async(const at::Tensor& output, const at::Tensor& input) {
  const detail::ObservedCollective observed(*this, "all_gather_into", detail::nbytes(input), detail::nbytes(output));
  detail::check_all_gather_shapes(*this, output, input);
  auto c = make_call("all_gather_into", sig_of(input), run_all_gather);
  c->inputs = {input};
  c->outputs = {output};
  return issue(world_, rank_, name(), std::move(c));
}

WorkPtr ThreadGroup::reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const detail::ObservedCollective observed(*this, "reduce_scatter_into", detail::nbytes(input), detail::nbytes(output));
  detail::check_reduce_scatter_shapes(*this, output, input);
  detail::check_avg(*this, "reduce_scatter_into", input, op);
  auto c = make_call("reduce_scatter_into", sig_of(input) + "," + to_string(op), run_reduce_scatter);
  c->inputs = {input};
  c->outputs = {output};
  c->reduce = op;
  return issue(world_, rank_, name(), std::move(c));
}

WorkPtr ThreadGroup::all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                             const std::vector<int64_t>& output_splits,
                                             const std::vector<int64_t>& input_splits) {
  const detail::ObservedCollective observed(*this, "all_to_all_single", detail::nbytes(input), detail::nbytes(output));
  auto splits = detail::resolve_all_to_all_splits(*this, output, input, output_splits, input_splits);
  // Shapes differ across ranks by design; the splits are checked against each other in step 2.
  auto c = make_call("all_to_all_single", std::string(c10::toString(input.scalar_type())), run_all_to_all);
  c->inputs = {input};
  c->outputs = {output};
  c->out_splits = std::move(splits.first);
  c->in_splits = std::move(splits.second);
  return issue(world_, rank_, name(), std::move(c));
}

WorkPtr ThreadGroup::broadcast_async(const at::Tensor& tensor, int src) {
  const detail::ObservedCollective observed(*this, "broadcast", detail::nbytes(tensor), detail::nbytes(tensor));
  detail::check_rank_arg(*this, "broadcast", "src", src);
  auto c = make_call("broadcast", sig_of(tensor) + ",src=" + std::to_string(src), run_broadcast);
  c->inputs = {tensor};
  c->outputs = {tensor};
  c->root = src;
  return issue(world_, rank_, name(), std::move(c));
}

WorkPtr ThreadGroup::barrier_async() {
  const detail::ObservedCollective observed(*this, "barrier", 0, 0);
  return issue(world_, rank_, name(), make_call("barrier", "", run_nothing));
}

WorkPtr ThreadGroup::gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) {
  const detail::ObservedCollective observed(*this, "gather", detail::nbytes(input), detail::nbytes(outputs));
  detail::check_rank_arg(*this, "gather", "dst", dst);
  auto c = make_call("gather", sig_of(input) + ",dst=" + std::to_string(dst), run_gather);
  c->inputs = {input};
  c->root = dst;
  if (rank_ == dst) {
    detail::check_gather_outputs(*this, input, outputs);
    c->outputs = outputs;
  }
  return issue(world_, rank_, name(), std::move(c));
}

WorkPtr ThreadGroup::scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
  const detail::ObservedCollective observed(*this, "scatter", detail::nbytes(inputs), detail::nbytes(output));
  detail::check_rank_arg(*this, "scatter", "src", src);
  auto c = make_call("scatter", sig_of(output) + ",src=" + std::to_string(src), run_scatter);
  c->outputs = {output};
  c->root = src;
  if (rank_ == src) {
    detail::check_scatter_inputs(*this, output, inputs);
    c->inputs = inputs;
  }
  return issue(world_, rank_, name(), std::move(c));
}

// ---- Point to point: NOTE: [ThreadGroup point to point] ----------------------------------

namespace {

// Completes when message `ticket` of its channel has arrived, taking it into `message`.
class RecvSource final : public WorldSource {
 public:
  RecvSource(std::shared_ptr<ThreadWorld> world, ChannelKey key, uint64_t ticket,
             std::shared_ptr<at::Tensor> message, GroupName where)
      : WorldSource(std::move(world), std::move(where)), key_(key), ticket_(ticket), message_(std::move(message)) {}

  bool wait_until(Clock::time_point deadline) override {
    auto& s = world_->state();
    std::unique_lock<std::mutex> lk(s.mu);
    while (!settle()) {
      s.cv.wait_until(lk, std::min(deadline, give_up_at_));
      if (settle()) break;
      const auto now = Clock::now();
      if (now >= give_up_at_) {
        // Unlike a round, a late message stops nobody else: fail this receive only.
        error_ = std::make_exception_ptr(CollectiveError(
            "recv from rank " + std::to_string(std::get<0>(key_)) + " (tag " + std::to_string(std::get<2>(key_)) +
            ") on " + *where_ + " timed out after " + std::to_string(world_->timeout().count()) + " ms"));
        settled_ = true;
        break;
      }
      if (now >= deadline) return false;
    }
    return true;
  }

 private:
  // Settled once the ticketed message arrived (taken into `message_`) or the world aborted.
  bool settle() override {
    if (settled_) return true;
    auto& s = world_->state();
    auto ch = s.channels.find(key_);  // exists while this ticket is pending
    if (ch != s.channels.end()) {
      auto m = ch->second.messages.find(ticket_);
      if (m != ch->second.messages.end()) {
        *message_ = std::move(m->second);
        ch->second.messages.erase(m);
        // Nothing queued, nobody waiting: forget the channel (its numbering restarts at 0
        // on both sides).
        if (ch->second.messages.empty() && ch->second.sent == ch->second.tickets) s.channels.erase(ch);
        settled_ = true;
        return true;
      }
    }
    if (s.aborted) {
      error_ = std::make_exception_ptr(CollectiveError(aborted_error("recv", *where_, s.reason)));
      settled_ = true;
    }
    return settled_;
  }

  ChannelKey key_;
  uint64_t ticket_;
  std::shared_ptr<at::Tensor> message_;  // shared with the Work's finish step
};

}  // namespace

WorkPtr ThreadGroup::send_async(const at::Tensor& tensor, int dst, int tag) {
  const detail::ObservedCollective observed(*this, "send", detail::nbytes(tensor), 0);
  detail::check_rank_arg(*this, "send", "dst", dst);
  TORCH_CHECK(dst != rank_, "send on ", describe(), ": a rank cannot send to itself");
  at::Tensor message;
  {
    at::NoGradGuard no_grad;  // the receiver gets data, not a piece of the sender's graph
    message = tensor.clone();
  }
  auto& s = world_->state();
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.aborted) throw CollectiveError(aborted_error("send", describe(), s.reason));
    Channel& ch = s.channels[ChannelKey{rank_, dst, tag}];
    ch.messages.emplace(ch.sent++, std::move(message));
  }
  s.cv.notify_all();
  return Work::completed("send", name());
}

WorkPtr ThreadGroup::recv_async(const at::Tensor& tensor, int src, int tag) {
  const detail::ObservedCollective observed(*this, "recv", 0, detail::nbytes(tensor));
  detail::check_rank_arg(*this, "recv", "src", src);
  TORCH_CHECK(src != rank_, "recv on ", describe(), ": a rank cannot receive from itself");
  const GroupName& where = name();
  const ChannelKey key{src, rank_, tag};
  uint64_t ticket;
  {
    auto& s = world_->state();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.aborted) throw CollectiveError(aborted_error("recv", *where, s.reason));
    ticket = s.channels[key].tickets++;
  }
  auto message = std::make_shared<at::Tensor>();
  auto finish = [message, tensor, src, where] {
    TORCH_CHECK(message->sizes() == tensor.sizes() && message->scalar_type() == tensor.scalar_type(), "recv on ",
                *where, ": rank ", src, " sent ", sig_of(*message), " but the receive buffer is ", sig_of(tensor));
    at::NoGradGuard no_grad;
    tensor.copy_(*message);
  };
  return std::make_shared<Work>("recv", where, std::make_unique<RecvSource>(world_, key, ticket, message, where),
                                std::move(finish), world_->timeout());
}

// ---- Sub-groups --------------------------------------------------------------------------

namespace {

// The sub-world made by round `seq` of `world` for `ranks`: the first member to get here
// creates it, the others share it.
std::shared_ptr<ThreadWorld> child_world(ThreadWorld& world, uint64_t seq, const std::vector<int>& ranks) {
  auto& s = world.state();
  std::lock_guard<std::mutex> lk(s.mu);
  auto& slot = s.children[{seq, ranks}];
  if (!slot) slot = ThreadWorld::create(static_cast<int>(ranks.size()), s.timeout);
  if (s.aborted) slot->abort(s.reason);
  return slot;
}

}  // namespace

std::shared_ptr<Group> ThreadGroup::new_subgroup(const std::vector<int>& ranks) {
  detail::check_subgroup_ranks(*this, ranks);
  std::ostringstream sig;
  for (int r : ranks) sig << r << ",";
  // One round checks that every rank passed the same ranks; its sequence number, the same on
  // every rank, names the sub-world.
  uint64_t seq = 0;
  issue(world_, rank_, name(), make_call("new_subgroup", sig.str(), run_nothing), &seq)->wait();
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  std::shared_ptr<ThreadWorld> child = child_world(*world_, seq, ranks);
  std::vector<int> globals;
  for (int r : ranks) globals.push_back(global_ranks_[r]);
  return std::make_shared<ThreadGroup>(child, static_cast<int>(it - ranks.begin()), globals);
}

}  // namespace comm
}  // namespace dtensor
