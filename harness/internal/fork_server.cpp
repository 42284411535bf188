// harness/internal/fork_server.cpp: the fork server (zygote) that forks the rank processes,
// with its spare ranks (NOTE: [Spare ranks]).
#include "harness/internal/launch_io.h"
#include "harness/internal/timing.h"

#include "dtensor/comm/trace.h"

#include <c10/util/Exception.h>

#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

using nlohmann::json;

namespace dtensor {
namespace testing {
namespace internal {

namespace {

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

// What the zygote keeps between requests.
struct Zygote {
  int fd;                     // its socket to the orchestrator
  std::set<pid_t> kids;       // ranks handed out
  std::vector<Spare> spares;  // NOTE: [Spare ranks]
  std::string last_launch;    // ctl path of the last test launched (one per test)
  int launches = 0, max_world = 0;
  size_t want_spares = 0;
  bool launching = false;  // served rank r < world_size - 1 of a test: more requests follow
  bool spares_enabled = true;
};

// Reaps the children that exited: a spare is dropped, a rank's exit reported.
void reap_children(Zygote& z) {
  char drain[256];
  while (::read(g_chld_pipe[0], drain, sizeof drain) > 0) {
  }
  int st = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) {
    auto sp = std::find_if(z.spares.begin(), z.spares.end(), [&](const Spare& x) { return x.pid == pid; });
    if (sp != z.spares.end()) {  // a spare died before use (killed from outside)
      ::close(sp->fd);
      z.spares.erase(sp);
      continue;
    }
    z.kids.erase(pid);
    comm::trace_event("zygote.reaped");
    write_line(z.fd, {{"exit", pid}, {"status", st}});
  }
}

// The orchestrator is gone: take every rank with us.
[[noreturn]] void exit_with_ranks(const Zygote& z) {
  for (pid_t k : z.kids) {
    ::kill(-k, SIGKILL);
    ::kill(k, SIGKILL);
  }
  for (const auto& sp : z.spares) ::kill(sp.pid, SIGKILL);
  // Reaped here, not left to init (which, in some containers, never reaps).
  for (pid_t k : z.kids) ::waitpid(k, nullptr, 0);
  for (const auto& sp : z.spares) ::waitpid(sp.pid, nullptr, 0);
  ::_exit(0);
}

// Launches one rank (a spare when there is one) and answers with its pid.
void launch_rank(Zygote& z, const RankRequest& req) {
  comm::trace_event("zygote.request", req.rank);
  z.max_world = std::max(z.max_world, req.world_size);
  if (req.ctl_path != z.last_launch) {
    z.last_launch = req.ctl_path;
    if (++z.launches >= 2 && z.spares_enabled) z.want_spares = static_cast<size_t>(z.max_world);
  }
  pid_t pid = -1;
  while (pid < 0 && !z.spares.empty()) {
    Spare sp = z.spares.back();
    z.spares.pop_back();
    const bool sent = write_line(sp.fd, json(req));
    ::close(sp.fd);
    if (sent) pid = sp.pid;
  }
  if (pid < 0) {
    pid = ::fork();
    if (pid == 0) rank_process_main_in_zygote_child(z.fd, req);
  }
  if (pid > 0) z.kids.insert(pid);
  z.launching = req.rank + 1 < req.world_size;
  write_line(z.fd, {{"pid", pid}, {"errno", pid < 0 ? errno : 0}});
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
  Zygote z;
  z.fd = fd;
  const char* spares_env = std::getenv("DTENSOR_FORK_SPARES");
  z.spares_enabled = !(spares_env && std::string(spares_env) == "0");
  LineReader rd;
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {g_chld_pipe[0], POLLIN, 0}};
    // Spares are forked only while nothing is waiting.
    // ... and not in the middle of a launch (its next rank's request is on its way).
    const bool refill = z.spares.size() < z.want_spares && !z.launching;
    if (::poll(p, 2, refill ? 0 : -1) < 0) continue;
    if (p[1].revents) reap_children(z);
    if (p[0].revents) {
      if (rd.fill(fd) == 0) exit_with_ranks(z);
      std::string line;
      while (rd.next(line)) launch_rank(z, json::parse(line).get<RankRequest>());
    } else if (refill) {
      Spare sp = fork_spare(fd, z.spares);
      if (sp.pid > 0) z.spares.push_back(sp);
      else z.want_spares = 0;  // fork failed: no spares from now on
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

}  // namespace

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

int fork_server_fd() { return g_zygote_fd; }

pid_t fork_server_spawn(const RankRequest& req) {
  write_line(g_zygote_fd, json(req));
  return zygote_pump(/*want_pid=*/true, static_cast<int>(kSpawnReplyWait.count()));
}

void fork_server_pump() {
  if (fork_server_running()) zygote_pump(false, 0);
}

std::optional<int> take_rank_exit(pid_t pid) {
  auto it = g_zygote_exits.find(pid);
  if (it == g_zygote_exits.end()) return std::nullopt;
  const int status = it->second;
  g_zygote_exits.erase(it);
  return status;
}

void forget_rank(pid_t pid) {
  if (!take_rank_exit(pid)) g_unawaited.insert(pid);
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
