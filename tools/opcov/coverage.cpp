// tools/opcov/coverage.cpp: see coverage.h.
#include "tools/opcov/coverage.h"

#include "tools/opcov/text_internal.h"

#include "converters/op_db.h"
#include "converters/source_dir_internal.h"
#include "dtensor/ops/registry.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <cstdio>
#include <iomanip>
#include <set>
#include <sstream>

namespace dtensor {
namespace opcov {

using testing::CaseRecord;



using namespace text;

std::string reason_class(const CaseRecord& r) {
  if (r.status == "xfail") return "expected failure";
  if (r.status == "xpass") return "unexpected pass";
  if (r.status == "timeout") return "timeout";
  const std::string& m = r.reason;
  if (m.find("crashed") != std::string::npos) return "crash";
  const auto nr = m.find("has no sharding rule");
  if (nr != std::string::npos) {
    const auto p = m.find("operator ");
    if (p != std::string::npos && p < nr) return "no rule: " + m.substr(p + 9, nr - p - 10);
    return "no rule";
  }
  if (m.find("no valid sharding") != std::string::npos) return "no valid strategy";
  if (m.find("computing the output shape") != std::string::npos) return "shape inference";
  if (m.find("got a plain tensor") != std::string::npos || m.find("mixing DTensors and plain") != std::string::npos)
    return "plain tensor mixed in";
  if (m.find("values differ") != std::string::npos || m.find("differs from the expected") != std::string::npos ||
      m.find("is a plain tensor, not a DTensor") != std::string::npos ||
      m.find("differ on another rank") != std::string::npos)
    return "wrong result";
  return "other error";
}

// ---- exclusions --------------------------------------------------------------------------------

// NOTE: [Listing files] (converters/op_suite.h): the format expected_failures.txt has too.
Exclusions Exclusions::parse(const std::string& text, const std::string& source_name) {
  Exclusions ex;
  for (auto& l : testing::parse_listing(text, source_name, 1, "'<regex> <reason>'", "an exclusion")) {
    Exclusion e{l.fields[0], std::move(l.reason), l.line};
    std::regex re;
    try {
      re = std::regex(e.pattern);
    } catch (const std::regex_error&) {
      TORCH_CHECK(false, source_name, ":", e.line, ": '", e.pattern, "' is not a valid regular expression");
    }
    ex.entries_.push_back(std::move(e));
    ex.res_.push_back(std::move(re));
  }
  return ex;
}

Exclusions Exclusions::load(const std::string& path) {
  return parse(testing::read_listing(path, "coverage exclusions"), path);
}

const Exclusion* Exclusions::match(const std::string& op) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (std::regex_match(op, res_[i])) return &entries_[i];
  return nullptr;
}

std::string default_exclusions_path() {
  if (const char* p = std::getenv("DTENSOR_OPCOV_EXCLUSIONS")) return p;
  return std::string(testing::internal::source_dir()) + "/suites/ops/coverage_exclusions.txt";
}

// NOTE: [PyTorch's DTensor op test beside ours]
std::vector<PytorchOpInfo> parse_pytorch_dtensor_ops(const std::string& text, const std::string& source_name) {
  std::vector<PytorchOpInfo> out;
  for (auto& l : testing::parse_listing(text, source_name, 2, "'<opinfo> <pass|xfail|skip> <aten op>'", "an OpInfo line")) {
    TORCH_CHECK(l.fields[1] == "pass" || l.fields[1] == "xfail" || l.fields[1] == "skip", source_name, ":", l.line,
                ": expectation '", l.fields[1], "' is not one of pass, xfail, skip");
    out.push_back({l.fields[0], l.fields[1], l.reason});
  }
  return out;
}

std::string default_pytorch_dtensor_ops_path() {
  return std::string(testing::internal::source_dir()) + "/suites/ops/pytorch_dtensor_ops.txt";
}

// NOTE: [Overloads PyTorch's DTensor registers]
PytorchRegistered parse_pytorch_registered_ops(const std::string& text, const std::string& source_name) {
  PytorchRegistered out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const std::string prefix = "# torch ";
    if (line.rfind(prefix, 0) == 0) {
      out.torch = line.substr(prefix.size(), line.find(':') == std::string::npos ? std::string::npos
                                                                                  : line.find(':') - prefix.size());
      break;
    }
  }
  for (auto& l : testing::parse_listing(text, source_name, 1, "'<namespace::name[.overload]> <strategy|rule|handler>'",
                                        "an operator line")) {
    TORCH_CHECK(l.fields[0].find("::") != std::string::npos, source_name, ":", l.line, ": '", l.fields[0],
                "' is not an operator name (namespace::name[.overload])");
    out.ops.push_back(l.fields[0]);
  }
  return out;
}

