// harness/internal/launcher.h: starting rank processes (fork server, spawn, worker pool) and
// talking to them (DESIGN.md D3).
//
// NOTE: [Rank process protocol]
// The orchestrator (the gtest process) makes a private temp dir holding a Unix socket
// `ctl.sock` and one log file per rank, and hosts a TCPStore on 127.0.0.1 (port chosen by the
// kernel) for the ranks' c10d rendezvous. Each rank process (however started) redirects its
// stdout/stderr to its log, connects to ctl.sock, says {"hello":rank}, creates its process
// group, and then for each {"run":test_id} line runs that body and answers with one
// {"result":RankResult} line. A one-shot rank runs the test of its request and exits; a pool
// worker waits for the next line. Crashes are seen as the socket closing plus the exit status.
#pragma once

#include "harness/internal/rank_run.h"
#include "harness/multi_rank_test.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {
namespace internal {

struct RankRequest {
  std::string test_id;  // empty for a pool worker (tests come over the socket)
  int rank = 0;
  int world_size = 1;
  std::string ctl_path;
  std::string log_path;
  int store_port = 0;
  std::string backend = "gloo";
  int64_t timeout_ms = 0;
};
void to_json(nlohmann::json& j, const RankRequest& r);
void from_json(const nlohmann::json& j, RankRequest& r);

// Forks the fork server (zygote). Call at program start, before any thread exists.
void start_fork_server();
bool fork_server_running();
void stop_fork_server();

// A rank's fatal-signal handlers (print the rank and its stack) and SIGUSR1 (print the stack
// of the thread that installed them, the test thread). Rank processes and external ranks.
void install_rank_signals(int rank);

// Entry of a rank process; never returns.
[[noreturn]] void rank_process_main(const RankRequest& request);

// The ranks of one test (or of one worker pool), seen from the orchestrator.
class RankSet {
 public:
  // Starts the ranks. With a `test_id` each rank runs that one test and exits; without one
  // (worker pool) the ranks wait for tests sent by run().
  RankSet(LaunchMode mode, int world_size, std::string backend, std::chrono::milliseconds timeout,
          std::string one_shot_test_id = "");
  ~RankSet();  // kills whatever still runs, removes the temp dir

  // Runs `test_id` on every rank and waits (up to `timeout`) for all outcomes. `stacks` gets
  // the stack dumps of ranks killed at the timeout.
  std::vector<RankOutcome> run(const std::string& test_id, std::chrono::milliseconds timeout,
                               std::string* stacks);
  // False once a rank died or a test failed (a pool must then be replaced).
  bool healthy() const;
  const std::string& backend() const;
  int world_size() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The worker pool: one RankSet reused while healthy and of the same world size and backend.
RankSet& worker_pool(int world_size, const std::string& backend, std::chrono::milliseconds timeout);
void discard_worker_pool();

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
