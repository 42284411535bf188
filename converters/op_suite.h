// converters/op_suite.h
//
// The op suite: every sample of every op of the database (op_db.h) checked by the driver
// (op_check.h) on a mesh, forward and backward, each outcome a CaseRecord (DESIGN.md D6:
// reports are data first). suites/ops runs it family by family under gtest and compares the
// records with the checked-in expected failures; tools/opcov runs it (or reads the records
// the suite wrote) and renders the coverage report.
//
//   // In every rank (collective):
//   auto mesh = init_device_mesh("cpu", {4});
//   std::vector<CaseRecord> records =
//       run_op_suite(mesh, "1d", ops_of_family(op_db(), "pointwise"), suite_options("1d"));
//
// NOTE: [Op suite statuses]
// Each case (op, sample variant, mesh, direction) ends as one of:
//   pass   every placement combination matched the plain op;
//   fail   some combination gave a wrong shape, dtype or value;
//   error  some combination threw (no sharding rule, no valid strategy, ...);
//   skip   not checked: the sample is invalid on plain tensors, or (backward) nothing is
//          differentiable or the op writes an input;
// and, after the expected-failures file is applied:
//   xfail  listed as expected to fail, and did not pass;
//   xpass  listed as expected to fail, but passed (an unexpected pass fails the suite).
// "timeout" is used by tools that kill a case that runs too long.
#pragma once

#include "converters/op_check.h"
#include "converters/op_db.h"
#include "dtensor/mesh/device_mesh.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {

struct CaseRecord {
  std::string op;         // "aten::add.Tensor"
  std::string family;
  std::string variant;    // the sample's name
  std::string mesh;       // "1d" (all ranks) or "2d"
  std::string direction;  // "fwd" or "bwd"
  std::string status;     // NOTE: [Op suite statuses]
  std::string reason;     // why not a pass (the first failing combination's message)
  std::string failing_placements;
  std::vector<int> failing_ranks;  // processes that crashed or timed out (empty with threads)
  double max_error = 0;
  double duration_ms = 0;  // of the whole sample (both directions)
  int64_t combinations = 0;
  int64_t passed = 0;
  int64_t refused = 0;  // DirectionResult::refused
  // {passed, run} per placement of the first tensor argument (DirectionResult::by_placement).
  std::map<std::string, std::pair<int64_t, int64_t>> by_placement;
  bool used_fallback = false;  // NOTE: [Replicate fallback] was needed
  bool generated = false;      // the sample came from the op's schema
  // For a case that failed for want of a sharding rule: its status when run again through
  // the replicate fallback ("" when not tried). Set by run_op_suite's retry option.
  std::string fallback_status;
  // NOTE: [Trivial cases]: why a pass verified nothing ("" when it did).
  std::string trivial;
  // Which placement combinations ran (NOTE: [Converter covering design]): the design, the
  // size of the whole product, and the indices of the combinations visited (empty for the
  // full product, which visits 0 .. total-1).
  std::string design;
  int64_t total_combinations = 0;
  std::vector<int64_t> plan;
  // libtorch warnings raised while the sample ran (OpCheckResult::warnings) or while its
  // op's samples were made, on any rank (run_op_suite unites the ranks' lists: a warning
  // libtorch gives once per process reaches one rank thread only).
  std::vector<std::string> warnings;
};
void to_json(nlohmann::json& j, const CaseRecord& r);
void from_json(const nlohmann::json& j, CaseRecord& r);

// The caps of suite_options (NOTE: [Converter covering design]; see op_suite.cpp).
constexpr int64_t kMaxCombinations1D = 160;
constexpr int64_t kMaxCombinations2D = 48;

// The driver options of a mesh kind: "1d" tries Partial and uneven shards; "2d" chooses
// per mesh dim (Partial and uneven included). Both cap the combinations per sample.
OpCheckOptions suite_options(const std::string& mesh_kind);

// The mesh of a mesh kind over `world` (collective): "1d" all ranks; "2d" {2, n/2}, of
// `device_type` ("cpu", or "cuda" for the op coverage of a GPU run).
// nullopt for "2d" when the world size is odd or < 4.
std::optional<DeviceMesh> suite_mesh(const std::string& mesh_kind, comm::GroupPtr world = nullptr,
                                     const std::string& device_type = "cpu");

std::vector<const OpInfo*> ops_of_family(const OpDb& db, const std::string& family);

struct SuiteRunOptions {
  // Called after each op with (ops done, ops total).
  std::function<void(size_t, size_t)> progress;
  // A sample that fails for want of a sharding rule runs again through the replicate
  // fallback (a few combinations), to tell "fallback" from "no rule" (tools/opcov).
  bool retry_with_fallback = false;
};

// Collective. Runs every sample of `ops` on `mesh`; two records per sample (fwd, bwd).
std::vector<CaseRecord> run_op_suite(const DeviceMesh& mesh, const std::string& mesh_kind,
                                     const std::vector<const OpInfo*>& ops, const OpCheckOptions& options,
                                     const SuiteRunOptions& run = {});

// ---- checked-in listings ------------------------------------------------------------------------
//
// NOTE: [Listing files] suites/ops/expected_failures.txt and coverage_exclusions.txt share one
// format: one entry per line, `#` starts a comment, blank lines are skipped; an entry is
// `n_fields` whitespace-separated fields, then a reason (the rest of the line, required).
struct ListingEntry {
  std::vector<std::string> fields;
  std::string reason;
  int line = 0;
};
// Throws naming `source_name` and the line for a line with too few fields ("expected <form>")
// or no reason ("<an_entry> needs a reason").
std::vector<ListingEntry> parse_listing(const std::string& text, const std::string& source_name, size_t n_fields,
                                        const std::string& form, const std::string& an_entry);
// The file's text; throws "cannot read the <what> file <path><hint>".
std::string read_listing(const std::string& path, const std::string& what, const std::string& hint = "");

// ---- expected failures -------------------------------------------------------------------------
//
// A text file, one entry per line: `<op> <variant> <mesh> <direction> <reason...>`, where
// the first four fields may be `*`, and `#` starts a comment. Example:
//   aten::mean.dim  uneven_f64  *  *  Partial(avg) of uneven shards is not an average
struct ExpectedFailure {
  std::string op, variant, mesh, direction, reason;
  int line = 0;
};

class ExpectedFailures {
 public:
  ExpectedFailures() = default;
  // Throws naming the file and line for a malformed line.
  static ExpectedFailures load(const std::string& path);
  static ExpectedFailures parse(const std::string& text, const std::string& source_name);
  // The first entry matching the case, or nullptr.
  const ExpectedFailure* match(const CaseRecord& r) const;
  const std::vector<ExpectedFailure>& entries() const { return entries_; }

 private:
  std::vector<ExpectedFailure> entries_;
};

// Applies the file: a matching case that did not pass becomes "xfail" (its reason prefixed
// with the file's), one that passed becomes "xpass". Skips stay skips.
void apply_expected_failures(std::vector<CaseRecord>& records, const ExpectedFailures& xf);

// The checked-in file (suites/ops/expected_failures.txt of the source tree), or the path in
// DTENSOR_OPS_EXPECTED_FAILURES.
std::string default_expected_failures_path();

}  // namespace testing
}  // namespace dtensor
