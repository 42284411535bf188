// harness/internal/launcher.cpp: see NOTE: [Rank process protocol] in launcher.h.
#define BOOST_PROCESS_USE_STD_FS
#include "harness/internal/launcher.h"

#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/device.h"
#include "dtensor/comm/trace.h"
#include "dtensor/compat.h"

#include <boost/process.hpp>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <set>
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

// How long the other ranks may go on after one rank failed, crashed or skipped, before the
// harness kills them (they are usually blocked in a collective with the failed rank).
constexpr std::chrono::milliseconds kAbortGrace{1000};
// How long a rank may take to exit after it reported its result.
constexpr std::chrono::milliseconds kExitGrace{5000};
// How long ranks killed at a timeout get to print their stacks.
constexpr std::chrono::milliseconds kStackDumpWait{500};
// Extra time a rank's process group waits in a collective beyond the test's timeout.
constexpr std::chrono::milliseconds kGroupTimeoutMargin{30000};
// Poll period of the orchestrator's wait loop.
constexpr int kPollMs = 5;
// How long after a pool rank finished its body the others may take to finish theirs before the
// closing barrier is run (NOTE: [Closing barrier on demand]).
constexpr std::chrono::milliseconds kCloseDelay{50};

void to_json(json& j, const RankRequest& r) {
  j = {{"test_id", r.test_id},       {"rank", r.rank},       {"world_size", r.world_size},
       {"ctl_path", r.ctl_path},     {"log_path", r.log_path}, {"store_port", r.store_port},
       {"backend", r.backend},       {"timeout_ms", r.timeout_ms}};
}
void from_json(const json& j, RankRequest& r) {
  r.test_id = j.at("test_id").get<std::string>();
  r.rank = j.at("rank").get<int>();
  r.world_size = j.at("world_size").get<int>();
  r.ctl_path = j.at("ctl_path").get<std::string>();
  r.log_path = j.at("log_path").get<std::string>();
  r.store_port = j.at("store_port").get<int>();
  r.backend = j.at("backend").get<std::string>();
  r.timeout_ms = j.at("timeout_ms").get<int64_t>();
}

namespace {

// NOTE: [No SIGPIPE from a peer that is gone]
// A rank can exit between the orchestrator's last read and its next write (the "exit" line
// of ~RankSet, a pool's next "run"): a plain write() to that socket raises SIGPIPE, which
// kills the test program without a word. Sockets are written with MSG_NOSIGNAL (EPIPE is then
// an ordinary error), and main_with_harness ignores SIGPIPE for the pipes.
bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  bool socket = true;
  while (off < s.size()) {
    ssize_t w = socket ? ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL) : -1;
    if (w < 0 && socket && errno == ENOTSOCK) {
      socket = false;
      continue;
    }
    if (!socket) w = ::write(fd, s.data() + off, s.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(w);
  }
  return true;
}
bool write_line(int fd, const json& j) { return write_all(fd, j.dump() + "\n"); }

// Newline-delimited messages over a socket.
struct LineReader {
  std::string buf;
  // Reads what is available: >0 bytes read, 0 EOF, -1 nothing now / error.
  ssize_t fill(int fd) {
    char tmp[65536];
    ssize_t r = ::read(fd, tmp, sizeof tmp);
    if (r > 0) buf.append(tmp, static_cast<size_t>(r));
    if (r < 0 && errno != EAGAIN && errno != EINTR) return 0;
    return r;
  }
  bool next(std::string& line) {
    auto nl = buf.find('\n');
    if (nl == std::string::npos) return false;
    line = buf.substr(0, nl);
    buf.erase(0, nl + 1);
    return true;
  }
};

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// ---- fork server -------------------------------------------------------------------------------
int g_zygote_fd = -1;
pid_t g_zygote_pid = -1;
LineReader g_zygote_reader;
std::map<pid_t, int> g_zygote_exits;
std::set<pid_t> g_unawaited;  // NOTE: [Reported ranks are not waited for]
int g_chld_pipe[2] = {-1, -1};

void on_sigchld(int) {
  int saved = errno;
  char c = 1;
  (void)!::write(g_chld_pipe[1], &c, 1);
  errno = saved;
}

[[noreturn]] void rank_process_main_in_zygote_child(int fd, const RankRequest& req) {
  ::signal(SIGCHLD, SIG_DFL);
  ::close(fd);
  ::close(g_chld_pipe[0]);
  ::close(g_chld_pipe[1]);
  rank_process_main(req);
}

