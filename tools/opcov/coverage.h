// tools/opcov/coverage.h
//
// The op-coverage report (DESIGN.md D6, issue: op coverage): from the op suite's CaseRecords
// (converters/op_suite.h) and the dispatcher's list of operators, a status for every aten
// operator, and the three renderings tools/opcov writes:
//   coverage.json  schema-versioned data: run info, one record per case, one row per op;
//   summary.md     headline "N of M ops", tables by reason and by family, a block per failing
//                  op with the command that reproduces it;
//   report.html    one static page (no network): op x placement grid coloured by status,
//                  filterable by family and status.
//
// NOTE: [Op coverage statuses]
// Every operator overload of the dispatcher's "aten" namespace gets one status:
//   covered   it has cases, and every case that ran passed (rule or decomposition);
//   failing   some case failed, errored for another reason than a missing rule, timed out,
//             or is an expected failure;
//   fallback  it has no rule (or decomposes into an op without one) and passes through the
//             opt-in replicate fallback (NOTE: [Replicate fallback]);
//   no rule   it has no rule and nothing above holds (not exercised, or fails without one);
//   untested  it has a rule but no sample ran (should not happen: the suite requires samples).
// An op name (aten::add) counts as covered when each of its overloads that ran is covered.
#pragma once

#include "converters/op_suite.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace dtensor {
namespace opcov {

constexpr int kSchemaVersion = 1;

struct OpRow {
  std::string op;      // "aten::add.Tensor"
  std::string name;    // "aten::add"
  std::string family;  // from the records ("" when not exercised)
  std::string status;  // NOTE: [Op coverage statuses]
  std::string reason;  // the first non-passing case's reason
  bool has_rule = false;
  bool composite = false;  // has a CompositeImplicitAutograd kernel (decomposes above DTensor)
  bool generated = false;  // its samples came from its schema
  std::map<std::string, int> cases;  // status -> count
};

// Run metadata written into coverage.json and the report headers.
struct RunInfo {
  std::string started;   // ISO 8601, UTC
  double duration_s = 0;
  int world_size = 0;
  std::string libtorch;  // TORCH_VERSION
  std::string command;
  std::string source;  // "opcov run" or "results of <dir>"
};

// One row per aten operator overload of the dispatcher (sorted), statuses from `records`.
std::vector<OpRow> classify_ops(const std::vector<testing::CaseRecord>& records);

// A short class for a case's reason: "no rule: aten::x", "wrong values", "no valid strategy",
// "shape inference", "crash", "timeout", "expected failure", "other error".
std::string reason_class(const testing::CaseRecord& r);

// Headline numbers (also in coverage.json "summary").
struct Summary {
  int op_names = 0, op_names_covered = 0;
  int overloads = 0, overloads_covered = 0;
  std::map<std::string, int> overloads_by_status;
  int rule_names = 0, rule_overloads = 0;  // ops with a registered rule
  // Distinct op names with every 1-D / 2-D, forward / backward case passing (hand-written
  // and generated samples), keyed "1d fwd", "1d bwd", "2d fwd", "2d bwd", "both fwd".
  std::map<std::string, int> verified_names;
  std::map<std::string, int> cases_by_status;
};
Summary summarize(const std::vector<testing::CaseRecord>& records, const std::vector<OpRow>& rows);

nlohmann::json coverage_json(const RunInfo& info, const std::vector<testing::CaseRecord>& records,
                             const std::vector<OpRow>& rows, const Summary& summary);
std::string summary_markdown(const RunInfo& info, const std::vector<testing::CaseRecord>& records,
                             const std::vector<OpRow>& rows, const Summary& summary);
std::string report_html(const RunInfo& info, const std::vector<testing::CaseRecord>& records,
                        const std::vector<OpRow>& rows, const Summary& summary);

// The shell command that reproduces the cases of `op` (tools/opcov on that op only).
std::string reproduce_command(const std::string& op);

}  // namespace opcov
}  // namespace dtensor
