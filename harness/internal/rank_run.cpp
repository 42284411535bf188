// harness/internal/rank_run.cpp
#include "harness/internal/rank_run.h"

#include "dtensor/comm/group.h"
#include "dtensor/comm/trace.h"
#include "harness/internal/symbolise.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <sched.h>

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <typeinfo>

namespace dtensor {
namespace testing {
namespace internal {

// ---- registry ------------------------------------------------------------------------------
namespace {
struct Entry {
  RankTestFactory factory;
  std::string file;
  int line = -1;
};
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
thread_local int t_rank = -1;
thread_local std::function<void()> t_body_done_hook;
}  // namespace

void set_body_done_hook(std::function<void()> hook) { t_body_done_hook = std::move(hook); }

RankTestRegistrar::RankTestRegistrar(const char* test_id, RankTestFactory factory, const char* file,
                                     int line) {
  registry()[test_id] = Entry{std::move(factory), file, line};
}

bool registered(const std::string& test_id) { return registry().count(test_id) > 0; }

void set_current_rank(int rank) { t_rank = rank; }
int current_rank() { return t_rank; }

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  const char* desc = strsignal(sig);
  std::ostringstream os;
  os << "SIG" << (abbrev ? abbrev : std::to_string(sig).c_str()) << " (" << (desc ? desc : "?")
     << ")";
  return os.str();
}

// ---- results ---------------------------------------------------------------------------------
using Kind = RankPart::Kind;

bool RankResult::failed() const {
  for (auto& p : parts)
    if (p.kind != Kind::kSkip) return true;
  return false;
}
bool RankResult::fatal() const {
  for (auto& p : parts)
    if (p.kind != Kind::kFailure) return true;
  return false;
}
bool RankResult::skipped() const {
  if (failed()) return false;
  for (auto& p : parts)
    if (p.kind == Kind::kSkip) return true;
  return false;
}
bool RankResult::only_collective_errors() const {
  bool any = false;
  for (auto& p : parts) {
    if (p.kind == Kind::kSkip) continue;
    if (!p.collective_error) return false;
    any = true;
  }
  return any;
}

namespace {
const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kFailure: return "failure";
    case Kind::kFatal: return "fatal";
    case Kind::kSkip: return "skip";
    case Kind::kException: return "exception";
  }
  return "?";
}
Kind kind_named(const std::string& name) {
  for (Kind k : {Kind::kFailure, Kind::kFatal, Kind::kSkip, Kind::kException})
    if (name == kind_name(k)) return k;
  C10_THROW_ERROR(ValueError, c10::str("a rank's result has a part of unknown kind '", name, "'"));
}
}  // namespace

void to_json(nlohmann::json& j, const RankPart& p) {
  j = {{"kind", kind_name(p.kind)}, {"file", p.file}, {"line", p.line}, {"message", p.message},
       {"collective_error", p.collective_error}};
}
void from_json(const nlohmann::json& j, RankPart& p) {
  p.kind = kind_named(j.at("kind").get<std::string>());
  p.file = j.at("file").get<std::string>();
  p.line = j.at("line").get<int>();
  p.message = j.at("message").get<std::string>();
  p.collective_error = j.value("collective_error", false);
}
void to_json(nlohmann::json& j, const RankResult& r) {
  j = {{"rank", r.rank}, {"parts", r.parts}, {"duration_ms", r.duration_ms}};
}
void from_json(const nlohmann::json& j, RankResult& r) {
  r.rank = j.at("rank").get<int>();
  r.parts = j.at("parts").get<std::vector<RankPart>>();
  r.duration_ms = j.value("duration_ms", 0.0);
}

// ---- capture ---------------------------------------------------------------------------------
RankCapture::RankCapture(std::shared_ptr<RankSink> sink)
    : ::testing::ScopedFakeTestPartResultReporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &unused_),
      sink_(std::move(sink)) {}