// NOTE: [Spare ranks]
// Forking a rank from the zygote costs ~5 ms here (page tables of a process with libtorch's
// 285 libraries mapped), and the ranks of a test are forked one after the other, so the last
// rank of 4 started ~15 ms after the first and the process group waited for it. Once a second
// test has been launched (a program that runs one test, as ctest does, never pays for
// spares), the zygote keeps as many spare children as the largest world size it has seen:
// forked in advance, each blocks reading its request from a socket, then runs the rank
// exactly as a freshly forked child would (same zygote state, same steps). A request takes a
// spare when there is one; spares are forked again only once every rank of the launch has
// been handed out and no request is waiting (a refill in the middle of a launch delayed its
// later ranks by a fork each). Spares die with the zygote (PDEATHSIG; the zygote kills and
// reaps them when the orchestrator goes). DTENSOR_FORK_SPARES=0 turns them off. With spares
// and libgcc loaded once in the zygote, the ranks of a 4-rank test start within ~9 ms of the
// launch instead of ~21 ms.
struct Spare {
  pid_t pid;
  int fd;  // the zygote's end of the spare's request socket
};

// Forks a spare: returns it, or pid -1 when fork failed.
Spare fork_spare(int zygote_fd, const std::vector<Spare>& spares) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return {-1, -1};
  const pid_t zygote = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != zygote) ::_exit(0);
    ::close(sv[0]);
    for (const auto& sp : spares) ::close(sp.fd);
    LineReader rd;
    std::string line;
    while (!rd.next(line)) {
      if (rd.fill(sv[1]) == 0) ::_exit(0);  // the zygote closed it: not needed
    }
    ::close(sv[1]);
    rank_process_main_in_zygote_child(zygote_fd, json::parse(line).get<RankRequest>());
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    return {-1, -1};
  }
  return {pid, sv[0]};
}

[[noreturn]] void zygote_loop(int fd, pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);
  ::prctl(PR_SET_NAME, "dtensor-zygote");
  // backtrace() loads libgcc_s on first use (3 ms, and more under load): once here, inherited
  // by every rank, instead of in each rank (install_rank_signal_handlers).
  void* warm[1];
  ::backtrace(warm, 1);
  if (::pipe2(g_chld_pipe, O_CLOEXEC | O_NONBLOCK) != 0) ::_exit(1);
  struct sigaction sa {};
  sa.sa_handler = on_sigchld;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);
  std::set<pid_t> kids;      // ranks handed out
  std::vector<Spare> spares;  // NOTE: [Spare ranks]
  std::string last_launch;    // ctl path of the last test launched (one per test)
  int launches = 0, max_world = 0;
  size_t want_spares = 0;
  bool launching = false;  // served rank r < world_size - 1 of a test: more requests follow
  const char* spares_env = std::getenv("DTENSOR_FORK_SPARES");
  const bool spares_enabled = !(spares_env && std::string(spares_env) == "0");
  LineReader rd;
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {g_chld_pipe[0], POLLIN, 0}};
    // Spares are forked only while nothing is waiting.
    // ... and not in the middle of a launch (its next rank's request is on its way).
    const bool refill = spares.size() < want_spares && !launching;
    if (::poll(p, 2, refill ? 0 : -1) < 0) continue;
    if (p[1].revents) {
      char drain[256];
      while (::read(g_chld_pipe[0], drain, sizeof drain) > 0) {
      }
      int st = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
        auto sp = std::find_if(spares.begin(), spares.end(), [&](const Spare& x) { return x.pid == pid; });
        if (sp != spares.end()) {  // a spare died before use (killed from outside)
          ::close(sp->fd);
          spares.erase(sp);
          continue;
        }
        kids.erase(pid);
        comm::trace_event("zygote.reaped");
        write_line(fd, {{"exit", pid}, {"status", st}});
      }
    }
    if (p[0].revents) {
      if (rd.fill(fd) == 0) {  // the orchestrator is gone: take every rank with us
        for (pid_t k : kids) {
          ::kill(-k, SIGKILL);
          ::kill(k, SIGKILL);
        }
        for (const auto& sp : spares) ::kill(sp.pid, SIGKILL);
        // Reaped here, not left to init (which, in some containers, never reaps).
        for (pid_t k : kids) ::waitpid(k, nullptr, 0);
        for (const auto& sp : spares) ::waitpid(sp.pid, nullptr, 0);
        ::_exit(0);
      }
      std::string line;
      while (rd.next(line)) {
        RankRequest req = json::parse(line).get<RankRequest>();
        comm::trace_event("zygote.request", req.rank);
        max_world = std::max(max_world, req.world_size);
        if (req.ctl_path != last_launch) {
          last_launch = req.ctl_path;
          if (++launches >= 2 && spares_enabled) want_spares = static_cast<size_t>(max_world);
        }
        pid_t pid = -1;
        while (pid < 0 && !spares.empty()) {
          Spare sp = spares.back();
          spares.pop_back();
          const bool sent = write_line(sp.fd, json(req));
          ::close(sp.fd);
          if (sent) pid = sp.pid;
        }
        if (pid < 0) {
          pid = ::fork();
          if (pid == 0) rank_process_main_in_zygote_child(fd, req);
        }
        if (pid > 0) kids.insert(pid);
        launching = req.rank + 1 < req.world_size;
        write_line(fd, {{"pid", pid}, {"errno", pid < 0 ? errno : 0}});
      }
    } else if (refill) {
      Spare sp = fork_spare(fd, spares);
      if (sp.pid > 0) spares.push_back(sp);
      else want_spares = 0;  // fork failed: no spares from now on
    }
  }
}

