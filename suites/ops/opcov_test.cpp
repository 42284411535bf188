// suites/ops/opcov_test.cpp: tools/opcov: the status of every dispatcher op, the three
// renderings, and the program itself run as a user runs it.
#include "dtensor/ops/registry.h"
#include "suites/testing/build_paths.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"
#include "tools/opcov/coverage.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <unistd.h>
#include <map>
#include <regex>

namespace dtensor {
namespace {

namespace paths = testing::build_paths;

using testing::CaseRecord;
using testing::contains;
using testing::error_of;

CaseRecord rec(const std::string& op, const std::string& mesh, const std::string& dir, const std::string& status,
               const std::string& reason = "", const std::string& fallback = "") {
  CaseRecord r;
  r.op = op;
  r.family = "test";
  r.variant = "even";
  r.mesh = mesh;
  r.direction = dir;
  r.status = status;
  r.reason = reason;
  r.fallback_status = fallback;
  if (status == "pass") r.by_placement["Shard(dim=0)"] = {2, 2};
  return r;
}

std::vector<CaseRecord> sample_records() {
  const std::string no_rule = "DTensor: operator aten::cummax has no sharding rule (inputs: ...)";
  return {rec("aten::mul.Tensor", "1d", "fwd", "pass"),  rec("aten::mul.Tensor", "1d", "bwd", "pass"),
          rec("aten::mul.Tensor", "2d", "fwd", "pass"),  rec("aten::mul.Tensor", "2d", "bwd", "pass"),
          rec("aten::cummax", "1d", "fwd", "error", no_rule, "pass"),
          rec("aten::cummax", "1d", "bwd", "skip", "not checked on every placement: the forward failed (1 combinations)"),
          rec("aten::sort", "1d", "fwd", "fail", "output 0 (...): values differ: max abs diff 3"),
          rec("aten::sort", "1d", "bwd", "skip", "no differentiable output"),
          rec("aten::_cdist_forward", "1d", "fwd", "error", "DTensor: operator aten::_cdist_forward has no sharding rule", "fail")};
}

const opcov::OpRow& row_of(const std::vector<opcov::OpRow>& rows, const std::string& op) {
  for (const auto& r : rows)
    if (r.op == op) return r;
  throw std::runtime_error("no row for " + op);
}

TEST(OpCoverage, EveryDispatcherOpGetsAStatus) {
  auto rows = opcov::classify_ops(sample_records());
  EXPECT_GT(rows.size(), 1500u);  // every aten overload of libtorch's dispatcher
  EXPECT_EQ(row_of(rows, "aten::mul.Tensor").status, "covered");
  EXPECT_EQ(row_of(rows, "aten::cummax").status, "fallback");
  EXPECT_EQ(row_of(rows, "aten::sort").status, "failing");
  EXPECT_PRED2(contains, row_of(rows, "aten::sort").reason, "values differ");
  EXPECT_EQ(row_of(rows, "aten::_cdist_forward").status, "no rule");
  EXPECT_EQ(row_of(rows, "aten::lgamma").status, "untested");  // has a rule, no records here
  EXPECT_TRUE(row_of(rows, "aten::lgamma").has_rule);
  EXPECT_EQ(row_of(rows, "aten::linalg_svd").status, "no rule");
  EXPECT_EQ(row_of(rows, "aten::linalg_svd").reason, "not exercised (no sample)");
  EXPECT_TRUE(row_of(rows, "aten::matmul").composite);
}

TEST(OpCoverage, ReasonClasses) {
  auto rs = sample_records();
  EXPECT_EQ(opcov::reason_class(rs[4]), "no rule: aten::cummax");
  EXPECT_EQ(opcov::reason_class(rs[6]), "wrong result");
  CaseRecord x = rs[6];
  x.status = "xfail";
  EXPECT_EQ(opcov::reason_class(x), "expected failure");
  x = rs[6];
  x.reason = "crashed: killed by signal Segmentation fault";
  EXPECT_EQ(opcov::reason_class(x), "crash");
}

// NOTE: [Strict coverage]: aten::mul has overloads besides mul.Tensor (mul.Scalar, mul.out,
// ...) that never ran: the name is not covered, nor verified, until they are covered or
// excluded with a reason. The previous (loose) count ignored them.
TEST(OpCoverage, SummaryCountsANameOnlyWhenEveryOverloadIsCoveredOrExcluded) {
  auto records = sample_records();
  auto rows = opcov::classify_ops(records);
  auto s = opcov::summarize(records, rows);
  EXPECT_EQ(s.overloads_by_status.at("covered"), 1);
  EXPECT_EQ(s.op_names_covered, 0);
  EXPECT_EQ(s.op_names_covered_loose, 1);  // aten::mul
  EXPECT_EQ(s.verified_names_loose.at("1d fwd"), 1);
  EXPECT_EQ(s.verified_names.count("1d fwd"), 0u);
  EXPECT_EQ(s.cases_by_status.at("pass"), 4);
  EXPECT_EQ(s.cases_skipped, 2);

  const auto ex = opcov::Exclusions::parse("# other mul overloads\naten::mul\\.(?!Tensor$).+  not sampled in this test\n", "x.txt");
  rows = opcov::classify_ops(records, ex);
  s = opcov::summarize(records, rows);
  EXPECT_EQ(row_of(rows, "aten::mul.Scalar").status, "excluded");
  EXPECT_EQ(row_of(rows, "aten::mul.Scalar").reason, "not sampled in this test");
  EXPECT_EQ(row_of(rows, "aten::mul.Tensor").status, "covered");
  EXPECT_EQ(s.op_names_covered, 1);
  EXPECT_EQ(s.verified_names.at("1d fwd"), 1);
  EXPECT_EQ(s.verified_names.at("2d bwd"), 1);
  EXPECT_EQ(s.verified_names.at("both fwd"), 1);
  EXPECT_PRED2(contains, opcov::headline(s), "1 of " + std::to_string(s.op_names) + " aten op names are covered");
  EXPECT_PRED2(contains, opcov::headline(s), "2 cases were skipped");

  EXPECT_PRED2(contains, error_of([] { opcov::Exclusions::parse("aten::x\n", "x.txt"); }),
               "x.txt:1: an exclusion needs a reason");
  EXPECT_PRED2(contains, error_of([] { opcov::Exclusions::parse("aten::(x why\n", "x.txt"); }),
               "x.txt:1: 'aten::(x' is not a valid regular expression");
}

// An exclusion covers overloads that did not run: one whose cases ran keeps their verdict, so
// that a failing out= overload is not hidden behind the out= exclusion.
// NOTE: [PyTorch's DTensor op test beside ours]: per OpInfo PyTorch passes, our strict status of
// its aten op name; and the OpInfos PyTorch does not pass whose op we cover.
TEST(OpCoverage, ComparesWithPyTorchsDTensorOpTest) {
  const auto pytorch = opcov::parse_pytorch_dtensor_ops(
      "# comment\nmul pass aten::mul\nsort pass aten::sort\nnn.functional.pad xfail aten::mul\n"
      "pad.circular pass aten::no_such_op\n",
      "p.txt");
  ASSERT_EQ(pytorch.size(), 4u);
  auto rows = opcov::classify_ops(sample_records());
  // aten::mul: Tensor covered, the other overloads have no case here: not covered (strict).
  const auto uncovered = opcov::compare_with_pytorch(pytorch, rows);
  EXPECT_EQ(uncovered.pass_covered, 0);
  for (auto& r : rows)
    if (r.name == "aten::mul" && r.status != "covered") r.status = "excluded";
  const auto c = opcov::compare_with_pytorch(pytorch, rows);
  EXPECT_EQ(c.opinfos, 4);
  EXPECT_EQ(c.pytorch_pass, 3);
  EXPECT_EQ(c.pass_covered, 1);
  ASSERT_EQ(c.pass_not_covered.size(), 2u);
  EXPECT_EQ(c.pass_not_covered[0][0], "sort");
  EXPECT_PRED2(contains, c.pass_not_covered[0][2], "failing 1");
  EXPECT_PRED2(contains, c.pass_not_covered[1][2], "no such aten op");
  ASSERT_EQ(c.covered_not_pass.size(), 1u);
  EXPECT_EQ(c.covered_not_pass[0][0], "nn.functional.pad");
  EXPECT_PRED2(contains, error_of([] { opcov::parse_pytorch_dtensor_ops("abs maybe aten::abs\n", "p.txt"); }),
               "p.txt:1: expectation 'maybe' is not one of pass, xfail, skip");
  // The checked-in list parses, and names PyTorch's test passes.
  const auto checked_in = opcov::parse_pytorch_dtensor_ops(
      testing::read_listing(opcov::default_pytorch_dtensor_ops_path(), "PyTorch DTensor ops"),
      opcov::default_pytorch_dtensor_ops_path());
  EXPECT_GT(checked_in.size(), 500u);
  EXPECT_TRUE(std::any_of(checked_in.begin(), checked_in.end(),
                          [](const auto& p) { return p.opinfo == "linalg.svd" && p.expectation == "pass"; }));
}

// NOTE: [Overloads PyTorch's DTensor registers]
TEST(OpCoverage, ComparesWithTheOverloadsPytorchRegisters) {
  const auto pytorch = opcov::parse_pytorch_registered_ops(
      "# Generated\n# torch 9.1.0+cpu: 5 operator overloads\naten::mul.Tensor strategy\naten::sort strategy\n"
      "aten::cummax strategy\naten::no_such_op.default strategy\nprims::sum handler\n",
      "r.txt");
  EXPECT_EQ(pytorch.torch, "9.1.0+cpu");
  ASSERT_EQ(pytorch.ops.size(), 5u);
  const auto rows = opcov::classify_ops(sample_records());
  const auto exceptions = opcov::Exclusions::parse("aten::cummax  values and indices: not yet\n", "e.txt");
  const auto c = opcov::compare_with_registered(pytorch, rows, exceptions);
  EXPECT_EQ(c.registered, 5);
  EXPECT_EQ(c.covered, 1);  // mul.Tensor
  EXPECT_EQ(c.absent, (std::vector<std::string>{"aten::no_such_op.default", "prims::sum"}));
  ASSERT_EQ(c.exceptions.size(), 1u);
  EXPECT_EQ(c.exceptions[0], (std::vector<std::string>{"aten::cummax", "fallback", "values and indices: not yet"}));
  ASSERT_EQ(c.not_covered.size(), 1u);
  EXPECT_EQ(c.not_covered[0][0], "aten::sort");
  EXPECT_EQ(c.not_covered[0][1], "failing");
  EXPECT_PRED2(contains, c.not_covered[0][2], "values differ");
  EXPECT_PRED2(contains, error_of([] { opcov::parse_pytorch_registered_ops("relu strategy\n", "r.txt"); }),
               "r.txt:1: 'relu' is not an operator name");
  EXPECT_PRED2(contains, error_of([] { opcov::parse_pytorch_registered_ops("aten::relu\n", "r.txt"); }),
               "r.txt:1: an operator line needs a reason");
}

// Every overload PyTorch's DTensor registers that this libtorch has either has a rule here,
// decomposes above DTensor (CompositeImplicitAutograd: its pieces' rules apply), or is listed
// in pytorch_registered_exceptions.txt with the reason. A listed entry must name overloads
// PyTorch registers, and must not name only overloads that have a rule (it would be stale).
TEST(OpCoverage, EveryOverloadPytorchRegistersHasARuleHereOrIsListed) {
  const auto pytorch = opcov::parse_pytorch_registered_ops(
      testing::read_listing(opcov::default_pytorch_registered_ops_path(), "PyTorch registered ops"),
      opcov::default_pytorch_registered_ops_path());
  const auto exceptions = opcov::Exclusions::parse(
      testing::read_listing(opcov::default_pytorch_registered_exceptions_path(), "exceptions"),
      opcov::default_pytorch_registered_exceptions_path());
  EXPECT_GT(pytorch.ops.size(), 1000u);
  std::vector<std::string> missing;
  std::map<int, int> listed_without_rule, listed_matches;  // exception line -> overloads
  int present = 0, ruled = 0;
  for (const std::string& op : pytorch.ops) {
    const opcov::Exclusion* e = exceptions.match(op);
    if (e) ++listed_matches[e->line];
    const auto dot = op.find('.', op.find("::") + 2);
    auto handle = c10::Dispatcher::singleton().findSchema(
        {op.substr(0, dot), dot == std::string::npos ? "" : op.substr(dot + 1)});
    if (!handle || !handle->hasSchema()) continue;
    ++present;
    const bool rule = ops::has_rule(op);
    ruled += rule;
    const bool composite = handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    if (e && !rule) ++listed_without_rule[e->line];
    if (!rule && !composite && !e) missing.push_back(op);
  }
  EXPECT_GT(present, 1000);
  EXPECT_TRUE(missing.empty()) << missing.size() << " overloads PyTorch's DTensor registers have no rule here and are "
                               << "not listed in pytorch_registered_exceptions.txt: " << c10::Join(", ", missing);
  for (const auto& e : exceptions.entries()) {
    EXPECT_GT(listed_matches[e.line], 0) << "pytorch_registered_exceptions.txt:" << e.line << " (" << e.pattern
                                         << ") matches no overload PyTorch registers";
    // On a libtorch without any of its overloads the entry has nothing to excuse here.
    if (listed_matches[e.line] > 0 && listed_without_rule.count(e.line) == 0) {
      bool any_present = false;
      for (const std::string& op : pytorch.ops) {
        const auto dot = op.find('.', op.find("::") + 2);
        if (exceptions.match(op) == &e &&
            c10::Dispatcher::singleton()
                .findSchema({op.substr(0, dot), dot == std::string::npos ? "" : op.substr(dot + 1)})
                .has_value())
          any_present = true;
      }
      EXPECT_FALSE(any_present) << "pytorch_registered_exceptions.txt:" << e.line << " (" << e.pattern
                                << ") lists only overloads that have a rule now: remove it";
    }
  }
  std::cout << "PyTorch registers " << pytorch.ops.size() << " overloads; " << present << " are in this libtorch, "
            << ruled << " of them with a rule here\n";
}

// NOTE: [Listing files]: expected_failures.txt and coverage_exclusions.txt share one parser.
TEST(OpCoverage, ListingFilesShareOneFormat) {
  const auto l = testing::parse_listing("# c\n\na b  the reason  \nc d e # trailing comment\n", "l.txt", 2, "'<a> <b> <r>'",
                                        "an entry");
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].fields, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(l[0].reason, "the reason");
  EXPECT_EQ(l[0].line, 3);
  EXPECT_EQ(l[1].reason, "e");
  EXPECT_PRED2(contains, error_of([] { testing::parse_listing("a\n", "l.txt", 2, "'<a> <b> <r>'", "an entry"); }),
               "l.txt:1: expected '<a> <b> <r>'");
  EXPECT_PRED2(contains, error_of([] { testing::parse_listing("a b\n", "l.txt", 2, "'<a> <b> <r>'", "an entry"); }),
               "l.txt:1: an entry needs a reason");
}

TEST(OpCoverage, AnExcludedOverloadThatRanKeepsItsVerdict) {
  auto records = sample_records();
  records.push_back(rec("aten::mul.out", "1d", "fwd", "fail", "output 0 (...): values differ: max abs diff 1"));
  const auto ex = opcov::Exclusions::parse("aten::mul\\.(?!Tensor$).+  not sampled in this test\n", "x.txt");
  const auto rows = opcov::classify_ops(records, ex);
  EXPECT_EQ(row_of(rows, "aten::mul.Scalar").status, "excluded");
  EXPECT_EQ(row_of(rows, "aten::mul.out").status, "failing");
  EXPECT_EQ(row_of(rows, "aten::mul.out").excluded, "not sampled in this test");
  EXPECT_EQ(opcov::summarize(records, rows).op_names_covered, 0);
}

// NOTE: [Trivial cases]: passes that verified nothing do not cover an overload, and rules
// count as exercised only where a forward case ran.
TEST(OpCoverage, TrivialPassesDoNotCoverAndRulesAreCountedAsExercised) {
  auto records = sample_records();
  CaseRecord t = rec("aten::tile", "1d", "fwd", "pass");
  t.trivial = "every output is empty";
  records.push_back(t);
  auto rows = opcov::classify_ops(records);
  EXPECT_EQ(row_of(rows, "aten::tile").status, "trivial");
  auto s = opcov::summarize(records, rows);
  EXPECT_EQ(s.trivial_passes, 1);
  EXPECT_TRUE(row_of(rows, "aten::mul.Tensor").has_rule);
  EXPECT_LT(s.rule_overloads_exercised, s.rule_overloads);
  EXPECT_GE(s.rule_overloads_exercised, 1);  // mul.Tensor
  EXPECT_EQ(s.rule_overloads_exercised + static_cast<int>(s.rule_overloads_not_exercised.size()), s.rule_overloads);
}

// The checked-in exclusions parse, and each names at least one operator of this libtorch
// (an entry that matches nothing is stale), except an entry whose reason ends "(absent from
// libtorch >= X.Y)" on those libtorch lines (the older lines check it).
TEST(OpCoverage, TheCheckedInExclusionsParseAndMatchOperators) {
  const auto ex = opcov::Exclusions::load(opcov::default_exclusions_path());
  const auto rows = opcov::classify_ops({}, ex);
  const std::regex absent_since("\\(absent from libtorch >= ([0-9]+)\\.([0-9]+)\\)$");
  for (const auto& e : ex.entries()) {
    const bool used = std::any_of(rows.begin(), rows.end(), [&](const opcov::OpRow& r) { return r.excluded == e.reason; });
    std::smatch m;
    if (!used && std::regex_search(e.reason, m, absent_since)) {
      const int major = std::stoi(m[1]), minor = std::stoi(m[2]);
      if (TORCH_VERSION_MAJOR > major || (TORCH_VERSION_MAJOR == major && TORCH_VERSION_MINOR >= minor)) continue;
    }
    EXPECT_TRUE(used) << "coverage_exclusions.txt:" << e.line << " (" << e.pattern << ") matches no operator";
  }
}

TEST(OpCoverage, RendersMarkdownAndASelfContainedPage) {
  auto records = sample_records();
  auto rows = opcov::classify_ops(records);
  auto s = opcov::summarize(records, rows);
  opcov::RunInfo info;
  info.world_size = 4;
  const std::string md = opcov::summary_markdown(info, records, rows, s);
  EXPECT_PRED2(contains, md, "**" + std::to_string(s.op_names_covered) + " of " + std::to_string(s.op_names) + " ops**");
  EXPECT_PRED2(contains, md, opcov::headline(s));
  EXPECT_PRED2(contains, md, "| wrong result | 1 |");
  EXPECT_PRED2(contains, md, "### aten::sort (test)");
  EXPECT_PRED2(contains, md, "build/tools/opcov --ops '^aten::sort$'");
  const std::string html = opcov::report_html(info, records, rows, s);
  EXPECT_PRED2(contains, html, "<td>aten::mul.Tensor</td>");
  EXPECT_PRED2(contains, html, "<th title=\"1-D forward, by the first tensor's placement\">Shard(dim=0)</th>");
  EXPECT_PRED2(contains, html, "<select id=\"fam\">");
  EXPECT_EQ(html.find("http"), std::string::npos) << "the page must not load anything from the network";
  // Summary first, then the grid; a reproduce command for the failing op.
  EXPECT_LT(html.find("id=\"summary\""), html.find("id=\"ops\""));
  EXPECT_PRED2(contains, html, "<table id=\"families\">");
  EXPECT_PRED2(contains, html, "<code>build/tools/opcov --ops '^aten::sort$'");
  const auto j = opcov::coverage_json(info, records, rows, s);
  EXPECT_EQ(j.at("schema_version"), opcov::kSchemaVersion);
  EXPECT_EQ(j.at("records").size(), records.size());
  EXPECT_EQ(j.at("ops").size(), rows.size());
}

// report.html in a real browser (Debian's chromium, headless): it loads without a console
// error, and the filter (opened through the page's #q=... hash) shows the one matching row.
// A page with a script error is caught the same way (the check can fail).
TEST(OpCoverage, ReportLoadsInHeadlessChromiumAndFilters) {
  const char* chromium = "/usr/bin/chromium";
  if (::access(chromium, X_OK) != 0)
    GTEST_SKIP() << chromium << " is not installed (ci/setup installs Debian's chromium package)";
  auto records = sample_records();
  auto rows = opcov::classify_ops(records);
  auto s = opcov::summarize(records, rows);
  testing::TempDir dir;
  {
    std::ofstream(dir.path() + "/report.html") << opcov::report_html({}, records, rows, s);
    std::ofstream(dir.path() + "/broken.html") << "<!DOCTYPE html><html><body><script>no_such_function();</script></body></html>";
  }
  auto load = [&](const std::string& page) {
    return testing::run_program(chromium, {"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                           "--user-data-dir=" + dir.path() + "/profile", "--enable-logging=stderr",
                                           "--v=0", "--dump-dom", "file://" + dir.path() + "/" + page},
                                {}, std::chrono::seconds(60));
  };
  auto broken = load("broken.html");
  EXPECT_PRED2(contains, broken.output, "no_such_function is not defined");
  auto run = load("report.html#q=aten::mul.Tensor");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("CONSOLE"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Uncaught"), std::string::npos) << run.output;
  EXPECT_PRED2(contains, run.output, "<span id=\"count\">1 of " + std::to_string(rows.size()) + " operators</span>");
}

// ---- strategy discovery and PyTorch's DTensor beside ours ---------------------------------------

TEST(OpCoverage, StrategyCategoriesPutWrongValuesFirst) {
  EXPECT_EQ(opcov::strategy_category("ok", "ok"), "both right");
  EXPECT_EQ(opcov::strategy_category("unjudged", "ok"), "both right");
  EXPECT_EQ(opcov::strategy_category("ok", "unsupported"), "only ours");
  EXPECT_EQ(opcov::strategy_category("unsupported", "ok"), "only PyTorch");
  EXPECT_EQ(opcov::strategy_category("unsupported", "unsupported"), "neither");
  EXPECT_EQ(opcov::strategy_category("ok", "wrong"), "PyTorch wrong");
  EXPECT_EQ(opcov::strategy_category("unsupported", "wrong"), "PyTorch wrong");
  EXPECT_EQ(opcov::strategy_category("wrong", "ok"), "we are wrong");
  EXPECT_EQ(opcov::strategy_category("wrong", "wrong"), "we are wrong");
  EXPECT_EQ(opcov::strategy_category("ok", "error"), "");  // PyTorch's side did not judge it
}

// A discovery file and PyTorch's lines as the two tools write them.
nlohmann::json sample_discovery() {
  return nlohmann::json::parse(R"J({"ranks": 2, "seconds": 1.5, "ops": 2, "samples": 3, "skipped": 1,
    "combinations": 5, "valid": 7, "judged": 2, "wrong": 1, "wrong_ops": 1, "missing": 2, "missing_ops": 1,
    "errors": 0, "crashed": [{"op": "aten::lu_unpack", "why": "Segmentation fault"}],
    "per_op": [
      {"op": "aten::mm", "wrong": [],
       "missing": [{"variant": "ab", "strategy": "(S(1), R) -> (P(sum))", "saved": 96},
                   {"variant": "ab", "strategy": "(S(1), P(sum)) -> (P(sum))", "saved": null}],
       "choices": [
         {"sample": 0, "variant": "ab", "inputs": ["S(0)", "R"], "status": "ok", "outputs": ["S(0)"], "cost": 0, "collectives": 0, "dumped": true},
         {"sample": 0, "variant": "ab", "inputs": ["S(1)", "R"], "status": "ok", "outputs": ["R"], "cost": 96, "collectives": 1, "dumped": true},
         {"sample": 0, "variant": "ab", "inputs": ["P(sum)", "R"], "status": "ok", "outputs": ["P(sum)"], "cost": 1, "collectives": 0, "dumped": true},
         {"sample": 0, "variant": "ab", "inputs": ["R", "S(0)"], "status": "ok", "outputs": ["R"], "cost": 48, "collectives": 1, "dumped": true}]},
      {"op": "aten::relu", "wrong": [{"variant": "x", "strategy": "(S(0)) -> (S(0))"}], "missing": [],
       "choices": [
         {"sample": 2, "variant": "x", "inputs": ["P(sum)"], "status": "unsupported", "outputs": [], "message": "no valid strategy", "dumped": true},
         {"sample": 2, "variant": "x", "inputs": ["S(0)"], "status": "wrong", "outputs": ["S(0)"], "cost": 0, "dumped": true},
         {"sample": 2, "variant": "x", "inputs": ["R"], "status": "ok", "outputs": ["R"], "cost": 0, "dumped": true}]},
      {"op": "aten::matmul", "wrong": [], "missing": [],
       "choices": [
         {"sample": 3, "variant": "m", "inputs": ["S(1)", "R"], "status": "unjudged", "outputs": [], "cost": 0, "message": "decomposes into ops with rules", "dumped": true}]}]})J");
}

std::string sample_pytorch_lines() {
  return R"J({"torch": "2.15.0", "ranks": 2, "world": "LocalTensorMode"}
{"sample": 0, "op": "aten::mm", "inputs": ["S(0)", "R"], "status": "ok", "outputs": ["S(0)"], "redistributions": 0}
{"sample": 0, "op": "aten::mm", "inputs": ["S(1)", "R"], "status": "ok", "outputs": ["P(sum)"], "redistributions": 0}
{"sample": 0, "op": "aten::mm", "inputs": ["P(sum)", "R"], "status": "wrong", "outputs": ["P(sum)"], "redistributions": 0, "max_error": 0.5, "reproducer": "x = <b>"}
{"sample": 0, "op": "aten::mm", "inputs": ["R", "S(0)"], "status": "unsupported", "message": "no strategy\nsecond line"}
{"sample": 2, "op": "aten::relu", "inputs": ["P(sum)"], "status": "ok", "outputs": ["R"], "redistributions": 1}
{"sample": 2, "op": "aten::relu", "inputs": ["S(0)"], "status": "ok", "outputs": ["S(0)"], "redistributions": 0}
{"sample": 2, "op": "aten::relu", "inputs": ["R"], "status": "error", "message": "the plain op failed"}
{"sample": 5, "op": "aten::abs", "inputs": ["R"], "status": "ok", "outputs": ["R"], "redistributions": 0}
{"sample": 3, "op": "aten::matmul", "inputs": ["S(1)", "R"], "status": "ok", "outputs": ["P(sum)"], "redistributions": 1}
)J";
}

