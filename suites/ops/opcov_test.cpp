// suites/ops/opcov_test.cpp: tools/opcov: the status of every dispatcher op, the three
// renderings, and the program itself run as a user runs it.
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"
#include "tools/opcov/coverage.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>

namespace dtensor {
namespace {

using testing::CaseRecord;
using testing::contains;

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
          rec("aten::cholesky", "1d", "fwd", "error", "DTensor: operator aten::cholesky has no sharding rule", "fail")};
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
  EXPECT_EQ(row_of(rows, "aten::cholesky").status, "no rule");
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

TEST(OpCoverage, SummaryCountsVerifiedNamesPerMeshAndDirection) {
  auto records = sample_records();
  auto rows = opcov::classify_ops(records);
  auto s = opcov::summarize(records, rows);
  EXPECT_EQ(s.verified_names.at("1d fwd"), 1);  // aten::mul
  EXPECT_EQ(s.verified_names.at("2d bwd"), 1);
  EXPECT_EQ(s.verified_names.at("both fwd"), 1);
  EXPECT_EQ(s.overloads_by_status.at("covered"), 1);
  EXPECT_GE(s.op_names_covered, 1);
  EXPECT_EQ(s.cases_by_status.at("pass"), 4);
}

TEST(OpCoverage, RendersMarkdownAndASelfContainedPage) {
  auto records = sample_records();
  auto rows = opcov::classify_ops(records);
  auto s = opcov::summarize(records, rows);
  opcov::RunInfo info;
  info.world_size = 4;
  const std::string md = opcov::summary_markdown(info, records, rows, s);
  EXPECT_PRED2(contains, md, "**" + std::to_string(s.op_names_covered) + " of " + std::to_string(s.op_names) + " ops**");
  EXPECT_PRED2(contains, md, "| wrong result | 1 |");
  EXPECT_PRED2(contains, md, "### aten::sort (test)");
  EXPECT_PRED2(contains, md, "build/tools/opcov --ops '^aten::sort$'");
  const std::string html = opcov::report_html(info, records, rows, s);
  EXPECT_PRED2(contains, html, "<td>aten::mul.Tensor</td>");
  EXPECT_PRED2(contains, html, "<th title=\"1-D forward, by the first tensor's placement\">Shard(dim=0)</th>");
  EXPECT_PRED2(contains, html, "<select id=\"fam\">");
  EXPECT_EQ(html.find("http"), std::string::npos) << "the page must not load anything from the network";
  const auto j = opcov::coverage_json(info, records, rows, s);
  EXPECT_EQ(j.at("schema_version"), opcov::kSchemaVersion);
  EXPECT_EQ(j.at("records").size(), records.size());
  EXPECT_EQ(j.at("ops").size(), rows.size());
}

// The program, as the README runs it (small selection to stay fast).
TEST(OpcovProgram, WritesTheThreeFilesWithStatuses) {
  testing::TempDir out;
  auto run = testing::run_program(DTENSOR_OPCOV_PATH, {"--ops", "^aten::(mul\\.Tensor|cummax)$", "--meshes", "1d",
                                                       "--out", out.path(), "--quiet"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(out.entries(), (std::vector<std::string>{"coverage.json", "report.html", "summary.md"}));
  auto j = nlohmann::json::parse(testing::read_file(out.path() + "/coverage.json"));
  std::map<std::string, std::string> status;
  for (const auto& op : j.at("ops")) status[op.at("op")] = op.at("status");
  EXPECT_EQ(status.at("aten::mul.Tensor"), "covered");
  EXPECT_EQ(status.at("aten::cummax"), "fallback");  // no rule; its generated sample passes through the fallback
  EXPECT_EQ(status.at("aten::linalg_svd"), "no rule");
  EXPECT_PRED2(contains, run.output, "ops covered");
}

TEST(OpcovProgram, BadArgumentsAreNamed) {
  auto run = testing::run_program(DTENSOR_OPCOV_PATH, {"--ops", "("});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_PRED2(contains, run.output, "--ops '(' is not a valid regular expression");
  run = testing::run_program(DTENSOR_OPCOV_PATH, {"--meshes", "3d"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_PRED2(contains, run.output, "--meshes takes 1d and/or 2d, got '3d'");
  run = testing::run_program(DTENSOR_OPCOV_PATH, {"--results", "/nonexistent/dir"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_PRED2(contains, run.output, "--results /nonexistent/dir is not a directory");
}

}  // namespace
}  // namespace dtensor
