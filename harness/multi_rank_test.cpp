// harness/multi_rank_test.cpp: the fixtures' orchestration (see multi_rank_test.h).
#include "harness/multi_rank_test.h"

#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/device.h"
#include "dtensor/comm/object_collectives.h"
#include "dtensor/comm/thread_group.h"
#include "dtensor/comm/trace.h"
#include "harness/internal/external.h"
#include "harness/internal/launcher.h"
#include "harness/internal/rank_run.h"
#include "harness/internal/timing.h"

#include <c10/util/Exception.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <sstream>
#include <condition_variable>
#include <sstream>
#include <thread>

namespace dtensor {
namespace testing {

using internal::env_or;

std::string to_string(LaunchMode m) {
  switch (m) {
    case LaunchMode::kForkServer: return "fork";
    case LaunchMode::kSpawn: return "spawn";
    case LaunchMode::kWorkerPool: return "pool";
  }
  return "?";
}

LaunchMode launch_mode_from_string(const std::string& s) {
  if (s == "fork" || s == "fork_server") return LaunchMode::kForkServer;
  if (s == "spawn") return LaunchMode::kSpawn;
  if (s == "pool" || s == "worker_pool") return LaunchMode::kWorkerPool;
  TORCH_CHECK(false, "unknown launch mode '", s, "' (DTENSOR_LAUNCH_MODE): expected fork, spawn or pool");
}

int gpu_count() {
  static const int n = comm::cuda_device_count();
  return n;
}

int default_world_size(int gpu_count) {
  return gpu_count > 1 ? std::min(gpu_count, kDefaultWorldSize) : kDefaultWorldSize;
}

std::string default_backend(int gpu_count, int world_size, bool nccl_built) {
  return nccl_built && gpu_count >= world_size ? "nccl" : "gloo";
}

std::string device_type_for_backend(const std::string& backend) {
  return comm::detail::backend_uses_cuda(backend) ? "cuda" : "cpu";
}

std::string gpu_skip_reason(const std::string& backend, int world_size, int gpu_count,
                            int required_gpus) {
  std::ostringstream why;
  if (comm::detail::backend_uses_nccl(backend) && gpu_count < world_size) {
    why << "backend " << backend << " runs one rank per GPU: " << world_size << " ranks need "
        << world_size << " CUDA devices, this machine has " << gpu_count;
    if (gpu_count > 0) why << " (set DTENSOR_WORLD_SIZE=" << gpu_count << ", or DTENSOR_BACKEND=gloo)";
  } else if (comm::detail::backend_uses_cuda(backend) && gpu_count < 1) {
    why << "backend " << backend << " moves CUDA tensors: it needs a CUDA device, this machine has none";
  } else if (required_gpus > gpu_count) {
    why << "Need at least " << required_gpus << " CUDA devices, found " << gpu_count;
  }
  return why.str();
}

comm::Group& MultiRankTest::group() const {
  TORCH_CHECK(group_ != nullptr, "group() is only available inside a DTENSOR_TEST_F body");
  return *group_;
}

namespace {
// NOTE: [Rank kinds of a pass]
// DTENSOR_RANK_KIND=threads runs only the thread-rank tests (process-rank tests skip, saying
// so), =processes only the process-rank ones, =all (the default) both. CI's passes at world
// sizes 2 and 8 run the thread suites this way. Any other value fails every multi-rank test,
// so a typo cannot skip a whole run and stay green.
std::string rank_kind_error() {
  return "DTENSOR_RANK_KIND='" + env_or("DTENSOR_RANK_KIND", "") +
         "' is not one of all, threads, processes";
}
// "" when tests of rank kind `mine` ("threads" or "processes") run in this pass, "error" for
// a bad value, else the skip reason.
std::string rank_kind_skip_reason(const std::string& mine) {
  const std::string kind = env_or("DTENSOR_RANK_KIND", "all");
  if (kind != "all" && kind != "threads" && kind != "processes") return "error";
  if (kind == "all" || kind == mine) return "";
  return mine == "threads" ? "thread ranks are not run in this pass (DTENSOR_RANK_KIND=processes)"
                           : "process ranks are not run in this pass (DTENSOR_RANK_KIND=threads)";
}
}  // namespace

int MultiRankTest::ranks() const { return group().size(); }

std::vector<int64_t> MultiRankTest::mesh_shape_2d() const {
  const int n = ranks();
  TORCH_CHECK(n % 2 == 0, "mesh_shape_2d: a 2-D mesh {n / 2, 2} needs an even number of ranks, "
              "this test has ", n, " (skip first with DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2))");
  return {n / 2, 2};
}

// NOTE: [Tests at any world size]
// The suites run at DTENSOR_WORLD_SIZE 2, 4 and 8 (CI runs the thread suites at 2 and 8 as
// well as 4), on "cpu" or "cuda" (process ranks over nccl, or over gloo on one GPU). Meshes
// are built from the fixture (ranks(), mesh_shape_2d(), device_type()) and expected values
// are computed from the rank count. A test that truly needs a count (a 2x2x2 mesh, a value
// written down for 4 ranks) declares it with DTENSOR_REQUIRE_WORLD_SIZE*, and is skipped
// with that reason elsewhere: a skip names what it needs, where a literal mesh of the wrong
// size would fail (or, in a rank outside the mesh, error) for a reason that is not the
// library's.
std::string world_size_skip_reason(int world_size, int n, const std::string& relation) {
  bool ok = true;
  if (relation == "exactly") ok = world_size == n;
  else if (relation == "at least") ok = world_size >= n;
  else if (relation == "a multiple of") ok = n > 0 && world_size % n == 0;
  else TORCH_CHECK(false, "world_size_skip_reason: unknown relation '", relation, "'");
  if (ok) return "";
  std::ostringstream why;
  why << "needs " << relation << " " << n << " ranks; this run has " << world_size
      << " (DTENSOR_WORLD_SIZE)";
  return why.str();
}

void MultiRankTest::RankBody() {
  ADD_FAILURE() << "RankBody() of a dtensor fixture was not overridden: define the test with "
                   "DTENSOR_TEST_F, not TEST_F";
}

int MultiRankTest::effective_world_size() const {
  const std::string v = env_or("DTENSOR_WORLD_SIZE", "");
  if (v.empty()) return world_size();
  try {
    int n = std::stoi(v);
    TORCH_CHECK(n >= 1, "must be >= 1");
    return n;
  } catch (const std::exception&) {
    TORCH_CHECK(false, "DTENSOR_WORLD_SIZE='", v, "' is not a positive integer");
  }
}

std::chrono::milliseconds MultiRankTest::effective_timeout() const {
  const std::string v = env_or("DTENSOR_TEST_TIMEOUT", "");
  if (v.empty()) return timeout();
  try {
    double s = std::stod(v);
    TORCH_CHECK(s > 0, "must be positive");
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  } catch (const std::exception&) {
    TORCH_CHECK(false, "DTENSOR_TEST_TIMEOUT='", v, "' is not a positive number of seconds");
  }
}

int MultiProcessTest::world_size() const { return default_world_size(gpu_count()); }

std::string MultiProcessTest::device_type() const { return device_type_for_backend(effective_backend()); }

std::string MultiProcessTest::backend() const {
  return default_backend(gpu_count(), effective_world_size(), comm::backend_available("nccl"));
}

std::string backend_name_error(const std::string& backend) {
  static const std::string kValid = "gloo, nccl or mpi, or device:backend pairs such as cpu:gloo,cuda:nccl";
  std::string error;
  std::stringstream ss(backend);
  std::string item;
  int items = 0;
  while (std::getline(ss, item, ',')) {
    ++items;
    const auto colon = item.find(':');
    const std::string name = colon == std::string::npos ? item : item.substr(colon + 1);
    if (name != "gloo" && name != "nccl" && name != "mpi")
      return "DTENSOR_BACKEND='" + backend + "' names no backend ('" + name + "'); valid backends are " + kValid;
  }
  if (items == 0) return "the backend is empty; valid backends are " + kValid;
  return error;
}

std::string MultiProcessTest::effective_backend() const {
  return env_or("DTENSOR_BACKEND", backend());
}

LaunchMode MultiProcessTest::effective_launch_mode() const {
  const std::string v = env_or("DTENSOR_LAUNCH_MODE", "");
  return v.empty() ? launch_mode() : launch_mode_from_string(v);
}

void MultiProcessTest::RunRanks(const std::string& test_id) {
  if (internal::external_launcher_active()) {
    internal::run_external(test_id, effective_timeout());
    return;
  }
  const std::string kind_skip = rank_kind_skip_reason("processes");
  if (kind_skip == "error") FAIL() << rank_kind_error();
  if (!kind_skip.empty()) GTEST_SKIP() << kind_skip;
  comm::trace_event("test.start");
  const int n = effective_world_size();
  const std::string backend = effective_backend();
  // NOTE: [Misspelled backends fail]
  // A backend this build or machine lacks (nccl without CUDA) skips; a name that is no backend
  // at all (DTENSOR_BACKEND=glo) fails, or a typo in CI would skip every test and stay green.
  const std::string bad_name = backend_name_error(backend);
  if (!bad_name.empty()) FAIL() << bad_name;
  std::string why;
  if (!comm::backend_available(backend, &why)) GTEST_SKIP() << why;
  const std::string gpu_why = gpu_skip_reason(backend, n, gpu_count(), required_gpus());
  if (!gpu_why.empty()) GTEST_SKIP() << gpu_why;
  const auto timeout = effective_timeout();
  const LaunchMode mode = effective_launch_mode();
  std::string stacks;
  std::vector<internal::RankOutcome> outcomes;
  if (mode == LaunchMode::kWorkerPool) {
    outcomes = internal::worker_pool(n, backend, timeout).run(test_id, timeout, &stacks);
  } else {
    internal::RankSet ranks(mode, n, backend, timeout, test_id);
    outcomes = ranks.run(test_id, timeout, &stacks);
  }
  comm::trace_event("test.ran");
  internal::report_outcomes(test_id, outcomes, timeout, stacks);
  comm::trace_event("test.end");
}

// NOTE: [Loud ends of threaded tests]
// Threaded ranks share the test program: a rank calling exit(0) would end it with status 0
// and no result (ctest reads a pass), and a crash would print nothing naming the test. While
// a threaded test runs, exit() fails the program naming the test and rank (an atexit handler
// that _exits with 1), and a fatal signal prints the test and rank before the default action.
namespace {
std::atomic<bool> g_threaded_test_running{false};
char g_threaded_test_name[256];
thread_local int t_thread_rank = -1;

void on_exit_during_threaded_test() {
  if (!g_threaded_test_running.load()) return;
  std::fprintf(stderr,
               "[dtensor] exit() was called during %s (by rank %d): a test must not end the "
               "program; failing it\n",
               g_threaded_test_name, t_thread_rank);
  std::fflush(nullptr);
  ::_exit(1);
}

void on_fatal_signal_in_threaded_test(int sig) {
  char msg[400];
  const int len = std::snprintf(msg, sizeof msg, "[dtensor] fatal signal %d (%s) in rank %d of %s\n",
                                sig, strsignal(sig), t_thread_rank, g_threaded_test_name);
  if (len > 0) (void)!::write(2, msg, static_cast<size_t>(std::min<int>(len, sizeof msg - 1)));
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

struct ThreadedTestScope {
  std::vector<std::pair<int, struct sigaction>> old;
  explicit ThreadedTestScope(const std::string& test_id) {
    static const bool registered = std::atexit(on_exit_during_threaded_test) == 0;
    (void)registered;
    std::snprintf(g_threaded_test_name, sizeof g_threaded_test_name, "%s", test_id.c_str());
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
      struct sigaction sa {}, prev {};
      sa.sa_handler = on_fatal_signal_in_threaded_test;
      ::sigaction(sig, &sa, &prev);
      old.emplace_back(sig, prev);
    }
    g_threaded_test_running = true;
  }
  ~ThreadedTestScope() {
    g_threaded_test_running = false;
    for (auto& kv : old) ::sigaction(kv.first, &kv.second, nullptr);
  }
};
}  // namespace

// NOTE: [Threaded ranks]
// Each rank is a thread with its own fixture instance, thread-local rank and default group.
// One RankCapture intercepts the assertions of all threads and files them under the rank of
// the thread that made them. When a rank stops early (ASSERT, exception, skip) the world is
// aborted, so ranks blocked in collectives with it wake up with CollectiveError instead of
// waiting for the timeout. A thread that ignores the abort (busy loop) cannot be killed: at
// the timeout it is reported and left detached, with its fixture leaked on purpose.
namespace {

// What the rank threads of one threaded test share with the test's thread.
struct ThreadedRun {
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0;
  std::vector<std::optional<internal::RankResult>> results;
  std::vector<bool> body_done;
};

// Rank r's thread: its group, its body, its result.
void run_rank_thread(int r, const std::string& test_id, const std::shared_ptr<comm::ThreadWorld>& world,
                     const std::shared_ptr<ThreadedRun>& shared, const std::shared_ptr<internal::RankSink>& sink) {
  t_thread_rank = r;
  internal::set_rank_intra_op_threads(world->size());
  auto g = std::make_shared<comm::ThreadGroup>(world, r);
  comm::set_thread_default_group(g);
  internal::set_body_done_hook([shared, r] {
    std::lock_guard<std::mutex> lk(shared->mu);
    shared->body_done[r] = true;
  });
  internal::RankResult res = internal::run_rank_body(test_id, r, g, *sink);
  internal::set_body_done_hook(nullptr);
  comm::set_thread_default_group(nullptr);
  internal::set_current_rank(-1);
  if (res.fatal()) world->abort("rank " + std::to_string(r) + " stopped early");
  std::lock_guard<std::mutex> lk(shared->mu);
  shared->results[r] = std::move(res);
  ++shared->finished;
  shared->cv.notify_all();
}

// Waits for every rank's thread until the timeout; then aborts the world and waits a little
// more. Returns whether all finished; `unfinished` marks those still running at the timeout.
bool wait_for_ranks(ThreadedRun& shared, comm::ThreadWorld& world, int n, std::chrono::milliseconds timeout,
                    std::vector<bool>& unfinished) {
  std::unique_lock<std::mutex> lk(shared.mu);
  if (shared.cv.wait_for(lk, timeout, [&] { return shared.finished == n; })) return true;
  for (int r = 0; r < n; ++r) unfinished[r] = !shared.results[r].has_value();
  lk.unlock();
  world.abort("the test timed out");
  lk.lock();
  return shared.cv.wait_for(lk, internal::kThreadAbortWait, [&] { return shared.finished == n; });
}

}  // namespace

void MultiThreadedTest::RunRanks(const std::string& test_id) {
  if (!internal::registered(test_id)) {
    ADD_FAILURE() << "no DTENSOR_TEST_F named " << test_id;
    return;
  }
  const std::string kind_skip = rank_kind_skip_reason("threads");
  if (kind_skip == "error") FAIL() << rank_kind_error();
  if (!kind_skip.empty()) GTEST_SKIP() << kind_skip;
  const int n = effective_world_size();
  const auto timeout = effective_timeout();
  ThreadedTestScope loud_ends(test_id);  // NOTE: [Loud ends of threaded tests]
  auto world = comm::ThreadWorld::create(n, timeout);
  auto shared = std::make_shared<ThreadedRun>();
  shared->results.resize(n);
  shared->body_done.resize(n, false);
  // Threads share the sink; the capture (the installed gtest reporter) belongs to this frame
  // and is removed before reporting, so that the report itself reaches gtest.
  auto sink = std::make_shared<internal::RankSink>();
  auto capture = std::make_unique<internal::RankCapture>(sink);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(run_rank_thread, r, test_id, world, shared, sink);
  std::vector<bool> unfinished_at_timeout(n, false);
  const bool all_done = wait_for_ranks(*shared, *world, n, timeout, unfinished_at_timeout);
  capture.reset();
  std::vector<internal::RankOutcome> outcomes(n);
  {
    std::lock_guard<std::mutex> lk(shared->mu);
    for (int r = 0; r < n; ++r) {
      outcomes[r].rank = r;
      outcomes[r].result = shared->results[r];
      outcomes[r].body_done = shared->body_done[r];
      if (unfinished_at_timeout[r]) {
        outcomes[r].end = internal::RankOutcome::End::kTimedOut;
        outcomes[r].result.reset();
      }
    }
  }
  if (all_done) {
    for (auto& t : threads) t.join();
  } else {
    for (auto& t : threads) t.detach();  // see NOTE: [Threaded ranks]
  }
  internal::report_outcomes(test_id, outcomes, timeout,
                            all_done ? "" : "(threads cannot be stack-dumped; they were left detached)\n");
}

}  // namespace testing
}  // namespace dtensor
