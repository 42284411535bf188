// tools/strategy_discovery: strategy discovery (converters/strategy_discovery.h) over the op
// sample database (converters/op_db.h): for every sample of every op, the valid strategies on
// one mesh dim of --ranks ranks, then the op's rule judged against them: the strategies it
// offers that are not valid (wrong), and the valid ones it does not offer where it would
// redistribute (missing, the most bytes saved first).
//
//   strategy_discovery [--ranks 2] [--ops aten::mm,aten::add.Tensor] [--missing 3] [--timeout 120]
//                      [--fail-on-wrong]
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

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using dtensor::testing::DiscoveryOptions;
using dtensor::testing::OpInfo;
using dtensor::testing::RuleJudgement;
using dtensor::testing::SampleDiscovery;

struct Options {
  int64_t ranks = 2;
  std::set<std::string> ops;
  size_t missing = 3;
  unsigned timeout = 120;
  bool fail_on_wrong = false;
};

int usage(const std::string& why) {
  std::cerr << "strategy_discovery: " << why << "\n"
            << "usage: strategy_discovery [--ranks N] [--ops OP,OP...] [--missing N] [--timeout S] [--fail-on-wrong]\n";
  return 2;
}

// What one op's child reports back, one line of counts.
struct Counts {
  long samples = 0, skipped = 0, combinations = 0, judged = 0, wrong = 0, missing = 0, errors = 0;
};

// Runs in the child: prints the op's findings, writes its counts to `fd`.
void examine(const OpInfo& info, const c10::OperatorHandle& op, const Options& o, int fd) {
  Counts c;
  for (const auto& sample : info.make_samples()) {
    ++c.samples;
    DiscoveryOptions d_opts;
    d_opts.ranks = o.ranks;
    try {
      const SampleDiscovery d = dtensor::testing::discover_strategies(op, sample, d_opts);
      if (!d.skipped.empty()) {
        ++c.skipped;
        continue;
      }
      c.combinations += static_cast<long>(d.combinations.size());
      const RuleJudgement j = dtensor::testing::judge_rule(op, sample, d);
      if (!j.has_rule || j.own_local_computation) continue;
      ++c.judged;
      c.wrong += static_cast<long>(j.wrong.size());
      c.missing += static_cast<long>(j.missing.size());
      for (const auto& w : j.wrong)
        std::printf("wrong    %s [%s] %s\n", info.op.c_str(), sample.variant.c_str(), w.to_string().c_str());
      for (size_t i = 0; i < j.missing.size() && i < o.missing; ++i)
        std::printf("missing  %s [%s] %s saves %.0f bytes\n", info.op.c_str(), sample.variant.c_str(),
                    j.missing[i].strategy.to_string().c_str(), j.missing[i].saved);
    } catch (const std::exception& e) {
      ++c.errors;
      const auto* err = dynamic_cast<const c10::Error*>(&e);
      std::printf("error    %s [%s] %s\n", info.op.c_str(), sample.variant.c_str(),
                  (err ? err->msg() : std::string(e.what())).substr(0, 200).c_str());
    }
  }
  std::fflush(stdout);
  char line[256];
  const int n = std::snprintf(line, sizeof line, "%ld %ld %ld %ld %ld %ld %ld\n", c.samples, c.skipped,
                              c.combinations, c.judged, c.wrong, c.missing, c.errors);
  if (::write(fd, line, static_cast<size_t>(n)) != n) _exit(3);
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
      } else {
        return usage("unknown option " + a);
      }
    } catch (const std::exception&) {
      return usage(a + " " + v + ": not a number");
    }
  }
  at::set_num_threads(1);  // before any op: no OpenMP pool for the children to inherit
  const auto start = std::chrono::steady_clock::now();
  const auto& db = dtensor::testing::op_db();
  Counts total;
  long ops = 0, crashed = 0, wrong_ops = 0, missing_ops = 0;
  for (const OpInfo& info : db.ops()) {
    if (info.family == "random") continue;
    if (!o.ops.empty() && !o.ops.count(info.op)) continue;
    const auto op = c10::Dispatcher::singleton().findSchema({info.name(), info.overload()});
    if (!op) continue;
    ++ops;
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
      examine(info, *op, o, fds[1]);
      _exit(0);
    }
    ::close(fds[1]);
    std::string out;
    char buf[256];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    Counts c;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        std::sscanf(out.c_str(), "%ld %ld %ld %ld %ld %ld %ld", &c.samples, &c.skipped, &c.combinations, &c.judged,
                    &c.wrong, &c.missing, &c.errors) != 7) {
      ++crashed;
      std::printf("crashed  %s (%s)\n", info.op.c_str(),
                  WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "no report");
      continue;
    }
    total.samples += c.samples;
    total.skipped += c.skipped;
    total.combinations += c.combinations;
    total.judged += c.judged;
    total.wrong += c.wrong;
    total.missing += c.missing;
    total.errors += c.errors;
    wrong_ops += c.wrong > 0;
    missing_ops += c.missing > 0;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "\n%ld ops, %ld samples on one mesh dim of %lld ranks: %ld skipped, %ld input combinations run; %ld samples "
      "judged against their rules: wrong strategies %ld (%ld ops), missing strategies %ld (%ld ops); %ld errors, "
      "%ld ops crashed; %.1f s\n",
      ops, total.samples, static_cast<long long>(o.ranks), total.skipped, total.combinations, total.judged,
      total.wrong, wrong_ops, total.missing, missing_ops, total.errors, crashed, seconds);
  return o.fail_on_wrong && total.wrong > 0 ? 1 : 0;
}