opcov::PytorchStrategies pytorch_from(const std::string& text) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/p.jsonl") << text;
  return opcov::load_pytorch_strategies(dir.path() + "/p.jsonl");
}

TEST(OpCoverage, PytorchsDTensorBesideOursPerCombination) {
  const auto d = sample_discovery();
  const auto p = pytorch_from(sample_pytorch_lines());
  EXPECT_EQ(p.header.at("torch"), "2.15.0");
  ASSERT_EQ(p.lines.size(), 9u);
  const auto c = opcov::compare_strategies(d, p);
  EXPECT_EQ(c.compared, 7);  // the "error" line is not judged
  // matmul decomposes on our side: right, but neither side is cheaper (its cost is not known).
  EXPECT_EQ(c.totals, (std::map<std::string, int>{{"both right", 3},
                                                  {"PyTorch cheaper", 1},
                                                  {"PyTorch wrong", 1},
                                                  {"only ours", 1},
                                                  {"only PyTorch", 1},
                                                  {"we are wrong", 1}}));
  EXPECT_EQ(c.pytorch_only_ran, 1);  // sample 5: not in our file
  EXPECT_EQ(c.ours_only_ran, 0);
  // (P(sum), R): a cost of 1 (a local split) with no collective is not "PyTorch cheaper".
  EXPECT_EQ(c.ops.at("aten::mm").counts.at("PyTorch cheaper"), 1);
  EXPECT_EQ(c.ops.at("aten::relu").counts.at("we are wrong"), 1);
  ASSERT_EQ(c.pytorch_wrong.size(), 1u);
  EXPECT_EQ(c.pytorch_wrong[0].at("reproducer"), "x = <b>");
  // What differs is spelt out per op, the message's first line only.
  const auto& mm = c.ops.at("aten::mm").differences;
  ASSERT_EQ(mm.size(), 3u);
  EXPECT_EQ(mm[0], "[ab] (S(1), R): PyTorch cheaper; ours ok -> (R) (1 collectives, cost 96); PyTorch ok -> (P(sum)) (0 collectives)");
  EXPECT_EQ(mm[2], "[ab] (R, S(0)): only ours; ours ok -> (R) (1 collectives, cost 48); PyTorch unsupported: no strategy");

  auto records = sample_records();
  auto rows = opcov::classify_ops(records);
  auto s = opcov::summarize(records, rows);
  opcov::RunInfo info;
  info.discovery = d;
  info.pytorch_strategies = p;
  const std::string html = opcov::report_html(info, records, rows, s);
  EXPECT_PRED2(contains, html, "<section id=\"discovery\">");
  EXPECT_PRED2(contains, html, "5 input combinations run, 7 valid strategies found");
  EXPECT_PRED2(contains, html, "<td>(S(0)) -&gt; (S(0))</td>");  // the wrong strategy
  EXPECT_PRED2(contains, html, "<td>the rule raises</td>");      // ranked first
  EXPECT_LT(html.find("the rule raises"), html.find("96 bytes"));
  EXPECT_PRED2(contains, html, "<summary>aten::mm: 1 combinations</summary>");
  EXPECT_PRED2(contains, html, "<pre>x = &lt;b&gt;</pre>");
  EXPECT_PRED2(contains, html, "aten::lu_unpack (Segmentation fault)");
  EXPECT_PRED2(contains, html, "both right 3, only ours 1, only PyTorch 1, PyTorch wrong 1, we are wrong 1, neither 0");
  EXPECT_LT(html.find("id=\"summary\""), html.find("id=\"discovery\""));
  EXPECT_LT(html.find("id=\"discovery\""), html.find("id=\"ops\""));
  const std::string md = opcov::summary_markdown(info, records, rows, s);
  EXPECT_PRED2(contains, md, "## Strategy discovery");
  EXPECT_PRED2(contains, md, "- aten::relu [x] (S(0)) -> (S(0))");
  EXPECT_PRED2(contains, md, "```python\nx = <b>\n```");
  const auto j = opcov::coverage_json(info, records, rows, s).at("strategy_discovery");
  EXPECT_EQ(j.at("valid"), 7);
  EXPECT_EQ(j.at("wrong_strategies").size(), 1u);
  EXPECT_EQ(j.at("top_missing")[0].at("saved"), nullptr);
  EXPECT_EQ(j.at("pytorch").at("totals").at("only PyTorch"), 1);
  EXPECT_EQ(j.at("pytorch").at("per_op").at("aten::relu").at("we are wrong"), 1);

  // PyTorch's side absent (an old torch): said so, without a table.
  const auto absent = pytorch_from(R"({"torch": "1.13.1", "unavailable": "no LocalTensorMode in torch 1.13.1"})" "\n");
  info.pytorch_strategies = absent;
  const std::string without = opcov::report_html(info, records, rows, s);
  EXPECT_PRED2(contains, without, "PyTorch's DTensor beside ours: not run (no LocalTensorMode in torch 1.13.1).");
  EXPECT_EQ(without.find("pytorch-categories"), std::string::npos);
  // No discovery: no section.
  EXPECT_EQ(opcov::report_html({}, records, rows, s).find("id=\"discovery\""), std::string::npos);
}

