// harness/internal/external.cpp
//
// NOTE: [External ranks learn of failures through the store]
// Under torchrun/mpirun/srun there is no orchestrator to kill a rank's peers, so each rank
// watches its peers itself, out of band, through the job's TCPStore (hosted by rank 0; keys
// under "dtensor_ext/"), never through the process group (which may be stuck mid-collective):
//  - A rank whose body ends early (ASSERT, exception, skip) posts why under "t<k>/why" before
//    anything else. Every rank's watchdog thread polls that key while its test runs and aborts
//    its own pending collectives (NOTE: [Aborting waits]): they end with a CollectiveError,
//    classed as caused by the first failure. So a peer blocked in all_reduce is freed at once.
//  - The test's timeout (DTENSOR_TEST_TIMEOUT or the fixture's) is enforced by the watchdog:
//    at the deadline it aborts the rank's collectives; a rank still in its body kStuckGrace
//    later (blocked outside any collective) prints its stack, posts a result saying so, waits
//    until the test was reported, and leaves the job (exit 1).
//  - Results are exchanged through the store (t<k>/result/<rank>), not by a collective. A
//    rank that neither reports nor beats its heartbeat (hb/<rank>, every kHeartbeat) for
//    kDeadAfter is gone (crashed or killed, or its host is cut off).
//  - While a body runs, the watchdog also reads its peers' heartbeats (NOTE: [A peer lost
//    without a word]): one that stopped for kDeadAfter is gone, and the rank's collectives are
//    aborted naming it, instead of waiting for the test's timeout.
//  - The reporter is rank 0, or, when rank 0 is stuck or gone, the first surviving rank: when
//    the store (rank 0's) fails, rank 1 reports; a rank > 1 reports only when rank 1's backup
//    store (a TCPStore rank 1 hosts for this purpose) cannot be reached either.
//  - After a test in which a rank stopped early or was aborted, every rank replaces the
//    process group (the old one may hold a pending collective; it is leaked, never destroyed).
//    After a rank is stuck or gone the job cannot go on: the remaining tests are skipped,
//    naming why, and the program fails.
#include "harness/internal/external.h"

#include "dtensor/comm/abort.h"
#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/rendezvous.h"
#include "dtensor/compat.h"
#include "harness/internal/launcher.h"
#include "harness/internal/rank_run.h"
#include "harness/internal/timing.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