std::string default_pytorch_registered_ops_path() {
  return std::string(testing::internal::source_dir()) + "/suites/ops/pytorch_registered_ops.txt";
}

std::string default_pytorch_registered_exceptions_path() {
  return std::string(testing::internal::source_dir()) + "/suites/ops/pytorch_registered_exceptions.txt";
}

RegisteredComparison compare_with_registered(const PytorchRegistered& pytorch, const std::vector<OpRow>& rows,
                                             const Exclusions& exceptions) {
  std::map<std::string, const OpRow*> by_op;
  for (const OpRow& r : rows) by_op[r.op] = &r;
  RegisteredComparison c;
  c.torch = pytorch.torch;
  for (const std::string& op : pytorch.ops) {
    ++c.registered;
    auto it = by_op.find(op);
    if (it == by_op.end()) {
      c.absent.push_back(op);
      continue;
    }
    const OpRow& r = *it->second;
    if (r.status == "covered") {
      ++c.covered;
    } else if (const Exclusion* e = exceptions.match(op)) {
      c.exceptions.push_back({op, r.status, e->reason});
    } else {
      c.not_covered.push_back({op, r.status, r.reason});
    }
  }
  return c;
}

PytorchComparison compare_with_pytorch(const std::vector<PytorchOpInfo>& pytorch, const std::vector<OpRow>& rows) {
  // Our strict status per op name (NOTE: [Strict coverage]): "covered", or the overloads' statuses.
  std::map<std::string, std::map<std::string, int>> by_name;
  for (const OpRow& r : rows) ++by_name[r.name][r.status];
  auto covered = [](const std::map<std::string, int>& st) {
    int other = 0;
    for (const auto& kv : st)
      if (kv.first != "covered" && kv.first != "excluded") other += kv.second;
    return other == 0 && st.count("covered") > 0;
  };
  PytorchComparison c;
  for (const PytorchOpInfo& p : pytorch) {
    ++c.opinfos;
    auto it = by_name.find(p.aten);
    const bool ours = it != by_name.end() && covered(it->second);
    if (p.expectation == "pass") {
      ++c.pytorch_pass;
      if (ours) {
        ++c.pass_covered;
        continue;
      }
      std::string status;
      if (it == by_name.end()) {
        status = "no such aten op here (a Python-level composite, or not in this libtorch)";
      } else {
        for (const auto& kv : it->second) status += (status.empty() ? "" : ", ") + kv.first + " " + std::to_string(kv.second);
        status += " (overloads)";
      }
      c.pass_not_covered.push_back({p.opinfo, p.aten, status});
    } else if (ours) {
      c.covered_not_pass.push_back({p.opinfo, p.expectation, p.aten});
    }
  }
  return c;
}

namespace {
// A backward skip that says backward does not apply to the op (NOTE: [Strict coverage]).
bool backward_not_applicable(const CaseRecord& r) {
  return r.direction == "bwd" && r.status == "skip" &&
         (r.reason.find("writes an input") != std::string::npos ||
          r.reason.find("no differentiable output") != std::string::npos ||
          r.reason.find("not differentiable on plain tensors") != std::string::npos ||
          r.reason.find("inputs that require grad are refused") != std::string::npos);
}
}  // namespace