TEST(OpCoverage, BadDiscoveryAndPytorchFilesAreNamed) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/coverage.json") << R"({"ops": []})";
  std::ofstream(dir.path() + "/broken.json") << "{";
  std::ofstream(dir.path() + "/no-header.jsonl") << R"({"sample": 0, "op": "aten::mm", "inputs": [], "status": "ok"})" << "\n";
  std::ofstream(dir.path() + "/bad-line.jsonl") << R"({"torch": "2.15.0"})" << "\n" << R"({"sample": 0})" << "\n";
  EXPECT_PRED2(contains, error_of([&] { opcov::load_discovery(dir.path() + "/coverage.json"); }),
               "coverage.json is not strategy_discovery's --json output");
  EXPECT_PRED2(contains, error_of([&] { opcov::load_discovery(dir.path() + "/broken.json"); }),
               "broken.json is not valid JSON");
  EXPECT_PRED2(contains, error_of([&] { opcov::load_discovery(dir.path() + "/absent.json"); }),
               "cannot read --discovery " + dir.path() + "/absent.json");
  EXPECT_PRED2(contains, error_of([&] { opcov::load_pytorch_strategies(dir.path() + "/no-header.jsonl"); }),
               "does not start with pytorch_strategies.py's header");
  EXPECT_PRED2(contains, error_of([&] { opcov::load_pytorch_strategies(dir.path() + "/bad-line.jsonl"); }),
               "bad-line.jsonl line 2 lacks \"sample\", \"op\", \"inputs\" or \"status\"");
}

