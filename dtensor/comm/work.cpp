// dtensor/comm/work.cpp: see NOTE: [Async collectives] in work.h.
#include "dtensor/comm/work.h"

#include "dtensor/comm/group.h"

#include <c10/util/Exception.h>

#include <utility>

namespace dtensor {
namespace comm {

namespace {

class DoneSource final : public Work::Source {
 public:
  explicit DoneSource(std::exception_ptr error) : error_(std::move(error)) {}
  bool wait_until(Work::Clock::time_point) override { return true; }
  bool is_completed() override { return true; }
  std::exception_ptr error() override { return error_; }

 private:
  std::exception_ptr error_;
};

// Completes when another Work has completed and finished (its finish step ran).
class ChainSource final : public Work::Source {
 public:
  explicit ChainSource(WorkPtr inner) : inner_(std::move(inner)) {}
  bool wait_until(Work::Clock::time_point deadline) override {
    const auto now = Work::Clock::now();
    const auto left = deadline > now ? std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now)
                                     : std::chrono::milliseconds(0);
    if (!inner_->is_completed() && left.count() == 0) return false;
    try {
      inner_->wait(std::max(left, std::chrono::milliseconds(1)));
    } catch (...) {
      if (!inner_->is_completed()) return false;  // timed out: still in flight
      error_ = std::current_exception();
    }
    return true;
  }
  bool is_completed() override { return inner_->is_completed(); }
  std::exception_ptr error() override { return error_; }
  std::optional<Work::Clock::time_point> completed_at() override { return inner_->completed_at(); }

 private:
  WorkPtr inner_;
  std::exception_ptr error_;
};

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& x) {
    return x.what_without_backtrace();
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

Work::Work(const char* op, GroupName where, std::unique_ptr<Source> source, std::function<void()> finish,
           std::chrono::milliseconds timeout)
    : op_(op),
      where_(std::move(where)),
      source_(std::move(source)),
      finish_(std::move(finish)),
      timeout_(timeout),
      issued_at_(Clock::now()) {
  TORCH_INTERNAL_ASSERT(source_ != nullptr && op_ != nullptr && where_ != nullptr, "Work: no source or name");
}

Work::~Work() {
  bool done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done = finished_;
  }
  if (done) return;
  try {
    wait();
  } catch (const std::exception& e) {
    TORCH_WARN("an async ", op_, " whose result was never waited for failed: ", e.what());
  }
}

WorkPtr Work::completed(const char* op, GroupName where, std::exception_ptr error) {
  return std::make_shared<Work>(op, std::move(where), std::make_unique<DoneSource>(std::move(error)), nullptr,
                                std::chrono::milliseconds(1));
}

WorkPtr Work::completed(const char* op, std::string where, std::exception_ptr error) {
  return completed(op, std::make_shared<const std::string>(std::move(where)), std::move(error));
}

WorkPtr Work::chain(WorkPtr inner, std::function<void()> then) {
  TORCH_INTERNAL_ASSERT(inner != nullptr, "Work::chain: no inner work");
  const char* op = inner->op_;
  GroupName where = inner->where_;
  const auto timeout = inner->timeout_;
  auto w = std::make_shared<Work>(op, std::move(where), std::make_unique<ChainSource>(std::move(inner)),
                                  std::move(then), timeout);
  return w;
}

void Work::note_completion() {
  if (completed_at_) return;
  completed_at_ = source_->completed_at();
  if (!completed_at_) completed_at_ = Clock::now();
  // The backend may finish (and time) the operation before this Work exists: issued_at_ is taken
  // when the Work is made, after the backend accepted the call. Completion is never reported
  // earlier than the issue.
  if (*completed_at_ < issued_at_) completed_at_ = issued_at_;
}

void Work::wait_until(Clock::time_point deadline, bool throw_on_timeout) {
  std::lock_guard<std::mutex> wlk(wait_mu_);
  std::unique_lock<std::mutex> lk(mu_);
  waited_ = true;
  if (!finished_) {
    lk.unlock();
    const bool completed = source_->wait_until(deadline);
    lk.lock();
    if (!completed) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - issued_at_).count();
      const std::string msg = std::string(op_) + " on " + *where_ + " has not completed " + std::to_string(ms) +
                              " ms after it was issued";
      if (!throw_on_timeout) throw CollectiveError(msg + "; the collective timeout has passed");
      throw CollectiveError(msg + " (wait with a timeout; it is still in flight)");
    }
    note_completion();
    error_ = source_->error();
    if (error_) {
      // Name the op and group unless the source already raised a CollectiveError.
      try {
        std::rethrow_exception(error_);
      } catch (const CollectiveError&) {
      } catch (...) {
        error_ = std::make_exception_ptr(
            CollectiveError(std::string(op_) + " on " + *where_ + " failed: " + message_of(error_)));
      }
    } else if (finish_) {
      lk.unlock();  // the finish step may take a while (copies); state readers need not wait
      std::exception_ptr finish_error;
      try {
        finish_();
      } catch (...) {
        finish_error = std::current_exception();
      }
      lk.lock();
      error_ = finish_error;
    }
    finish_ = nullptr;  // releases the tensors it holds
    finished_ = true;
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::wait() { wait_until(Clock::now() + timeout_, /*throw_on_timeout=*/false); }

void Work::wait(std::chrono::milliseconds timeout) { wait_until(Clock::now() + timeout, true); }

bool Work::is_completed() {
  std::lock_guard<std::mutex> lk(mu_);
  if (finished_) return true;
  if (!source_->is_completed()) return false;
  note_completion();
  return true;
}

std::exception_ptr Work::exception() {
  std::lock_guard<std::mutex> lk(mu_);
  if (finished_) return error_;
  if (!source_->is_completed()) return nullptr;
  note_completion();
  return source_->error();
}

bool Work::was_waited() const {
  std::lock_guard<std::mutex> lk(mu_);
  return waited_;
}

std::optional<Work::Clock::time_point> Work::completed_at() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!completed_at_ && source_->is_completed()) note_completion();
  return completed_at_;
}

void wait_all(const std::vector<WorkPtr>& works) {
  std::exception_ptr first;
  for (const auto& w : works) {
    if (!w) continue;
    try {
      w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace comm
}  // namespace dtensor