namespace dtensor {
namespace testing {
namespace internal {

namespace {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
const std::string kPrefix = "dtensor_ext/";

std::optional<comm::RendezvousInfo> g_info;
bool g_checked = false;
comm::GroupPtr g_group;
std::vector<comm::GroupPtr>* g_retired = new std::vector<comm::GroupPtr>();  // never destroyed
c10::intrusive_ptr<c10d::Store> g_store;     // the main thread's connection (rank 0: the server)
c10::intrusive_ptr<c10d::TCPStore> g_backup;  // rank 1: the backup store it hosts
std::string g_backup_host;
int g_backup_port = 0;
int g_generation = 0;
int g_test = 0;
std::string g_broken;  // non-empty: no further test can run, and why
int g_live = 0;         // ranks expected to check out at the end (not stuck, not gone)
bool g_rank_zero_gone = false;
bool g_joined = false;
std::string g_join_error;  // joining the job failed: the first test fails with this
std::string g_peers_failed_to_join;  // the peers whose join failed too (NOTE: [Who could not join])
comm::C10dGroupOptions g_group_options;

std::string err_text(const std::exception& e) {
  auto* ce = dynamic_cast<const c10::Error*>(&e);
  return ce ? ce->what_without_backtrace() : e.what();
}
std::string short_text(std::string s, size_t n = 300) {
  if (s.size() > n) s = s.substr(0, n) + "...";
  return s;
}
std::string bytes_str(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }
std::vector<uint8_t> str_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host, int port, milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  compat::disable_libuv(o);
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

// NOTE: [A peer lost without a word]
// A rank whose process dies closes its sockets: its peers' Gloo pairs fail at once. A rank whose
// host is cut off (a link down, a host frozen or SIGSTOPped) closes nothing: its peers' pairs
// wait for data that never comes, until the test's timeout or the group's. So while a body
// runs, each rank's watchdog reads its peers' heartbeats every kPeerCheck and, when one has
// not moved for kDeadAfter, aborts its own collectives naming that rank (stderr says so at
// once); the results then mark it gone without waiting again. On the far side of the cut, the
// lost rank's own watchdog sees the store stop answering and that rank reports alone, as when
// rank 0 dies. A store request (add, check, get) has no timeout of its own: in libtorch 1.13
// only a wait sets the socket's receive timeout (connect_watchdog_store arms it with one), and
// since 2.x a wait polls and leaves the socket without one, so a request to a store cut off
// blocks until TCP gives up, many minutes later. So a second thread, the monitor, watches the
// watchdog's requests: one unanswered for kStoreLostAfter marks the store lost and aborts this
// rank's collectives; the watchdog's thread, still blocked, is left behind at exit.

// A connection for the watchdog: every request on it fails after kStoreLostAfter without an
// answer.
c10::intrusive_ptr<c10d::TCPStore> connect_watchdog_store(const std::string& host, int port) {
  auto s = connect_store(host, port, kStoreLostAfter);
  s->add(kPrefix + "watchdogs", 1);
  s->wait({kPrefix + "watchdogs"}, kStoreLostAfter);  // sets the socket's receive timeout
  return s;
}

// The IPv4 address of the network interface `name` (GLOO_SOCKET_IFNAME, as PyTorch reads it).
std::string interface_address(const std::string& name) {
  TORCH_CHECK(name.find(',') == std::string::npos, "GLOO_SOCKET_IFNAME='", name,
              "': the harness binds Gloo to one interface; name one");
  ifaddrs* all = nullptr;
  TORCH_CHECK(::getifaddrs(&all) == 0, "GLOO_SOCKET_IFNAME='", name, "': getifaddrs failed: ", std::strerror(errno));
  std::string found, names;
  for (ifaddrs* a = all; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
    if (names.find(std::string(" ") + a->ifa_name + ",") == std::string::npos)
      names += std::string(" ") + a->ifa_name + ",";
    if (found.empty() && name == a->ifa_name) {
      char buf[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
    }
  }
  ::freeifaddrs(all);
  if (!names.empty()) names.pop_back();
  TORCH_CHECK(!found.empty(), "GLOO_SOCKET_IFNAME='", name, "': this host has no IPv4 interface of that name (it has:",
              names, ")");
  return found;
}

// The local address this host's packets to `host` leave from (its route's source): where the
// other ranks, which reach `host` too, can reach this one.
std::string source_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN] = {};
      if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf)) out = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

// The group's and the store's timeout: DTENSOR_TEST_TIMEOUT plus a margin when set (short
// test timeouts then bound every wait), else the collectives' default.
milliseconds group_timeout() {
  const std::string v = env_or("DTENSOR_TEST_TIMEOUT", "");
  try {
    const double s = v.empty() ? 0 : std::stod(v);
    if (s > 0) return milliseconds(static_cast<int64_t>(s * 1000)) + kGroupTimeoutMargin;
  } catch (const std::exception&) {
    // the tests report the malformed value (MultiRankTest::effective_timeout)
  }
  return comm::kDefaultCollectiveTimeout;
}

// ---- printing on one rank only, switchable -----------------------------------------------
class Switchable : public ::testing::TestEventListener {
 public:
  explicit Switchable(::testing::TestEventListener* inner) : inner_(inner) {}
  std::atomic<bool> on{false};
#define DTENSOR_FWD(name, T) \
  void name(T x) override {  \
    if (on) inner_->name(x); \
  }
  DTENSOR_FWD(OnTestProgramStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsSetUpStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsSetUpEnd, const ::testing::UnitTest&)
  DTENSOR_FWD(OnTestSuiteStart, const ::testing::TestSuite&)
  DTENSOR_FWD(OnTestStart, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestDisabled, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestPartResult, const ::testing::TestPartResult&)
  DTENSOR_FWD(OnTestEnd, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestSuiteEnd, const ::testing::TestSuite&)
  DTENSOR_FWD(OnEnvironmentsTearDownStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsTearDownEnd, const ::testing::UnitTest&)
  DTENSOR_FWD(OnTestProgramEnd, const ::testing::UnitTest&)
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  DTENSOR_FWD(OnTestCaseStart, const ::testing::TestCase&)
  DTENSOR_FWD(OnTestCaseEnd, const ::testing::TestCase&)
#endif
#undef DTENSOR_FWD
  void OnTestIterationStart(const ::testing::UnitTest& u, int i) override {
    if (on) inner_->OnTestIterationStart(u, i);
  }
  void OnTestIterationEnd(const ::testing::UnitTest& u, int i) override {
    if (on) inner_->OnTestIterationEnd(u, i);
  }

