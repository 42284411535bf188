// dtensor/comm/gloo_loop_ticker.cpp
//
// NOTE: [Gloo's loop ticks]
// Gloo's tcp device runs an epoll loop that "ticks" when a socket has an event, else every
// 10 ms; removing a socket from it (Loop::unregisterDescriptor) waits for the next tick. In
// the libgloo of Debian 12 / libtorch 1.13 every pair whose connecting side this rank is
// removes its listening socket that way, one pair after the other, and closing a pair does
// it too: a 4-rank group took ~33 ms to connect here, mostly in those waits (traced with
// DTENSOR_HARNESS_TRACE: ranks finished their connect ~10 ms apart), and destroying a group
// 20-40 ms. (Gloo from 2023, in libtorch 2.x, has one listening socket per device, so fewer
// such waits at connect.) While a Gloo group connects or is destroyed, a LoopTicker makes
// the loop tick every kTick: it registers an eventfd with the device's loop and a thread
// writes to it; the handler drains it. Between those phases it is idle (no cost to
// collectives). Without Debian's libgloo (libtorch with Gloo linked in) there is no ticker;
// DTENSOR_GLOO_LOOP_TICKER=0 turns it off (to measure the difference).
#include "dtensor/comm/gloo_loop_ticker_internal.h"

// DTENSOR_GLOO_TCP: CMake found the Gloo library libtorch uses (Debian's libgloo), whose tcp
// transport classes the ticker needs.
#ifdef DTENSOR_GLOO_TCP
#include <gloo/transport/tcp/device.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

namespace dtensor {
namespace comm {

#ifdef DTENSOR_GLOO_TCP
namespace {

class TcpLoopTicker final : public LoopTicker, public ::gloo::transport::tcp::Handler {
 public:
  static constexpr std::chrono::microseconds kTick{200};

  TcpLoopTicker(std::shared_ptr<::gloo::transport::tcp::Device> device, int fd) : device_(std::move(device)), fd_(fd) {}
  // Releases the device with the loop ticking: when this holds its last reference, ~Loop
  // joins the loop thread after its next tick; the handler stays valid until then.
  ~TcpLoopTicker() override {
    start();
    device_.reset();
    stop();
    ::close(fd_);
  }
  void register_with_loop() { device_->registerDescriptor(fd_, EPOLLIN, this); }
  void handleEvents(int) override {
    uint64_t n;
    while (::read(fd_, &n, sizeof n) > 0) {
    }
  }
  void start() override {
    if (thread_.joinable()) return;
    stop_ = false;
    thread_ = std::thread([this] {
      const uint64_t one = 1;
      while (!stop_.load()) {
        (void)!::write(fd_, &one, sizeof one);
        std::this_thread::sleep_for(kTick);
      }
    });
  }
  void stop() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::shared_ptr<::gloo::transport::tcp::Device> device_;
  int fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace

std::unique_ptr<LoopTicker> LoopTicker::attach(const std::shared_ptr<::gloo::transport::Device>& device) {
  static const bool off = [] {
    const char* v = std::getenv("DTENSOR_GLOO_LOOP_TICKER");  // "0": off, to compare
    return v && std::string(v) == "0";
  }();
  if (off) return nullptr;
  auto tcp = std::dynamic_pointer_cast<::gloo::transport::tcp::Device>(device);
  if (!tcp) return nullptr;
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return nullptr;
  auto t = std::make_unique<TcpLoopTicker>(std::move(tcp), fd);
  t->register_with_loop();
  return t;
}
#else
std::unique_ptr<LoopTicker> LoopTicker::attach(const std::shared_ptr<::gloo::transport::Device>&) { return nullptr; }
#endif

}  // namespace comm
}  // namespace dtensor