void RankCapture::ReportTestPartResult(const ::testing::TestPartResult& r) {
  RankPart p;
  p.kind = r.skipped() ? Kind::kSkip : r.fatally_failed() ? Kind::kFatal : Kind::kFailure;
  p.file = r.file_name() ? r.file_name() : "";
  p.line = r.line_number();
  p.message = r.message();
  sink_->add(t_rank, std::move(p));
}

void RankSink::add(int rank, RankPart part) {
  std::lock_guard<std::mutex> lk(mu_);
  parts_.emplace_back(rank, std::move(part));
}

std::vector<RankPart> RankSink::take(int rank) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<RankPart> out;
  std::vector<std::pair<int, RankPart>> keep;
  for (auto& kv : parts_) {
    if (kv.first == rank) out.push_back(std::move(kv.second));
    else keep.push_back(std::move(kv));
  }
  parts_ = std::move(keep);
  return out;
}

// ---- running a body --------------------------------------------------------------------------
namespace {
std::string type_name(const std::exception& e) {
  int status = 0;
  const char* mangled = typeid(e).name();
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && d ? d.get() : mangled;
}

// An uncaught exception: its type and message always; filed where it was thrown when known
// (a c10::Error records that: TORCH_CHECK's file:line), else at the DTENSOR_TEST_F line.
RankPart exception_part(const std::string& where, const std::exception& e, const Entry& entry) {
  RankPart p;
  p.kind = Kind::kException;
  p.file = entry.file;
  p.line = entry.line;
  std::string what = e.what();
  std::string thrown;
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    what = ce->what_without_backtrace();
    std::smatch m;
    const std::string full = ce->what();
    if (std::regex_search(full, m, std::regex("Exception raised from (\\S+) at ([^\\s:]+):([0-9]+)"))) {
      p.file = m[2];
      p.line = std::stoi(m[3]);
      thrown = ", thrown in " + m[1].str() + " at " + p.file + ":" + m[3].str();
    }
  }
  p.message = "uncaught exception in " + where + ": " + what + " (" + type_name(e) + thrown + ")";
  p.collective_error = dynamic_cast<const comm::CollectiveError*>(&e) != nullptr;
  return p;
}
bool stopped(const std::vector<RankPart>& parts) {
  for (auto& p : parts)
    if (p.kind != Kind::kFailure) return true;
  return false;
}

// Runs one step of a rank's test (`where` names it in the report); an exception becomes a part
// of the rank's captured output instead of leaving the rank.
void run_guarded(RankSink& capture, int rank, const Entry& entry, const char* where,
                 const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    capture.add(rank, exception_part(where, e, entry));
  } catch (...) {
    capture.add(rank, RankPart{Kind::kException, entry.file, entry.line,
                               std::string("uncaught non-std exception in ") + where});
  }
}
}  // namespace

// gtest's testing::Test saves every gtest flag when it is constructed and writes them back when
// it is destroyed. Thread ranks construct and destroy their fixtures at the same moment, so
// those writes would race (with equal values, but a data race all the same, which TSan
// reports): one process-wide mutex orders fixture construction and destruction.
namespace {
std::mutex& fixture_lifetime_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

// NOTE: [Intra-op threads of a rank]
// The ranks of a test run on this host's cores at once, and ATen sizes each one's intra-op
// (OpenMP) pool to every core: 4 ranks on 2 cores start 8 threads that spin in each other's
// way. Measured, the op suite's convolution family on 4 thread ranks (2 cores, today's PyTorch
// wheel): 154 s with the default pools, 59 s with one thread per rank. So each rank gets
// max(1, cores / ranks on this host), as torchrun does for several processes per node (it sets
// OMP_NUM_THREADS=1). A set OMP_NUM_THREADS is the user's choice and is left alone. Ranks
// started by an external launcher are not sized here: the launcher knows the host's layout.
void set_rank_intra_op_threads(int ranks_on_this_host) {
  if (std::getenv("OMP_NUM_THREADS")) return;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  int cores = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / std::max(1, ranks_on_this_host));
  if (at::get_num_threads() != threads) at::set_num_threads(threads);
}