 private:
  std::unique_ptr<::testing::TestEventListener> inner_;
};
Switchable* g_printer = nullptr;
Switchable* g_xml = nullptr;

void start_reporting() {
  if (g_printer) g_printer->on = true;
  if (g_xml) g_xml->on = true;
}

// ---- the watchdog --------------------------------------------------------------------------
class Watchdog {
 public:
  void connect(c10::intrusive_ptr<c10d::Store> store) { store_ = std::move(store); }
  void start(int rank, int world_size) {
    rank_ = rank;
    n_ = world_size;
    beat_.assign(n_, -1);
    beat_at_.assign(n_, Clock::now());
    lost_.assign(n_, false);
    thread_ = std::thread([this] { loop(); });
    monitor_ = std::thread([this] { monitor(); });
  }
  void stop() {
    bool lost;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      lost = !store_lost_.empty();
    }
    cv_.notify_all();
    if (monitor_.joinable()) monitor_.join();
    if (!thread_.joinable()) return;
    if (lost) thread_.detach();  // may be blocked in a request to the lost store for good
    else thread_.join();
  }
  void begin(int test, const std::string& test_id, Clock::time_point deadline, milliseconds timeout) {
    std::lock_guard<std::mutex> lk(mu_);
    test_ = test;
    test_id_ = test_id;
    deadline_ = deadline;
    timeout_ = timeout;
    in_body_ = true;
    timed_out_ = false;
  }
  // The body returned; true when it was still running at the deadline.
  bool end() {
    std::unique_lock<std::mutex> lk(mu_);
    // A rank declared stuck has posted its result already and is leaving (loop()).
    cv_.wait(lk, [&] { return !stuck_; });
    in_body_ = false;
    test_ = -1;
    return timed_out_;
  }
  std::string store_lost() {
    std::lock_guard<std::mutex> lk(mu_);
    return store_lost_;
  }
  // The peers found gone while a body ran (NOTE: [A peer lost without a word]).
  std::vector<bool> lost() {
    std::lock_guard<std::mutex> lk(mu_);
    return lost_;
  }
  // The peers' heartbeats as last read during test `test`, and when each last moved; false
  // when none was read during that test.
  bool peer_beats(int test, std::vector<int64_t>* beat, std::vector<Clock::time_point>* at) {
    std::lock_guard<std::mutex> lk(mu_);
    if (baseline_test_ != test) return false;
    *beat = beat_;
    *at = beat_at_;
    return true;
  }

