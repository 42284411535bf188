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
//   covered   it has cases, every case that ran passed (rule or decomposition), and at least
//             one forward pass is not trivial (NOTE: [Trivial cases]);
//   trivial   every case that ran passed, but each verified nothing (empty, all-NaN, an input
//             unchanged);
//   excluded  no case of it ran, and it is listed with a reason in
//             suites/ops/coverage_exclusions.txt (an overload whose cases ran keeps their verdict);
//   failing   some case failed, errored for another reason than a missing rule, timed out,
//             or is an expected failure;
//   fallback  it has no rule (or decomposes into an op without one) and passes through the
//             opt-in replicate fallback (NOTE: [Replicate fallback]);
//   no rule   it has no rule and nothing above holds (not exercised, or fails without one);
//   untested  it has a rule but no sample ran (should not happen: the suite requires samples).
// NOTE: [Strict coverage]
// An op name (aten::add) is covered when EVERY overload of it is covered or excluded with a
// reason, and at least one is covered. It is verified on a (mesh, direction) when every
// overload that is not excluded has a non-trivial pass there and no case that did not pass
// (backward: an overload whose backward does not apply -- it writes an input, no output is
// differentiable -- is passed over, but one overload must have a non-trivial backward pass).
// The "loose" figures are the previous definitions (an overload that never ran was ignored),
// kept to compare.
#pragma once

#include "converters/op_suite.h"
#include "tools/opcov/discovery.h"

#include <nlohmann/json.hpp>

#include <map>
#include <regex>
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
  std::string excluded;  // the exclusion's reason when listed ("" when not)
};

// suites/ops/coverage_exclusions.txt: `<regex over aten::name.overload> <reason...>` per line,
// `#` comments. Throws naming file and line for a malformed line or regex.
struct Exclusion {
  std::string pattern, reason;
  int line = 0;
};
class Exclusions {
 public:
  static Exclusions load(const std::string& path);
  static Exclusions parse(const std::string& text, const std::string& source_name);
  const Exclusion* match(const std::string& op) const;
  const std::vector<Exclusion>& entries() const { return entries_; }

 private:
  std::vector<Exclusion> entries_;
  std::vector<std::regex> res_;
};
std::string default_exclusions_path();

// NOTE: [PyTorch's DTensor op test beside ours]
// suites/ops/pytorch_dtensor_ops.txt (written by tools/opcov/pytorch_dtensor_ops.py): every
// OpInfo of PyTorch's op database with what PyTorch's own DTensor op test expects of it
// (pass, xfail, skip) and the aten op it names. The reports list, for the OpInfos PyTorch
// passes, whether we cover that aten op name (strict), and the other way round.
struct PytorchOpInfo {
  std::string opinfo, expectation, aten;  // "linalg.svd", "pass", "aten::linalg_svd"
};
std::vector<PytorchOpInfo> parse_pytorch_dtensor_ops(const std::string& text, const std::string& source_name);
std::string default_pytorch_dtensor_ops_path();
struct PytorchComparison {
  int opinfos = 0, pytorch_pass = 0;
  int pass_covered = 0;  // OpInfos PyTorch passes whose aten op name we cover
  // OpInfos PyTorch passes whose aten name we do not cover: (opinfo, aten name, our status).
  std::vector<std::vector<std::string>> pass_not_covered;
  // OpInfos PyTorch xfails or skips whose aten name we cover: (opinfo, expectation, aten name).
  std::vector<std::vector<std::string>> covered_not_pass;
};
PytorchComparison compare_with_pytorch(const std::vector<PytorchOpInfo>& pytorch, const std::vector<OpRow>& rows);

