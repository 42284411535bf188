// converters/op_suite.cpp: see op_suite.h.
#include "converters/op_suite.h"
#include "converters/source_dir_internal.h"

#include "dtensor/comm/group.h"
#include "dtensor/comm/object_collectives.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dtensor {
namespace testing {

void to_json(nlohmann::json& j, const CaseRecord& r) {
  j = {{"op", r.op},
       {"family", r.family},
       {"variant", r.variant},
       {"mesh", r.mesh},
       {"direction", r.direction},
       {"status", r.status},
       {"reason", r.reason},
       {"failing_placements", r.failing_placements},
       {"failing_ranks", r.failing_ranks},
       {"max_error", r.max_error},
       {"duration_ms", r.duration_ms},
       {"combinations", r.combinations},
       {"passed", r.passed},
       {"refused", r.refused},
       {"by_placement", r.by_placement},
       {"used_fallback", r.used_fallback},
       {"generated", r.generated},
       {"fallback_status", r.fallback_status},
       {"trivial", r.trivial},
       {"design", r.design},
       {"total_combinations", r.total_combinations},
       {"plan", r.plan},
       {"warnings", r.warnings}};
}

void from_json(const nlohmann::json& j, CaseRecord& r) {
  r.op = j.at("op").get<std::string>();
  r.family = j.value("family", "");
  r.variant = j.value("variant", "");
  r.mesh = j.at("mesh").get<std::string>();
  r.direction = j.at("direction").get<std::string>();
  r.status = j.at("status").get<std::string>();
  r.reason = j.value("reason", "");
  r.failing_placements = j.value("failing_placements", "");
  r.failing_ranks = j.value("failing_ranks", std::vector<int>{});
  r.max_error = j.value("max_error", 0.0);
  r.duration_ms = j.value("duration_ms", 0.0);
  r.combinations = j.value("combinations", int64_t{0});
  r.passed = j.value("passed", int64_t{0});
  r.refused = j.value("refused", int64_t{0});
  if (j.contains("by_placement")) r.by_placement = j.at("by_placement").get<std::map<std::string, std::pair<int64_t, int64_t>>>();
  r.used_fallback = j.value("used_fallback", false);
  r.generated = j.value("generated", false);
  r.fallback_status = j.value("fallback_status", "");
  r.trivial = j.value("trivial", "");
  r.design = j.value("design", "");
  r.total_combinations = j.value("total_combinations", int64_t{0});
  r.plan = j.value("plan", std::vector<int64_t>{});
  r.warnings = j.value("warnings", std::vector<std::string>{});
}

// Combinations per sample (NOTE: [Converter covering design]). Below the cap, the whole
// product. Above it, a pairwise covering design (every operand in each of its placements,
// every pair of operands in each pair of placements) topped up with seeded random
// combinations to the cap. 1-D: every placement of a unary or binary op (4 x 4 for [8, 4]
// operands), ternary ops covered pairwise. 2-D: per mesh dim choices give 16 per tensor, so a
// binary op runs all 256 (the pairs are the product) and a ternary op ~260 of 4096.

OpCheckOptions suite_options(const std::string& mesh_kind) {
  TORCH_CHECK(mesh_kind == "1d" || mesh_kind == "2d", "op suite: unknown mesh kind '", mesh_kind,
              "'; use \"1d\" or \"2d\"");
  OpCheckOptions o;
  o.backward = true;
  o.converter.partial = true;
  o.converter.uneven = true;
  o.converter.mesh_2d = mesh_kind == "2d";
  o.converter.max_combinations = mesh_kind == "1d" ? kMaxCombinations1D : kMaxCombinations2D;
  // Shards reorder float32 sums: a little looser than the driver's defaults.
  o.rtol = 1e-4;
  o.atol = 1e-5;
  return o;
}

std::optional<DeviceMesh> suite_mesh(const std::string& mesh_kind, comm::GroupPtr world,
                                     const std::string& device_type) {
  if (!world) world = comm::default_group();
  TORCH_CHECK(world != nullptr, "op suite: no group to build the mesh over");
  const int64_t n = world->size();
  if (mesh_kind == "1d") return init_device_mesh(device_type, {n}, {}, world);
  TORCH_CHECK(mesh_kind == "2d", "op suite: unknown mesh kind '", mesh_kind, "'; use \"1d\" or \"2d\"");
  if (n < 4 || n % 2 != 0) return std::nullopt;
  return init_device_mesh(device_type, {2, n / 2}, {}, world);
}

std::vector<const OpInfo*> ops_of_family(const OpDb& db, const std::string& family) {
  std::vector<const OpInfo*> out;
  for (const OpInfo& info : db.ops())
    if (family.empty() || info.family == family) out.push_back(&info);
  return out;
}

namespace {

CaseRecord record_of(const OpInfo& info, const OpSample& s, const std::string& mesh_kind, const char* dir,
                     const DirectionResult& d, const OpCheckResult& r) {
  CaseRecord c;
  c.op = info.op;
  c.family = info.family;
  c.variant = s.variant;
  c.mesh = mesh_kind;
  c.direction = dir;
  c.status = to_string(d.status);
  c.reason = d.reason;
  if (!d.failures.empty()) c.failing_placements = d.failures.front().placements;
  c.max_error = d.max_error;
  c.duration_ms = r.duration_ms;
  c.combinations = d.combinations;
  c.passed = d.passed;
  c.refused = d.refused;
  c.by_placement = d.by_placement;
  c.used_fallback = r.used_fallback;
  c.generated = info.generated;
  c.trivial = d.trivial;
  c.design = r.design;
  c.total_combinations = r.total_combinations;
  if (r.design != "full product") c.plan = r.plan;
  c.warnings = r.warnings;
  return c;
}

void add_unique(std::vector<std::string>& into, const std::vector<std::string>& more) {
  for (const std::string& w : more)
    if (std::find(into.begin(), into.end(), w) == into.end()) into.push_back(w);
}

// Collective: every rank's records of one op get the warnings any rank's copy of them got
// (NOTE: [Warnings go into the records] in op_check.cpp). The records are the same cases in
// the same order on every rank.
void unite_warnings_over_ranks(const DeviceMesh& mesh, std::vector<CaseRecord>& records, size_t first) {
  std::vector<std::vector<std::string>> mine;
  for (size_t i = first; i < records.size(); ++i) mine.push_back(records[i].warnings);
  for (const auto& theirs : comm::all_gather_object(*mesh.world(), mine))
    for (size_t i = 0; i < theirs.size() && first + i < records.size(); ++i)
      add_unique(records[first + i].warnings, theirs[i]);
}

}  // namespace

// Combinations tried through the replicate fallback (every input is gathered: costly).
constexpr int64_t kFallbackCombinations = 6;

std::vector<CaseRecord> run_op_suite(const DeviceMesh& mesh, const std::string& mesh_kind,
                                     const std::vector<const OpInfo*>& ops, const OpCheckOptions& options,
                                     const SuiteRunOptions& run) {
  std::vector<CaseRecord> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpInfo& info = *ops[i];
    const size_t first_record = out.size();
    std::vector<std::string> sample_warnings;  // raised while making the samples
    std::vector<OpSample> samples;
    {
      ScopedWarningCollector collect(&sample_warnings);
      samples = info.make_samples();
    }
    for (const OpSample& s : samples) {
      if (mesh_kind != "1d" && !s.only_1d_because.empty()) {
        DirectionResult skipped;
        skipped.reason = "checked on 1-D meshes only: " + s.only_1d_because;
        out.push_back(record_of(info, s, mesh_kind, "fwd", skipped, OpCheckResult{}));
        out.push_back(record_of(info, s, mesh_kind, "bwd", skipped, OpCheckResult{}));
        continue;
      }
      OpCheckOptions o = options;
      o.identity_is_trivial = info.generated;  // NOTE: [Trivial cases]
      OpCheckResult r = check_sample(mesh, info, s, o);
      CaseRecord fwd = record_of(info, s, mesh_kind, "fwd", r.forward, r);
      CaseRecord bwd = record_of(info, s, mesh_kind, "bwd", r.backward, r);
      const bool missing_rule = r.forward.status == CheckStatus::kError &&
                                r.forward.reason.find("has no sharding rule") != std::string::npos;
      if (run.retry_with_fallback && missing_rule) {
        OpCheckOptions fo = o;
        fo.replicate_fallback = true;
        fo.converter.max_combinations = kFallbackCombinations;
        fo.converter.cover_pairs = false;  // a probe: does it work through the fallback
        OpCheckResult f = check_sample(mesh, info, s, fo);
        fwd.fallback_status = to_string(f.forward.status);
        bwd.fallback_status = to_string(f.backward.status);
        add_unique(fwd.warnings, f.warnings);
        add_unique(bwd.warnings, f.warnings);
      }
      add_unique(fwd.warnings, sample_warnings);
      add_unique(bwd.warnings, sample_warnings);
      out.push_back(std::move(fwd));
      out.push_back(std::move(bwd));
    }
    unite_warnings_over_ranks(mesh, out, first_record);
    if (run.progress) run.progress(i + 1, ops.size());
  }
  return out;
}