// Reads zygote messages; returns the pid of a spawn reply when `want_pid`.
pid_t zygote_pump(bool want_pid, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    std::string line;
    while (g_zygote_reader.next(line)) {
      json j = json::parse(line);
      if (j.contains("exit")) {
        const pid_t pid = j["exit"].get<pid_t>();
        if (g_unawaited.erase(pid) == 0) g_zygote_exits[pid] = j["status"].get<int>();
      } else if (j.contains("pid")) {
        pid_t pid = j["pid"].get<pid_t>();
        TORCH_CHECK(pid > 0, "the fork server could not fork a rank: ", std::strerror(j["errno"].get<int>()));
        return pid;
      }
    }
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    TORCH_CHECK(left > 0 || !want_pid, "the fork server did not answer within ", timeout_ms, " ms");
    pollfd p{g_zygote_fd, POLLIN, 0};
    if (::poll(&p, 1, want_pid ? left : 0) <= 0) {
      if (!want_pid) return -1;
      continue;
    }
    TORCH_CHECK(g_zygote_reader.fill(g_zygote_fd) != 0, "the fork server died");
  }
}

// ---- rank process ------------------------------------------------------------------------------
int g_rank_for_signals = -1;
pid_t g_main_tid = 0;

// NOTE: [Symbolised user frames]: after the usual backtrace, one line
//   [dtensor] frames: <module>+0x<offset> <module>+0x<offset> ...
// (module-relative addresses, the main program by its real path) that the orchestrator turns
// into functions and file:line with addr2line (symbolise_stack in rank_run.cpp).
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

int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  return fd;
}

}  // namespace

void install_rank_signals(int rank) { install_rank_signal_handlers(rank); }

void start_fork_server() {
  if (g_zygote_fd >= 0) return;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
  const pid_t parent = ::getpid();
  std::cout.flush();
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(sv[0]);
    zygote_loop(sv[1], parent);
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    return;
  }
  g_zygote_fd = sv[0];
  g_zygote_pid = pid;
}

bool fork_server_running() { return g_zygote_fd >= 0; }

void stop_fork_server() {
  if (g_zygote_fd < 0) return;
  ::close(g_zygote_fd);  // EOF makes the zygote kill its ranks and exit
  g_zygote_fd = -1;
  int st;
  ::waitpid(g_zygote_pid, &st, 0);
  g_zygote_pid = -1;
}

