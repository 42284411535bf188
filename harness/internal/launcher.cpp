// harness/internal/launcher.cpp: the orchestrator's side of the ranks: RankSet (launching,
// watching and reporting a test's ranks) and the worker pool. NOTE: [Rank process protocol] in
// launcher.h; the fork server, the rank process and the rank-set directories are in
// fork_server.cpp, rank_process.cpp and temp_dirs.cpp.
#define BOOST_PROCESS_USE_STD_FS
#include "harness/internal/launcher.h"

#include "harness/internal/external_store.h"
#include "harness/internal/launch_io.h"
#include "harness/internal/timing.h"

#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/device.h"
#include "dtensor/comm/trace.h"

#include <boost/process.hpp>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>

namespace bp = boost::process;
namespace fs = std::filesystem;
using nlohmann::json;

// NOTE: [Loopback peers without DNS]
// libtorch 2.x names the address of every TCPStore connection with getnameinfo (c10d's
// socket.cpp, formatSockAddr, flags NI_NUMERICSERV only), eagerly: each client when it
// connects (the orchestrator's and every rank's), and the server, on its one thread, for
// every connection it accepts. Both sockets are IPv6 (dual-stack), so 127.0.0.1 is seen as
// ::ffff:127.0.0.1, which glibc looks up in /etc/hosts as an IPv6 address (no entry), then
// asks DNS for (PTR 1.0.0.127.in-addr.arpa). A query that goes unanswered costs the
// resolver's 5 s timeout (then it asks again), and queries sent by the 4 ranks of a test at
// once were lost together: 1 test in 6 to 10 took 5 s to create its group (libtorch 1.13
// formats addresses only when debug logging is on: no queries). This program's
// getnameinfo (it precedes libc's in symbol lookup) names an IPv4-mapped loopback address as
// its IPv4 form, 127.x.y.z, which /etc/hosts names; every other call goes to libc unchanged.
extern "C" int getnameinfo(const struct sockaddr* sa, socklen_t salen, char* host, socklen_t hostlen,
                           char* serv, socklen_t servlen, int flags) {
  using Fn = int (*)(const struct sockaddr*, socklen_t, char*, socklen_t, char*, socklen_t, int);
  static const Fn libc = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, "getnameinfo"));
  if (!libc) return EAI_SYSTEM;
  if (sa && sa->sa_family == AF_INET6 && salen >= sizeof(sockaddr_in6) && host && hostlen > 0) {
    const auto* s6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr) && s6->sin6_addr.s6_addr[12] == 127) {
      sockaddr_in s4{};
      s4.sin_family = AF_INET;
      s4.sin_port = s6->sin6_port;
      std::memcpy(&s4.sin_addr, &s6->sin6_addr.s6_addr[12], 4);
      return libc(reinterpret_cast<const sockaddr*>(&s4), sizeof s4, host, hostlen, serv, servlen, flags);
    }
  }
  return libc(sa, salen, host, hostlen, serv, servlen, flags);
}

namespace dtensor {
namespace testing {
namespace internal {


// ---- RankSet -----------------------------------------------------------------------------------
struct RankSet::Impl {
  LaunchMode mode;
  int n;
  std::string backend;
  std::chrono::milliseconds timeout;
  bool pool;
  fs::path dir;
  int listen_fd = -1;
  c10::intrusive_ptr<c10d::TCPStore> store;
  struct Proc {
    pid_t pid = -1;
    bool exited = false;
    int status = 0;
    int fd = -1;  // control connection, after hello
    LineReader rd;
    std::optional<RankResult> result;
    bool close_pending = false;  // `result` came before the closing barrier (NOTE: [Closing barrier on demand])
    bool body_done = false;
    std::string log_path;
    std::uintmax_t log_offset = 0;
  };
  std::vector<Proc> procs;
  struct Pending {
    int fd;
    LineReader rd;
  };
  std::vector<Pending> pending;
  bool healthy = true;
  LiveDir* live_dir = nullptr;  // NOTE: [Nothing left in TMPDIR]

  void start(const std::string& test_id);
  void pump(int wait_ms);
  void poll_exits();
  void handle_line(Proc* p, Pending* pend, const std::string& line);

