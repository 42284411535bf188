// harness/internal/rank_run.cpp
#include "harness/internal/rank_run.h"

#include "dtensor/comm/group.h"
#include "dtensor/comm/trace.h"

#include <c10/util/Exception.h>

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
// NOTE: [Symbolised user frames] (rank_process.cpp): the frames of the last "[dtensor] frames:"
// line of a rank's output, symbolised with addr2line -i: a return address inside code that
// was inlined becomes one frame per inlined function, innermost first (the user's function
// around an inlined std::future::wait is a frame of its own). With line tables (-g, -g1:
// CMAKE_BUILD_TYPE=Debug or RelWithDebInfo) each frame has its file:line; without them (our
// Release build) a frame is its function and the offset in it, and the failure is filed at the
// test's DTENSOR_TEST_F line. Function names come from the symbol table (nm), qualified.
struct Frame {
  std::string module, function, file;
  int line = -1;
  long offset = -1;  // of the return address in the function, when it has no line
};

std::string read_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[65536];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  ::pclose(p);
  return out;
}

// The functions of `module` from its symbol table (nm -n: sorted by address; -C: demangled),
// for the qualified name of the function holding an address (addr2line -i names it by its
// DWARF name alone, "wait_forever") and for offsets in it.
std::vector<std::pair<unsigned long, std::string>> functions_of(const std::string& module) {
  std::vector<std::pair<unsigned long, std::string>> fns;
  std::istringstream is(read_command("nm -n -C --defined-only '" + module + "' 2>/dev/null"));
  for (std::string line; std::getline(is, line);) {
    // <address> <type> <name, which may contain spaces>
    const auto s1 = line.find(' ');
    if (s1 == std::string::npos || s1 + 3 > line.size() || line[s1 + 2] != ' ') continue;
    if (std::string("tTwWi").find(line[s1 + 1]) == std::string::npos) continue;
    std::string name = line.substr(s1 + 3);
    const auto clone = name.find(" [clone ");
    if (clone != std::string::npos) name.erase(clone);
    try {
      fns.emplace_back(std::stoul(line.substr(0, s1), nullptr, 16), std::move(name));
    } catch (const std::exception&) {
    }
  }
  return fns;
}

std::vector<Frame> symbolise_stack(const std::string& output) {
  std::vector<Frame> frames;
  const auto at = output.rfind("[dtensor] frames:");
  if (at == std::string::npos) return frames;
  std::istringstream is(output.substr(at + 17, output.find('\n', at) - at - 17));
  std::string tok;
  std::vector<std::pair<std::string, unsigned long>> raw;
  while (is >> tok) {
    const auto plus = tok.rfind("+0x");
    if (plus == std::string::npos) continue;
    try {
      raw.emplace_back(tok.substr(0, plus), std::stoul(tok.substr(plus + 3), nullptr, 16));
    } catch (const std::exception&) {
    }
  }
  // Each return address's frames (one, or its inlined chain), in stack order.
  std::vector<std::vector<Frame>> per_address(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) per_address[i].push_back(Frame{raw[i].first});
  // One addr2line per module, its addresses in order.
  std::map<std::string, std::vector<size_t>> by_module;
  for (size_t i = 0; i < raw.size(); ++i) by_module[raw[i].first].push_back(i);
  for (auto& [module, idx] : by_module) {
    const bool system = module.find("/libc.so") != std::string::npos || module.find("libstdc++") != std::string::npos ||
                        module.find("libgcc") != std::string::npos || module.find("ld-linux") != std::string::npos ||
                        module.find("libtorch") != std::string::npos || module.find("libc10") != std::string::npos;
    if (system || ::access(module.c_str(), R_OK) != 0 || module.find('\'') != std::string::npos) continue;
    std::ostringstream cmd;
    cmd << "addr2line -C -f -i -a -e '" << module << "'";
    // The call instruction before the return address (the line of the call, not the next one).
    for (size_t i : idx) cmd << " 0x" << std::hex << (raw[i].second > 0 ? raw[i].second - 1 : 0);
    cmd << " 2>/dev/null";
    // Output per address: the address ("0x..."), then function and file:line per inlined level.
    std::istringstream lines(read_command(cmd.str()));
    size_t k = 0;  // index into idx of the current address
    bool started = false;
    std::vector<Frame>* cur = nullptr;
    for (std::string fn; std::getline(lines, fn);) {
      if (fn.rfind("0x", 0) == 0) {  // the next address
        if (started) ++k;
        started = true;
        if (k >= idx.size()) break;
        cur = &per_address[idx[k]];
        cur->clear();
        continue;
      }
      std::string loc;
      if (!cur || !std::getline(lines, loc)) break;
      Frame f;
      f.module = module;
      if (fn != "??") f.function = fn;
      const auto colon = loc.rfind(':');
      if (colon != std::string::npos && loc.substr(0, colon) != "??") {
        f.file = std::filesystem::path(loc.substr(0, colon)).lexically_normal().string();  // no "build/../"
        try {
          f.line = std::stoi(loc.substr(colon + 1));
        } catch (const std::exception&) {
          f.line = -1;  // "?": no line table
        }
      }
      if (f.line <= 0) f.file.clear();
      cur->push_back(f);
    }
    // The function holding each address (the last, outermost, frame of its chain) by its
    // symbol table name; without a line, with the return address's offset in it.
    const auto fns = functions_of(module);
    for (size_t i : idx) {
      auto& fs = per_address[i];
      if (fs.empty()) fs.push_back(Frame{module});
      auto it = std::upper_bound(fns.begin(), fns.end(), raw[i].second - 1,
                                 [](unsigned long a, const std::pair<unsigned long, std::string>& f) { return a < f.first; });
      if (it == fns.begin()) continue;
      --it;
      Frame& outer = fs.back();
      outer.function = it->second;
      if (outer.line <= 0) outer.offset = static_cast<long>(raw[i].second - it->first);
    }
  }
  for (auto& fs : per_address) frames.insert(frames.end(), fs.begin(), fs.end());
  return frames;
}

