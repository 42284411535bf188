// tools/opcov/coverage.cpp: see coverage.h.
#include "tools/opcov/coverage.h"

#include "converters/op_db.h"
#include "dtensor/ops/registry.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <set>
#include <sstream>

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

std::vector<OpRow> classify_ops(const std::vector<CaseRecord>& records) {
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
      if (row.reason.empty()) row.reason = first_line(r->reason);
      const bool missing = reason_class(*r).rfind("no rule", 0) == 0;
      only_missing_rules = only_missing_rules && missing;
      fallback_passes = fallback_passes && (r->fallback_status == "pass" || r->fallback_status == "skip");
    }
    if (all_pass) row.status = "covered";
    else if (only_missing_rules && fallback_passes) row.status = "fallback";
    else if (only_missing_rules) row.status = "no rule";
    else row.status = "failing";
    rows.push_back(std::move(row));
  }
  return rows;
}

Summary summarize(const std::vector<CaseRecord>& records, const std::vector<OpRow>& rows) {
  Summary s;
  std::map<std::string, std::vector<const OpRow*>> by_name;
  for (const OpRow& r : rows) {
    by_name[r.name].push_back(&r);
    ++s.overloads_by_status[r.status];
    if (r.has_rule) ++s.rule_overloads;
  }
  s.overloads = static_cast<int>(rows.size());
  s.overloads_covered = s.overloads_by_status["covered"];
  s.op_names = static_cast<int>(by_name.size());
  for (const auto& kv : by_name) {
    bool any_exercised = false, all_covered = true, rule = false;
    for (const OpRow* r : kv.second) {
      rule = rule || r->has_rule;
      const bool exercised = std::any_of(r->cases.begin(), r->cases.end(),
                                         [](const auto& c) { return c.first != "skip" && c.second > 0; });
      if (!exercised) continue;
      any_exercised = true;
      all_covered = all_covered && r->status == "covered";
    }
    if (rule) ++s.rule_names;
    if (any_exercised && all_covered) ++s.op_names_covered;
  }
  // Verified names per (mesh, direction): some case passed, none failed.
  std::map<std::string, std::map<std::string, std::pair<int, int>>> per_name;  // name -> key -> {pass, bad}
  for (const auto& r : records) {
    ++s.cases_by_status[r.status];
    const std::string key = r.mesh + " " + r.direction;
    auto& slot = per_name[name_of(r.op)][key];
    if (r.status == "pass") ++slot.first;
    else if (not_passing(r.status)) ++slot.second;
  }
  for (const auto& kv : per_name) {
    bool fwd_both = true;
    for (const char* key : {"1d fwd", "1d bwd", "2d fwd", "2d bwd"}) {
      auto it = kv.second.find(key);
      const bool ok = it != kv.second.end() && it->second.first > 0 && it->second.second == 0;
      if (ok) ++s.verified_names[key];
      if (std::string(key).find("fwd") != std::string::npos) fwd_both = fwd_both && ok;
    }
    if (fwd_both) ++s.verified_names["both fwd"];
  }
  return s;
}

std::string reproduce_command(const std::string& op) {
  std::string escaped;
  for (char c : op) {
    if (c == '.') escaped += "\\\\.";
    else escaped += c;
  }
  return "build/tools/opcov --ops '^" + escaped + "$' --out /tmp/opcov-" + name_of(op).substr(6) + " --print-failures";
}

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
            {"overloads", s.overloads},
            {"overloads_covered", s.overloads_covered},
            {"overloads_by_status", s.overloads_by_status},
            {"rule_names", s.rule_names},
            {"rule_overloads", s.rule_overloads},
            {"verified_names", s.verified_names},
            {"cases_by_status", s.cases_by_status}}},
          {"records", records},
          {"ops", ops}};
}

