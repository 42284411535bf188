// dtensor/comm/async_work.cpp: see NOTE: [Async collectives] in async_work.h.
#include "dtensor/comm/async_work.h"

#include "dtensor/comm/group.h"

#include <ATen/ThreadLocalState.h>
#include <c10/util/Exception.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace dtensor {
namespace comm {

struct Work::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

Work::Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

Work::~Work() {
  if (waited_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    TORCH_WARN("an async collective whose result was never used failed: ", e.what());
  }
}

void Work::wait() {
  waited_ = true;
  std::unique_lock<std::mutex> lk(state_->mu);
  // Bounded by the collectives' own timeouts (and aborts), which end the function.
  state_->cv.wait(lk, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->done;
}

namespace {

// One issuing thread's queue and worker.
class Stream {
 public:
  ~Stream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();  // runs what is queued first
  }

  void push(std::function<void()> fn, std::shared_ptr<Work::State> state) {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(Item{std::move(fn), std::move(state), at::ThreadLocalState(),
                          is_initialized() ? default_group() : nullptr});
    ++pending_;
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    cv_.notify_all();
  }

  void drain() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return pending_ == 0; });
  }

  int64_t pending() {
    std::lock_guard<std::mutex> lk(mu_);
    return pending_;
  }

 private:
  struct Item {
    std::function<void()> fn;
    std::shared_ptr<Work::State> state;
    at::ThreadLocalState tls;
    GroupPtr default_group;
  };

  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped and drained
      Item item = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      std::exception_ptr error;
      try {
        at::ThreadLocalStateGuard tls(item.tls);
        set_thread_default_group(item.default_group);
        item.fn();
      } catch (...) {
        error = std::current_exception();
      }
      set_thread_default_group(nullptr);
      item.fn = nullptr;  // release captured tensors before the work counts as done
      lk.lock();
      --pending_;  // before the Work completes: once wait() returns, pending() no longer counts it
      cv_.notify_all();
      lk.unlock();
      {
        std::lock_guard<std::mutex> slk(item.state->mu);
        item.state->done = true;
        item.state->error = error;
      }
      item.state->cv.notify_all();
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  int64_t pending_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

thread_local std::unique_ptr<Stream> t_stream;

}  // namespace

WorkPtr launch_async(std::function<void()> fn) {
  TORCH_CHECK(fn != nullptr, "launch_async: empty function");
  if (!t_stream) t_stream = std::make_unique<Stream>();
  auto state = std::make_shared<Work::State>();
  t_stream->push(std::move(fn), state);
  return std::make_shared<Work>(std::move(state));
}

void wait_launched_work() {
  if (t_stream) t_stream->drain();
}

int64_t launched_work_pending() { return t_stream ? t_stream->pending() : 0; }

}  // namespace comm
}  // namespace dtensor
