// tools/opcov/report.cpp: the op-coverage report's files (coverage.json, summary.md,
// report.html; see coverage.h).
#include "tools/opcov/coverage.h"

#include "tools/opcov/text_internal.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace dtensor {
namespace opcov {

using testing::CaseRecord;
using namespace text;

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
// NOTE: [Overloads PyTorch's DTensor registers]
nlohmann::json registered_json(const RunInfo& info, const std::vector<OpRow>& rows, const Summary& s) {
  if (info.pytorch_registered.ops.empty()) return nullptr;
  const RegisteredComparison c = compare_with_registered(info.pytorch_registered, rows, info.registered_exceptions);
  return {{"torch", c.torch},
          {"registered", c.registered},
          {"covered", c.covered},
          {"our_overloads_covered", s.overloads_covered},
          {"absent", c.absent},
          {"exceptions", c.exceptions},
          {"not_covered", c.not_covered}};
}

// One sentence: PyTorch's registered overloads and ours.
std::string registered_sentence(const RegisteredComparison& c, const Summary& s) {
  std::ostringstream o;
  o << "PyTorch " << c.torch << "'s DTensor registers a sharding strategy for " << c.registered
    << " operator overloads (suites/ops/pytorch_registered_ops.txt); " << c.absent.size()
    << " of them are not in this libtorch's dispatcher. Of the others, we cover " << c.covered << ", "
    << c.exceptions.size() << " are listed exceptions (suites/ops/pytorch_registered_exceptions.txt) and "
    << c.not_covered.size() << " are not covered. We cover " << s.overloads_covered << " overloads in all ("
    << (s.overloads_covered > c.registered ? "more than" : s.overloads_covered == c.registered ? "as many as" : "fewer than")
    << " PyTorch registers).";
  return o.str();
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
          {"pytorch_registered", registered_json(info, rows, s)},
          {"strategy_discovery", discovery_json(info.discovery, info.pytorch_strategies)},
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

  if (!info.pytorch_registered.ops.empty()) {
    const RegisteredComparison c = compare_with_registered(info.pytorch_registered, rows, info.registered_exceptions);
    md << "\n## Overloads PyTorch's DTensor registers\n\n" << registered_sentence(c, s) << "\n\n";
    md << "Not covered here (" << c.not_covered.size() << "):\n\n| overload | our status | why |\n|---|---|---|\n";
    for (const auto& v : c.not_covered) md << "| `" << v[0] << "` | " << v[1] << " | " << md_escape(v[2]) << " |\n";
    md << "\nExceptions (" << c.exceptions.size() << "):\n\n| overload | our status | reason |\n|---|---|---|\n";
    for (const auto& v : c.exceptions) md << "| `" << v[0] << "` | " << v[1] << " | " << md_escape(v[2]) << " |\n";
    md << "\nNot in this libtorch (" << c.absent.size() << "): ";
    for (size_t i = 0; i < c.absent.size(); ++i) md << (i ? ", " : "") << "`" << c.absent[i] << "`";
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
  md << discovery_markdown(info.discovery, info.pytorch_strategies);
  return md.str();
}

namespace {

const char* const kStatuses[] = {"covered", "trivial", "failing", "fallback", "excluded", "no rule", "untested"};

// A status as a CSS class name.
std::string css(const std::string& st) {
  std::string c;
  for (char ch : st)
    if (ch != ' ') c += ch;
  return c;
}

// The page's head and style.
void html_head(std::ostringstream& h) {
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
}

// The families' table: overloads by status.
void html_families(std::ostringstream& h, const std::vector<OpRow>& rows) {
  std::map<std::string, std::map<std::string, int>> fam;  // family -> status -> overloads
  for (const OpRow& r : rows)
    if (!r.family.empty()) ++fam[r.family][r.status];
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
}

// What changed since the previous report, PyTorch's DTensor op test beside ours, and the
// overloads PyTorch's DTensor registers.
void html_comparisons(std::ostringstream& h, const RunInfo& info, const std::vector<OpRow>& rows, const Summary& s) {
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
  if (!info.pytorch_registered.ops.empty()) {  // NOTE: [Overloads PyTorch's DTensor registers]
    const RegisteredComparison c = compare_with_registered(info.pytorch_registered, rows, info.registered_exceptions);
    h << "<h3>Overloads PyTorch's DTensor registers</h3>\n<p id=\"registered\">" << html_escape(registered_sentence(c, s))
      << "</p>\n<table id=\"registered-gaps\"><tr><th>overload PyTorch registers</th><th>our status</th><th>why or "
         "reason</th></tr>\n";
    for (const auto* list : {&c.not_covered, &c.exceptions})
      for (const auto& v : *list)
        h << "<tr><td>" << html_escape(v[0]) << "</td><td class=\"" << css(v[1]) << "\">" << html_escape(v[1])
          << (list == &c.exceptions ? " (listed)" : "") << "</td><td>" << html_escape(v[2]) << "</td></tr>\n";
    h << "</table>\n";
  }
}

// The summary section: the figures, the families, the comparisons, the definitions.
void html_summary(std::ostringstream& h, const RunInfo& info, const std::vector<OpRow>& rows, const Summary& s) {
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
  html_families(h, rows);
  html_comparisons(h, info, rows, s);
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

}

// Per op: the worst status per (mesh, direction), and passed/run per 1-D placement.
struct OpCells {
  std::map<std::string, std::map<std::string, std::string>> cell;  // op -> "1d fwd" -> status
  std::map<std::string, std::map<std::string, std::pair<int64_t, int64_t>>> grid;  // op -> placement -> {pass, run}
  std::set<std::string> placements;
};

OpCells op_cells(const std::vector<CaseRecord>& records) {
  OpCells o;
  auto rank = [](const std::string& st) {
    static const std::map<std::string, int> order = {{"skip", 0}, {"pass", 1}, {"xpass", 2}, {"xfail", 3},
                                                     {"fail", 4}, {"error", 4}, {"timeout", 5}};
    auto it = order.find(st);
    return it == order.end() ? 4 : it->second;
  };
  for (const auto& r : records) {
    std::string& c = o.cell[r.op][r.mesh + " " + r.direction];
    if (c.empty() || rank(r.status) > rank(c)) c = r.status;
    if (r.mesh == "1d" && r.direction == "fwd")
      for (const auto& kv : r.by_placement) {
        o.placements.insert(kv.first);
        o.grid[r.op][kv.first].first += kv.second.first;
        o.grid[r.op][kv.first].second += kv.second.second;
      }
  }
  return o;
}

// One operator's row.
void html_op_row(std::ostringstream& h, const OpRow& r, const OpCells& o) {
  h << "<tr data-family=\"" << html_escape(r.family) << "\" data-status=\"" << r.status << "\"><td>"
    << html_escape(r.op) << (r.has_rule ? "" : (r.composite ? " <small>(composite)</small>" : "")) << "</td><td>"
    << html_escape(r.family) << "</td><td class=\"" << css(r.status) << "\">" << r.status << "</td>";
  for (const char* key : {"1d fwd", "1d bwd", "2d fwd", "2d bwd"}) {
    auto it = o.cell.find(r.op);
    std::string c = it == o.cell.end() ? "" : it->second.count(key) ? it->second.at(key) : "";
    h << "<td class=\"" << c << "\">" << c << "</td>";
  }
  h << "<td class=\"reason\">" << html_escape(first_line(r.reason, 400));
  if (r.status == "failing" || r.status == "trivial") h << "<code>" << html_escape(reproduce_command(r.op)) << "</code>";
  h << "</td>";
  for (const auto& p : o.placements) {
    auto it = o.grid.find(r.op);
    if (it == o.grid.end() || !it->second.count(p)) {
      h << "<td></td>";
      continue;
    }
    const auto& pr = it->second.at(p);
    const char* cls = pr.first == pr.second ? "pass" : pr.first == 0 ? "fail" : "mixed";
    h << "<td class=\"" << cls << "\">" << pr.first << "/" << pr.second << "</td>";
  }
  h << "</tr>\n";
}

// The operators' section: the filter, the table (exercised operators first), its script.
void html_ops(std::ostringstream& h, const std::vector<CaseRecord>& records, const std::vector<OpRow>& rows) {
  const OpCells o = op_cells(records);
  std::set<std::string> families;
  for (const OpRow& r : rows)
    if (!r.family.empty()) families.insert(r.family);
  h << "<h2>Operators</h2>\n<div id=\"controls\">Family <select id=\"fam\"><option value=\"\">all</option>";
  for (const auto& f : families) h << "<option>" << html_escape(f) << "</option>";
  h << "</select> Status <select id=\"st\"><option value=\"\">all</option>";
  for (const char* st : kStatuses) h << "<option>" << st << "</option>";
  h << "</select> Op <input id=\"q\" placeholder=\"aten::add\"> <span id=\"count\"></span></div>\n";
  h << "<table id=\"ops\"><thead><tr><th>op</th><th>family</th><th>status</th><th>1-D fwd</th><th>1-D bwd</th>"
       "<th>2-D fwd</th><th>2-D bwd</th><th>reason</th>";
  for (const auto& p : o.placements) h << "<th title=\"1-D forward, by the first tensor's placement\">" << html_escape(p) << "</th>";
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
  for (const OpRow* rp : order) html_op_row(h, *rp, o);
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
}

}  // namespace

std::string report_html(const RunInfo& info, const std::vector<CaseRecord>& records,
                        const std::vector<OpRow>& rows, const Summary& s) {
  std::ostringstream h;
  html_head(h);
  html_summary(h, info, rows, s);
  h << discovery_html(info.discovery, info.pytorch_strategies);
  html_ops(h, records, rows);
  return h.str();
}

}  // namespace opcov
}  // namespace dtensor
