// tools/opcov/coverage.cpp: see coverage.h.
#include "tools/opcov/coverage.h"

#include "converters/op_db.h"
#include "dtensor/ops/registry.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <cstdio>
#include <iomanip>
#include <set>
#include <sstream>

#ifndef DTENSOR_SOURCE_DIR
#define DTENSOR_SOURCE_DIR "."
#endif

namespace dtensor {
namespace opcov {

using testing::CaseRecord;



namespace {

bool not_passing(const std::string& status) { return status != "pass" && status != "skip"; }

std::string name_of(const std::string& op) {
  const auto sep = op.find("::");
  const auto dot = op.find('.', sep == std::string::npos ? 0 : sep + 2);
  return dot == std::string::npos ? op : op.substr(0, dot);
}

// "aten::add_" -> "aten::add"; dunder names ("aten::__lshift__") stay.
std::string base_name(const std::string& name) {
  if (name.size() > 2 && name.back() == '_' && name[name.size() - 2] != '_') return name.substr(0, name.size() - 1);
  return name;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string md_escape(std::string s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '|' || s[i] == '\n') s[i] = s[i] == '|' ? '/' : ' ';
  return s;
}

std::string first_line(const std::string& s, size_t max = 300) {
  std::string l = s.substr(0, s.find('\n'));
  return l.size() > max ? l.substr(0, max) + "..." : l;
}

int count_of(const std::map<std::string, int>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

std::string pct(int n, int d) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << (d ? 100.0 * n / d : 0.0) << "%";
  return os.str();
}

}  // namespace

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
  return std::string(DTENSOR_SOURCE_DIR) + "/suites/ops/coverage_exclusions.txt";
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
  return std::string(DTENSOR_SOURCE_DIR) + "/suites/ops/pytorch_dtensor_ops.txt";
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

Summary summarize(const std::vector<CaseRecord>& records, const std::vector<OpRow>& rows) {
  Summary s;
  std::map<std::string, std::vector<const OpRow*>> by_name;
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
  // Per overload and (mesh, direction): {non-trivial passes, bad cases, not-applicable skips, cases}.
  struct Tally {
    int real = 0, bad = 0, na = 0, n = 0, pass = 0;
  };
  std::map<std::string, std::map<std::string, Tally>> per_op;
  std::map<std::string, std::map<std::string, std::pair<int, int>>> loose;  // name -> key -> {pass, bad}
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
  for (const auto& kv : loose) {
    bool fwd_both = true;
    for (const char* key : {"1d fwd", "1d bwd", "2d fwd", "2d bwd"}) {
      auto it = kv.second.find(key);
      const bool ok = it != kv.second.end() && it->second.first > 0 && it->second.second == 0;
      if (ok) ++s.verified_names_loose[key];
      if (std::string(key).find("fwd") != std::string::npos) fwd_both = fwd_both && ok;
    }
    if (fwd_both) ++s.verified_names_loose["both fwd"];
  }
  for (const auto& kv : by_name) {
    bool fwd_both = true;
    for (const char* key : {"1d fwd", "1d bwd", "2d fwd", "2d bwd"}) {
      const bool bwd = std::string(key).find("bwd") != std::string::npos;
      bool ok = true, some_real = false;
      for (const OpRow* r : kv.second) {
        if (r->status == "excluded") continue;
        auto it = per_op.find(r->op);
        const Tally t = it == per_op.end() || !it->second.count(key) ? Tally{} : it->second.at(key);
        some_real = some_real || t.real > 0;
        if (t.bad > 0) ok = false;
        else if (t.real > 0) continue;
        else if (bwd && t.n > 0 && t.na + t.pass == t.n) continue;  // backward does not apply
        else ok = false;
      }
      ok = ok && some_real;
      if (ok) ++s.verified_names[key];
      if (!bwd) fwd_both = fwd_both && ok;
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

std::string reproduce_command(const std::string& op) {
  std::string escaped;
  for (char c : op) {
    if (c == '.') escaped += "\\\\.";
    else escaped += c;
  }
  return "build/tools/opcov --ops '^" + escaped + "$' --out /tmp/opcov-" + name_of(op).substr(6) + " --print-failures";
}

namespace {
nlohmann::json pytorch_json(const RunInfo& info, const std::vector<OpRow>& rows) {
  if (info.pytorch_ops.empty()) return nullptr;
  const PytorchComparison c = compare_with_pytorch(info.pytorch_ops, rows);
  return {{"opinfos", c.opinfos},
          {"pytorch_pass", c.pytorch_pass},
          {"pytorch_pass_we_cover", c.pass_covered},
          {"pytorch_pass_we_do_not_cover", c.pass_not_covered},
          {"we_cover_pytorch_does_not_pass", c.covered_not_pass}};
}
}  // namespace

nlohmann::json coverage_json(const RunInfo& info, const std::vector<CaseRecord>& records,
                             const std::vector<OpRow>& rows, const Summary& s) {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpRow& r : rows)
    ops.push_back({{"op", r.op},
                   {"name", r.name},
                   {"family", r.family},
                   {"status", r.status},
                   {"reason", r.reason},
                   {"has_rule", r.has_rule},
                   {"composite", r.composite},
                   {"generated", r.generated},
                   {"excluded", r.excluded},
                   {"cases", r.cases}});
  return {{"schema_version", kSchemaVersion},
          {"run",
           {{"started", info.started},
            {"duration_s", info.duration_s},
            {"world_size", info.world_size},
            {"libtorch", info.libtorch},
            {"command", info.command},
            {"source", info.source}}},
          {"summary",
           {{"op_names", s.op_names},
            {"op_names_covered", s.op_names_covered},
            {"op_names_covered_loose", s.op_names_covered_loose},
            {"overloads_excluded", s.overloads_excluded},
            {"rule_overloads_exercised", s.rule_overloads_exercised},
            {"rule_overloads_not_exercised", s.rule_overloads_not_exercised},
            {"cases_skipped", s.cases_skipped},
            {"refused", s.refused},
            {"trivial_passes", s.trivial_passes},
            {"covering_cases", s.covering_cases},
            {"combinations_run", s.combinations_run},
            {"combinations_total", s.combinations_total},
            {"verified_names_loose", s.verified_names_loose},
            {"headline", headline(s)},
            {"overloads", s.overloads},
            {"overloads_covered", s.overloads_covered},
            {"overloads_by_status", s.overloads_by_status},
            {"rule_names", s.rule_names},
            {"rule_overloads", s.rule_overloads},
            {"verified_names", s.verified_names},
            {"cases_by_status", s.cases_by_status}}},
          {"pytorch_dtensor_ops", pytorch_json(info, rows)},
          {"records", records},
          {"ops", ops}};
}

std::string summary_markdown(const RunInfo& info, const std::vector<CaseRecord>& records,
                             const std::vector<OpRow>& rows, const Summary& s) {
  std::ostringstream md;
  md << "# DTensor op coverage\n\n";
  md << "**" << s.op_names_covered << " of " << s.op_names << " ops** covered. " << headline(s) << "\n\n";
  md << "Run: " << info.started << ", " << std::fixed << std::setprecision(1) << info.duration_s << " s, world size "
     << info.world_size << ", libtorch " << info.libtorch << ", " << info.source << ".\n\n";
  md << "| verified op names | 1-D | 2-D |\n|---|---|---|\n";
  md << "| forward | " << count_of(s.verified_names, "1d fwd") << " | " << count_of(s.verified_names, "2d fwd") << " |\n";
  md << "| backward | " << count_of(s.verified_names, "1d bwd") << " | " << count_of(s.verified_names, "2d bwd") << " |\n\n";
  md << "Forward on both meshes: " << count_of(s.verified_names, "both fwd") << " op names. Ops with a sharding rule: "
     << s.rule_names << " names, " << s.rule_overloads << " overloads, " << s.rule_overloads_exercised
     << " of them exercised.\n\n";
  md << "Previous (loose) definitions, for comparison: " << s.op_names_covered_loose
     << " names covered (overloads that never ran ignored); verified forward " << count_of(s.verified_names_loose, "1d fwd")
     << " (1-D) / " << count_of(s.verified_names_loose, "2d fwd") << " (2-D), backward "
     << count_of(s.verified_names_loose, "1d bwd") << " / " << count_of(s.verified_names_loose, "2d bwd") << ".\n\n";

  md << "## Operators by status\n\n| status | overloads | share |\n|---|---|---|\n";
  for (const char* st : {"covered", "trivial", "excluded", "fallback", "failing", "no rule", "untested"})
    md << "| " << st << " | " << count_of(s.overloads_by_status, st) << " | " << pct(count_of(s.overloads_by_status, st), s.overloads)
       << " |\n";

  md << "\n## Cases by status\n\n| status | cases |\n|---|---|\n";
  for (const auto& kv : s.cases_by_status) md << "| " << kv.first << " | " << kv.second << " |\n";

  // By reason (cases that did not pass), largest first.
  std::map<std::string, int> by_reason;
  for (const auto& r : records)
    if (not_passing(r.status)) ++by_reason[reason_class(r)];
  std::vector<std::pair<std::string, int>> reasons(by_reason.begin(), by_reason.end());
  std::sort(reasons.begin(), reasons.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  md << "\n## Cases that did not pass, by reason\n\n| reason | cases |\n|---|---|\n";
  for (const auto& kv : reasons) md << "| " << md_escape(kv.first) << " | " << kv.second << " |\n";

  // By family (exercised overloads).
  std::map<std::string, std::map<std::string, int>> fam;
  for (const OpRow& r : rows)
    if (!r.family.empty()) ++fam[r.family][r.status];
  md << "\n## Exercised operators by family\n\n| family | covered | fallback | failing | no rule |\n|---|---|---|---|---|\n";
  for (const auto& kv : fam)
    md << "| " << kv.first << " | " << count_of(kv.second, "covered") << " | " << count_of(kv.second, "fallback") << " | "
       << count_of(kv.second, "failing") << " | " << count_of(kv.second, "no rule") << " |\n";

  md << "\n## Overloads with a registered rule that no case exercised (" << s.rule_overloads_not_exercised.size()
     << ")\n\nA rule registered under a bare name (aten::add) applies to every overload of it; these overloads "
        "have no forward case that ran.\n\n";
  for (size_t i = 0; i < s.rule_overloads_not_exercised.size(); ++i)
    md << (i ? ", " : "") << "`" << s.rule_overloads_not_exercised[i] << "`";
  md << "\n";

  if (!info.pytorch_ops.empty()) {
    const PytorchComparison c = compare_with_pytorch(info.pytorch_ops, rows);
    md << "\n## PyTorch's DTensor op test beside ours\n\nOf " << c.opinfos << " OpInfos (suites/ops/pytorch_dtensor_ops.txt), "
       << "PyTorch's test_dtensor_ops.py passes " << c.pytorch_pass << "; we cover the aten op name of " << c.pass_covered
       << " of those (strict). Not covered here (" << c.pass_not_covered.size() << "):\n\n| OpInfo | aten op | our status |\n|---|---|---|\n";
    for (const auto& v : c.pass_not_covered) md << "| " << md_escape(v[0]) << " | `" << v[1] << "` | " << md_escape(v[2]) << " |\n";
    md << "\nCovered here, expected to fail or skipped in PyTorch's test (" << c.covered_not_pass.size() << "): ";
    for (size_t i = 0; i < c.covered_not_pass.size(); ++i)
      md << (i ? ", " : "") << md_escape(c.covered_not_pass[i][0]) << " (" << c.covered_not_pass[i][1] << ")";
    md << "\n";
  }

  md << "\n## Failing operators\n\n";
  int failing = 0;
  for (const OpRow& r : rows) {
    if (r.status != "failing") continue;
    ++failing;
    md << "### " << r.op << " (" << r.family << ")\n\n";
    for (const auto& rec : records) {
      if (rec.op != r.op || !not_passing(rec.status)) continue;
      md << "- `" << rec.variant << "`, " << rec.mesh << ", " << rec.direction << ": **" << rec.status << "**";
      if (!rec.failing_placements.empty()) md << " with `" << md_escape(rec.failing_placements) << "`";
      md << ": " << md_escape(first_line(rec.reason)) << "\n";
    }
    md << "\n```sh\n" << reproduce_command(r.op) << "\n```\n\n";
  }
  if (failing == 0) md << "None.\n";
  return md.str();
}

std::string report_html(const RunInfo& info, const std::vector<CaseRecord>& records,
                        const std::vector<OpRow>& rows, const Summary& s) {
  // Per op: the worst status per (mesh, direction), and passed/run per 1-D placement.
  auto rank = [](const std::string& st) {
    static const std::map<std::string, int> order = {{"skip", 0}, {"pass", 1}, {"xpass", 2}, {"xfail", 3},
                                                     {"fail", 4}, {"error", 4}, {"timeout", 5}};
    auto it = order.find(st);
    return it == order.end() ? 4 : it->second;
  };
  std::map<std::string, std::map<std::string, std::string>> cell;  // op -> "1d fwd" -> status
  std::map<std::string, std::map<std::string, std::pair<int64_t, int64_t>>> grid;  // op -> placement -> {pass, run}
  std::set<std::string> placements;
  for (const auto& r : records) {
    std::string& c = cell[r.op][r.mesh + " " + r.direction];
    if (c.empty() || rank(r.status) > rank(c)) c = r.status;
    if (r.mesh == "1d" && r.direction == "fwd")
      for (const auto& kv : r.by_placement) {
        placements.insert(kv.first);
        grid[r.op][kv.first].first += kv.second.first;
        grid[r.op][kv.first].second += kv.second.second;
      }
  }
  std::set<std::string> families;
  std::map<std::string, std::map<std::string, int>> fam;  // family -> status -> overloads
  for (const OpRow& r : rows)
    if (!r.family.empty()) {
      families.insert(r.family);
      ++fam[r.family][r.status];
    }
  static const char* kStatuses[] = {"covered", "trivial", "failing", "fallback", "excluded", "no rule", "untested"};
  auto css = [](const std::string& st) {
    std::string c;
    for (char ch : st)
      if (ch != ' ') c += ch;
    return c;
  };

  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>DTensor op coverage</title>\n<style>\n"
       "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:110em}table{border-collapse:collapse;font-size:12px}"
       "td,th{border:1px solid #ccc;padding:2px 5px;text-align:left;vertical-align:top}"
       "#ops th{background:#eee;position:sticky;top:0;z-index:1}"
       ".pass,.covered{background:#bfe7bf}.fail,.error,.failing,.timeout{background:#f3b1aa}"
       ".xfail{background:#f6d7a7}.xpass{background:#e6a3e6}.skip{background:#eee;color:#888}"
       ".fallback{background:#cfe0f7}.norule{background:#f2f2f2;color:#777}.mixed{background:#f7e39c}"
       ".trivial{background:#fff3c4}.excluded{background:#e0e0e0}.untested{background:#fbd}"
       ".reason{min-width:28em;max-width:60em;white-space:normal;color:#333}.reason code{display:block;color:#555;margin-top:2px}"
       "#controls{margin:1em 0;position:sticky;top:0;background:#fff}.bar{display:flex;height:14px;width:30em;border:1px solid #aaa}"
       ".bar div{height:100%}dt{font-weight:bold}dd{margin:0 0 .4em 1.5em}\n</style></head><body>\n";
  h << "<h1>DTensor op coverage</h1>\n<section id=\"summary\"><h2>Summary</h2>\n<p id=\"headline\">" << html_escape(headline(s))
    << "</p>\n";
  h << "<table id=\"numbers\"><tr><th>figure</th><th>value</th></tr>"
    << "<tr><td>op names covered (strict)</td><td>" << s.op_names_covered << " of " << s.op_names << "</td></tr>"
    << "<tr><td>op names covered (previous, loose definition)</td><td>" << s.op_names_covered_loose << "</td></tr>"
    << "<tr><td>overloads covered / excluded</td><td>" << s.overloads_covered << " / " << s.overloads_excluded << " of "
    << s.overloads << "</td></tr>"
    << "<tr><td>verified op names, forward 1-D / 2-D</td><td>" << count_of(s.verified_names, "1d fwd") << " / "
    << count_of(s.verified_names, "2d fwd") << "</td></tr>"
    << "<tr><td>verified op names, backward 1-D / 2-D</td><td>" << count_of(s.verified_names, "1d bwd") << " / "
    << count_of(s.verified_names, "2d bwd") << "</td></tr>"
    << "<tr><td>rule overloads exercised / registered</td><td>" << s.rule_overloads_exercised << " / " << s.rule_overloads
    << "</td></tr>"
    << "<tr><td>cases skipped / passing but trivial</td><td>" << s.cases_skipped << " / " << s.trivial_passes << "</td></tr>"
    << "<tr><td>combinations refused as documented</td><td>" << s.refused << "</td></tr>"
    << "<tr><td>combinations run / in the full products</td><td>" << s.combinations_run << " / " << s.combinations_total
    << "</td></tr></table>\n";
  h << "<h3>Exercised overloads by family</h3>\n<table id=\"families\"><tr><th>family</th><th>overloads</th><th>"
       "covered</th><th></th></tr>\n";
  for (const auto& kv : fam) {
    int total = 0;
    for (const auto& st : kv.second) total += st.second;
    h << "<tr><td>" << html_escape(kv.first) << "</td><td>" << total << "</td><td>" << count_of(kv.second, "covered")
      << " (" << pct(count_of(kv.second, "covered"), total) << ")</td><td><div class=\"bar\">";
    for (const char* st : kStatuses) {
      const int n = count_of(kv.second, st);
      if (n > 0)
        h << "<div class=\"" << css(st) << "\" style=\"width:" << 100.0 * n / total << "%\" title=\"" << st << ": " << n
          << "\"></div>";
    }
    h << "</div></td></tr>\n";
  }
  h << "</table>\n";
  if (!info.previous_status.empty()) {
    h << "<h3>Changes since the previous report</h3>\n<table id=\"changes\"><tr><th>op</th><th>before</th><th>now</th></tr>\n";
    int changed = 0;
    for (const OpRow& r : rows) {
      auto it = info.previous_status.find(r.op);
      const std::string before = it == info.previous_status.end() ? "(absent)" : it->second;
      if (before == r.status) continue;
      ++changed;
      h << "<tr><td>" << html_escape(r.op) << "</td><td class=\"" << css(before) << "\">" << html_escape(before)
        << "</td><td class=\"" << css(r.status) << "\">" << r.status << "</td></tr>\n";
    }
    h << "</table><p>" << changed << " overloads changed status.</p>\n";
  }
  if (!info.pytorch_ops.empty()) {
    const PytorchComparison c = compare_with_pytorch(info.pytorch_ops, rows);
    h << "<h3>PyTorch's DTensor op test beside ours</h3>\n<p id=\"pytorch\">Of " << c.opinfos
      << " OpInfos (suites/ops/pytorch_dtensor_ops.txt), PyTorch's test_dtensor_ops.py passes " << c.pytorch_pass
      << "; we cover the aten op name of " << c.pass_covered << " of those (strict); " << c.covered_not_pass.size()
      << " OpInfos it expects to fail or skips name an op we cover.</p>\n<table id=\"pytorch-only\"><tr><th>OpInfo PyTorch "
         "passes</th><th>aten op</th><th>our status</th></tr>\n";
    for (const auto& v : c.pass_not_covered)
      h << "<tr><td>" << html_escape(v[0]) << "</td><td>" << html_escape(v[1]) << "</td><td>" << html_escape(v[2])
        << "</td></tr>\n";
    h << "</table>\n";
  }
  h << "<h3>Definitions</h3>\n<dl>"
       "<dt>case</dt><dd>one sample of one op on one mesh (1-D: all ranks; 2-D: 2 x n/2), forward or backward. Each "
       "placement combination of its tensor arguments (Replicate, Shard of each dim, uneven shards, Partial) runs on "
       "DTensors; the outputs gathered with full_tensor, and the gradients, must equal the plain op's, every rank must "
       "agree on each output's spec, and each local shard must have the shape its spec implies.</dd>"
       "<dt>trivial</dt><dd>a passing case whose outputs are empty or all NaN, or (generated samples) an input "
       "unchanged, or whose gradients are all zero: it is not counted as verified.</dd>"
       "<dt>covered (overload)</dt><dd>every case that ran passed and at least one forward case is not trivial.</dd>"
       "<dt>covered (op name)</dt><dd>every overload of the name is covered, or excluded with a reason in "
       "suites/ops/coverage_exclusions.txt, and at least one is covered.</dd>"
       "<dt>verified op name (mesh, direction)</dt><dd>every overload that is not excluded has a non-trivial pass "
       "there and nothing that failed (backward: overloads where backward does not apply are passed over).</dd>"
       "<dt>loose</dt><dd>the previous definition: overloads that never ran were ignored.</dd>"
       "<dt>fallback / no rule</dt><dd>no sharding rule; the op works (or not) through the opt-in replicate "
       "fallback.</dd></dl>\n";
  h << "<p>Run " << html_escape(info.started) << ", world size " << info.world_size << ", libtorch "
    << html_escape(info.libtorch) << ", " << html_escape(info.source) << ".</p>\n</section>\n";

  h << "<h2>Operators</h2>\n<div id=\"controls\">Family <select id=\"fam\"><option value=\"\">all</option>";
  for (const auto& f : families) h << "<option>" << html_escape(f) << "</option>";
  h << "</select> Status <select id=\"st\"><option value=\"\">all</option>";
  for (const char* st : kStatuses) h << "<option>" << st << "</option>";
  h << "</select> Op <input id=\"q\" placeholder=\"aten::add\"> <span id=\"count\"></span></div>\n";
  h << "<table id=\"ops\"><thead><tr><th>op</th><th>family</th><th>status</th><th>1-D fwd</th><th>1-D bwd</th>"
       "<th>2-D fwd</th><th>2-D bwd</th><th>reason</th>";
  for (const auto& p : placements) h << "<th title=\"1-D forward, by the first tensor's placement\">" << html_escape(p) << "</th>";
  h << "</tr></thead><tbody>\n";
  // Exercised operators first (failing, trivial, covered, ...), the unexercised ones last.
  std::vector<const OpRow*> order;
  for (const OpRow& r : rows) order.push_back(&r);
  auto prio = [](const OpRow* r) {
    static const std::map<std::string, int> p = {{"failing", 0}, {"untested", 1}, {"trivial", 2}, {"covered", 3},
                                                 {"fallback", 4}, {"excluded", 5}, {"no rule", 6}};
    auto it = p.find(r->status);
    return (r->family.empty() ? 10 : 0) + (it == p.end() ? 7 : it->second);
  };
  std::stable_sort(order.begin(), order.end(), [&](const OpRow* a, const OpRow* b) { return prio(a) < prio(b); });
  for (const OpRow* rp : order) {
    const OpRow& r = *rp;
    h << "<tr data-family=\"" << html_escape(r.family) << "\" data-status=\"" << r.status << "\"><td>"
      << html_escape(r.op) << (r.has_rule ? "" : (r.composite ? " <small>(composite)</small>" : "")) << "</td><td>"
      << html_escape(r.family) << "</td><td class=\"" << css(r.status) << "\">" << r.status << "</td>";
    for (const char* key : {"1d fwd", "1d bwd", "2d fwd", "2d bwd"}) {
      auto it = cell.find(r.op);
      std::string c = it == cell.end() ? "" : it->second.count(key) ? it->second.at(key) : "";
      h << "<td class=\"" << c << "\">" << c << "</td>";
    }
    h << "<td class=\"reason\">" << html_escape(first_line(r.reason, 400));
    if (r.status == "failing" || r.status == "trivial") h << "<code>" << html_escape(reproduce_command(r.op)) << "</code>";
    h << "</td>";
    for (const auto& p : placements) {
      auto it = grid.find(r.op);
      if (it == grid.end() || !it->second.count(p)) {
        h << "<td></td>";
        continue;
      }
      const auto& pr = it->second.at(p);
      const char* cls = pr.first == pr.second ? "pass" : pr.first == 0 ? "fail" : "mixed";
      h << "<td class=\"" << cls << "\">" << pr.first << "/" << pr.second << "</td>";
    }
    h << "</tr>\n";
  }
  // The filter also reads the page's #fam=..&st=..&q=.. (so a link, or a test, can open it filtered).
  h << "</tbody></table>\n<script>\n"
       "const rows=[...document.querySelectorAll('#ops tbody tr')];\n"
       "function apply(){const f=document.getElementById('fam').value,s=document.getElementById('st').value,"
       "q=document.getElementById('q').value.trim();let n=0;for(const r of rows){const ok=(!f||r.dataset.family===f)&&"
       "(!s||r.dataset.status===s)&&(!q||r.cells[0].textContent.includes(q));r.style.display=ok?'':'none';if(ok)n++;}"
       "document.getElementById('count').textContent=n+' of '+rows.length+' operators';}\n"
       "const hash=new URLSearchParams(location.hash.slice(1));\n"
       "for(const id of ['fam','st','q']){const el=document.getElementById(id);if(hash.has(id))el.value=hash.get(id);"
       "el.addEventListener('input',apply);}\napply();\n"
       "</script>\n</body></html>\n";
  return h.str();
}

}  // namespace opcov
}  // namespace dtensor