// ---- expected failures -------------------------------------------------------------------------

std::vector<ListingEntry> parse_listing(const std::string& text, const std::string& source_name, size_t n_fields,
                                        const std::string& form, const std::string& an_entry) {
  std::vector<ListingEntry> entries;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line = line.substr(0, hash);
    std::istringstream fields(line);
    ListingEntry e;
    std::string f;
    while (e.fields.size() < n_fields && fields >> f) e.fields.push_back(f);
    if (e.fields.empty()) continue;  // blank or comment
    TORCH_CHECK(e.fields.size() == n_fields, source_name, ":", n, ": expected ", form, ", got '", line, "'");
    std::getline(fields >> std::ws, e.reason);
    while (!e.reason.empty() && std::isspace(static_cast<unsigned char>(e.reason.back()))) e.reason.pop_back();
    TORCH_CHECK(!e.reason.empty(), source_name, ":", n, ": ", an_entry, " needs a reason (", form, ")");
    e.line = n;
    entries.push_back(std::move(e));
  }
  return entries;
}

std::string read_listing(const std::string& path, const std::string& what, const std::string& hint) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "cannot read the ", what, " file ", path, hint);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ExpectedFailures ExpectedFailures::parse(const std::string& text, const std::string& source_name) {
  ExpectedFailures xf;
  for (auto& l : parse_listing(text, source_name, 4, "'<op> <variant> <mesh> <direction> <reason>'",
                                   "an expected failure")) {
    ExpectedFailure e{l.fields[0], l.fields[1], l.fields[2], l.fields[3], std::move(l.reason), l.line};
    TORCH_CHECK(e.mesh == "*" || e.mesh == "1d" || e.mesh == "2d", source_name, ":", e.line, ": mesh '", e.mesh,
                "' is not one of 1d, 2d, *");
    TORCH_CHECK(e.direction == "*" || e.direction == "fwd" || e.direction == "bwd", source_name, ":", e.line,
                ": direction '", e.direction, "' is not one of fwd, bwd, *");
    xf.entries_.push_back(std::move(e));
  }
  return xf;
}