 private:
  void loop() {
    c10::intrusive_ptr<c10d::Store> store = store_;
    auto last_beat = Clock::now() - kHeartbeat;
    auto last_peer_check = Clock::now();
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, kExternalPoll);
      if (stop_) break;
      if (!store_lost_.empty()) continue;
      const int test = test_;
      const auto deadline = deadline_;
      const bool in_body = in_body_;
      asking_since_ = Clock::now();  // the monitor watches the requests below
      lk.unlock();
      try {
        const auto now = Clock::now();
        if (now - last_beat >= kHeartbeat) {
          store->add(kPrefix + "hb/" + std::to_string(rank_), 1);
          last_beat = now;
        }
        if (test >= 0) {
          const std::string pre = kPrefix + "t" + std::to_string(test) + "/";
          if (!comm::waits_aborted() && store->check({pre + "why"})) {
            const std::string why = bytes_str(store->get(pre + "why"));
            std::lock_guard<std::mutex> g(mu_);
            if (test_ == test) comm::abort_waits(why);  // not once the next test began
          }
          if (in_body && now - last_peer_check >= kPeerCheck) {
            last_peer_check = now;
            check_peers(*store, test, now);
          }
          if (in_body && now > deadline) on_deadline(*store, test, pre, now > deadline + kStuckGrace);
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu_);
        if (store_lost_.empty()) lose_store(short_text(err_text(e)));
      }
      lk.lock();
      asking_since_.reset();
    }
  }

  // NOTE: [A peer lost without a word]: a watchdog request unanswered for kStoreLostAfter.
  void monitor() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, kExternalPoll);
      if (stop_ || !store_lost_.empty() || !asking_since_) continue;
      if (Clock::now() - *asking_since_ > kStoreLostAfter)
        lose_store("no answer for " + std::to_string(kStoreLostAfter.count() / 1000) + " s");
    }
  }

  // mu_ held.
  void lose_store(const std::string& why) {
    store_lost_ = why;
    comm::abort_waits("rank 0 is gone (the connection to the job's store, which it hosts, failed: " + why + ")");
  }

  // NOTE: [A peer lost without a word]. Runs on the watchdog thread, mu_ not held.
  void check_peers(c10d::Store& store, int test, Clock::time_point now) {
    std::vector<int64_t> read(n_, -1);
    for (int r = 0; r < n_; ++r)
      if (r != rank_ && !lost_[r]) read[r] = store.add(kPrefix + "hb/" + std::to_string(r), 0);
    std::vector<int> newly;
    {
      // beat_ and beat_at_ are written by this thread only, under mu_ for peer_beats().
      std::lock_guard<std::mutex> g(mu_);
      if (test != baseline_test_) {  // a fresh baseline for every test
        baseline_test_ = test;
        std::fill(beat_.begin(), beat_.end(), -1);
        std::fill(beat_at_.begin(), beat_at_.end(), now);
      }
      for (int r = 0; r < n_; ++r) {
        if (r == rank_ || lost_[r]) continue;
        if (read[r] != beat_[r]) {
          beat_[r] = read[r];
          beat_at_[r] = now;
        } else if (now - beat_at_[r] > kDeadAfter) {
          newly.push_back(r);
        }
      }
    }
    if (newly.empty()) return;
    std::ostringstream why;
    why << (newly.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < newly.size(); ++i) why << (i ? "," : "") << newly[i];
    why << (newly.size() == 1 ? " is" : " are") << " gone: no heartbeat for " << kDeadAfter.count() / 1000
        << " s (crashed, killed, or cut off from the job's store)";
    std::lock_guard<std::mutex> g(mu_);
    if (test_ != test || !in_body_) return;
    for (int r : newly) lost_[r] = true;
    std::cerr << "[dtensor] rank " << rank_ << ": " << why.str() << "; ending this rank's collectives" << std::endl;
    if (!comm::waits_aborted()) comm::abort_waits(why.str());
  }

  void on_deadline(c10d::Store& store, int test, const std::string& pre, bool stuck) {
    std::string test_id;
    milliseconds timeout;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (test_ != test || !in_body_) return;
      timed_out_ = true;
      test_id = test_id_;
      timeout = timeout_;
      std::ostringstream secs;
      secs << timeout.count() / 1000.0;
      comm::abort_waits(test_id + " timed out after " + secs.str() + " s");
    }
    if (!stuck) return;
    // Still in the body kStuckGrace after its collectives were aborted: blocked elsewhere.
    {
      std::lock_guard<std::mutex> g(mu_);
      stuck_ = true;
    }
    ::kill(::getpid(), SIGUSR1);  // the test thread prints its stack (install_rank_signals)
    RankResult r;
    r.rank = rank_;
    r.parts.push_back({RankPart::Kind::kException, "", -1,
                       "still running the test body " + std::to_string(kStuckGrace.count() / 1000) +
                           " s after the timeout, outside any collective (its stack is on this "
                           "rank's stderr); this rank leaves the job"});
    nlohmann::json j = {{"result", r}, {"timed_out", true}, {"stuck", true}};
    try {
      store.set(pre + "result/" + std::to_string(rank_), str_bytes(j.dump()));
      const auto until = Clock::now() + kReportWait;
      while (Clock::now() < until && !store.check({pre + "reported"}))
        std::this_thread::sleep_for(kExternalPoll);  // waiting for the reporter (rank 0 hosts the store)
    } catch (const std::exception&) {
      // the store is gone: nothing left to wait for
    }
    std::cerr << "[dtensor] rank " << rank_ << ": stuck in " << test_id << " after its timeout; leaving the job"
              << std::endl;
    ::_exit(1);
  }

  int rank_ = -1;
  int n_ = 0;
  std::vector<int64_t> beat_;               // peers' heartbeats as last read (watchdog thread)
  std::vector<Clock::time_point> beat_at_;  // when each last moved
  std::vector<bool> lost_;                  // peers found gone (NOTE: [A peer lost without a word])
  int baseline_test_ = -1;                  // the test beat_ was read in
  c10::intrusive_ptr<c10d::Store> store_;  // its own connection to the job's store
  std::thread thread_;
  std::thread monitor_;
  std::optional<Clock::time_point> asking_since_;  // a store request in flight since (mu_)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int test_ = -1;
  std::string test_id_;
  Clock::time_point deadline_;
  milliseconds timeout_{0};
  bool in_body_ = false;
  bool timed_out_ = false;
  bool stuck_ = false;
  std::string store_lost_;
};
Watchdog* g_watchdog = nullptr;

