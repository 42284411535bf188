// tools/opcov/discovery.cpp: NOTE: [Discovery in the op-coverage report].
#include "tools/opcov/discovery.h"

#include "tools/opcov/text_internal.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace dtensor {
namespace opcov {

using nlohmann::json;
using namespace text;

const char* const kStrategyCategories[] = {"both right", "only ours", "only PyTorch", "PyTorch wrong", "we are wrong",
                                           "neither"};
const size_t kStrategyCategoryCount = sizeof(kStrategyCategories) / sizeof(kStrategyCategories[0]);

json load_discovery(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "opcov: cannot read --discovery ", path);
  json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "opcov: --discovery ", path, " is not valid JSON: ", e.what());
  }
  TORCH_CHECK(j.is_object() && j.contains("per_op") && j["per_op"].is_array() && j.contains("ranks"),
              "opcov: --discovery ", path, " is not strategy_discovery's --json output (no \"per_op\" or \"ranks\")");
  return j;
}

PytorchStrategies load_pytorch_strategies(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "opcov: cannot read --pytorch-strategies ", path);
  PytorchStrategies p;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "opcov: --pytorch-strategies ", path, " line ", n, " is not JSON: ", e.what());
    }
    TORCH_CHECK(j.is_object(), "opcov: --pytorch-strategies ", path, " line ", n, " is not a JSON object");
    if (p.header.is_null()) {
      TORCH_CHECK(j.contains("torch"), "opcov: --pytorch-strategies ", path,
                  " does not start with pytorch_strategies.py's header (no \"torch\")");
      p.header = std::move(j);
      continue;
    }
    TORCH_CHECK(j.contains("sample") && j.contains("inputs") && j.contains("status") && j.contains("op"),
                "opcov: --pytorch-strategies ", path, " line ", n, " lacks \"sample\", \"op\", \"inputs\" or \"status\"");
    p.lines.push_back(std::move(j));
  }
  TORCH_CHECK(!p.header.is_null(), "opcov: --pytorch-strategies ", path, " is empty");
  return p;
}

std::string strategy_category(const std::string& ours, const std::string& pytorch) {
  if (pytorch != "ok" && pytorch != "wrong" && pytorch != "unsupported") return "";
  if (ours == "wrong") return "we are wrong";
  if (pytorch == "wrong") return "PyTorch wrong";
  const bool we_run = ours == "ok" || ours == "unjudged";
  const bool they_run = pytorch == "ok";
  if (we_run && they_run) return "both right";
  if (we_run) return "only ours";
  if (they_run) return "only PyTorch";
  return "neither";
}

namespace {

std::string joined(const json& labels) {
  std::string s = "(";
  for (size_t i = 0; i < labels.size(); ++i) s += (i ? ", " : "") + labels[i].get<std::string>();
  return s + ")";
}

std::string key_of(const json& sample, const json& inputs) { return sample.dump() + joined(inputs); }

}  // namespace

StrategyComparison compare_strategies(const json& discovery, const PytorchStrategies& pytorch) {
  StrategyComparison c;
  if (discovery.is_null() || pytorch.lines.empty()) return c;
  std::map<std::string, const json*> theirs;
  for (const json& l : pytorch.lines) theirs[key_of(l["sample"], l["inputs"])] = &l;
  std::map<std::string, bool> matched;
  for (const json& op : discovery["per_op"]) {
    if (!op.contains("choices")) continue;
    for (const json& ch : op["choices"]) {
      const std::string key = key_of(ch["sample"], ch["inputs"]);
      auto it = theirs.find(key);
      if (it == theirs.end()) {
        if (ch.value("dumped", false)) ++c.ours_only_ran;
        continue;
      }
      matched[key] = true;
      const json& t = *it->second;
      const std::string ours = ch["status"].get<std::string>(), their = t["status"].get<std::string>();
      const std::string category = strategy_category(ours, their);
      if (category.empty()) continue;
      ++c.compared;
      ++c.totals[category];
      StrategyComparison::Op& o = c.ops[op["op"].get<std::string>()];
      ++o.counts[category];
      std::string cheaper;
      if (category == "both right" && ours == "ok") {  // an unjudged choice's cost is not known
        // Collectives on both sides (a local split of a Replicate costs a byte in
        // redistribute_cost, and nothing on the wire).
        const bool we_move = ch.contains("collectives") ? ch["collectives"].get<int>() > 0 : ch.value("cost", 0.0) > 0;
        const bool they_move = t.value("redistributions", 0) > 0;
        if (we_move != they_move) cheaper = we_move ? "PyTorch cheaper" : "ours cheaper";
        if (!cheaper.empty()) {
          ++c.totals[cheaper];
          ++o.counts[cheaper];
        }
      }
      if ((category != "both right" || !cheaper.empty()) && o.differences.size() < 20) {
        std::ostringstream line;
        line << "[" << ch.value("variant", "") << "] " << joined(ch["inputs"]) << ": "
             << (cheaper.empty() ? category : cheaper) << "; ours " << ours;
        if (!ch["outputs"].empty()) line << " -> " << joined(ch["outputs"]);
        if (ch.contains("collectives"))
          line << " (" << ch["collectives"].get<int>() << " collectives, cost " << ch.value("cost", 0.0) << ")";
        else if (ch.contains("cost"))
          line << " (cost " << ch["cost"].get<double>() << ")";
        line << "; PyTorch " << their;
        if (t.contains("outputs") && !t["outputs"].empty()) line << " -> " << joined(t["outputs"]);
        if (their != "unsupported") line << " (" << t.value("redistributions", 0) << " collectives)";
        if (t.contains("message")) line << ": " << first_line(t["message"].get<std::string>(), 160);
        o.differences.push_back(line.str());
      }
      if (their == "wrong") {
        json w = {{"op", op["op"]}, {"variant", ch.value("variant", "")}, {"inputs", t["inputs"]}};
        for (const char* k : {"outputs", "max_error", "reproducer"})
          if (t.contains(k)) w[k] = t[k];
        c.pytorch_wrong.push_back(std::move(w));
      }
    }
  }
  for (const json& l : pytorch.lines)
    if (!matched.count(key_of(l["sample"], l["inputs"]))) ++c.pytorch_only_ran;
  return c;
}

