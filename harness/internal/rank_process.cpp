// harness/internal/rank_process.cpp: a rank process: its signal handlers and stacks, its
// process group, and the loop that runs the tests it is sent (NOTE: [Rank process protocol] in
// launcher.h).
#include "harness/internal/launch_io.h"
#include "harness/internal/rank_run.h"

#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/device.h"
#include "dtensor/comm/trace.h"
#include "dtensor/compat.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>

using nlohmann::json;

namespace dtensor {
namespace testing {
namespace internal {

namespace {

int g_rank_for_signals = -1;
pid_t g_main_tid = 0;

// NOTE: [Symbolised user frames]: after the usual backtrace, one line
//   [dtensor] frames: <module>+0x<offset> <module>+0x<offset> ...
// (module-relative addresses, the main program by its real path) that the orchestrator turns
// into functions and file:line with addr2line (symbolise_stack in symbolise.cpp).
char g_exe_path[1024] = "";
const void* g_exe_base = nullptr;

void write_frames_line(int fd, void* const* frames, int n) {
  char line[256];
  (void)!::write(fd, "[dtensor] frames:", 17);
  for (int i = 0; i < n; ++i) {
    Dl_info info{};
    if (!::dladdr(frames[i], &info) || !info.dli_fname || !info.dli_fbase) continue;
    const char* mod = info.dli_fbase == g_exe_base && g_exe_path[0] ? g_exe_path : info.dli_fname;
    const auto off = reinterpret_cast<uintptr_t>(frames[i]) - reinterpret_cast<uintptr_t>(info.dli_fbase);
    const int len = std::snprintf(line, sizeof line, " %s+0x%lx", mod, static_cast<unsigned long>(off));
    if (len > 0) (void)!::write(fd, line, std::min(static_cast<size_t>(len), sizeof line - 1));
  }
  (void)!::write(fd, "\n", 1);
}

void write_stack(int fd) {
  void* frames[64];
  int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, fd);
  write_frames_line(fd, frames, n);
}

void on_fatal_signal(int sig) {
  char msg[160];
  int len = std::snprintf(msg, sizeof msg, "[dtensor] rank %d: fatal signal %d (%s); stack:\n",
                          g_rank_for_signals, sig, strsignal(sig));
  (void)!::write(2, msg, static_cast<size_t>(len));
  write_stack(2);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void on_stack_request(int) {
  pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  if (tid != g_main_tid) {  // forward to the thread that runs the test body
    ::syscall(SYS_tgkill, ::getpid(), g_main_tid, SIGUSR1);
    return;
  }
  char msg[128];
  int len = std::snprintf(msg, sizeof msg, "[dtensor] stack of rank %d (test thread):\n",
                          g_rank_for_signals);
  (void)!::write(2, msg, static_cast<size_t>(len));
  write_stack(2);
}

void install_rank_signal_handlers(int rank) {
  g_rank_for_signals = rank;
  g_main_tid = static_cast<pid_t>(::syscall(SYS_gettid));
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc now, not inside a signal handler
  Dl_info self{};
  if (::dladdr(reinterpret_cast<void*>(&write_frames_line), &self)) g_exe_base = self.dli_fbase;
  const ssize_t len = ::readlink("/proc/self/exe", g_exe_path, sizeof g_exe_path - 1);
  g_exe_path[len > 0 ? len : 0] = 0;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, on_fatal_signal);
  struct sigaction sa {};
  sa.sa_handler = on_stack_request;
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace

void install_rank_signals(int rank) { install_rank_signal_handlers(rank); }

namespace {

// Points stdout and stderr at the rank's log and connects to the orchestrator: the control
// socket. A rank that cannot exits with code 3.
int open_log_and_connect(const RankRequest& req) {
  // The orchestrator created the log (NOTE: [Nothing left in TMPDIR]); it is gone only when the
  // orchestrator was stopped and removed its directory, and then this rank has nothing to do.
  int logfd = ::open(req.log_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (logfd < 0) {
    std::fprintf(stderr, "[dtensor] rank %d: cannot open its log %s: %s (was the test program stopped?)\n",
                 req.rank, req.log_path.c_str(), std::strerror(errno));
    ::_exit(3);
  }
  ::dup2(logfd, 1);
  ::dup2(logfd, 2);
  ::close(logfd);
  install_rank_signal_handlers(req.rank);
  int ctl = connect_unix(req.ctl_path);
  if (ctl < 0) {
    std::fprintf(stderr, "[dtensor] rank %d: cannot connect to %s: %s\n", req.rank, req.ctl_path.c_str(),
                 std::strerror(errno));
    ::_exit(3);
  }
  return ctl;
}

// The rank's process group (and the default group), or null with `error` set.
comm::GroupPtr create_rank_group(const RankRequest& req, std::string* error) {
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(req.store_port);
    so.isServer = false;
    so.waitWorkers = false;
    so.timeout = std::chrono::milliseconds(req.timeout_ms);
    compat::disable_libuv(so);
    comm::trace_event("rank.store", req.rank);
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    // NOTE: [Rank devices]: this rank's GPU is current before NCCL builds its communicators.
    if (comm::detail::backend_uses_cuda(req.backend)) comm::use_rank_cuda_device(req.rank);
    comm::C10dGroupOptions go;
    go.backend = req.backend;
    go.timeout = std::chrono::milliseconds(req.timeout_ms);
    go.gloo_hostname = "127.0.0.1";
    comm::GroupPtr group = comm::C10dGroup::create(store, req.rank, req.world_size, go);
    // No barrier here: create() itself returns on no rank before every rank has finished its
    // connect (NOTE: [Group creation completes on every rank]). A Gloo barrier here added
    // ~1 ms per test, and a failure inside it (a peer already through it, through its body and
    // gone) would be filed as this rank failing to create its group: a primary failure of a
    // rank that did nothing wrong (DESIGN.md D12).
    comm::set_default_group(group);
    return group;
  } catch (const std::exception& e) {
    auto* ce = dynamic_cast<const c10::Error*>(&e);
    *error = ce ? ce->what_without_backtrace() : e.what();
    return nullptr;
  }
}

void send_result(int ctl, const json& message) {
  std::cout.flush();
  std::fflush(nullptr);
  write_line(ctl, message);
}

// A pool worker: runs the tests the orchestrator sends until it says "exit" or goes away.
[[noreturn]] void serve_tests(int ctl, const RankRequest& req, const comm::GroupPtr& group, RankSink& sink,
                              const std::function<RankResult(const std::string&)>& run_one, bool barrier_on_demand) {
  LineReader rd;
  RankResult res;          // of the last test
  std::string last_id;     // its name
  bool can_close = false;  // the last test's closing barrier may still be asked for
  for (;;) {
    std::string line;
    while (!rd.next(line)) {
      if (rd.fill(ctl) == 0) ::_exit(0);
    }
    json j = json::parse(line);
    if (j.contains("exit")) ::_exit(0);
    if (j.contains("close")) {  // NOTE: [Closing barrier on demand]
      if (!can_close) continue;
      can_close = false;
      run_closing_barrier(last_id, group, sink, res);
      send_result(ctl, {{"result", res}});
      continue;
    }
    comm::trace_event("rank.run", req.rank);
    last_id = j.at("run").get<std::string>();
    res = run_one(last_id);
    can_close = barrier_on_demand && needs_closing_barrier(res, group);
    send_result(ctl, {{"result", res}, {"close_pending", can_close}});
  }
}

}  // namespace

[[noreturn]] void rank_process_main(const RankRequest& req) {
  comm::trace_event("rank.start", req.rank);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const int ctl = open_log_and_connect(req);
  write_line(ctl, {{"hello", req.rank}, {"pid", ::getpid()}});
  set_body_done_hook([ctl] { write_line(ctl, {{"body_done", true}}); });  // for the timeout report
  std::string group_error;
  set_rank_intra_op_threads(req.world_size);  // NOTE: [Intra-op threads of a rank]
  const comm::GroupPtr group = create_rank_group(req, &group_error);
  auto sink = std::make_shared<RankSink>();
  RankCapture capture(sink);
  // NOTE: [Closing barrier on demand]: a pool worker on a CPU backend leaves the closing barrier
  // to the orchestrator (see RankSet::run).
  const bool barrier_on_demand = req.test_id.empty() && !comm::detail::backend_uses_nccl(req.backend);
  auto run_one = [&](const std::string& id) {
    if (!group) {
      RankResult r;
      r.rank = req.rank;
      r.parts.push_back({RankPart::Kind::kException, "", -1,
                         "creating the " + req.backend + " process group failed: " + group_error});
      return r;
    }
    return run_rank_body(id, req.rank, group, *sink, /*barrier_after=*/!barrier_on_demand);
  };
  if (req.test_id.empty()) serve_tests(ctl, req, group, *sink, run_one, barrier_on_demand);
  const RankResult res = run_one(req.test_id);
  send_result(ctl, {{"result", res}});
  comm::trace_event("rank.exit", req.rank);
  // with_comms: the barrier ran in run_rank_body. The group is destroyed by the process's
  // exit: ~ProcessGroupGloo takes 20-40 ms per rank here, which would double the per-test
  // cost, and nothing can observe the difference once the rank is gone.
  ::_exit(res.failed() ? 1 : 0);
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
