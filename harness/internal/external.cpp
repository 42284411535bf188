// harness/internal/external.cpp: the job (ExternalJob) a rank runs its tests in under an external
// launcher: joining it, one test's run and report, leaving it. The store's helpers are in
// external_store.cpp, the watchdog in watchdog.cpp.
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
#include "dtensor/utils/no_destructor_internal.h"
#include "harness/internal/external_store.h"
#include "harness/internal/launcher.h"
#include "harness/internal/rank_run.h"
#include "harness/internal/switchable_listener.h"
#include "harness/internal/timing.h"
#include "harness/internal/watchdog.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

namespace dtensor {
namespace testing {
namespace internal {

namespace {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
const std::string& kPrefix = kExternalPrefix;

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

// NOTE: [The external job is never destroyed]
// The job holds process groups it retired after a failed test (each may hold a collective
// pending on a dead peer: destroying it would block in Gloo's destructor) and the watchdog
// (whose thread may be blocked for good in a request to a store that is gone). Neither may be
// destroyed at exit, so the one ExternalJob lives in a utils::NoDestructor.
// What one test's run on this rank produced (ExternalJob::run).
struct TestRun {
  std::string test_id;
  milliseconds timeout{0};
  int k = 0;                // the test's number in the job
  std::string pre;          // its keys' prefix in the store
  Clock::time_point t0;
  RankResult mine;
  bool body_done = false;
  bool timed_out = false;
  bool aborted = false;
};

// Every rank's outcome of a test, as read from the store.
struct Gathered {
  explicit Gathered(int n) : outcomes(n), stuck(n, false), gone(n, false) {}
  std::vector<RankOutcome> outcomes;
  std::vector<bool> stuck, gone, lost;
};

// The job this process is one rank of (NOTE: [External ranks learn of failures through the store]).
class ExternalJob {
 public:
  bool detected();
  bool joined() const { return joined_; }
  void init();
  void run(const std::string& test_id, milliseconds timeout);
  void shutdown();

 private:
  void check_out();
  void join(const comm::RendezvousInfo& info);
  void host_backup_store(const comm::RendezvousInfo& info);
  void join_failed(const comm::RendezvousInfo& info, const std::exception& e, Clock::time_point join_start);
  void make_group();
  bool rank_zero_answers();
  std::string peers_that_could_not_join();
  bool i_report_for_rank_zero();
  void start_reporting();
  TestRun run_body(const std::string& test_id, milliseconds timeout);
  void post_result(const TestRun& t);
  void gather_results(const TestRun& t, Gathered& g);
  void report_alone(const TestRun& t, const std::exception& e);
  void report(const TestRun& t, Gathered& g);
  void after_test(const TestRun& t, const Gathered& g);
  void wait_for_join_reports(int me, int n);