ExpectedFailures ExpectedFailures::load(const std::string& path) {
  return parse(read_listing(path, "expected-failures", " (set DTENSOR_OPS_EXPECTED_FAILURES to its path)"), path);
}

const ExpectedFailure* ExpectedFailures::match(const CaseRecord& r) const {
  auto ok = [](const std::string& pattern, const std::string& value) { return pattern == "*" || pattern == value; };
  for (const ExpectedFailure& e : entries_)
    if (ok(e.op, r.op) && ok(e.variant, r.variant) && ok(e.mesh, r.mesh) && ok(e.direction, r.direction)) return &e;
  return nullptr;
}

void apply_expected_failures(std::vector<CaseRecord>& records, const ExpectedFailures& xf) {
  for (CaseRecord& r : records) {
    // Skips stay skips; records that went through the file already (read back from a
    // suite run) are left as they are.
    if (r.status == "skip" || r.status == "xfail" || r.status == "xpass") continue;
    const ExpectedFailure* e = xf.match(r);
    if (!e) continue;
    if (r.status == "pass") {
      r.status = "xpass";
      r.reason = "listed as expected to fail (" + e->reason + ") but passed";
    } else {
      r.status = "xfail";
      r.reason = e->reason + " [" + r.reason + "]";
    }
  }
}

std::string default_expected_failures_path() {
  if (const char* p = std::getenv("DTENSOR_OPS_EXPECTED_FAILURES")) return p;
  return std::string(internal::source_dir()) + "/suites/ops/expected_failures.txt";
}

}  // namespace testing
}  // namespace dtensor