// NOTE: [Rank 0 leaves group creation last]
// C10dGroup::create returns on a rank once every rank has arrived at its creation barrier,
// but a rank that arrived early may still be sending its wait for the barrier's gate when the
// last one, rank 0, goes on: rank 0 failing at once (a crash in its first test) then dies with
// that request unread, the kernel resets the connection, and the peer's join failed with
// "Connection reset by peer" (1 in 4 runs of HarnessReports.ExternalRankZeroDying*) instead of
// its first test reporting that rank 0 is gone. So after creating a group every rank > 0
// counts itself out (an add: its reply means the store has read everything the rank sent),
// the last one opens a gate (a set, which has no reply), and rank 0, which hosts the store,
// waits for that gate: once it goes on, no peer has a store request in flight.
void make_group() {
  const std::string gen = "dtensor_world_" + std::to_string(g_generation);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(gen, g_store);
  g_group = comm::C10dGroup::create(prefixed, g_info->rank, g_info->world_size, g_group_options);
  const int n = g_info->world_size;
  if (n > 1) {
    const std::string gate = kPrefix + gen + "/all_out";
    if (g_info->rank > 0 && g_store->add(kPrefix + gen + "/out", 1) == n - 1) g_store->set(gate, str_bytes("1"));
    if (g_info->rank == 0) g_store->wait({gate}, g_group_options.timeout);
  }
  comm::set_default_group(g_group);
}