namespace {

struct MissingRow {
  std::string op, variant, strategy;
  double saved;  // < 0: the rule raises for those inputs
};

std::vector<MissingRow> top_missing(const json& discovery, size_t n) {
  std::vector<MissingRow> rows;
  for (const json& op : discovery["per_op"])
    for (const json& m : op.value("missing", json::array()))
      rows.push_back({op["op"].get<std::string>(), m.value("variant", ""), m.value("strategy", ""),
                      m["saved"].is_number() ? m["saved"].get<double>() : -1.0});
  // The rule raising for the inputs first, then the most bytes saved.
  std::stable_sort(rows.begin(), rows.end(), [](const MissingRow& a, const MissingRow& b) {
    const double x = a.saved < 0 ? 1e300 : a.saved, y = b.saved < 0 ? 1e300 : b.saved;
    return x > y;
  });
  if (rows.size() > n) rows.resize(n);
  return rows;
}

std::string saved_text(double saved) {
  if (saved < 0) return "the rule raises";
  std::ostringstream os;
  os << static_cast<long long>(saved) << " bytes";
  return os.str();
}

long count(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<long>() : 0; }

std::string figures_sentence(const json& d) {
  std::ostringstream os;
  os << "Strategy discovery (tools/strategy_discovery, one mesh dim of " << count(d, "ranks") << " ranks): "
     << count(d, "ops") << " ops, " << count(d, "samples") << " samples (" << count(d, "skipped") << " skipped), "
     << count(d, "combinations") << " input combinations run, " << count(d, "valid")
     << " valid strategies found; the rules of " << count(d, "judged") << " samples judged: " << count(d, "wrong")
     << " wrong strategies (" << count(d, "wrong_ops") << " ops), " << count(d, "missing")
     << " missing strategies that would save communication (" << count(d, "missing_ops") << " ops); "
     << d.value("crashed", json::array()).size() << " ops crashed on inconsistent pieces; "
     << static_cast<long>(d.value("seconds", 0.0)) << " s.";
  return os.str();
}

std::string pytorch_sentence(const PytorchStrategies& p, const StrategyComparison& c) {
  std::ostringstream os;
  if (p.header.is_null()) return "";
  if (p.header.contains("unavailable")) {
    os << "PyTorch's DTensor beside ours: not run (" << p.header["unavailable"].get<std::string>() << ").";
    return os.str();
  }
  os << "PyTorch " << p.header.value("torch", "?") << " beside ours on the same samples and input combinations ("
     << p.header.value("world", "?") << ", " << p.header.value("ranks", 0) << " ranks): " << c.compared << " compared: ";
  for (size_t i = 0; i < kStrategyCategoryCount; ++i)
    os << (i ? ", " : "") << kStrategyCategories[i] << " " << count_of(c.totals, kStrategyCategories[i]);
  os << "; where both are right, ours moves no input where PyTorch does in " << count_of(c.totals, "ours cheaper")
     << ", PyTorch where we do in " << count_of(c.totals, "PyTorch cheaper") << ".";
  return os.str();
}

}  // namespace