// The two tools as the main job runs them: discovery's findings on one op go into the report.
TEST(OpcovProgram, PutsDiscoverysFindingsInTheReport) {
  testing::TempDir out;
  auto discovery = testing::run_program(paths::strategy_discovery(),
                                        {"--ops", "aten::mm,aten::relu", "--json", out.path() + "/discovery.json",
                                         "--dump-samples", out.path() + "/samples"});
  ASSERT_EQ(discovery.exit_code, 0) << discovery.output;
  const auto d = nlohmann::json::parse(testing::read_file(out.path() + "/discovery.json"));
  EXPECT_EQ(d.at("ops"), 2);
  EXPECT_EQ(d.at("wrong"), 0);
  ASSERT_EQ(d.at("per_op").size(), 2u);
  for (const auto& op : d.at("per_op")) {
    EXPECT_GT(op.at("choices").size(), 0u) << op.at("op");
    EXPECT_GT(op.at("dumped").get<int>(), 0) << op.at("op");
  }
  const auto index = nlohmann::json::parse(testing::read_file(out.path() + "/samples/index.json"));
  EXPECT_EQ(index.at("ranks"), 2);
  EXPECT_GT(index.at("dumped").get<int>(), 0);
  auto run = testing::run_program(paths::opcov(), {"--ops", "^aten::mm$", "--meshes", "1d", "--out", out.path(),
                                                       "--discovery", out.path() + "/discovery.json", "--quiet"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto j = nlohmann::json::parse(testing::read_file(out.path() + "/coverage.json")).at("strategy_discovery");
  EXPECT_EQ(j.at("combinations"), d.at("combinations"));
  EXPECT_PRED2(contains, testing::read_file(out.path() + "/report.html"), "<section id=\"discovery\">");
  run = testing::run_program(paths::opcov(), {"--pytorch-strategies", out.path() + "/p.jsonl"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_PRED2(contains, run.output, "--pytorch-strategies needs --discovery");
  discovery = testing::run_program(paths::strategy_discovery(), {"--json", "/nonexistent/dir/d.json"});
  EXPECT_EQ(discovery.exit_code, 2);
  EXPECT_PRED2(contains, discovery.output, "--json /nonexistent/dir/d.json: cannot write that file");
}

// PyTorch's DTensor (today's wheel, tools/opcov/pytorch_strategies.py) on the samples
// discovery dumped, merged into the report. PyTorch's own answers are the reference for its
// column: mm with rows sharded and the other operand replicated runs without a collective and
// stays row-sharded there, as on our side.
TEST(OpcovProgram, PutsPytorchsDTensorBesideOurs) {
  const std::string python = std::getenv("DTENSOR_TORCH_PYTHON") ? std::getenv("DTENSOR_TORCH_PYTHON")
                                                                  : DTENSOR_TORCH_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no Python with today's torch (ci/test configures the wheel's)";
  testing::TempDir out;
  auto discovery = testing::run_program(paths::strategy_discovery(),
                                        {"--ops", "aten::mm,aten::relu,aten::sum.dim_IntList", "--json",
                                         out.path() + "/discovery.json", "--dump-samples", out.path() + "/samples"});
  ASSERT_EQ(discovery.exit_code, 0) << discovery.output;
  auto theirs = testing::run_program(python, {paths::pytorch_strategies_script(), out.path() + "/samples", "--out",
                                              out.path() + "/pytorch.jsonl"},
                                     {}, std::chrono::seconds(300));
  ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
  const auto p = opcov::load_pytorch_strategies(out.path() + "/pytorch.jsonl");
  ASSERT_FALSE(p.header.contains("unavailable")) << p.header.dump();
  const auto d = opcov::load_discovery(out.path() + "/discovery.json");
  const auto c = opcov::compare_strategies(d, p);
  EXPECT_GT(c.compared, 0);
  EXPECT_EQ(c.ours_only_ran, 0) << "every dumped combination has PyTorch's answer";
  EXPECT_EQ(c.pytorch_only_ran, 0);
  EXPECT_EQ(c.totals.count("we are wrong"), 0u) << "our rules chose a strategy discovery finds not valid";
  bool seen = false;
  for (const auto& l : p.lines) {
    if (l.at("op") != "aten::mm" || l.at("inputs") != nlohmann::json({"S(0)", "R"})) continue;
    seen = true;
    EXPECT_EQ(l.at("status"), "ok") << l.dump();
    EXPECT_EQ(l.at("outputs"), nlohmann::json({"S(0)"})) << l.dump();
    EXPECT_EQ(l.at("redistributions"), 0) << l.dump();
  }
  EXPECT_TRUE(seen);
  auto run = testing::run_program(paths::opcov(), {"--ops", "^aten::mm$", "--meshes", "1d", "--out", out.path(),
                                                       "--discovery", out.path() + "/discovery.json",
                                                       "--pytorch-strategies", out.path() + "/pytorch.jsonl", "--quiet"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string html = testing::read_file(out.path() + "/report.html");
  EXPECT_PRED2(contains, html, "<table id=\"pytorch-categories\">");
  EXPECT_PRED2(contains, html, "<td>aten::mm</td>");
}

// The program, as the README runs it (small selection to stay fast).
TEST(OpcovProgram, WritesTheThreeFilesWithStatuses) {
  testing::TempDir out;
  auto run = testing::run_program(paths::opcov(), {"--ops", "^aten::(mul\\.Tensor|glu)$", "--meshes", "1d",
                                                       "--out", out.path(), "--quiet"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(out.entries(), (std::vector<std::string>{"coverage.json", "report.html", "summary.md"}));
  auto j = nlohmann::json::parse(testing::read_file(out.path() + "/coverage.json"));
  std::map<std::string, std::string> status;
  for (const auto& op : j.at("ops")) status[op.at("op")] = op.at("status");
  EXPECT_EQ(status.at("aten::mul.Tensor"), "covered");
  EXPECT_EQ(status.at("aten::glu"), "fallback");  // no rule; its generated sample passes through the fallback
  EXPECT_EQ(status.at("aten::linalg_svd"), "no rule");
  EXPECT_PRED2(contains, run.output, "ops covered");
}

// libtorch's deprecation warnings of the ops run in opcov's child processes go into the case
// records, not to the terminal (NOTE: [Warnings go into the records]).
TEST(OpcovProgram, LibtorchWarningsGoIntoTheRecordsNotToTheTerminal) {
  testing::TempDir out;
  auto run = testing::run_program(paths::opcov(), {"--ops", "^aten::(_aminmax|chain_matmul)$", "--meshes", "1d",
                                                       "--out", out.path(), "--quiet"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("Warning"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("deprecated"), std::string::npos) << run.output;
  auto j = nlohmann::json::parse(testing::read_file(out.path() + "/coverage.json"));
  std::map<std::string, int> warned;  // op -> records that name its deprecation
  for (const auto& r : j.at("records"))
    for (const auto& w : r.value("warnings", std::vector<std::string>{}))
      if (w.find("deprecated") != std::string::npos) ++warned[r.at("op").get<std::string>()];
  EXPECT_EQ(warned, (std::map<std::string, int>{{"aten::_aminmax", 2}, {"aten::chain_matmul", 2}}));
}

TEST(OpcovProgram, BadArgumentsAreNamed) {
  auto run = testing::run_program(paths::opcov(), {"--ops", "("});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_PRED2(contains, run.output, "--ops '(' is not a valid regular expression");
  run = testing::run_program(paths::opcov(), {"--meshes", "3d"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_PRED2(contains, run.output, "--meshes takes 1d and/or 2d, got '3d'");
  run = testing::run_program(paths::opcov(), {"--results", "/nonexistent/dir"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_PRED2(contains, run.output, "--results /nonexistent/dir is not a directory");
}

}  // namespace
}  // namespace dtensor