[[noreturn]] void rank_process_main(const RankRequest& req) {
  comm::trace_event("rank.start", req.rank);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
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
    std::fprintf(stderr, "[dtensor] rank %d: cannot connect to %s: %s\n", req.rank,
                 req.ctl_path.c_str(), std::strerror(errno));
    ::_exit(3);
  }
  write_line(ctl, {{"hello", req.rank}, {"pid", ::getpid()}});
  set_body_done_hook([ctl] { write_line(ctl, {{"body_done", true}}); });  // for the timeout report

  comm::GroupPtr group;
  std::string group_error;
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
    group = comm::C10dGroup::create(store, req.rank, req.world_size, go);
    // No barrier here: create() itself returns on no rank before every rank has finished its
    // connect (NOTE: [Group creation completes on every rank]). A Gloo barrier here added
    // ~1 ms per test, and a failure inside it (a peer already through it, through its body and
    // gone) would be filed as this rank failing to create its group: a primary failure of a
    // rank that did nothing wrong (DESIGN.md D12).
    comm::set_default_group(group);
  } catch (const std::exception& e) {
    auto* ce = dynamic_cast<const c10::Error*>(&e);
    group_error = ce ? ce->what_without_backtrace() : e.what();
  }
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
  if (!req.test_id.empty()) {
    RankResult res = run_one(req.test_id);
    std::cout.flush();
    std::fflush(nullptr);
    write_line(ctl, {{"result", res}});
    comm::trace_event("rank.exit", req.rank);
    // with_comms: the barrier ran in run_rank_body. The group is destroyed by the process's
    // exit: ~ProcessGroupGloo takes 20-40 ms per rank here, which would double the per-test
    // cost, and nothing can observe the difference once the rank is gone.
    ::_exit(res.failed() ? 1 : 0);
  }
  LineReader rd;
  RankResult res;       // of the last test
  std::string last_id;  // its name
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
      run_closing_barrier(last_id, group, *sink, res);
      std::cout.flush();
      std::fflush(nullptr);
      write_line(ctl, {{"result", res}});
      continue;
    }
    comm::trace_event("rank.run", req.rank);
    last_id = j.at("run").get<std::string>();
    res = run_one(last_id);
    can_close = barrier_on_demand && needs_closing_barrier(res, group);
    std::cout.flush();
    std::fflush(nullptr);
    write_line(ctl, {{"result", res}, {"close_pending", can_close}});
  }
}

// ---- RankSet -----------------------------------------------------------------------------------
struct LiveDir;  // NOTE: [Nothing left in TMPDIR]

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
  // (g_unawaited). Ranks without a result are waited for (their exit status is the report),
  // and so is every rank of a spawned set (this process reaps those itself).
  bool awaited(const Proc& p) const {
    return p.pid > 0 && !p.exited && (!p.result || mode == LaunchMode::kSpawn || !fork_server_running());
  }
  void kill_all() {
    for (int r = 0; r < n; ++r) kill_rank(r, SIGKILL);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      poll_exits();
      bool all = true;
      for (auto& p : procs) all = all && !awaited(p);
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));  // waiting for SIGKILL to land
    }
    for (auto& p : procs)
      if (p.pid > 0 && !p.exited && !awaited(p)) {
        p.exited = true;  // as far as this set is concerned
        auto it = g_zygote_exits.find(p.pid);
        if (it != g_zygote_exits.end()) g_zygote_exits.erase(it);
        else g_unawaited.insert(p.pid);
      }
  }
};