  // One run() of a test on these ranks.
  struct Run {
    std::chrono::steady_clock::time_point t0, deadline;
    std::chrono::milliseconds timeout;
    std::vector<RankOutcome> out;
    std::vector<bool> done;
    std::optional<std::chrono::steady_clock::time_point> first_abnormal;
    std::optional<std::chrono::steady_clock::time_point> first_close_pending;
    bool closing = false;  // the closing barrier was asked for
    bool timed_out = false;
  };
  void mark_finished_ranks(Run& run, std::chrono::steady_clock::time_point now);
  void ask_for_closing_barrier(Run& run, std::chrono::steady_clock::time_point now);
  void stop_at_timeout(Run& run);
  void wait_for_one_shot_exits();
  void fill_outcome(int r, Run& run, std::string* stacks);
  void kill_rank(int r, int sig) {
    if (procs[r].pid > 0 && !procs[r].exited) {
      if (sig == SIGKILL) ::kill(-procs[r].pid, sig);  // the rank's own children too
      ::kill(procs[r].pid, sig);
    }
  }
  // NOTE: [Reported ranks are not waited for]
  // A fork-server rank that reported its result has nothing left to do but _exit, and its
  // exit (tearing down a process with libtorch mapped, then the fork server's reaping and
  // message) took ~4 ms of each 4-rank test here. Such ranks are killed and not waited for:
  // the fork server reaps them, and their exit messages are dropped when they come
  // (forget_rank). Ranks without a result are waited for (their exit status is the report),
  // and so is every rank of a spawned set (this process reaps those itself).
  bool awaited(const Proc& p) const {
    return p.pid > 0 && !p.exited && (!p.result || mode == LaunchMode::kSpawn || !fork_server_running());
  }
  void kill_all() {
    for (int r = 0; r < n; ++r) kill_rank(r, SIGKILL);
    const auto deadline = std::chrono::steady_clock::now() + kKillWait;
    while (std::chrono::steady_clock::now() < deadline) {
      poll_exits();
      bool all = true;
      for (auto& p : procs) all = all && !awaited(p);
      if (all) break;
      std::this_thread::sleep_for(kRankSetPoll);  // waiting for SIGKILL to land
    }
    for (auto& p : procs)
      if (p.pid > 0 && !p.exited && !awaited(p)) {
        p.exited = true;  // as far as this set is concerned
        forget_rank(p.pid);
      }
  }
};

void RankSet::Impl::start(const std::string& test_id) {
  comm::trace_event("set.start");
  const std::string tmpdir = env_or("TMPDIR", "/tmp");
  remove_stale_dirs(tmpdir);
  std::string tmpl = tmpdir + "/dtensor-ranks-" + std::to_string(::getpid()) + "-XXXXXX";
  TORCH_CHECK(::mkdtemp(tmpl.data()) != nullptr, "cannot create a temp dir from ", tmpl, ": ",
              std::strerror(errno));
  dir = tmpl;
  live_dir = register_live_dir(dir.string(), n);
  const std::string ctl = (dir / "ctl.sock").string();
  listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, ctl.c_str(), sizeof(addr.sun_path) - 1);
  TORCH_CHECK(listen_fd >= 0 && ::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::listen(listen_fd, 64) == 0,
              "cannot listen on ", ctl, ": ", std::strerror(errno));
  set_nonblocking(listen_fd);
  store = host_store("127.0.0.1", timeout);
  comm::trace_event("set.store");