// NOTE: [Overloads PyTorch's DTensor registers]
// suites/ops/pytorch_registered_ops.txt (written by tools/opcov/pytorch_registered_ops.py with
// today's wheel) lists every operator overload PyTorch's DTensor has a sharding strategy, rule
// or handler for. Each one this libtorch's dispatcher has should be covered by ours (strict
// status "covered"); suites/ops/pytorch_registered_exceptions.txt lists, with the reason, those
// that are not (the format of coverage_exclusions.txt: `<regex> <reason>`). The reports give,
// of PyTorch's overloads: those absent here (a newer aten; PyTorch's Python-only prims), those
// we cover, the listed exceptions and the rest with our status; and our count of covered
// overloads beside PyTorch's count of registered ones. A test (OpCoverage.
// EveryOverloadPytorchRegistersHasARuleHereOrIsListed) checks the listing against the rules.
struct PytorchRegistered {
  std::string torch;              // the version in the file's header
  std::vector<std::string> ops;   // "aten::add.Tensor", "aten::relu", "prims::sum"
};
PytorchRegistered parse_pytorch_registered_ops(const std::string& text, const std::string& source_name);
std::string default_pytorch_registered_ops_path();
std::string default_pytorch_registered_exceptions_path();
struct RegisteredComparison {
  std::string torch;
  int registered = 0, covered = 0;
  std::vector<std::string> absent;                    // not in this libtorch's dispatcher
  std::vector<std::vector<std::string>> exceptions;   // (op, our status, reason): listed
  std::vector<std::vector<std::string>> not_covered;  // (op, our status, why): not listed
};
RegisteredComparison compare_with_registered(const PytorchRegistered& pytorch, const std::vector<OpRow>& rows,
                                             const Exclusions& exceptions);

// Run metadata written into coverage.json and the report headers.
struct RunInfo {
  std::string started;   // ISO 8601, UTC
  double duration_s = 0;
  int world_size = 0;
  std::string libtorch;  // TORCH_VERSION
  std::string command;
  std::string source;  // "opcov run" or "results of <dir>"
  // Status per overload of a previous report (--previous coverage.json): report.html lists
  // the changes. Empty: none given.
  std::map<std::string, std::string> previous_status;
  // NOTE: [PyTorch's DTensor op test beside ours] (empty: no comparison in the reports).
  std::vector<PytorchOpInfo> pytorch_ops;
  // NOTE: [Overloads PyTorch's DTensor registers] (no ops: no comparison in the reports).
  PytorchRegistered pytorch_registered;
  Exclusions registered_exceptions;
  // NOTE: [Discovery in the op-coverage report]: strategy_discovery's findings (null: none)
  // and PyTorch's DTensor on the same combinations (no header: none).
  nlohmann::json discovery;
  PytorchStrategies pytorch_strategies;
};

// One row per aten operator overload of the dispatcher (sorted), statuses from `records`.
std::vector<OpRow> classify_ops(const std::vector<testing::CaseRecord>& records,
                                const Exclusions& exclusions = {});

// A short class for a case's reason: "no rule: aten::x", "wrong values", "no valid strategy",
// "shape inference", "crash", "timeout", "expected failure", "other error".
std::string reason_class(const testing::CaseRecord& r);

// Headline numbers (also in coverage.json "summary").
struct Summary {
  int op_names = 0, op_names_covered = 0;
  int overloads = 0, overloads_covered = 0;
  std::map<std::string, int> overloads_by_status;
  int rule_names = 0, rule_overloads = 0;  // ops with a registered rule
  // Rule overloads with a forward case that ran (not skipped), and those without one.
  int rule_overloads_exercised = 0;
  std::vector<std::string> rule_overloads_not_exercised;
  int op_names_covered_loose = 0;  // NOTE: [Strict coverage]: the previous definition
  int overloads_excluded = 0;
  int cases_skipped = 0;        // cases not checked (invalid sample, nothing differentiable, ...)
  int64_t refused = 0;          // combinations refused as documented inside passing cases
  int trivial_passes = 0;       // passing cases that verified nothing (NOTE: [Trivial cases])
  int covering_cases = 0;       // cases that ran a covering design instead of the full product
  int64_t combinations_run = 0, combinations_total = 0;
  // Distinct op names with every 1-D / 2-D, forward / backward case passing (hand-written
  // and generated samples), keyed "1d fwd", "1d bwd", "2d fwd", "2d bwd", "both fwd".
  std::map<std::string, int> verified_names;
  std::map<std::string, int> verified_names_loose;
  std::map<std::string, int> cases_by_status;
};
Summary summarize(const std::vector<testing::CaseRecord>& records, const std::vector<OpRow>& rows);

// The headline sentence (summary.md, report.html, the terminal): strict numbers, with their
// definitions, the caps, skips, trivial passes and refusals.
std::string headline(const Summary& s);

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