std::vector<OpRow> classify_ops(const std::vector<CaseRecord>& records, const Exclusions& exclusions) {
  std::map<std::string, std::vector<const CaseRecord*>> by_op;
  for (const auto& r : records) by_op[r.op].push_back(&r);
  std::vector<c10::OperatorName> names = c10::Dispatcher::singleton().getAllOpNames();
  std::set<std::string> keys;
  for (const auto& n : names)
    if (n.name.rfind("aten::", 0) == 0) keys.insert(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
  for (const auto& kv : by_op) keys.insert(kv.first);  // ops of records from another libtorch
  std::vector<OpRow> rows;
  for (const std::string& key : keys) {
    OpRow row;
    row.op = key;
    row.name = name_of(key);
    row.has_rule = ops::has_rule(key);
    const auto dot = key.find('.', 6);
    auto handle = c10::Dispatcher::singleton().findSchema(
        {key.substr(0, dot), dot == std::string::npos ? "" : key.substr(dot + 1)});
    row.composite = handle && handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    auto it = by_op.find(key);
    std::vector<const CaseRecord*> ran;
    if (it != by_op.end()) {
      for (const CaseRecord* r : it->second) {
        row.family = r->family;
        row.generated = r->generated;
        ++row.cases[r->status];
        if (r->status != "skip") ran.push_back(r);
      }
    }
    if (ran.empty()) {
      row.status = row.has_rule ? "untested" : "no rule";
      row.reason = it == by_op.end() ? "not exercised (no sample)" : "every sample was skipped: " +
                                                                          first_line(it->second.front()->reason);
      rows.push_back(std::move(row));
      continue;
    }
    bool all_pass = true, only_missing_rules = true, fallback_passes = true;
    for (const CaseRecord* r : ran) {
      if (r->status == "pass") continue;
      all_pass = false;
      // A backward not checked because its forward failed: the forward record tells why.
      if (r->reason.rfind("not checked on every placement: the forward failed", 0) == 0) continue;
      if (row.reason.empty()) row.reason = first_line(r->reason);
      const bool missing = reason_class(*r).rfind("no rule", 0) == 0;
      only_missing_rules = only_missing_rules && missing;
      fallback_passes = fallback_passes && (r->fallback_status == "pass" || r->fallback_status == "skip");
    }
    const bool real_pass = std::any_of(ran.begin(), ran.end(), [](const CaseRecord* r) {
      return r->direction == "fwd" && r->status == "pass" && r->trivial.empty();
    });
    if (all_pass && real_pass) row.status = "covered";
    else if (all_pass) {
      row.status = "trivial";
      row.reason = "every passing case verified nothing: " + ran.front()->trivial;
    } else if (only_missing_rules && fallback_passes) row.status = "fallback";
    else if (only_missing_rules) row.status = "no rule";
    else row.status = "failing";
    rows.push_back(std::move(row));
  }
  for (OpRow& row : rows) {
    const Exclusion* e = exclusions.match(row.op);
    if (!e) continue;
    row.excluded = e->reason;
    // An overload that ran cases keeps what they say (a failing one is not hidden).
    const bool ran = std::any_of(row.cases.begin(), row.cases.end(),
                                 [](const auto& c) { return c.first != "skip" && c.second > 0; });
    if (!ran) {
      row.status = "excluded";
      row.reason = e->reason;
    }
  }
  return rows;
}

namespace {

using RowsByName = std::map<std::string, std::vector<const OpRow*>>;

// Counts by overload and by op name.
RowsByName count_overloads(const std::vector<CaseRecord>& records, const std::vector<OpRow>& rows, Summary& s) {
  RowsByName by_name;
  std::set<std::string> exercised_fwd;  // overloads with a forward case that ran
  for (const auto& r : records)
    if (r.direction == "fwd" && r.status != "skip") exercised_fwd.insert(r.op);
  for (const OpRow& r : rows) {
    by_name[r.name].push_back(&r);
    ++s.overloads_by_status[r.status];
    if (r.status == "excluded") ++s.overloads_excluded;
    if (r.has_rule) {
      ++s.rule_overloads;
      if (exercised_fwd.count(r.op)) ++s.rule_overloads_exercised;
      else s.rule_overloads_not_exercised.push_back(r.op);
    }
  }
  s.overloads = static_cast<int>(rows.size());
  s.overloads_covered = s.overloads_by_status["covered"];
  s.op_names = static_cast<int>(by_name.size());
  for (const auto& kv : by_name) {
    bool any_exercised = false, loose_all = true, rule = false, strict_all = true, any_covered = false;
    for (const OpRow* r : kv.second) {
      rule = rule || r->has_rule;
      strict_all = strict_all && (r->status == "covered" || r->status == "excluded");
      any_covered = any_covered || r->status == "covered";
      const bool exercised = std::any_of(r->cases.begin(), r->cases.end(),
                                         [](const auto& c) { return c.first != "skip" && c.second > 0; });
      if (!exercised) continue;
      any_exercised = true;
      loose_all = loose_all && (r->status == "covered" || r->status == "trivial");
    }
    if (rule) ++s.rule_names;
    if (any_exercised && loose_all) ++s.op_names_covered_loose;
    if (strict_all && any_covered) ++s.op_names_covered;
  }
  return by_name;
}

// Per overload and (mesh, direction): non-trivial passes, bad cases, not-applicable skips, cases.
struct Tally {
  int real = 0, bad = 0, na = 0, n = 0, pass = 0;
};
using TallyByOp = std::map<std::string, std::map<std::string, Tally>>;

// Counts by case; the tallies per overload, and (loosely, per op name) passes and bad cases.
TallyByOp tally_cases(const std::vector<CaseRecord>& records, Summary& s,
                      std::map<std::string, std::map<std::string, std::pair<int, int>>>& loose) {
  TallyByOp per_op;
  for (const auto& r : records) {
    ++s.cases_by_status[r.status];
    if (r.status == "skip") ++s.cases_skipped;
    if (r.status == "pass" && !r.trivial.empty()) ++s.trivial_passes;
    if (r.direction == "fwd") {
      s.refused += r.refused;
      s.combinations_run += r.combinations;
      s.combinations_total += r.total_combinations;
      if (!r.design.empty() && r.design != "full product") ++s.covering_cases;
    }
    const std::string key = r.mesh + " " + r.direction;
    Tally& t = per_op[r.op][key];
    ++t.n;
    if (r.status == "pass") ++t.pass;
    if (r.status == "pass" && r.trivial.empty()) ++t.real;
    if (not_passing(r.status)) ++t.bad;
    if (backward_not_applicable(r)) ++t.na;
    auto& slot = loose[name_of(r.op)][key];
    if (r.status == "pass") ++slot.first;
    else if (not_passing(r.status)) ++slot.second;
  }
  return per_op;
}

// Whether op name `rows` is verified for `key` (mesh and direction), strictly: every overload
// not excluded has a non-trivial pass and no bad case (a backward that does not apply counts).
bool verified(const std::vector<const OpRow*>& rows, const TallyByOp& per_op, const std::string& key) {
  const bool bwd = key.find("bwd") != std::string::npos;
  bool some_real = false;
  for (const OpRow* r : rows) {
    if (r->status == "excluded") continue;
    auto it = per_op.find(r->op);
    const Tally t = it == per_op.end() || !it->second.count(key) ? Tally{} : it->second.at(key);
    some_real = some_real || t.real > 0;
    if (t.bad > 0) return false;
    if (t.real > 0) continue;
    if (bwd && t.n > 0 && t.na + t.pass == t.n) continue;  // backward does not apply
    return false;
  }
  return some_real;
}

}  // namespace

Summary summarize(const std::vector<CaseRecord>& records, const std::vector<OpRow>& rows) {
  Summary s;
  const RowsByName by_name = count_overloads(records, rows, s);
  std::map<std::string, std::map<std::string, std::pair<int, int>>> loose;  // name -> key -> {pass, bad}
  const TallyByOp per_op = tally_cases(records, s, loose);
  const char* const keys[] = {"1d fwd", "1d bwd", "2d fwd", "2d bwd"};
  for (const auto& kv : loose) {
    bool fwd_both = true;
    for (const char* key : keys) {
      auto it = kv.second.find(key);
      const bool ok = it != kv.second.end() && it->second.first > 0 && it->second.second == 0;
      if (ok) ++s.verified_names_loose[key];
      if (std::string(key).find("fwd") != std::string::npos) fwd_both = fwd_both && ok;
    }
    if (fwd_both) ++s.verified_names_loose["both fwd"];
  }
  for (const auto& kv : by_name) {
    bool fwd_both = true;
    for (const char* key : keys) {
      const bool ok = verified(kv.second, per_op, key);
      if (ok) ++s.verified_names[key];
      if (std::string(key).find("fwd") != std::string::npos) fwd_both = fwd_both && ok;
    }
    if (fwd_both) ++s.verified_names["both fwd"];
  }
  return s;
}

std::string headline(const Summary& s) {
  std::ostringstream os;
  os << s.op_names_covered << " of " << s.op_names << " aten op names are covered: every overload of the name is covered "
     << "or excluded with a reason (" << s.overloads_excluded << " overloads excluded), where an overload is covered "
     << "when it has a forward case that verifies something and every case of it passes. " << s.overloads_covered
     << " of " << s.overloads << " overloads are covered. A case compares every placement combination when there are "
     << "at most " << testing::kMaxCombinations1D << " (1-D mesh) or " << testing::kMaxCombinations2D
     << " (2-D mesh), else a pairwise covering design (each operand in each of its placements, each pair "
     << "of operands in each pair of placements) plus seeded random ones (" << s.covering_cases
     << " forward cases ran such a design; " << s.combinations_run << " of the " << s.combinations_total
     << " combinations of all forward cases ran). " << s.cases_skipped
     << " cases were skipped, " << s.trivial_passes << " passing cases verified nothing and are not counted, "
     << s.refused << " combinations were refused as documented. Rules: " << s.rule_overloads_exercised << " of "
     << s.rule_overloads << " overloads with a registered rule were exercised.";
  return os.str();
}

}  // namespace opcov
}  // namespace dtensor
