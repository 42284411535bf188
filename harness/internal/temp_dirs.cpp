// harness/internal/temp_dirs.cpp: the directories of rank sets, removed however the
// orchestrator ends (NOTE: [Nothing left in TMPDIR]).
#include "harness/internal/launch_io.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace fs = std::filesystem;

namespace dtensor {
namespace testing {
namespace internal {

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

}  // namespace

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

namespace {

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

}  // namespace

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
}  // namespace internal
}  // namespace testing
}  // namespace dtensor