  procs.resize(n);
  for (int r = 0; r < n; ++r) {
    RankRequest req;
    req.test_id = test_id;
    req.rank = r;
    req.world_size = n;
    req.ctl_path = ctl;
    req.log_path = (dir / ("rank" + std::to_string(r) + ".log")).string();
    req.store_port = store->getPort();
    req.backend = backend;
    // The group's own timeout is longer than the test's, so that a hang is caught by the
    // orchestrator (which reports it with stacks), not by a collective deep in one rank.
    req.timeout_ms = (timeout + kGroupTimeoutMargin).count();
    procs[r].log_path = req.log_path;
    if (mode == LaunchMode::kSpawn || !fork_server_running()) {
      bp::child c(bp::exe = "/proc/self/exe", bp::args = std::vector<std::string>{},
                  bp::env["DTENSOR_RANK_REQUEST"] = json(req).dump(),
                  (bp::std_out & bp::std_err) > req.log_path, bp::std_in < bp::null);
      procs[r].pid = c.id();
      c.detach();
    } else {
      // Created here, not by the rank (NOTE: [Nothing left in TMPDIR]).
      const int logfd = ::open(req.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      TORCH_CHECK(logfd >= 0, "cannot create the log of rank ", r, " at ", req.log_path, ": ", std::strerror(errno));
      ::close(logfd);
      procs[r].pid = fork_server_spawn(req);
    }
    comm::trace_event("set.launched", r);
  }
}

void RankSet::Impl::handle_line(Proc* p, Pending* pend, const std::string& line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  if (j.contains("hello") && pend) {
    int r = j["hello"].get<int>();
    if (r >= 0 && r < n && procs[r].fd < 0) {
      procs[r].fd = pend->fd;
      procs[r].rd = std::move(pend->rd);
      pend->fd = -1;
      std::string more;
      while (procs[r].rd.next(more)) handle_line(&procs[r], nullptr, more);
    }
    return;
  }
  if (j.contains("body_done") && p) p->body_done = true;
  if (j.contains("result") && p) {
    p->result = j["result"].get<RankResult>();
    p->close_pending = j.value("close_pending", false);
    comm::trace_event("run.result", static_cast<int>(p - procs.data()));
  }
}

void RankSet::Impl::pump(int wait_ms) {
  std::vector<pollfd> fds;
  fds.push_back({listen_fd, POLLIN, 0});
  for (auto& pe : pending) fds.push_back({pe.fd, POLLIN, 0});
  for (auto& p : procs)
    if (p.fd >= 0) fds.push_back({p.fd, POLLIN, 0});
  if (fork_server_running()) fds.push_back({fork_server_fd(), POLLIN, 0});
  ::poll(fds.data(), fds.size(), wait_ms);
  // NOTE: [Exits before reads]: exits first, then everything readable, to the end. A rank writes
  // its result and then exits, so once its exit is seen here the result is in its socket: read
  // after, it is never missed. The other order lost results: a rank that wrote and exited
  // between this pump's read and its poll_exits was filed as "exited with code 0 before
  // reporting a result" (seen under load, GlooGaps.MaxAndMinKeepNaN on libtorch 2.6).
  // DTENSOR_HARNESS_PUMP_GAP_MS (tests only) widens the gap between the two halves, as a busy
  // machine does (HarnessReports.ARankExitingRightAfterItsResultIsNeverMissed).
  poll_exits();
  static const int gap_ms = std::atoi(env_or("DTENSOR_HARNESS_PUMP_GAP_MS", "0").c_str());
  if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
  for (;;) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) break;
    pending.push_back({c, {}});
  }
  auto drain = [](int fd, LineReader& rd) {
    ssize_t r;
    while ((r = rd.fill(fd)) > 0) {
    }
    return r;
  };
  for (auto& pe : pending) {
    if (pe.fd < 0) continue;
    ssize_t r = drain(pe.fd, pe.rd);
    std::string line;
    while (pe.fd >= 0 && pe.rd.next(line)) handle_line(nullptr, &pe, line);
    if (r == 0 && pe.fd >= 0) {
      ::close(pe.fd);
      pe.fd = -1;
    }
  }
  pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return p.fd < 0; }),
                pending.end());
  for (auto& p : procs) {
    if (p.fd < 0) continue;
    ssize_t r = drain(p.fd, p.rd);
    std::string line;
    while (p.rd.next(line)) handle_line(&p, nullptr, line);
    if (r == 0) {
      ::close(p.fd);
      p.fd = -2;  // closed
    }
  }
}

void RankSet::Impl::poll_exits() {
  fork_server_pump();
  for (auto& p : procs) {
    if (p.pid <= 0 || p.exited) continue;
    if (mode != LaunchMode::kSpawn && fork_server_running()) {
      if (const auto status = take_rank_exit(p.pid)) {
        comm::trace_event("run.exited", static_cast<int>(&p - procs.data()));
        p.exited = true;
        p.status = *status;
      }
    } else {
      int st = 0;
      if (::waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.exited = true;
        p.status = st;
      }
    }
  }
}

RankSet::RankSet(LaunchMode mode, int world_size, std::string backend,
                 std::chrono::milliseconds timeout, std::string one_shot_test_id)
    : impl_(std::make_unique<Impl>()) {
  impl_->mode = mode;
  impl_->n = world_size;
  impl_->backend = std::move(backend);
  impl_->timeout = timeout;
  impl_->pool = one_shot_test_id.empty();
  impl_->start(one_shot_test_id);
}