  std::optional<comm::RendezvousInfo> info_;
  bool checked_ = false;
  comm::GroupPtr group_;
  std::vector<comm::GroupPtr> retired_;        // NOTE: [The external job is never destroyed]
  c10::intrusive_ptr<c10d::Store> store_;      // the main thread's connection
  c10::intrusive_ptr<c10d::Store> server_;     // rank 0: the job's store (NOTE: [Rank 0 stops its store before it exits])
  c10::intrusive_ptr<c10d::TCPStore> backup_;  // rank 1: the backup store it hosts
  std::string backup_host_;
  int backup_port_ = 0;
  int generation_ = 0;
  int test_ = 0;
  std::string broken_;  // non-empty: no further test can run, and why
  int live_ = 0;        // ranks expected to check out at the end (not stuck, not gone)
  bool checked_out_ = false;  // rank 0: every rank checked out at the end
  bool rank_zero_gone_ = false;
  bool joined_ = false;
  std::string join_error_;             // joining the job failed: the first test fails with this
  std::string peers_failed_to_join_;  // the peers whose join failed too (NOTE: [Who could not join])
  comm::C10dGroupOptions group_options_;
  Watchdog watchdog_;
  // gtest's listeners own them; rank 0 (or who reports in its place) switches them on.
  SwitchableListener* printer_ = nullptr;
  SwitchableListener* xml_ = nullptr;
};

ExternalJob& job() {
  static dtensor::utils::NoDestructor<ExternalJob> the_job;
  return the_job.get();
}

void ExternalJob::start_reporting() {
  if (printer_) printer_->on = true;
  if (xml_) xml_->on = true;
}

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
void ExternalJob::make_group() {
  const std::string gen = "dtensor_world_" + std::to_string(generation_);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(gen, store_);
  group_ = comm::C10dGroup::create(prefixed, info_->rank, info_->world_size, group_options_);
  const int n = info_->world_size;
  if (n > 1) {
    const std::string gate = kPrefix + gen + "/all_out";
    if (info_->rank > 0 && store_->add(kPrefix + gen + "/out", 1) == n - 1) store_->set(gate, str_bytes("1"));
    if (info_->rank == 0) store_->wait({gate}, group_options_.timeout);
  }
  comm::set_default_group(group_);
}

// Whether rank 0, which hosts the job's store, still answers (a new connection and one round
// trip; a failed join is then reported as rank 0 being gone, like a failure in a test).
bool ExternalJob::rank_zero_answers() {
  try {
    auto s = connect_store(info_->master_addr, info_->master_port, kStoreProbeTimeout);
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
std::string ExternalJob::peers_that_could_not_join() {
  constexpr int kMaxNamed = 8;
  std::string out;
  int named = 0, more = 0;
  try {
    for (int r = 0; r < info_->world_size && store_; ++r) {
      if (r == info_->rank) continue;
      const std::string failed = kPrefix + "join_failed/" + std::to_string(r);
      std::string what;
      if (store_->check({failed})) {
        what = "rank " + std::to_string(r) + " could not join: " + bytes_str(store_->get(failed));
      } else if (!store_->check({kPrefix + "arrived/" + std::to_string(r)})) {
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
bool ExternalJob::i_report_for_rank_zero() {
  if (info_->rank == 1) return true;
  if (backup_port_ <= 0) return true;
  try {
    auto s = connect_store(backup_host_, backup_port_, kStoreProbeTimeout);
    s->add(kPrefix + "alive", 1);
    return false;  // rank 1 is alive and reports
  } catch (const std::exception&) {
    return true;  // rank 1 is gone too: every surviving rank reports
  }
}
// NOTE: [Who could not join]: the peers read the store rank 0 hosts when their own join fails
// (whether rank 0 answers, who failed and why), at about the moment rank 0's does. So after a
// failed join each peer checks out, and rank 0 leaves once every peer that reached the store
// has (at most kReportWait): leaving at once, it made a peer take it for gone.
void ExternalJob::wait_for_join_reports(int me, int n) {
  const std::string key = kPrefix + "join_checked_out";
  try {
    if (me > 0) {
      store_->add(key, 1);
      return;
    }
    int arrived = 0;
    for (int r = 1; r < n; ++r) arrived += store_->check({kPrefix + "arrived/" + std::to_string(r)}) ? 1 : 0;
    const auto until = Clock::now() + kReportWait;
    while (Clock::now() < until && store_->add(key, 0) < arrived)
      std::this_thread::sleep_for(kExternalPoll);  // polling the store rank 0 itself hosts
  } catch (const std::exception&) {
    // the store is gone: nothing to wait for
  }
}

bool ExternalJob::detected() {
  if (!checked_) {
    checked_ = true;
    info_ = comm::rendezvous_from_env();
  }
  return info_.has_value();
}

void ExternalJob::init() {
  if (!detected()) return;
  const auto& info = *info_;
  joined_ = true;  // tests run as this rank from now on, even if joining fails below
  std::cerr << "dtensor: rendezvous from " << info.source << ": rank " << info.rank << " of "
            << info.world_size << " (local rank " << info.local_rank << "), master " << info.master_addr
            << ":" << info.master_port << std::endl;
  group_options_.backend = env_or("DTENSOR_BACKEND", "gloo");
  group_options_.timeout = group_timeout();
  install_rank_signals(info.rank);
  const auto join_start = Clock::now();
  try {
    join(info);
  } catch (const std::exception& e) {
    join_failed(info, e, join_start);
  }
  comm::set_waits_abortable(true);
  if (join_error_.empty()) watchdog_.start(info.rank, info.world_size);
  // Every rank records the results; only the reporter (rank 0, NOTE above) prints them.
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (auto* p = listeners.default_result_printer()) listeners.Append(printer_ = new SwitchableListener(listeners.Release(p)));
  if (auto* x = listeners.default_xml_generator()) listeners.Append(xml_ = new SwitchableListener(listeners.Release(x)));
  if (info.rank == 0 || (!join_error_.empty() && i_report_for_rank_zero())) start_reporting();
}

void ExternalJob::join(const comm::RendezvousInfo& info) {
  // Gloo binds to the interface named by GLOO_SOCKET_IFNAME, as under PyTorch (a host with
  // several, or whose hostname does not resolve to the one the job uses).
  const std::string ifname = env_or("GLOO_SOCKET_IFNAME", "");
  if (!ifname.empty()) group_options_.gloo_hostname = interface_address(ifname);
  if (info.rank == 0)
    server_ = comm::make_tcp_store(info.master_addr, info.master_port, 0, info.world_size, group_options_.timeout);
  store_ = connect_store(info.master_addr, info.master_port, group_options_.timeout);
  store_->set(kPrefix + "arrived/" + std::to_string(info.rank), str_bytes("1"));  // NOTE: [Who could not join]
  // Everything that needs every rank alive happens before the group's creation, which no
  // rank leaves before all have arrived: a rank 0 failing in its first test cannot stop a
  // peer still joining.
  watchdog_.connect(connect_watchdog_store(info.master_addr, info.master_port));
  if (info.world_size > 1) {
    if (info.rank == 1) host_backup_store(info);
    const std::string b = bytes_str(store_->get(kPrefix + "backup"));
    backup_host_ = b.substr(0, b.find(' '));
    backup_port_ = std::stoi(b.substr(b.find(' ') + 1));
  }
  make_group();
}

void ExternalJob::host_backup_store(const comm::RendezvousInfo& info) {
  // The address the peers reach this host at: the one it reaches the master from (the
  // hostname may resolve to another interface, or to nothing the peers can reach).
  const std::string host = group_options_.gloo_hostname.empty() ? source_address_towards(info.master_addr, info.master_port)
                                                                 : group_options_.gloo_hostname;
  backup_ = host_store(host, kBackupStoreTimeout);
  store_->set(kPrefix + "backup", str_bytes(std::string(host) + " " + std::to_string(backup_->getPort())));
}

// Reported as the first test's failure (run), by this rank when rank 0 is gone.
void ExternalJob::join_failed(const comm::RendezvousInfo& info, const std::exception& e, Clock::time_point join_start) {
  const std::string why = short_text(err_text(e));
  join_error_ = "joining the job (" + info.source + ", master " + info.master_addr + ":" +
                std::to_string(info.master_port) + ") failed: " + why;
  // A rank whose join waited out the group's timeout waited for another: it is not named.
  const bool waited_out = Clock::now() - join_start >= group_options_.timeout * 9 / 10;
  if (store_ && !waited_out) {
    try {
      store_->set(kPrefix + "join_failed/" + std::to_string(info.rank), str_bytes(why));
    } catch (const std::exception&) {
      // the store is gone as well: the peers report that
    }
  }
  if (info.rank > 0 && !rank_zero_answers()) {
    rank_zero_gone_ = true;
    join_error_ = "rank 0 is gone (it no longer answers at " + info.master_addr + ":" +
                  std::to_string(info.master_port) + ", the job's store it hosts): " + join_error_;
  } else {
    peers_failed_to_join_ = peers_that_could_not_join();
    if (!peers_failed_to_join_.empty()) join_error_ += " (" + peers_failed_to_join_ + ")";
  }
  broken_ = join_error_;
  std::cerr << "[dtensor] rank " << info.rank << ": " << join_error_ << std::endl;
}

void ExternalJob::run(const std::string& test_id, milliseconds timeout) {
  if (!join_error_.empty() && test_++ == 0) {
    ADD_FAILURE() << "[rank " << info_->rank << "] " << join_error_
                  << (info_->rank == 0 || rank_zero_gone_ || !peers_failed_to_join_.empty()
                          ? ""
                          : " (rank 0, which hosts the job's store, answers: this rank's own connection failed)");
    return;
  }
  if (!broken_.empty()) GTEST_SKIP() << "not run: " << broken_;
  const TestRun t = run_body(test_id, timeout);
  Gathered g(group_->size());
  g.lost = watchdog_.lost();  // NOTE: [A peer lost without a word]
  try {
    // Cut off from the store: reporting through it would wait for its timeout.
    const std::string store_lost = watchdog_.store_lost();
    if (!store_lost.empty()) throw std::runtime_error(store_lost);
    post_result(t);
    gather_results(t, g);
  } catch (const std::exception& e) {
    report_alone(t, e);
    return;
  }
  report(t, g);
  after_test(t, g);
}

TestRun ExternalJob::run_body(const std::string& test_id, milliseconds timeout) {
  TestRun t;
  t.test_id = test_id;
  t.timeout = timeout;
  t.k = test_++;
  t.pre = kPrefix + "t" + std::to_string(t.k) + "/";
  t.t0 = Clock::now();
  comm::clear_aborted_waits();
  watchdog_.begin(t.k, test_id, t.t0 + timeout, timeout);
  {
    auto sink = std::make_shared<RankSink>();
    RankCapture capture(sink);
    bool& body_done = t.body_done;
    set_body_done_hook([&body_done] { body_done = true; });
    t.mine = run_rank_body(test_id, group_->rank(), group_, *sink);
    set_body_done_hook(nullptr);
  }
  t.timed_out = watchdog_.end();
  t.aborted = comm::waits_aborted().has_value();
  return t;
}

// This rank's result, and (the first rank to fail) why, for the watchdogs of its peers.
void ExternalJob::post_result(const TestRun& t) {
  const int me = group_->rank();
  if (t.mine.fatal() && store_->add(t.pre + "nwhy", 1) == 1) {
    std::string why;
    for (const auto& p : t.mine.parts)
      if (p.kind != RankPart::Kind::kFailure) {
        why = (p.kind == RankPart::Kind::kSkip ? "skipped: " : "failed: ") + short_text(p.message, 200);
        break;
      }
    store_->set(t.pre + "why", str_bytes("rank " + std::to_string(me) + " " + why));
  }
  store_->set(t.pre + "result/" + std::to_string(me),
              str_bytes(nlohmann::json({{"result", t.mine}, {"timed_out", t.timed_out}, {"stuck", false},
                                        {"body_done", t.body_done}}).dump()));
}

// Everyone's result, or its absence: stuck ranks post theirs kStuckGrace after the deadline; a
// rank whose heartbeat stops for kDeadAfter is gone.
void ExternalJob::gather_results(const TestRun& t, Gathered& g) {
  const int n = group_->size();
  std::vector<bool> have(n, false);
  std::vector<int64_t> beat(n, -1);
  std::vector<Clock::time_point> beat_at(n, Clock::now());
  // Go on from the watchdog's reading during the body: a peer it saw stop is not given
  // kDeadAfter anew (its body may have ended by a peer's failure first).
  watchdog_.peer_beats(t.k, &beat, &beat_at);
  const auto give_up = t.t0 + t.timeout + kStuckGrace + kReportWait / 2;
  for (;;) {
    bool all = true;
    for (int r = 0; r < n; ++r) {
      if (have[r] || g.gone[r]) continue;
      const std::string key = t.pre + "result/" + std::to_string(r);
      if (store_->check({key})) {
        auto j = nlohmann::json::parse(bytes_str(store_->get(key)));
        g.outcomes[r].result = j.at("result").get<RankResult>();
        if (j.value("timed_out", false)) g.outcomes[r].end = RankOutcome::End::kTimedOut;
        g.outcomes[r].body_done = j.value("body_done", false);
        g.stuck[r] = j.value("stuck", false);
        have[r] = true;
        continue;
      }
      const int64_t b = store_->add(kPrefix + "hb/" + std::to_string(r), 0);
      const auto now = Clock::now();
      if (b != beat[r]) {
        beat[r] = b;
        beat_at[r] = now;
      } else if (g.lost[r] || now - beat_at[r] > kDeadAfter || now > give_up) {
        g.gone[r] = true;
        continue;
      }
      all = false;
    }
    if (all) break;
    std::this_thread::sleep_for(kExternalPoll);  // polling the store (the group may be unusable)
  }
}

// The store is gone: rank 0, which hosts it, died (NOTE above).
void ExternalJob::report_alone(const TestRun& t, const std::exception& e) {
  const int me = group_->rank();
  broken_ = "rank 0 is gone (the connection to the job's store, which it hosts, failed: " + short_text(err_text(e)) + ")";
  rank_zero_gone_ = true;
  if (i_report_for_rank_zero()) start_reporting();
  ADD_FAILURE() << "[rank " << me << "] " << broken_ << " during " << t.test_id << "; rank " << me
                << " reports in its place, with its own result";
  RankOutcome o;
  o.rank = me;
  o.result = t.mine;
  if (t.timed_out) o.end = RankOutcome::End::kTimedOut;
  o.body_done = t.body_done;
  report_outcomes(t.test_id, {o}, t.timeout, "");
}

// The first rank neither stuck nor gone prints the merged result.
void ExternalJob::report(const TestRun& t, Gathered& g) {
  const int me = group_->rank(), n = group_->size();
  for (int r = 0; r < n; ++r) {
    g.outcomes[r].rank = r;
    if (!g.gone[r]) continue;
    if (!g.lost[r])  // each survivor says so (the watchdog did for those it found)
      std::cerr << "[dtensor] rank " << me << ": rank " << r << " is gone: it posted no result for " << t.test_id
                << " and its heartbeat stopped" << std::endl;
    RankResult gr;
    gr.rank = r;
    gr.parts.push_back({RankPart::Kind::kException, "", -1,
                        "rank " + std::to_string(r) +
                            " is gone: it posted no result and its heartbeat stopped (crashed, killed, or cut off from "
                            "the job's store)"});
    g.outcomes[r].result = gr;
  }
  int reporter = -1;
  for (int r = 0; r < n && reporter < 0; ++r)
    if (!g.stuck[r] && !g.gone[r]) reporter = r;
  if (reporter == me) start_reporting();
  report_outcomes(t.test_id, g.outcomes, t.timeout, "");
  if (reporter != me) return;
  try {
    store_->set(t.pre + "reported", str_bytes("1"));
  } catch (const std::exception&) {
    // the stuck ranks waiting for it leave on their own
  }
}

// After a rank was stuck or gone the job cannot go on; after a failure the group is replaced.
void ExternalJob::after_test(const TestRun& t, const Gathered& g) {
  const int n = group_->size();
  live_ = 0;
  for (int r = 0; r < n; ++r) live_ += !g.stuck[r] && !g.gone[r];
  for (int r = 0; r < n; ++r)
    if (g.stuck[r] || g.gone[r]) {
      broken_ = "rank " + std::to_string(r) + (g.stuck[r] ? " is stuck in " : " left the job during ") + t.test_id +
                (g.stuck[r] ? " (after its timeout)" : "");
      return;
    }
  bool replace = t.aborted || t.timed_out;
  for (const auto& o : g.outcomes) replace = replace || (o.result && o.result->fatal()) || o.end != RankOutcome::End::kFinished;
  if (!replace) return;
  // The old group may hold a pending collective: keep it alive, never use it again.
  retired_.push_back(group_);
  ++generation_;
  try {
    make_group();
  } catch (const std::exception& e) {
    broken_ = "replacing the process group after " + t.test_id + " failed: " + short_text(err_text(e));
    ADD_FAILURE() << "[rank " << group_->rank() << "] " << broken_;
  }
}

// NOTE: [Rank 0 stops its store before it exits]
// The job's store is served by a thread of rank 0 (TCPStore's daemon), which reads every peer's
// requests and notices each peer's connection close. Left running into exit(), it met a peer
// that closed while libtorch's statics were being destroyed, built the c10::Error it raises
// for a closed connection, and called c10's stack-trace fetcher, already gone: a segfault after
// rank 0 had reported every test passed (about 1 run in 10 of ci/multihost with PyTorch 2.x).
// So rank 0 hosts the store in an object of its own (server_; its own requests go through a
// connection like any peer's) and destroys it, which stops and joins the daemon, once every
// rank has checked out: then no peer has a request in flight, so the daemon cannot be in the
// middle of reading one. When a rank did not check out (stuck, gone, cut off, a request may
// be half read), the server is left running, as before. Rank 1's backup store, asked only
// when rank 0 is gone, is stopped likewise when rank 0 was not.
void ExternalJob::shutdown() {
  watchdog_.stop();
  if (joined_) check_out();
  if (checked_out_ && server_) server_.reset();
  if (!rank_zero_gone_ && backup_) backup_.reset();
}

void ExternalJob::check_out() {
  const int me = info_->rank, n = info_->world_size;
  if (live_ == 0) live_ = n;
  try {
    if (rank_zero_gone_ && me == 1 && backup_) {
      // The others ask whether rank 1 lives (i_report_for_rank_zero): stay until they did.
      const auto until = Clock::now() + kDeadAfter;
      while (Clock::now() < until && backup_->add(kPrefix + "alive", 0) < n - 2)
        std::this_thread::sleep_for(kExternalPoll);
    }
  } catch (const std::exception&) {
  }
  if (!join_error_.empty() && store_ && !rank_zero_gone_) wait_for_join_reports(me, n);
  if (!group_) return;
  try {
    if (!rank_zero_gone_) {
      // Rank 0 hosts the store: it leaves last, once every rank that can has checked out.
      store_->add(kPrefix + "done", 1);
      if (me == 0) {
        const auto until = Clock::now() + kReportWait;
        int64_t done = 0;
        while (Clock::now() < until && (done = store_->add(kPrefix + "done", 0)) < live_)
          std::this_thread::sleep_for(kExternalPoll);
        checked_out_ = done == n;
      }
    }
  } catch (const std::exception&) {
  }
  if (broken_.empty() && !comm::waits_aborted()) {
    comm::destroy_process_group();
    group_.reset();
  } else {
    retired_.push_back(group_);  // may hold a pending collective: never destroyed
    comm::set_default_group(nullptr);
  }
}

}  // namespace

bool external_launcher_detected() { return job().detected(); }
bool external_launcher_active() { return job().joined(); }
void init_external_launcher() { job().init(); }
void run_external(const std::string& test_id, std::chrono::milliseconds timeout) { job().run(test_id, timeout); }
void shutdown_external() { job().shutdown(); }

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