// NOTE: [Nothing left in TMPDIR]
// A rank set's directory (dtensor-ranks-<orchestrator pid>-XXXXXX: ctl.sock, rank<r>.log) is
// removed by ~RankSet. When the orchestrator is stopped by SIGTERM, SIGINT or SIGHUP (a ctest
// timeout, Ctrl-C), a handler removes the directories of the live rank sets (async-signal-safe:
// their file names are known) and then dies of the signal as it would have. Only the
// orchestrator creates files there (the rank logs too, before launching the rank): a rank still
// starting when the handler ran once created its log after the handler had removed it, and the
// directory stayed (seen under load). After a SIGKILL,
// the next rank set started in the same TMPDIR removes the directories of dead orchestrators.
// "Dead" includes a zombie: a killed orchestrator stays one until its parent waits for it
// (Boost.Process's terminate does not wait; some containers' init never does), and kill(pid, 0)
// succeeds on a zombie, which left such directories behind on some machines. It also includes
// a process that started after the directory was last written: the pid was reused.
// The live directories are a list the handler walks without a lock: nodes are pushed at its
// head with a compare-and-swap, published only once written (state kLive), and reused once
// free, never freed (the handler may run at any moment until the process ends), so the list
// is as long as the most rank sets ever live at once: any number, each cleaned up.
struct LiveDir {
  enum State : int { kFree, kWriting, kLive };
  std::atomic<int> state{kWriting};
  std::string path;
  int ranks = 0;
  LiveDir* next = nullptr;  // set before the node is published, then constant
};
namespace {
std::atomic<LiveDir*> g_live_dirs{nullptr};

void remove_dir_now(const char* dir, int ranks) {
  char f[600];
  std::snprintf(f, sizeof f, "%s/ctl.sock", dir);
  ::unlink(f);
  for (int r = 0; r < ranks; ++r) {
    std::snprintf(f, sizeof f, "%s/rank%d.log", dir, r);
    ::unlink(f);
  }
  ::rmdir(dir);
}

void on_stop_signal(int sig) {
  for (LiveDir* d = g_live_dirs.load(); d; d = d->next)
    if (d->state.load() == LiveDir::kLive) remove_dir_now(d->path.c_str(), d->ranks);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

LiveDir* register_live_dir(const std::string& path, int ranks) {
  static const bool installed = [] {
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
      struct sigaction prev {};
      ::sigaction(sig, nullptr, &prev);
      if (prev.sa_handler != SIG_DFL) continue;  // the program handles it itself
      struct sigaction sa {};
      sa.sa_handler = on_stop_signal;
      ::sigaction(sig, &sa, nullptr);
    }
    return true;
  }();
  (void)installed;
  LiveDir* d = nullptr;
  for (LiveDir* f = g_live_dirs.load(); f && !d; f = f->next) {
    int free = LiveDir::kFree;
    if (f->state.compare_exchange_strong(free, LiveDir::kWriting)) d = f;
  }
  if (!d) {
    d = new LiveDir();  // owned by the list for the rest of the process (above)
    d->next = g_live_dirs.load();
    while (!g_live_dirs.compare_exchange_weak(d->next, d)) {
    }
  }
  d->path = path;
  d->ranks = ranks;
  d->state.store(LiveDir::kLive);
  return d;
}

void unregister_live_dir(LiveDir* d) {
  if (d) d->state.store(LiveDir::kFree);
}

// True when no live process can own a rank-set directory named after `pid` and last written
// at `dir_mtime` (NOTE: [Nothing left in TMPDIR]): no such process, a zombie, or a process that
// started after that time (the pid was reused). Where /proc cannot tell, only ESRCH counts.
bool orchestrator_gone(pid_t pid, std::time_t dir_mtime) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  std::istringstream fields(stat.substr(paren + 2));
  std::string state;
  fields >> state;  // field 3
  if (state == "Z" || state == "X") return true;
  std::string field;
  for (int i = 4; i < 22 && (fields >> field); ++i) {
  }
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return false;  // field 22: start time, clock ticks after boot
  std::ifstream proc_stat("/proc/stat");
  std::string key;
  long long boot = -1;
  while (proc_stat >> key) {
    if (key == "btime") {
      proc_stat >> boot;
      break;
    }
  }
  const long ticks = ::sysconf(_SC_CLK_TCK);
  if (boot < 0 || ticks <= 0) return false;
  const long long started = boot + static_cast<long long>(start_ticks / static_cast<unsigned long long>(ticks));
  // A second of slack: btime and the tick count are whole seconds apart from the mtime.
  return started > static_cast<long long>(dir_mtime) + 1;
}