RankSet::~RankSet() {
  for (auto& p : impl_->procs)
    if (p.fd >= 0) write_line(p.fd, {{"exit", true}});
  impl_->kill_all();
  for (auto& p : impl_->procs)
    if (p.fd >= 0) ::close(p.fd);
  for (auto& pe : impl_->pending) ::close(pe.fd);
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  impl_->store.reset();
  std::error_code ec;
  if (!impl_->dir.empty()) fs::remove_all(impl_->dir, ec);
  unregister_live_dir(impl_->live_dir);
  comm::trace_event("set.end");
}

bool RankSet::healthy() const { return impl_->healthy; }
const std::string& RankSet::backend() const { return impl_->backend; }
int RankSet::world_size() const { return impl_->n; }

void RankSet::Impl::mark_finished_ranks(Run& run, std::chrono::steady_clock::time_point now) {
  for (int r = 0; r < n; ++r) {
    auto& p = procs[r];
    if (run.done[r]) continue;
    // A one-shot fork-server rank is done once it reported (NOTE: [Reported ranks are not waited for]).
    const bool finished = p.result && (pool || p.exited || !awaited(p));
    if (finished || p.exited) {
      run.done[r] = true;
      const bool abnormal = !p.result || p.result->fatal() || (p.exited && !WIFEXITED(p.status));
      if (abnormal && !run.first_abnormal) run.first_abnormal = now;
    }
    // A one-shot rank that reported but does not exit is stuck in teardown.
    if (!run.done[r] && p.result && !pool && now - run.t0 > run.timeout + kExitGrace) run.done[r] = true;
  }
}

// NOTE: [Closing barrier on demand]
// A pool rank on a CPU backend reports its result right after its body, before the closing
// barrier (close_pending), and then waits for the next line. When every rank has reported
// the barrier would add nothing: each rank's collectives completed, and the orchestrator,
// sending the next test only once all results are in, is the barrier (one Gloo collective
// less per test: ~3.5 ms of ~10 on this 2-core machine). Only when some ranks have finished
// their body and others have not after kCloseDelay is the barrier run: the finished ranks
// (and those finishing later) are sent "close", run the barrier and report again. A rank
// stuck in a collective its peers never make thus still meets their barrier, and the call
// check names the mismatch ([rank 1: all_reduce(...)] [rank 0: barrier()]) instead of a
// timeout. Not when a rank stopped early (ASSERT, skip, exception, crash): the others'
// barrier could only wait for it, as before (they are stopped after kAbortGrace).
void RankSet::Impl::ask_for_closing_barrier(Run& run, std::chrono::steady_clock::time_point now) {
  if (pool && !run.closing && !run.first_abnormal) {
    bool pending_close = false;
    for (int r = 0; r < n; ++r) pending_close = pending_close || (run.done[r] && procs[r].close_pending);
    if (pending_close && !run.first_close_pending) run.first_close_pending = now;
    if (run.first_close_pending && now - *run.first_close_pending > kCloseDelay) run.closing = true;
  }
  if (!run.closing) return;
  for (int r = 0; r < n; ++r) {
    auto& p = procs[r];
    if (!p.result || !p.close_pending) continue;
    comm::trace_event("run.close", r);
    p.result.reset();
    p.close_pending = false;
    run.done[r] = false;
    write_line(p.fd, {{"close", true}});  // a rank gone meanwhile is reported by its exit
  }
}

// The ranks still running are asked for their stacks, then killed.
void RankSet::Impl::stop_at_timeout(Run& run) {
  run.timed_out = true;
  for (int r = 0; r < n; ++r)
    if (!run.done[r]) kill_rank(r, SIGUSR1);
  const auto until = std::chrono::steady_clock::now() + kStackDumpWait;
  while (std::chrono::steady_clock::now() < until) pump(static_cast<int>(kRankSetPoll.count()));
  for (int r = 0; r < n; ++r)
    if (!run.done[r] && !procs[r].result) {
      run.out[r].end = RankOutcome::End::kTimedOut;
      kill_rank(r, SIGKILL);
    }
}