json discovery_json(const json& d, const PytorchStrategies& p) {
  if (d.is_null()) return nullptr;
  json out = {{"sentence", figures_sentence(d)}};
  for (const char* k : {"ranks", "seconds", "ops", "samples", "skipped", "combinations", "valid", "judged", "wrong",
                        "wrong_ops", "missing", "missing_ops", "errors", "crashed"})
    if (d.contains(k)) out[k] = d[k];
  json wrong = json::array();
  for (const json& op : d["per_op"])
    for (const json& w : op.value("wrong", json::array())) wrong.push_back({{"op", op["op"]}, {"variant", w["variant"]}, {"strategy", w["strategy"]}});
  out["wrong_strategies"] = wrong;
  json missing = json::array();
  for (const MissingRow& m : top_missing(d, 100))
    missing.push_back({{"op", m.op}, {"variant", m.variant}, {"strategy", m.strategy},
                       {"saved", m.saved < 0 ? json(nullptr) : json(m.saved)}});
  out["top_missing"] = missing;
  if (!p.header.is_null()) {
    const StrategyComparison c = compare_strategies(d, p);
    json ops = json::object();
    for (const auto& [op, o] : c.ops) ops[op] = o.counts;
    out["pytorch"] = {{"header", p.header},     {"sentence", pytorch_sentence(p, c)}, {"compared", c.compared},
                      {"totals", c.totals},     {"ours_only_ran", c.ours_only_ran},  {"pytorch_only_ran", c.pytorch_only_ran},
                      {"per_op", ops},          {"pytorch_wrong", c.pytorch_wrong}};
  }
  return out;
}

std::string discovery_markdown(const json& d, const PytorchStrategies& p) {
  if (d.is_null()) return "";
  std::ostringstream md;
  md << "\n## Strategy discovery\n\n" << figures_sentence(d) << "\n";
  bool any_wrong = false;
  for (const json& op : d["per_op"])
    for (const json& w : op.value("wrong", json::array())) {
      if (!any_wrong) md << "\nWrong strategies (a rule offers them; the op on their pieces gives other values):\n\n";
      any_wrong = true;
      md << "- " << op["op"].get<std::string>() << " [" << md_escape(w.value("variant", "")) << "] "
         << md_escape(w.value("strategy", "")) << "\n";
    }
  const auto missing = top_missing(d, 10);
  if (!missing.empty()) {
    md << "\nMissing strategies saving the most communication:\n\n| op | sample | strategy | saves |\n|---|---|---|---|\n";
    for (const MissingRow& m : missing)
      md << "| " << m.op << " | " << md_escape(m.variant) << " | " << md_escape(m.strategy) << " | " << saved_text(m.saved)
         << " |\n";
  }
  if (!p.header.is_null()) {
    const StrategyComparison c = compare_strategies(d, p);
    md << "\n### PyTorch's DTensor beside ours\n\n" << pytorch_sentence(p, c) << "\n";
    // One reproducer per op (the report lists every combination).
    std::string last_op;
    for (const json& w : c.pytorch_wrong) {
      const std::string op = w["op"].get<std::string>();
      if (op == last_op) continue;
      last_op = op;
      md << "\nPyTorch wrong: " << op << " " << joined(w["inputs"]) << " ("
         << count_of(c.ops.at(op).counts, "PyTorch wrong") << " combinations of " << op << ")\n";
      if (w.contains("reproducer")) md << "\n```python\n" << w["reproducer"].get<std::string>() << "\n```\n";
    }
  }
  return md.str();
}