// Whether rank 0, which hosts the job's store, still answers (a new connection and one round
// trip; a failed join is then reported as rank 0 being gone, like a failure in a test).
bool rank_zero_answers() {
  try {
    auto s = connect_store(g_info->master_addr, g_info->master_port, kStoreProbeTimeout);
    s->add(kPrefix + "probe", 1);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// NOTE: [Who could not join]
// Each rank says in the job's store that it arrived and, when its join fails before the
// group's timeout, why. A rank whose join fails at once (its Gloo connect to a peer finds no
// route, its hostname does not resolve) leaves its peers waiting in the group's creation for
// it until that timeout; they then read the store and name it, with its reason, instead of
// saying only "Socket Timeout". The peers that waited out the timeout with them are not named;
// a rank that never reached the store is. Best effort: the store may be gone.
std::string peers_that_could_not_join() {
  constexpr int kMaxNamed = 8;
  std::string out;
  int named = 0, more = 0;
  try {
    for (int r = 0; r < g_info->world_size && g_store; ++r) {
      if (r == g_info->rank) continue;
      const std::string failed = kPrefix + "join_failed/" + std::to_string(r);
      std::string what;
      if (g_store->check({failed})) {
        what = "rank " + std::to_string(r) + " could not join: " + bytes_str(g_store->get(failed));
      } else if (!g_store->check({kPrefix + "arrived/" + std::to_string(r)})) {
        what = "rank " + std::to_string(r) + " never reached the job's store";
      }
      if (what.empty()) continue;
      if (named++ < kMaxNamed) out += (out.empty() ? "" : "; ") + what;
      else ++more;
    }
  } catch (const std::exception&) {
    // the store is gone too: this rank's own error says what failed
  }
  if (more > 0) out += "; " + std::to_string(more) + " more ranks could not join";
  return out;
}

// A rank other than 0 decides whether it reports in rank 0's place (rank 0 is gone).
bool i_report_for_rank_zero() {
  if (g_info->rank == 1) return true;
  if (g_backup_port <= 0) return true;
  try {
    auto s = connect_store(g_backup_host, g_backup_port, kStoreProbeTimeout);
    s->add(kPrefix + "alive", 1);
    return false;  // rank 1 is alive and reports
  } catch (const std::exception&) {
    return true;  // rank 1 is gone too: every surviving rank reports
  }
}
}  // namespace

bool external_launcher_detected() {
  if (!g_checked) {
    g_checked = true;
    g_info = comm::rendezvous_from_env();
  }
  return g_info.has_value();
}

bool external_launcher_active() { return g_joined; }

void init_external_launcher() {
  if (!external_launcher_detected()) return;
  const auto& info = *g_info;
  g_joined = true;  // tests run as this rank from now on, even if joining fails below
  std::cerr << "dtensor: rendezvous from " << info.source << ": rank " << info.rank << " of "
            << info.world_size << " (local rank " << info.local_rank << "), master " << info.master_addr
            << ":" << info.master_port << std::endl;
  g_group_options.backend = env_or("DTENSOR_BACKEND", "gloo");
  g_group_options.timeout = group_timeout();
  install_rank_signals(info.rank);
  g_watchdog = new Watchdog();
  const auto join_start = Clock::now();
  try {
    // Gloo binds to the interface named by GLOO_SOCKET_IFNAME, as under PyTorch (a host with
    // several, or whose hostname does not resolve to the one the job uses).
    const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
    if (!ifname.empty()) g_group_options.gloo_hostname = interface_address(ifname);
    g_store = comm::make_tcp_store(info.master_addr, info.master_port, info.rank, info.world_size,
                                   g_group_options.timeout);
    g_store->set(kPrefix + "arrived/" + std::to_string(info.rank), str_bytes("1"));  // NOTE: [Who could not join]
    // Everything that needs every rank alive happens before the group's creation, which no
    // rank leaves before all have arrived: a rank 0 failing in its first test cannot stop a
    // peer still joining.
    g_watchdog->connect(connect_watchdog_store(info.master_addr, info.master_port));
    if (info.world_size > 1) {
      if (info.rank == 1) {
        c10d::TCPStoreOptions o;
        o.port = 0;
        o.isServer = true;
        o.waitWorkers = false;
        o.timeout = kBackupStoreTimeout;
        compat::disable_libuv(o);
        // The address the peers reach this host at: the one it reaches the master from (the
        // hostname may resolve to another interface, or to nothing the peers can reach).
        const std::string host = g_group_options.gloo_hostname.empty()
                                     ? source_address_towards(info.master_addr, info.master_port)
                                     : g_group_options.gloo_hostname;
        g_backup = c10::make_intrusive<c10d::TCPStore>(host, o);
        g_store->set(kPrefix + "backup", str_bytes(std::string(host) + " " + std::to_string(g_backup->getPort())));
      }
      const std::string b = bytes_str(g_store->get(kPrefix + "backup"));
      g_backup_host = b.substr(0, b.find(' '));
      g_backup_port = std::stoi(b.substr(b.find(' ') + 1));
    }
    make_group();
  } catch (const std::exception& e) {
    // Reported as the first test's failure (run_external), by this rank when rank 0 is gone.
    const std::string why = short_text(err_text(e));
    g_join_error = "joining the job (" + info.source + ", master " + info.master_addr + ":" +
                   std::to_string(info.master_port) + ") failed: " + why;
    // A rank whose join waited out the group's timeout waited for another: it is not named.
    const bool waited_out = Clock::now() - join_start >= g_group_options.timeout * 9 / 10;
    if (g_store && !waited_out) {
      try {
        g_store->set(kPrefix + "join_failed/" + std::to_string(info.rank), str_bytes(why));
      } catch (const std::exception&) {
        // the store is gone as well: the peers report that
      }
    }
    if (info.rank > 0 && !rank_zero_answers()) {
      g_rank_zero_gone = true;
      g_join_error = "rank 0 is gone (it no longer answers at " + info.master_addr + ":" +
                     std::to_string(info.master_port) + ", the job's store it hosts): " + g_join_error;
    } else {
      g_peers_failed_to_join = peers_that_could_not_join();
      if (!g_peers_failed_to_join.empty()) g_join_error += " (" + g_peers_failed_to_join + ")";
    }
    g_broken = g_join_error;
    std::cerr << "[dtensor] rank " << info.rank << ": " << g_join_error << std::endl;
  }
  comm::set_waits_abortable(true);
  if (g_join_error.empty()) g_watchdog->start(info.rank, info.world_size);
  // Every rank records the results; only the reporter (rank 0, NOTE above) prints them.
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (auto* p = listeners.default_result_printer()) listeners.Append(g_printer = new Switchable(listeners.Release(p)));
  if (auto* x = listeners.default_xml_generator()) listeners.Append(g_xml = new Switchable(listeners.Release(x)));
  if (info.rank == 0 || (!g_join_error.empty() && i_report_for_rank_zero())) start_reporting();
}

void run_external(const std::string& test_id, std::chrono::milliseconds timeout) {
  if (!g_join_error.empty() && g_test++ == 0) {
    ADD_FAILURE() << "[rank " << g_info->rank << "] " << g_join_error
                  << (g_info->rank == 0 || g_rank_zero_gone || !g_peers_failed_to_join.empty() ? ""
                                                            : " (rank 0, which hosts the job's store, answers: "
                                                              "this rank's own connection failed)");
    return;
  }
  if (!g_broken.empty()) GTEST_SKIP() << "not run: " << g_broken;
  const int me = g_group->rank(), n = g_group->size();
  const int k = g_test++;
  const std::string pre = kPrefix + "t" + std::to_string(k) + "/";
  const auto t0 = Clock::now();
  comm::clear_aborted_waits();
  g_watchdog->begin(k, test_id, t0 + timeout, timeout);
  RankResult mine;
  bool body_done = false;
  {
    auto sink = std::make_shared<RankSink>();
    RankCapture capture(sink);
    set_body_done_hook([&body_done] { body_done = true; });
    mine = run_rank_body(test_id, me, g_group, *sink);
    set_body_done_hook(nullptr);
  }
  const bool timed_out = g_watchdog->end();
  const bool aborted = comm::waits_aborted().has_value();

  std::vector<RankOutcome> outcomes(n);
  std::vector<bool> stuck(n, false), gone(n, false);
  const std::vector<bool> lost = g_watchdog->lost();  // NOTE: [A peer lost without a word]
  try {
    // Cut off from the store: reporting through it would wait for its timeout.
    const std::string store_lost = g_watchdog->store_lost();
    if (!store_lost.empty()) throw std::runtime_error(store_lost);
    if (mine.fatal() && g_store->add(pre + "nwhy", 1) == 1) {
      std::string why;
      for (auto& p : mine.parts)
        if (p.kind != RankPart::Kind::kFailure) {
          why = (p.kind == RankPart::Kind::kSkip ? "skipped: " : "failed: ") + short_text(p.message, 200);
          break;
        }
      g_store->set(pre + "why", str_bytes("rank " + std::to_string(me) + " " + why));
    }
    g_store->set(pre + "result/" + std::to_string(me),
                 str_bytes(nlohmann::json({{"result", mine}, {"timed_out", timed_out}, {"stuck", false},
                                           {"body_done", body_done}}).dump()));
    // Everyone's result, or its absence: stuck ranks post theirs kStuckGrace after the
    // deadline; a rank whose heartbeat stops for kDeadAfter is gone.
    std::vector<bool> have(n, false);
    std::vector<int64_t> beat(n, -1);
    std::vector<Clock::time_point> beat_at(n, Clock::now());
    // Go on from the watchdog's reading during the body: a peer it saw stop is not given
    // kDeadAfter anew (its body may have ended by a peer's failure first).
    g_watchdog->peer_beats(k, &beat, &beat_at);
    const auto give_up = t0 + timeout + kStuckGrace + kReportWait / 2;
    for (;;) {
      bool all = true;
      for (int r = 0; r < n; ++r) {
        if (have[r] || gone[r]) continue;
        const std::string key = pre + "result/" + std::to_string(r);
        if (g_store->check({key})) {
          auto j = nlohmann::json::parse(bytes_str(g_store->get(key)));
          outcomes[r].result = j.at("result").get<RankResult>();
          if (j.value("timed_out", false)) outcomes[r].end = RankOutcome::End::kTimedOut;
          outcomes[r].body_done = j.value("body_done", false);
          stuck[r] = j.value("stuck", false);
          have[r] = true;
          continue;
        }
        const int64_t b = g_store->add(kPrefix + "hb/" + std::to_string(r), 0);
        const auto now = Clock::now();
        if (b != beat[r]) {
          beat[r] = b;
          beat_at[r] = now;
        } else if (lost[r] || now - beat_at[r] > kDeadAfter || now > give_up) {
          gone[r] = true;
          continue;
        }
        all = false;
      }
      if (all) break;
      std::this_thread::sleep_for(kExternalPoll);  // polling the store (the group may be unusable)
    }
  } catch (const std::exception& e) {
    // The store is gone: rank 0, which hosts it, died (NOTE above).
    const std::string lost = short_text(err_text(e));
    g_broken = "rank 0 is gone (the connection to the job's store, which it hosts, failed: " + lost + ")";
    g_rank_zero_gone = true;
    if (i_report_for_rank_zero()) start_reporting();
    ADD_FAILURE() << "[rank " << me << "] " << g_broken << " during " << test_id << "; rank " << me
                  << " reports in its place, with its own result";
    RankOutcome o;
    o.rank = me;
    o.result = mine;
    if (timed_out) o.end = RankOutcome::End::kTimedOut;
    o.body_done = body_done;
    report_outcomes(test_id, {o}, timeout, "");
    return;
  }
  for (int r = 0; r < n; ++r) {
    outcomes[r].rank = r;
    if (gone[r] && !lost[r])  // each survivor says so (the watchdog did for those it found)
      std::cerr << "[dtensor] rank " << me << ": rank " << r << " is gone: it posted no result for " << test_id
                << " and its heartbeat stopped" << std::endl;
    if (gone[r]) {
      RankResult gr;
      gr.rank = r;
      gr.parts.push_back({RankPart::Kind::kException, "", -1,
                          "rank " + std::to_string(r) +
                              " is gone: it posted no result and its heartbeat stopped (crashed, killed, or cut off from "
                              "the job's store)"});
      outcomes[r].result = gr;
    }
  }
  int reporter = -1;
  for (int r = 0; r < n && reporter < 0; ++r)
    if (!stuck[r] && !gone[r]) reporter = r;
  if (reporter == me) start_reporting();
  report_outcomes(test_id, outcomes, timeout, "");
  if (reporter == me) {
    try {
      g_store->set(pre + "reported", str_bytes("1"));
    } catch (const std::exception&) {
    }
  }
  g_live = 0;
  for (int r = 0; r < n; ++r) g_live += !stuck[r] && !gone[r];
  for (int r = 0; r < n; ++r)
    if (stuck[r] || gone[r]) {
      g_broken = "rank " + std::to_string(r) + (stuck[r] ? " is stuck in " : " left the job during ") +
                 test_id + (stuck[r] ? " (after its timeout)" : "");
      return;
    }
  bool replace = aborted || timed_out;
  for (auto& o : outcomes) replace = replace || (o.result && o.result->fatal()) || o.end != RankOutcome::End::kFinished;
  if (replace) {
    // The old group may hold a pending collective: keep it alive, never use it again.
    g_retired->push_back(g_group);
    ++g_generation;
    try {
      make_group();
    } catch (const std::exception& e) {
      g_broken = "replacing the process group after " + test_id + " failed: " + short_text(err_text(e));
      ADD_FAILURE() << "[rank " << me << "] " << g_broken;
    }
  }
}

namespace {
// NOTE: [Who could not join]: the peers read the store rank 0 hosts when their own join fails
// (whether rank 0 answers, who failed and why), at about the moment rank 0's does. So after a
// failed join each peer checks out, and rank 0 leaves once every peer that reached the store
// has (at most kReportWait): leaving at once, it made a peer take it for gone.
void wait_for_join_reports(int me, int n) {
  const std::string key = kPrefix + "join_checked_out";
  try {
    if (me > 0) {
      g_store->add(key, 1);
      return;
    }
    int arrived = 0;
    for (int r = 1; r < n; ++r) arrived += g_store->check({kPrefix + "arrived/" + std::to_string(r)}) ? 1 : 0;
    const auto until = Clock::now() + kReportWait;
    while (Clock::now() < until && g_store->add(key, 0) < arrived)
      std::this_thread::sleep_for(kExternalPoll);  // polling the store rank 0 itself hosts
  } catch (const std::exception&) {
    // the store is gone: nothing to wait for
  }
}
}  // namespace

void shutdown_external() {
  if (g_watchdog) g_watchdog->stop();
  if (!g_joined) return;
  const int me = g_info->rank, n = g_info->world_size;
  if (g_live == 0) g_live = n;
  try {
    if (g_rank_zero_gone && me == 1 && g_backup) {
      // The others ask whether rank 1 lives (i_report_for_rank_zero): stay until they did.
      const auto until = Clock::now() + kDeadAfter;
      while (Clock::now() < until && g_backup->add(kPrefix + "alive", 0) < n - 2)
        std::this_thread::sleep_for(kExternalPoll);
    }
  } catch (const std::exception&) {
  }
  if (!g_join_error.empty() && g_store && !g_rank_zero_gone) wait_for_join_reports(me, n);
  if (!g_group) return;
  try {
    if (!g_rank_zero_gone) {
      // Rank 0 hosts the store: it leaves last, once every rank that can has checked out.
      g_store->add(kPrefix + "done", 1);
      if (me == 0) {
        const auto until = Clock::now() + kReportWait;
        while (Clock::now() < until && g_store->add(kPrefix + "done", 0) < g_live)
          std::this_thread::sleep_for(kExternalPoll);
      }
    }
  } catch (const std::exception&) {
  }
  if (g_broken.empty() && !comm::waits_aborted()) {
    comm::destroy_process_group();
    g_group.reset();
  } else {
    g_retired->push_back(g_group);  // may hold a pending collective: never destroyed
    comm::set_default_group(nullptr);
  }
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