RankResult run_rank_body(const std::string& test_id, int rank, const comm::GroupPtr& group,
                         RankSink& capture, bool barrier_after) {
  const auto t0 = std::chrono::steady_clock::now();
  RankResult res;
  res.rank = rank;
  set_current_rank(rank);
  auto it = registry().find(test_id);
  if (it == registry().end()) {
    res.parts.push_back({Kind::kException, "", -1,
                         "no DTENSOR_TEST_F named " + test_id + " is registered in this program"});
    return res;
  }
  const Entry& entry = it->second;
  std::unique_ptr<MultiRankTest> fx;
  auto guarded = [&](const char* where, const std::function<void()>& fn) {
    run_guarded(capture, rank, entry, where, fn);
  };
  guarded("the fixture constructor", [&] {
    std::lock_guard<std::mutex> lk(fixture_lifetime_mutex());
    fx = entry.factory();
  });
  if (fx) {
    fx->internal_set_rank(rank, group);
    guarded("SetUpRank", [&] { fx->SetUpRank(); });
  }
  std::vector<RankPart> parts = capture.take(rank);
  if (fx && !stopped(parts)) {
    comm::trace_event("rank.body", rank);
    guarded("the test body", [&] { fx->RankBody(); });
    auto more = capture.take(rank);
    parts.insert(parts.end(), more.begin(), more.end());
  }
  if (fx) {
    guarded("TearDownRank", [&] { fx->TearDownRank(); });
    auto more = capture.take(rank);
    parts.insert(parts.end(), more.begin(), more.end());
  }
  comm::trace_event("rank.body_done", rank);
  if (t_body_done_hook) t_body_done_hook();
  res.parts = std::move(parts);
  if (barrier_after) run_closing_barrier(test_id, group, capture, res);
  {
    std::lock_guard<std::mutex> lk(fixture_lifetime_mutex());
    fx.reset();
  }
  res.duration_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

bool needs_closing_barrier(const RankResult& res, const comm::GroupPtr& group) {
  return group && !stopped(res.parts);
}

void run_closing_barrier(const std::string& test_id, const comm::GroupPtr& group, RankSink& capture,
                         RankResult& res) {
  if (needs_closing_barrier(res, group)) {
    const auto it = registry().find(test_id);
    const Entry entry = it != registry().end() ? it->second : Entry{};
    run_guarded(capture, res.rank, entry, "the barrier after the test body",
                [&] { group->barrier(); });
    auto more = capture.take(res.rank);
    res.parts.insert(res.parts.end(), more.begin(), more.end());
  }
  comm::trace_event("rank.barrier_done", res.rank);
}

// ---- reporting -------------------------------------------------------------------------------
namespace {
// Where to file a crash or a timeout: the user's frame when it has a line, else the test's
// DTENSOR_TEST_F line; the user's frames (up to the test body) are added to the message.
std::pair<std::string, int> file_at(const std::string& test_id, const std::vector<Frame>& frames,
                                    std::string* detail) {
  std::pair<std::string, int> at{"", -1};
  auto it = registry().find(test_id);
  if (it != registry().end()) at = {it->second.file, it->second.line};
  const Frame* u = user_frame(frames);
  if (!u) return at;
  if (u->line > 0) at = {u->file, u->line};
  std::ostringstream os;
  os << ", in " << frame_str(*u);
  bool first = true;
  for (const Frame* f = u + 1; f < frames.data() + frames.size(); ++f) {
    if (f->function.empty() || f->function.rfind("dtensor::testing::", 0) == 0 || in_harness_source(f->file)) break;  // back in the harness
    if (harness_or_library(*f)) continue;
    os << (first ? "; called from " : " <- ") << frame_str(*f);
    first = false;
  }
  *detail = os.str();
  return at;
}

std::string ranks_str(const std::vector<int>& rs) {
  std::ostringstream os;
  for (size_t i = 0; i < rs.size(); ++i) os << (i ? "," : "") << rs[i];
  return os.str();
}
std::string prefixed(int rank, const std::string& text) {
  std::ostringstream os;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) os << "[rank " << rank << "] " << line << "\n";
  return os.str();
}
}  // namespace