// The harness's own sources: this file's directory's parent (<src>/harness/), as built.
bool in_harness_source(const std::string& file) {
  static const std::string dir = [] {
    std::string f = __FILE__;  // <src>/harness/internal/rank_run.cpp
    const auto cut = f.rfind("/internal/");
    return cut == std::string::npos ? std::string() : f.substr(0, cut + 1);
  }();
  if (!dir.empty() && dir[0] == '/' && !file.empty() && file[0] == '/') return file.rfind(dir, 0) == 0;
  return file.find("harness/internal/") != std::string::npos || file.find("harness/multi_rank_test") != std::string::npos ||
         file.find("harness/harness_main") != std::string::npos;
}

bool harness_or_library(const Frame& f) {
  if (f.function.rfind("dtensor::testing::", 0) == 0 || f.function.rfind("testing::", 0) == 0) return true;
  if (f.function.rfind("std::", 0) == 0 || f.function.rfind("__", 0) == 0) return true;  // library templates
  return in_harness_source(f.file) || f.file.find("/gtest/") != std::string::npos ||
         f.file.find("/googletest/") != std::string::npos || f.file.rfind("/usr/include/", 0) == 0;
}

// The user's frame: the first one with a function that is not the harness's, gtest's, or in
// a system library or libtorch (those were not symbolised).
const Frame* user_frame(const std::vector<Frame>& frames) {
  for (auto& f : frames)
    if (!f.function.empty() && !harness_or_library(f)) return &f;
  return nullptr;
}
std::string frame_str(const Frame& f) {
  std::string s = f.function;
  if (f.line > 0) {
    s += " (" + f.file + ":" + std::to_string(f.line) + ")";
  } else if (f.offset >= 0) {
    std::ostringstream os;
    os << "+0x" << std::hex << f.offset;
    s += os.str();
  }
  return s;
}
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