// One-shot ranks exit right after reporting; collect their exit status.
void RankSet::Impl::wait_for_one_shot_exits() {
  const auto until = std::chrono::steady_clock::now() + kExitGrace;
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (auto& p : procs) all = all && !awaited(p);
    if (all) break;
    pump(static_cast<int>(kRankSetPoll.count()));
  }
  kill_all();
}

void RankSet::Impl::fill_outcome(int r, Run& run, std::string* stacks) {
  auto& p = procs[r];
  auto& o = run.out[r];
  o.rank = r;
  o.result = p.result;
  o.body_done = p.body_done;
  if (o.end == RankOutcome::End::kFinished && p.exited) {
    if (WIFSIGNALED(p.status) && !p.result) {
      o.end = RankOutcome::End::kSignaled;
      o.signal = WTERMSIG(p.status);
    } else if (WIFEXITED(p.status) && !p.result) {
      o.end = RankOutcome::End::kExited;
      o.exit_code = WEXITSTATUS(p.status);
    }
  }
  std::ifstream in(p.log_path, std::ios::binary);
  if (in) {
    in.seekg(static_cast<std::streamoff>(p.log_offset));
    o.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (run.timed_out && stacks && o.end == RankOutcome::End::kTimedOut) {
    auto pos = o.output.find("[dtensor] stack of rank");
    if (pos != std::string::npos) *stacks += o.output.substr(pos);
    else *stacks += "[rank " + std::to_string(r) + "] (no stack: the rank did not answer)\n";
  }
  if (o.end != RankOutcome::End::kFinished || !o.result || o.result->failed()) healthy = false;
  if (pool && p.exited) healthy = false;
}

std::vector<RankOutcome> RankSet::run(const std::string& test_id, std::chrono::milliseconds timeout,
                                      std::string* stacks) {
  auto& I = *impl_;
  comm::trace_event("run.start");
  Impl::Run run;
  run.t0 = std::chrono::steady_clock::now();
  run.deadline = run.t0 + timeout;
  run.timeout = timeout;
  run.out.resize(I.n);
  run.done.assign(I.n, false);
  std::vector<bool> sent(I.n, !I.pool);
  for (auto& p : I.procs) {
    p.result.reset();
    p.close_pending = false;
    p.body_done = false;
    // NOTE: [A rank's output belongs to its test]: a pool rank's log holds every test it ran,
    // and this test's part starts where the log ends now (the rank starts it on "run", below).
    // A one-shot rank started its test when it was spawned, and may already have written to
    // its log -- crashed, even -- before this line runs on a loaded machine: all of it is this
    // test's.
    std::error_code ec;
    p.log_offset = I.pool && fs::exists(p.log_path, ec) ? fs::file_size(p.log_path, ec) : 0;
  }
  for (;;) {
    for (int r = 0; r < I.n; ++r) {
      auto& p = I.procs[r];
      if (I.pool && !sent[r] && p.fd >= 0) sent[r] = write_line(p.fd, {{"run", test_id}});
    }
    I.pump(static_cast<int>(kRankSetPoll.count()));
    const auto now = std::chrono::steady_clock::now();
    I.mark_finished_ranks(run, now);
    if (std::all_of(run.done.begin(), run.done.end(), [](bool d) { return d; })) break;
    I.ask_for_closing_barrier(run, now);
    if (run.first_abnormal && now - *run.first_abnormal > kAbortGrace) {
      for (int r = 0; r < I.n; ++r)
        if (!run.done[r]) {
          run.out[r].end = RankOutcome::End::kKilledAfterPeer;
          I.kill_rank(r, SIGKILL);
        }
      break;
    }
    if (now > run.deadline) {
      I.stop_at_timeout(run);
      break;
    }
  }
  if (!I.pool) I.wait_for_one_shot_exits();
  for (int r = 0; r < I.n; ++r) I.fill_outcome(r, run, stacks);
  return run.out;
}

// ---- worker pool -------------------------------------------------------------------------------
namespace {
std::unique_ptr<RankSet> g_pool;
}

RankSet& worker_pool(int world_size, const std::string& backend, std::chrono::milliseconds timeout) {
  if (g_pool && (!g_pool->healthy() || g_pool->world_size() != world_size || g_pool->backend() != backend))
    g_pool.reset();
  if (!g_pool) g_pool = std::make_unique<RankSet>(LaunchMode::kWorkerPool, world_size, backend, timeout);
  return *g_pool;
}

void discard_worker_pool() { g_pool.reset(); }

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