std::string summary_markdown(const RunInfo& info, const std::vector<CaseRecord>& records,
                             const std::vector<OpRow>& rows, const Summary& s) {
  std::ostringstream md;
  md << "# DTensor op coverage\n\n";
  md << "**" << s.op_names_covered << " of " << s.op_names << " ops** (aten operator names; " << s.overloads_covered
     << " of " << s.overloads << " overloads) are covered: every sharding of every sample matches the plain op.\n\n";
  md << "Run: " << info.started << ", " << std::fixed << std::setprecision(1) << info.duration_s << " s, world size "
     << info.world_size << ", libtorch " << info.libtorch << ", " << info.source << ".\n\n";
  md << "| verified op names | 1-D | 2-D |\n|---|---|---|\n";
  md << "| forward | " << count_of(s.verified_names, "1d fwd") << " | " << count_of(s.verified_names, "2d fwd") << " |\n";
  md << "| backward | " << count_of(s.verified_names, "1d bwd") << " | " << count_of(s.verified_names, "2d bwd") << " |\n\n";
  md << "Forward on both meshes: " << count_of(s.verified_names, "both fwd") << " op names. Ops with a sharding rule: "
     << s.rule_names << " names, " << s.rule_overloads << " overloads.\n\n";

  md << "## Operators by status\n\n| status | overloads | share |\n|---|---|---|\n";
  for (const char* st : {"covered", "fallback", "failing", "no rule", "untested"})
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
  for (const OpRow& r : rows)
    if (!r.family.empty()) families.insert(r.family);

  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>DTensor op coverage</title>\n<style>\n"
       "body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;font-size:12px}"
       "td,th{border:1px solid #ccc;padding:2px 5px;text-align:left}th{background:#eee;position:sticky;top:0}"
       ".pass,.covered{background:#bfe7bf}.fail,.error,.failing,.timeout{background:#f3b1aa}"
       ".xfail{background:#f6d7a7}.xpass{background:#e6a3e6}.skip{background:#eee;color:#888}"
       ".fallback{background:#cfe0f7}.norule{background:#f2f2f2;color:#777}.mixed{background:#f7e39c}"
       ".reason{max-width:40em;color:#555}#controls{margin:1em 0}\n</style></head><body>\n";
  h << "<h1>DTensor op coverage</h1>\n<p><b>" << s.op_names_covered << " of " << s.op_names << " ops</b> covered ("
    << s.overloads_covered << " of " << s.overloads << " overloads). Verified op names: forward " << count_of(s.verified_names, "1d fwd")
    << " (1-D) / " << count_of(s.verified_names, "2d fwd") << " (2-D), backward " << count_of(s.verified_names, "1d bwd") << " / "
    << count_of(s.verified_names, "2d bwd") << ".</p>\n<p>Run " << html_escape(info.started) << ", world size "
    << info.world_size << ", libtorch " << html_escape(info.libtorch) << ", " << html_escape(info.source) << ".</p>\n";
  h << "<div id=\"controls\">Family <select id=\"fam\"><option value=\"\">all</option>";
  for (const auto& f : families) h << "<option>" << html_escape(f) << "</option>";
  h << "</select> Status <select id=\"st\"><option value=\"\">all</option>";
  for (const char* st : {"covered", "failing", "fallback", "no rule", "untested"}) h << "<option>" << st << "</option>";
  h << "</select> Op <input id=\"q\" placeholder=\"aten::add\"> <span id=\"count\"></span></div>\n";
  h << "<table id=\"ops\"><thead><tr><th>op</th><th>family</th><th>status</th><th>1-D fwd</th><th>1-D bwd</th>"
       "<th>2-D fwd</th><th>2-D bwd</th>";
  for (const auto& p : placements) h << "<th title=\"1-D forward, by the first tensor's placement\">" << html_escape(p) << "</th>";
  h << "<th>reason</th></tr></thead><tbody>\n";
  for (const OpRow& r : rows) {
    const std::string st_class = r.status == "no rule" ? "norule" : r.status;
    h << "<tr data-family=\"" << html_escape(r.family) << "\" data-status=\"" << r.status << "\"><td>"
      << html_escape(r.op) << (r.has_rule ? "" : (r.composite ? " <small>(composite)</small>" : "")) << "</td><td>"
      << html_escape(r.family) << "</td><td class=\"" << st_class << "\">" << r.status << "</td>";
    for (const char* key : {"1d fwd", "1d bwd", "2d fwd", "2d bwd"}) {
      auto it = cell.find(r.op);
      std::string c = it == cell.end() ? "" : it->second.count(key) ? it->second.at(key) : "";
      h << "<td class=\"" << c << "\">" << c << "</td>";
    }
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
    h << "<td class=\"reason\">" << html_escape(first_line(r.reason, 200)) << "</td></tr>\n";
  }
  h << "</tbody></table>\n<script>\n"
       "const rows=[...document.querySelectorAll('#ops tbody tr')];\n"
       "function apply(){const f=document.getElementById('fam').value,s=document.getElementById('st').value,"
       "q=document.getElementById('q').value.trim();let n=0;for(const r of rows){const ok=(!f||r.dataset.family===f)&&"
       "(!s||r.dataset.status===s)&&(!q||r.cells[0].textContent.includes(q));r.style.display=ok?'':'none';if(ok)n++;}"
       "document.getElementById('count').textContent=n+' of '+rows.length+' operators';}\n"
       "for(const id of ['fam','st','q'])document.getElementById(id).addEventListener('input',apply);apply();\n"
       "</script>\n</body></html>\n";
  return h.str();
}

}  // namespace opcov
}  // namespace dtensor
