// tools/strategy_discovery: strategy discovery (converters/strategy_discovery.h) over the op
// sample database (converters/op_db.h): for every sample of every op, the valid strategies on
// one mesh dim of --ranks ranks, then the op's rule judged against them: the strategies it
// offers that are not valid (wrong), and the valid ones it does not offer where it would
// redistribute (missing, the most bytes saved first).
//
//   strategy_discovery [--ranks 2] [--ops aten::mm,aten::add.Tensor] [--missing 3] [--timeout 120]
//                      [--json FILE] [--dump-samples DIR] [--fail-on-wrong]
//   strategy_discovery --mesh 2x2x2 [--combinations 48] [--ops ...] [--timeout 120] [--fail-on-wrong]
//
// --mesh: instead, the rules' choices on a mesh of several dims (judge_rule_on_mesh: layouts
// drawn from every mesh dim's candidates, and strided ones, the chosen strategy run on
// simulated pieces); a chosen strategy whose pieces do not give the result is wrong.
// --json FILE: the findings for tools/opcov's report (NOTE: [Discovery in the op-coverage
// report] in tools/opcov/discovery.h): per op, its counts, wrong strategies, the most saving
// missing ones, and what the rule chooses for every input combination.
// --dump-samples DIR: every examined sample as DIR/<n>.pt (torch::pickle_save of a dict: "op",
// "variant", "args" as (name, value, keyword-only) per schema argument, "combinations" as
// placement labels per tensor argument, "rtol", "atol"), with DIR/index.json, for
// tools/opcov/pytorch_strategies.py to run the same combinations through PyTorch's DTensor.
//
// Each op runs in a child process: some kernels write out of bounds when given pieces of
// inconsistent shapes (nll_loss2d_backward, lu_unpack), and such an op is reported as crashed
// instead of ending the run; one still running after --timeout seconds (default 120) is killed
// and reported so. The process keeps one intra-op thread: an OpenMP pool made before a fork
// (PyTorch's wheel's) leaves the children hanging. Exit status: 1 with --fail-on-wrong when a
// rule is wrong, 2 for bad arguments.
#include "converters/op_db.h"
#include "converters/strategy_discovery.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using dtensor::testing::DiscoveryOptions;
using dtensor::testing::OpInfo;
using dtensor::testing::RuleJudgement;
using dtensor::testing::SampleDiscovery;
using nlohmann::json;

struct Options {
  int64_t ranks = 2;
  std::set<std::string> ops;
  size_t missing = 3;
  unsigned timeout = 120;
  bool fail_on_wrong = false;
  std::string json_path, dump_dir;
  std::vector<int64_t> mesh;  // --mesh: judge the choices on this mesh instead
  size_t combinations = 48;
};

int usage(const std::string& why) {
  std::cerr << "strategy_discovery: " << why << "\n"
            << "usage: strategy_discovery [--ranks N] [--ops OP,OP...] [--missing N] [--timeout S] [--json FILE]\n"
            << "                          [--dump-samples DIR] [--fail-on-wrong]\n"
            << "       strategy_discovery --mesh AxB[xC...] [--combinations N] [--ops OP,OP...] [--timeout S]\n"
            << "                          [--fail-on-wrong]\n";
  return 2;
}

json labels(const std::vector<dtensor::Placement>& ps) {
  json a = json::array();
  for (const auto& p : ps) a.push_back(dtensor::testing::placement_label(p));
  return a;
}