namespace {

// One test's outcomes, sorted for the report.
struct Tally {
  // Identical assertion failures across ranks: (file, line, message) -> ranks, in first-seen order.
  std::map<std::tuple<std::string, int, std::string>, std::vector<int>> failures;
  std::vector<std::tuple<std::string, int, std::string>> order;
  std::vector<int> secondary, killed, timed_out, failing;
  // What secondary ranks said (kept, shortened, after the primary failure): message -> ranks.
  std::map<std::string, std::vector<int>> secondary_messages;
  std::vector<std::string> secondary_order;
  std::vector<int> timed_out_in_body, timed_out_after_body;
  std::vector<std::pair<int, std::string>> skips;
};

// Primary problems: failures that are not merely collectives broken by a peer.
bool any_primary_problem(const std::vector<RankOutcome>& outcomes) {
  for (const auto& o : outcomes) {
    if (o.end == RankOutcome::End::kSignaled || o.end == RankOutcome::End::kTimedOut ||
        (o.end == RankOutcome::End::kExited && !o.result))
      return true;
    if (o.result && o.result->failed() && !o.result->only_collective_errors()) return true;
    if (o.result && o.result->skipped()) return true;  // a skip also breaks peers' collectives
  }
  return false;
}

// Sorts one rank's parts into `t`; true when one is a failure of this rank's own.
bool tally_parts(const RankOutcome& o, bool any_primary, Tally& t) {
  if (!o.result) return false;
  bool failed_rank = false;
  const bool sec = any_primary && o.result->only_collective_errors();
  if (sec) t.secondary.push_back(o.rank);
  for (const auto& p : o.result->parts) {
    if (p.kind == Kind::kSkip) {
      t.skips.emplace_back(o.rank, p.message);
      continue;
    }
    if (sec) {
      std::string m = p.message;
      if (m.size() > 240) m = m.substr(0, 240) + "...";
      if (!t.secondary_messages.count(m)) t.secondary_order.push_back(m);
      t.secondary_messages[m].push_back(o.rank);
      continue;
    }
    auto key = std::make_tuple(p.file, p.line, p.message);
    if (!t.failures.count(key)) t.order.push_back(key);
    t.failures[key].push_back(o.rank);
    failed_rank = true;
  }
  return failed_rank;
}

// Sorts one rank's end into `t` (reporting a crash or an early exit at once); true when it failed.
bool tally_end(const std::string& test_id, const RankOutcome& o, Tally& t) {
  switch (o.end) {
    case RankOutcome::End::kSignaled: {
      std::string detail;
      const auto at = file_at(test_id, symbolise_stack(o.output), &detail);
      ADD_FAILURE_AT(at.first.empty() ? "unknown file" : at.first.c_str(), at.second)
          << "[rank " << o.rank << "] crashed: killed by signal " << signal_name(o.signal) << " while running "
          << test_id << detail;
      return true;
    }
    case RankOutcome::End::kExited:
      if (o.result) return false;
      ADD_FAILURE() << "[rank " << o.rank << "] exited with code " << o.exit_code << " before reporting a result for "
                    << test_id;
      return true;
    case RankOutcome::End::kKilledAfterPeer: t.killed.push_back(o.rank); return false;
    case RankOutcome::End::kTimedOut:
      t.timed_out.push_back(o.rank);
      (o.body_done ? t.timed_out_after_body : t.timed_out_in_body).push_back(o.rank);
      return true;
    case RankOutcome::End::kFinished: return false;
  }
  return false;
}

// One failure for the timed-out ranks, filed where the first rank still in its body is stuck
// (its stack dump), when known.
void report_timeout(const std::string& test_id, const std::vector<RankOutcome>& outcomes, const Tally& t,
                    std::chrono::milliseconds timeout, const std::string& stacks) {
  std::ostringstream where;
  if (!t.timed_out_in_body.empty()) where << "; ranks still in the test body: " << ranks_str(t.timed_out_in_body);
  if (!t.timed_out_after_body.empty())
    where << "; ranks that had finished the body and waited for the others: " << ranks_str(t.timed_out_after_body);
  std::string detail;
  std::pair<std::string, int> at{"", -1};
  for (const auto& o : outcomes)
    if (o.end == RankOutcome::End::kTimedOut && !o.body_done) {
      at = file_at(test_id, symbolise_stack(o.output), &detail);
      if (!detail.empty()) detail = " (rank " + std::to_string(o.rank) + " is stuck" + detail + ")";
      break;
    }
  ADD_FAILURE_AT(at.first.empty() ? "unknown file" : at.first.c_str(), at.second)
      << test_id << " timed out after " << timeout.count() / 1000.0 << " s" << where.str() << detail
      << (stacks.empty() ? std::string() : "\nTheir stacks:\n" + stacks);
}

// The ranks that stopped because of the failure: what their collectives said, who was killed.
void report_secondary(Tally& t) {
  if (t.secondary.empty() && t.killed.empty()) return;
  std::ostringstream os;
  if (!t.secondary.empty()) {
    os << "ranks " << ranks_str(t.secondary) << " stopped with collective errors caused by the failure above:";
    for (const auto& m : t.secondary_order) {
      const auto& rs = t.secondary_messages[m];
      os << "\n[dtensor]   [rank" << (rs.size() > 1 ? "s " : " ") << ranks_str(rs) << "] " << m;
    }
    if (!t.killed.empty()) os << "\n[dtensor] ";
  }
  if (!t.killed.empty())
    os << "ranks " << ranks_str(t.killed) << " were stopped by the harness after rank " << t.failing.front()
       << " failed";
  std::cout << "[dtensor] " << os.str() << std::endl;
}

}  // namespace