void report_outcomes(const std::string& test_id, const std::vector<RankOutcome>& outcomes,
                     std::chrono::milliseconds timeout, const std::string& stacks) {
  // 1. Primary problems: failures that are not merely collectives broken by a peer.
  bool any_primary = false;
  for (auto& o : outcomes) {
    if (o.end == RankOutcome::End::kSignaled || o.end == RankOutcome::End::kTimedOut ||
        (o.end == RankOutcome::End::kExited && !o.result))
      any_primary = true;
    if (o.result && o.result->failed() && !o.result->only_collective_errors()) any_primary = true;
    if (o.result && o.result->skipped()) any_primary = true;  // a skip also breaks peers' collectives
  }
  // 2. Group identical assertion failures across ranks: (kind,file,line,message) -> ranks.
  std::map<std::tuple<std::string, int, std::string>, std::vector<int>> failures;
  std::vector<std::tuple<std::string, int, std::string>> order;
  std::vector<int> secondary, killed, timed_out, failing;
  // What secondary ranks said (NOTE: kept, shortened, after the primary failure): message -> ranks.
  std::map<std::string, std::vector<int>> secondary_messages;
  std::vector<std::string> secondary_order;
  std::vector<int> timed_out_in_body, timed_out_after_body;
  std::vector<std::pair<int, std::string>> skips;
  for (auto& o : outcomes) {
    bool failed_rank = false;
    if (o.result) {
      const bool sec = any_primary && o.result->only_collective_errors();
      if (sec) secondary.push_back(o.rank);
      for (auto& p : o.result->parts) {
        if (p.kind == Kind::kSkip) {
          skips.emplace_back(o.rank, p.message);
          continue;
        }
        if (sec) {
          std::string m = p.message;
          if (m.size() > 240) m = m.substr(0, 240) + "...";
          if (!secondary_messages.count(m)) secondary_order.push_back(m);
          secondary_messages[m].push_back(o.rank);
          continue;
        }
        auto key = std::make_tuple(p.file, p.line, p.message);
        if (!failures.count(key)) order.push_back(key);
        failures[key].push_back(o.rank);
        failed_rank = true;
      }
    }
    switch (o.end) {
      case RankOutcome::End::kSignaled: {
        std::string detail;
        const auto at = file_at(test_id, symbolise_stack(o.output), &detail);
        ADD_FAILURE_AT(at.first.empty() ? "unknown file" : at.first.c_str(), at.second)
            << "[rank " << o.rank << "] crashed: killed by signal " << signal_name(o.signal)
            << " while running " << test_id << detail;
        failed_rank = true;
        break;
      }
      case RankOutcome::End::kExited:
        if (!o.result) {
          ADD_FAILURE() << "[rank " << o.rank << "] exited with code " << o.exit_code
                        << " before reporting a result for " << test_id;
          failed_rank = true;
        }
        break;
      case RankOutcome::End::kKilledAfterPeer: killed.push_back(o.rank); break;
      case RankOutcome::End::kTimedOut:
        timed_out.push_back(o.rank);
        (o.body_done ? timed_out_after_body : timed_out_in_body).push_back(o.rank);
        failed_rank = true;
        break;
      case RankOutcome::End::kFinished: break;
    }
    if (failed_rank) failing.push_back(o.rank);
  }
  for (auto& key : order) {
    const auto& rs = failures[key];
    const char* file = std::get<0>(key).empty() ? nullptr : std::get<0>(key).c_str();
    ADD_FAILURE_AT(file ? file : "unknown file", std::get<1>(key))
        << "[rank" << (rs.size() > 1 ? "s " : " ") << ranks_str(rs) << "] " << std::get<2>(key);
  }
  if (!timed_out.empty()) {
    std::ostringstream where;
    if (!timed_out_in_body.empty()) where << "; ranks still in the test body: " << ranks_str(timed_out_in_body);
    if (!timed_out_after_body.empty())
      where << "; ranks that had finished the body and waited for the others: " << ranks_str(timed_out_after_body);
    // Filed where the first rank still in its body is stuck (its stack dump), when known.
    std::string detail;
    std::pair<std::string, int> at{"", -1};
    for (auto& o : outcomes)
      if (o.end == RankOutcome::End::kTimedOut && !o.body_done) {
        at = file_at(test_id, symbolise_stack(o.output), &detail);
        if (!detail.empty()) detail = " (rank " + std::to_string(o.rank) + " is stuck" + detail + ")";
        break;
      }
    ADD_FAILURE_AT(at.first.empty() ? "unknown file" : at.first.c_str(), at.second)
        << test_id << " timed out after " << timeout.count() / 1000.0 << " s" << where.str() << detail
        << (stacks.empty() ? std::string() : "\nTheir stacks:\n" + stacks);
  }
  if (!failing.empty() || !timed_out.empty()) {
    if (!secondary.empty() || !killed.empty()) {
      std::ostringstream os;
      if (!secondary.empty()) {
        os << "ranks " << ranks_str(secondary)
           << " stopped with collective errors caused by the failure above:";
        for (auto& m : secondary_order) {
          const auto& rs = secondary_messages[m];
          os << "\n[dtensor]   [rank" << (rs.size() > 1 ? "s " : " ") << ranks_str(rs) << "] " << m;
        }
        if (!killed.empty()) os << "\n[dtensor] ";
      }
      if (!killed.empty())
        os << "ranks " << ranks_str(killed)
           << " were stopped by the harness after rank " << failing.front() << " failed";
      std::cout << "[dtensor] " << os.str() << std::endl;
    }
    ::testing::Test::RecordProperty("failing_ranks", ranks_str(failing));
  } else if (failing.empty() && !skips.empty()) {
    std::ostringstream os;
    std::set<std::string> seen;
    for (auto& s : skips)
      if (seen.insert(s.second).second) os << "[rank " << s.first << "] " << s.second << " ";
    GTEST_SKIP() << os.str();
  }
  const bool show = !failing.empty() || env_or("DTENSOR_SHOW_RANK_OUTPUT", "0") == "1";
  if (show) {
    for (auto& o : outcomes)
      if (!o.output.empty()) std::cout << prefixed(o.rank, o.output);
    std::cout.flush();
  }
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