// Writes one sample for PyTorch's side (the format in the header comment). False when an
// argument cannot be pickled (a Generator): the sample is then not compared.
bool dump_sample(const std::string& path, const c10::OperatorHandle& op, const std::string& name,
                 const dtensor::testing::OpSample& sample, const SampleDiscovery& d) {
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<c10::IValue> stack = dtensor::testing::boxed_args(schema, sample.args, sample.kwargs);
  c10::impl::GenericList args(c10::AnyType::get());
  for (size_t i = 0; i < stack.size() && i < schema.arguments().size(); ++i) {
    const c10::Argument& a = schema.arguments()[i];
    args.push_back(c10::ivalue::Tuple::create({c10::IValue(a.name()), stack[i], c10::IValue(a.kwarg_only())}));
  }
  c10::impl::GenericList combinations(c10::AnyType::get());
  for (const auto& c : d.combinations) {
    std::vector<std::string> l;
    for (const auto& p : c.inputs) l.push_back(dtensor::testing::placement_label(p));
    combinations.push_back(c10::IValue(l));
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("op", name);
  dict.insert("variant", sample.variant);
  dict.insert("args", args);
  dict.insert("combinations", combinations);
  dict.insert("rtol", sample.rtol ? c10::IValue(*sample.rtol) : c10::IValue());
  dict.insert("atol", sample.atol ? c10::IValue(*sample.atol) : c10::IValue());
  std::vector<char> bytes;
  try {
    bytes = torch::jit::pickle_save(c10::IValue(dict));
  } catch (const std::exception&) {
    return false;
  }
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

// Runs in the child: prints the op's findings, writes them to `fd` as one JSON line. Samples
// are numbered from `first_sample` (their DIR/<n>.pt names).
// A sample whose examination raised: printed, and its entry in the op's "errors".
json report_error(const OpInfo& info, const dtensor::testing::OpSample& sample, const std::exception& e) {
  const auto* err = dynamic_cast<const c10::Error*>(&e);
  const std::string what = (err ? err->msg() : std::string(e.what())).substr(0, 200);
  std::printf("error    %s [%s] %s\n", info.op.c_str(), sample.variant.c_str(), what.c_str());
  return {{"variant", sample.variant}, {"message", what}};
}

// The child's findings to the parent, one JSON line (the child exits 3 if the pipe fails).
void write_report(int fd, const json& r) {
  const std::string line = r.dump() + "\n";
  for (size_t off = 0; off < line.size();) {
    const ssize_t w = ::write(fd, line.data() + off, line.size() - off);
    if (w <= 0) _exit(3);
    off += static_cast<size_t>(w);
  }
}

// --mesh: the child's work. Writes {"op", "samples", "skipped", "checked", "unsupported",
// "unjudged", "strided", "wrong"} to `fd`.
void examine_on_mesh(const OpInfo& info, const c10::OperatorHandle& op, const Options& o, long first_sample, int fd) {
  json r = {{"op", info.op}, {"samples", 0}, {"skipped", 0}, {"checked", 0}, {"unsupported", 0}, {"unjudged", 0},
            {"strided", 0}};
  json wrong = json::array(), errors = json::array();
  long n = first_sample - 1;
  for (const auto& sample : info.make_samples()) {
    ++n;
    r["samples"] = r["samples"].get<long>() + 1;
    dtensor::testing::MeshCheckOptions m;
    m.mesh_shape = o.mesh;
    m.combinations = o.combinations;
    m.seed = static_cast<uint64_t>(n);
    try {
      const auto j = dtensor::testing::judge_rule_on_mesh(op, sample, m);
      if (!j.skipped.empty()) {
        r["skipped"] = r["skipped"].get<long>() + 1;
        continue;
      }
      r["checked"] = r["checked"].get<long>() + static_cast<long>(j.checked);
      r["unsupported"] = r["unsupported"].get<long>() + static_cast<long>(j.unsupported);
      r["unjudged"] = r["unjudged"].get<long>() + static_cast<long>(j.unjudged);
      r["strided"] = r["strided"].get<long>() + static_cast<long>(j.strided);
      for (const auto& w : j.wrong) {
        std::printf("wrong    %s [%s] %s\n", info.op.c_str(), sample.variant.c_str(), w.c_str());
        wrong.push_back({{"variant", sample.variant}, {"strategy", w}});
      }
    } catch (const std::exception& e) {
      errors.push_back(report_error(info, sample, e));
    }
  }
  std::fflush(stdout);
  r["wrong"] = std::move(wrong);
  r["errors"] = std::move(errors);
  write_report(fd, r);
}

void examine(const OpInfo& info, const c10::OperatorHandle& op, const Options& o, long first_sample, int fd) {
  json r = {{"op", info.op}, {"samples", 0}, {"skipped", 0}, {"combinations", 0}, {"valid", 0},
            {"judged", 0}, {"confirmed", 0}, {"unoffered", 0}, {"missing_count", 0}, {"has_rule", false},
            {"own_local_computation", false}, {"dumped", 0}, {"dumped_ids", json::array()}};
  json wrong = json::array(), missing = json::array(), errors = json::array(), choices = json::array();
  long n = first_sample - 1;
  for (const auto& sample : info.make_samples()) {
    ++n;
    r["samples"] = r["samples"].get<long>() + 1;
    DiscoveryOptions d_opts;
    d_opts.ranks = o.ranks;
    try {
      const SampleDiscovery d = dtensor::testing::discover_strategies(op, sample, d_opts);
      if (!d.skipped.empty()) {
        r["skipped"] = r["skipped"].get<long>() + 1;
        continue;
      }
      r["combinations"] = r["combinations"].get<long>() + static_cast<long>(d.combinations.size());
      for (const auto& c : d.combinations) {
        if (!c.error.empty()) continue;
        long product = 1;  // every output's valid placements combine
        for (const auto& v : c.valid_outputs) product *= static_cast<long>(v.size());
        r["valid"] = r["valid"].get<long>() + product;
      }
      const bool dumped =
          !o.dump_dir.empty() && dump_sample(o.dump_dir + "/" + std::to_string(n) + ".pt", op, info.op, sample, d);
      if (dumped) {
        r["dumped"] = r["dumped"].get<long>() + 1;
        r["dumped_ids"].push_back(n);
      }
      const RuleJudgement j = dtensor::testing::judge_rule(op, sample, d);
      r["has_rule"] = r["has_rule"].get<bool>() || j.has_rule;
      if (!o.dump_dir.empty()) {  // every choice, "unsupported" ones of ops without a rule too
        for (const auto& c : j.choices) {
          json e = {{"sample", n}, {"variant", sample.variant}, {"inputs", labels(c.inputs)}, {"status", c.status},
                    {"outputs", labels(c.outputs)}, {"dumped", dumped}};
          if (std::isfinite(c.cost)) e["cost"] = c.cost;
          if (c.status != "unsupported") e["collectives"] = c.collectives;
          if (!c.message.empty()) e["message"] = c.message.substr(0, 200);
          choices.push_back(std::move(e));
        }
      }
      if (!j.has_rule || j.own_local_computation) {
        r["own_local_computation"] = r["own_local_computation"].get<bool>() || j.own_local_computation;
        continue;
      }
      r["judged"] = r["judged"].get<long>() + 1;
      r["confirmed"] = r["confirmed"].get<long>() + static_cast<long>(j.confirmed);
      r["unoffered"] = r["unoffered"].get<long>() + static_cast<long>(j.unoffered);
      r["missing_count"] = r["missing_count"].get<long>() + static_cast<long>(j.missing.size());
      for (const auto& w : j.wrong) {
        std::printf("wrong    %s [%s] %s\n", info.op.c_str(), sample.variant.c_str(), w.to_string().c_str());
        wrong.push_back({{"variant", sample.variant}, {"strategy", w.to_string()}});
      }
      for (size_t i = 0; i < j.missing.size() && i < o.missing; ++i) {
        std::printf("missing  %s [%s] %s saves %.0f bytes\n", info.op.c_str(), sample.variant.c_str(),
                    j.missing[i].strategy.to_string().c_str(), j.missing[i].saved);
        json m = {{"variant", sample.variant}, {"strategy", j.missing[i].strategy.to_string()}};
        // infinity (the rule raises for these inputs) is not a JSON number
        m["saved"] = std::isfinite(j.missing[i].saved) ? json(j.missing[i].saved) : json(nullptr);
        missing.push_back(std::move(m));
      }
    } catch (const std::exception& e) {
      errors.push_back(report_error(info, sample, e));
    }
  }
  std::fflush(stdout);
  r["wrong"] = std::move(wrong);
  r["missing"] = std::move(missing);
  r["errors"] = std::move(errors);
  r["choices"] = std::move(choices);
  write_report(fd, r);
}

bool make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) {
    struct stat st {};
    return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fail-on-wrong") {
      o.fail_on_wrong = true;
      continue;
    }
    if (i + 1 >= argc) return usage(a + ": missing its value");
    const std::string v = argv[++i];
    try {
      if (a == "--ranks") {
        o.ranks = std::stoll(v);
        if (o.ranks < 2) return usage("--ranks " + v + ": at least 2");
      } else if (a == "--timeout") {
        o.timeout = static_cast<unsigned>(std::stoul(v));
        if (o.timeout == 0) return usage("--timeout " + v + ": at least 1");
      } else if (a == "--missing") {
        o.missing = static_cast<size_t>(std::stoul(v));
      } else if (a == "--ops") {
        std::stringstream ss(v);
        for (std::string op; std::getline(ss, op, ',');) o.ops.insert(op);
      } else if (a == "--json") {
        o.json_path = v;
      } else if (a == "--dump-samples") {
        o.dump_dir = v;
      } else if (a == "--combinations") {
        o.combinations = static_cast<size_t>(std::stoul(v));
        if (o.combinations == 0) return usage("--combinations " + v + ": at least 1");
      } else if (a == "--mesh") {
        std::stringstream ss(v);
        for (std::string d; std::getline(ss, d, 'x');) {
          size_t used = 0;
          const long long n = std::stoll(d, &used);
          if (used != d.size() || n < 1) return usage("--mesh " + v + ": sizes of at least 1 joined by x, as 2x2x2");
          o.mesh.push_back(n);
        }
        if (o.mesh.size() < 2) return usage("--mesh " + v + ": at least two mesh dims (one dim: --ranks)");
      } else {
        return usage("unknown option " + a);
      }
    } catch (const std::exception&) {
      return usage(a + " " + v + ": not a number");
    }
  }
  if (!o.mesh.empty() && (!o.json_path.empty() || !o.dump_dir.empty()))
    return usage("--mesh checks the rules' choices; --json and --dump-samples are for one mesh dim");
  if (!o.dump_dir.empty() && !make_dir(o.dump_dir))
    return usage("--dump-samples " + o.dump_dir + ": cannot make that directory (" + std::strerror(errno) + ")");
  std::ofstream json_out;
  if (!o.json_path.empty()) {
    json_out.open(o.json_path);
    if (!json_out) return usage("--json " + o.json_path + ": cannot write that file (" + std::strerror(errno) + ")");
  }
  at::set_num_threads(1);  // before any op: no OpenMP pool for the children to inherit
  const auto start = std::chrono::steady_clock::now();
  const auto& db = dtensor::testing::op_db();
  long ops = 0, samples = 0, skipped = 0, combinations = 0, valid = 0, judged = 0, wrong = 0, missing = 0,
       errors = 0, dumped = 0, wrong_ops = 0, missing_ops = 0, checked = 0, unsupported = 0, unjudged = 0, strided = 0;
  json per_op = json::array(), crashed = json::array(), files = json::array();
  for (const OpInfo& info : db.ops()) {
    if (info.family == "random") continue;
    if (!o.ops.empty() && !o.ops.count(info.op)) continue;
    const auto op = c10::Dispatcher::singleton().findSchema({info.name(), info.overload()});
    if (!op) continue;
    ++ops;
    const long first_sample = samples;
    const long op_samples = static_cast<long>(info.make_samples().size());
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("strategy_discovery: pipe");
      return 1;
    }
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("strategy_discovery: fork");
      return 1;
    }
    if (pid == 0) {
      ::close(fds[0]);
      ::alarm(o.timeout);  // SIGALRM ends a hung op
      if (o.mesh.empty()) {
        examine(info, *op, o, first_sample, fds[1]);
      } else {
        examine_on_mesh(info, *op, o, first_sample, fds[1]);
      }
      _exit(0);
    }
    ::close(fds[1]);
    std::string out;
    char buf[65536];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    samples += op_samples;
    json r = json::parse(out, nullptr, /*allow_exceptions=*/false);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !r.is_object()) {
      const std::string why = WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "no report";
      std::printf("crashed  %s (%s)\n", info.op.c_str(), why.c_str());
      crashed.push_back({{"op", info.op}, {"why", why}});
      continue;
    }
    skipped += r["skipped"].get<long>();
    if (!o.mesh.empty()) {
      checked += r["checked"].get<long>();
      unsupported += r["unsupported"].get<long>();
      unjudged += r["unjudged"].get<long>();
      strided += r["strided"].get<long>();
      const long w = static_cast<long>(r["wrong"].size());
      wrong += w;
      wrong_ops += w > 0;
      errors += static_cast<long>(r["errors"].size());
      continue;
    }
    combinations += r["combinations"].get<long>();
    valid += r["valid"].get<long>();
    judged += r["judged"].get<long>();
    dumped += r["dumped"].get<long>();
    for (const auto& id : r["dumped_ids"]) files.push_back(id);
    r.erase("dumped_ids");
    const long w = static_cast<long>(r["wrong"].size()), m = r["missing_count"].get<long>();
    wrong += w;
    missing += m;
    errors += static_cast<long>(r["errors"].size());
    wrong_ops += w > 0;
    missing_ops += m > 0;
    if (json_out.is_open()) per_op.push_back(std::move(r));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.mesh.empty()) {
    std::printf(
        "\n%ld ops, %ld samples on a mesh of %s: %ld skipped; %ld layouts whose chosen strategy was run and checked "
        "(%ld of them strided), %ld without a strategy, %ld not simulated (a tensor both strided and Partial); wrong "
        "choices %ld (%ld ops); %ld errors, %zu ops crashed; %.1f s\n",
        ops, samples, c10::str(c10::IntArrayRef(o.mesh)).c_str(), skipped, checked, strided, unsupported, unjudged,
        wrong, wrong_ops, errors, crashed.size(), seconds);
    return o.fail_on_wrong && wrong > 0 ? 1 : 0;
  }
  std::printf(
      "\n%ld ops, %ld samples on one mesh dim of %lld ranks: %ld skipped, %ld input combinations run, %ld valid "
      "strategies found; %ld samples judged against their rules: wrong strategies %ld (%ld ops), missing "
      "strategies %ld (%ld ops); %ld errors, %zu ops crashed; %.1f s\n",
      ops, samples, static_cast<long long>(o.ranks), skipped, combinations, valid, judged, wrong, wrong_ops, missing,
      missing_ops, errors, crashed.size(), seconds);
  if (!o.dump_dir.empty()) {
    std::ofstream index(o.dump_dir + "/index.json");
    index << json{{"ranks", o.ranks}, {"samples", samples}, {"dumped", dumped}, {"files", files}}.dump() << "\n";
  }
  if (json_out.is_open()) {
    json_out << json{{"ranks", o.ranks},
                     {"seconds", seconds},
                     {"ops", ops},
                     {"samples", samples},
                     {"skipped", skipped},
                     {"combinations", combinations},
                     {"valid", valid},
                     {"judged", judged},
                     {"wrong", wrong},
                     {"wrong_ops", wrong_ops},
                     {"missing", missing},
                     {"missing_ops", missing_ops},
                     {"errors", errors},
                     {"crashed", crashed},
                     {"per_op", per_op}}
                    .dump()
             << "\n";
    if (!json_out) {
      std::cerr << "strategy_discovery: --json " << o.json_path << ": write failed\n";
      return 1;
    }
  }
  return o.fail_on_wrong && wrong > 0 ? 1 : 0;
}