void report_outcomes(const std::string& test_id, const std::vector<RankOutcome>& outcomes,
                     std::chrono::milliseconds timeout, const std::string& stacks) {
  const bool any_primary = any_primary_problem(outcomes);
  Tally t;
  for (const auto& o : outcomes) {
    const bool failed_parts = tally_parts(o, any_primary, t);
    const bool failed_end = tally_end(test_id, o, t);
    if (failed_parts || failed_end) t.failing.push_back(o.rank);
  }
  for (const auto& key : t.order) {
    const auto& rs = t.failures[key];
    const char* file = std::get<0>(key).empty() ? nullptr : std::get<0>(key).c_str();
    ADD_FAILURE_AT(file ? file : "unknown file", std::get<1>(key))
        << "[rank" << (rs.size() > 1 ? "s " : " ") << ranks_str(rs) << "] " << std::get<2>(key);
  }
  if (!t.timed_out.empty()) report_timeout(test_id, outcomes, t, timeout, stacks);
  if (!t.failing.empty() || !t.timed_out.empty()) {
    report_secondary(t);
    ::testing::Test::RecordProperty("failing_ranks", ranks_str(t.failing));
  } else if (!t.skips.empty()) {
    std::ostringstream os;
    std::set<std::string> seen;
    for (const auto& s : t.skips)
      if (seen.insert(s.second).second) os << "[rank " << s.first << "] " << s.second << " ";
    GTEST_SKIP() << os.str();
  }
  const bool show = !t.failing.empty() || env_or("DTENSOR_SHOW_RANK_OUTPUT", "0") == "1";
  if (show) {
    for (const auto& o : outcomes)
      if (!o.output.empty()) std::cout << prefixed(o.rank, o.output);
    std::cout.flush();
  }
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
