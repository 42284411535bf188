// harness/internal/watchdog.h: a rank's watchdog in the external-launcher mode (NOTE: [External
// ranks learn of failures through the store] in external.cpp): a thread that beats the rank's
// heartbeat, frees its collectives when a peer failed, the test timed out or a peer is lost
// (NOTE: [A peer lost without a word]), and a monitor thread that notices the store stop
// answering.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace dtensor {
namespace testing {
namespace internal {

class Watchdog {
 public:
  void connect(c10::intrusive_ptr<c10d::Store> store) { store_ = std::move(store); }
  void start(int rank, int world_size);
  void stop();
  void begin(int test, const std::string& test_id, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);
  // The body returned; true when it was still running at the deadline.
  bool end();
  std::string store_lost();
  // The peers found gone while a body ran (NOTE: [A peer lost without a word]).
  std::vector<bool> lost();
  // The peers' heartbeats as last read during test `test`, and when each last moved; false
  // when none was read during that test.
  bool peer_beats(int test, std::vector<int64_t>* beat, std::vector<std::chrono::steady_clock::time_point>* at);

 private:
  void loop();

  // NOTE: [A peer lost without a word]: a watchdog request unanswered for kStoreLostAfter.
  void monitor();

  // mu_ held.
  void lose_store(const std::string& why);

  // NOTE: [A peer lost without a word]. Runs on the watchdog thread, mu_ not held.
  void check_peers(c10d::Store& store, int test, std::chrono::steady_clock::time_point now);

  void on_deadline(c10d::Store& store, int test, const std::string& pre, bool stuck);

  int rank_ = -1;
  int n_ = 0;
  std::vector<int64_t> beat_;               // peers' heartbeats as last read (watchdog thread)
  std::vector<std::chrono::steady_clock::time_point> beat_at_;  // when each last moved
  std::vector<bool> lost_;                  // peers found gone (NOTE: [A peer lost without a word])
  int baseline_test_ = -1;                  // the test beat_ was read in
  c10::intrusive_ptr<c10d::Store> store_;  // its own connection to the job's store
  std::thread thread_;
  std::thread monitor_;
  std::optional<std::chrono::steady_clock::time_point> asking_since_;  // a store request in flight since (mu_)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int test_ = -1;
  std::string test_id_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds timeout_{0};
  bool in_body_ = false;
  bool timed_out_ = false;
  bool stuck_ = false;
  std::string store_lost_;
};

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