std::string discovery_html(const json& d, const PytorchStrategies& p) {
  if (d.is_null()) return "";
  std::ostringstream h;
  h << "<section id=\"discovery\"><h2>Strategy discovery</h2>\n<p id=\"discovery-figures\">" << html_escape(figures_sentence(d))
    << "</p>\n<p>Every placement of each tensor argument on one mesh dim (Replicate, Shard of each dim, uneven "
       "shards, Partial of each reduce kind) is laid out as pieces, the op runs on each rank's pieces, and every "
       "output placement is checked against the op on the whole tensors. A <b>wrong</b> strategy is one a rule "
       "offers that is not valid; a <b>missing</b> one is valid, not offered, and needs no redistribution of inputs "
       "the rule's choice would redistribute (docs/ops-coverage.md, \"Strategy discovery\").</p>\n";
  h << "<table id=\"discovery-wrong\"><tr><th>op</th><th>sample</th><th>wrong strategy</th></tr>\n";
  int wrong = 0;
  for (const json& op : d["per_op"])
    for (const json& w : op.value("wrong", json::array())) {
      ++wrong;
      h << "<tr class=\"fail\"><td>" << html_escape(op["op"].get<std::string>()) << "</td><td>"
        << html_escape(w.value("variant", "")) << "</td><td>" << html_escape(w.value("strategy", "")) << "</td></tr>\n";
    }
  if (wrong == 0) h << "<tr><td colspan=\"3\">none</td></tr>\n";
  h << "</table>\n<h3>Missing strategies, most communication saved first</h3>\n<table id=\"discovery-missing\"><tr><th>op"
       "</th><th>sample</th><th>strategy (inputs -&gt; outputs)</th><th>saves</th></tr>\n";
  for (const MissingRow& m : top_missing(d, 50))
    h << "<tr><td>" << html_escape(m.op) << "</td><td>" << html_escape(m.variant) << "</td><td>" << html_escape(m.strategy)
      << "</td><td>" << saved_text(m.saved) << "</td></tr>\n";
  h << "</table>\n";
  const json crashed = d.value("crashed", json::array());
  if (!crashed.empty()) {
    h << "<p id=\"discovery-crashed\">Crashed on pieces of inconsistent shapes (reported, not judged): ";
    for (size_t i = 0; i < crashed.size(); ++i)
      h << (i ? ", " : "") << html_escape(crashed[i].value("op", "")) << " (" << html_escape(crashed[i].value("why", "")) << ")";
    h << ".</p>\n";
  }
  if (!p.header.is_null()) {
    const StrategyComparison c = compare_strategies(d, p);
    h << "<h3>PyTorch's DTensor beside ours</h3>\n<p id=\"pytorch-strategies\">" << html_escape(pytorch_sentence(p, c))
      << "</p>\n";
    if (!p.header.contains("unavailable")) {
      h << "<table id=\"pytorch-categories\"><tr><th>op</th>";
      for (size_t i = 0; i < kStrategyCategoryCount; ++i) h << "<th>" << kStrategyCategories[i] << "</th>";
      h << "<th>ours cheaper</th><th>PyTorch cheaper</th><th>where they differ</th></tr>\n<tr><td><b>all</b></td>";
      for (size_t i = 0; i < kStrategyCategoryCount; ++i) h << "<td>" << count_of(c.totals, kStrategyCategories[i]) << "</td>";
      h << "<td>" << count_of(c.totals, "ours cheaper") << "</td><td>" << count_of(c.totals, "PyTorch cheaper")
        << "</td><td></td></tr>\n";
      for (const auto& [op, o] : c.ops) {
        const bool bad = count_of(o.counts, "PyTorch wrong") + count_of(o.counts, "we are wrong") > 0;
        h << "<tr" << (bad ? " class=\"fail\"" : "") << "><td>" << html_escape(op) << "</td>";
        for (size_t i = 0; i < kStrategyCategoryCount; ++i) h << "<td>" << count_of(o.counts, kStrategyCategories[i]) << "</td>";
        h << "<td>" << count_of(o.counts, "ours cheaper") << "</td><td>" << count_of(o.counts, "PyTorch cheaper")
          << "</td><td>";
        if (!o.differences.empty()) {
          h << "<details><summary>" << o.differences.size() << (o.differences.size() == 20 ? "+" : "")
            << " combinations</summary><ul>";
          for (const auto& l : o.differences) h << "<li>" << html_escape(l) << "</li>";
          h << "</ul></details>";
        }
        h << "</td></tr>\n";
      }
      h << "</table>\n";
      if (!c.pytorch_wrong.empty()) {
        h << "<h3>Where PyTorch gives wrong values</h3>\n<div id=\"pytorch-wrong\">\n";
        // Per op: every wrong combination, and the first one's reproducer.
        for (size_t i = 0; i < c.pytorch_wrong.size();) {
          const std::string op = c.pytorch_wrong[i]["op"].get<std::string>();
          size_t end = i;
          while (end < c.pytorch_wrong.size() && c.pytorch_wrong[end]["op"] == op) ++end;
          h << "<details><summary>" << html_escape(op) << ": " << end - i << " combinations</summary><ul>";
          for (size_t k = i; k < end; ++k) {
            const json& w = c.pytorch_wrong[k];
            h << "<li>[" << html_escape(w.value("variant", "")) << "] " << html_escape(joined(w["inputs"]));
            if (w.contains("outputs")) h << " -&gt; " << html_escape(joined(w["outputs"]));
            if (w.contains("max_error")) h << ", largest error " << html_escape(w["max_error"].dump());
            h << "</li>";
          }
          h << "</ul>";
          if (c.pytorch_wrong[i].contains("reproducer"))
            h << "<pre>" << html_escape(c.pytorch_wrong[i]["reproducer"].get<std::string>()) << "</pre>";
          h << "</details>\n";
          i = end;
        }
        h << "</div>\n";
      }
    }
  }
  h << "</section>\n";
  return h.str();
}

}  // namespace opcov
}  // namespace dtensor