// Directories of orchestrators that no longer exist (killed by SIGKILL).
void remove_stale_dirs(const std::string& tmpdir) {
  std::error_code ec;
  for (fs::directory_iterator it(tmpdir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string prefix = "dtensor-ranks-";
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dash = name.find('-', prefix.size());
    if (dash == std::string::npos) continue;
    pid_t pid = 0;
    try {
      pid = static_cast<pid_t>(std::stol(name.substr(prefix.size(), dash - prefix.size())));
    } catch (const std::exception&) {
      continue;
    }
    struct stat st {};
    if (pid <= 0 || ::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (pid == ::getpid() || !orchestrator_gone(pid, st.st_mtime)) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
}
}  // namespace

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
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = timeout;
  compat::disable_libuv(so);
  store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
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
      write_line(g_zygote_fd, json(req));
      procs[r].pid = zygote_pump(/*want_pid=*/true, 10000);
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
  if (fork_server_running()) fds.push_back({g_zygote_fd, POLLIN, 0});
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
  if (fork_server_running()) zygote_pump(false, 0);
  for (auto& p : procs) {
    if (p.pid <= 0 || p.exited) continue;
    if (mode != LaunchMode::kSpawn && fork_server_running()) {
      auto it = g_zygote_exits.find(p.pid);
      if (it != g_zygote_exits.end()) {
        comm::trace_event("run.exited", static_cast<int>(&p - procs.data()));
        p.exited = true;
        p.status = it->second;
        g_zygote_exits.erase(it);
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

std::vector<RankOutcome> RankSet::run(const std::string& test_id, std::chrono::milliseconds timeout,
                                      std::string* stacks) {
  auto& I = *impl_;
  comm::trace_event("run.start");
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + timeout;
  std::vector<bool> sent(I.n, !I.pool);
  for (auto& p : I.procs) {
    p.result.reset();
    p.close_pending = false;
    p.body_done = false;
    std::error_code ec;
    p.log_offset = fs::exists(p.log_path, ec) ? fs::file_size(p.log_path, ec) : 0;
  }
  std::vector<RankOutcome> out(I.n);
  std::vector<bool> done(I.n, false);
  std::optional<std::chrono::steady_clock::time_point> first_abnormal;
  std::optional<std::chrono::steady_clock::time_point> first_close_pending;
  bool closing = false;  // the closing barrier was asked for
  bool timed_out = false;
  for (;;) {
    for (int r = 0; r < I.n; ++r) {
      auto& p = I.procs[r];
      if (I.pool && !sent[r] && p.fd >= 0) sent[r] = write_line(p.fd, {{"run", test_id}});
    }
    I.pump(kPollMs);
    const auto now = std::chrono::steady_clock::now();
    for (int r = 0; r < I.n; ++r) {
      auto& p = I.procs[r];
      if (done[r]) continue;
      // A one-shot fork-server rank is done once it reported (NOTE: [Reported ranks are not waited for]).
      const bool finished = p.result && (I.pool || p.exited || !I.awaited(p));
      if (finished || p.exited) {
        done[r] = true;
        const bool abnormal = !p.result || p.result->fatal() ||
                              (p.exited && !WIFEXITED(p.status));
        if (abnormal && !first_abnormal) first_abnormal = now;
      }
      // A one-shot rank that reported but does not exit is stuck in teardown.
      if (!done[r] && p.result && !I.pool && now - t0 > timeout + kExitGrace) done[r] = true;
    }
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
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
    if (I.pool && !closing && !first_abnormal) {
      bool pending = false;
      for (int r = 0; r < I.n; ++r) pending = pending || (done[r] && I.procs[r].close_pending);
      if (pending && !first_close_pending) first_close_pending = now;
      if (first_close_pending && now - *first_close_pending > kCloseDelay) closing = true;
    }
    if (closing) {
      for (int r = 0; r < I.n; ++r) {
        auto& p = I.procs[r];
        if (!p.result || !p.close_pending) continue;
        comm::trace_event("run.close", r);
        p.result.reset();
        p.close_pending = false;
        done[r] = false;
        write_line(p.fd, {{"close", true}});  // a rank gone meanwhile is reported by its exit
      }
    }
    if (first_abnormal && now - *first_abnormal > kAbortGrace) {
      for (int r = 0; r < I.n; ++r)
        if (!done[r]) {
          out[r].end = RankOutcome::End::kKilledAfterPeer;
          I.kill_rank(r, SIGKILL);
        }
      break;
    }
    if (now > deadline) {
      timed_out = true;
      for (int r = 0; r < I.n; ++r)
        if (!done[r]) I.kill_rank(r, SIGUSR1);
      const auto until = std::chrono::steady_clock::now() + kStackDumpWait;
      while (std::chrono::steady_clock::now() < until) I.pump(kPollMs);
      for (int r = 0; r < I.n; ++r)
        if (!done[r] && !I.procs[r].result) {
          out[r].end = RankOutcome::End::kTimedOut;
          I.kill_rank(r, SIGKILL);
        }
      break;
    }
  }
  // One-shot ranks exit right after reporting; collect their exit status.
  if (!I.pool) {
    const auto until = std::chrono::steady_clock::now() + kExitGrace;
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (auto& p : I.procs) all = all && !I.awaited(p);
      if (all) break;
      I.pump(kPollMs);
    }
    I.kill_all();
  }
  for (int r = 0; r < I.n; ++r) {
    auto& p = I.procs[r];
    auto& o = out[r];
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
    if (timed_out && stacks && o.end == RankOutcome::End::kTimedOut) {
      auto pos = o.output.find("[dtensor] stack of rank");
      if (pos != std::string::npos) *stacks += o.output.substr(pos);
      else *stacks += "[rank " + std::to_string(r) + "] (no stack: the rank did not answer)\n";
    }
    if (o.end != RankOutcome::End::kFinished || !o.result || o.result->failed()) I.healthy = false;
    if (I.pool && p.exited) I.healthy = false;
  }
  return out;
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
