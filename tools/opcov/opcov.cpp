// tools/opcov/opcov.cpp: the op-coverage tool (issue: op coverage; DESIGN.md D6).
//
//   build/tools/opcov --out reports                      # run everything, write the report
//   build/tools/opcov --results DIR --out reports        # the op suite's records + generated ops
//   build/tools/opcov --ops '^aten::cumsum$' --print-failures
//
// It runs the op suite (converters/op_suite.h) over the hand-written samples (op_db) and the
// samples generated from schemas (generated_op_db), on a 1-D mesh of all ranks and a 2-D mesh,
// with ranks as threads, and writes coverage.json, summary.md and report.html (coverage.h).
// With --results it reads the records dtensor_ops_tests wrote (DTENSOR_OPS_RESULTS_DIR) for
// the hand-written samples instead of running them again.
//
// NOTE: [opcov child processes]
// Generated samples call every operator of the dispatcher with guessed arguments; some
// crash or hang. So the cases run in child processes forked from this (single-threaded)
// process, each with its own rank threads, streaming one JSON line per record. When a child
// dies or goes silent for --timeout seconds, the op it was on is recorded as crashed or timed
// out, and a new child resumes at the next op.
#include "converters/op_db.h"
#include "converters/op_suite.h"
#include "dtensor/comm/device.h"
#include "dtensor/comm/thread_group.h"
#include "harness/main.h"
#include "tools/opcov/coverage.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

namespace dtensor {
namespace opcov {
namespace {

namespace fs = std::filesystem;
using testing::CaseRecord;
using testing::OpInfo;

constexpr std::chrono::seconds kDefaultOpTimeout{120};
// The threads' collectives give up a little before the parent would kill the child.
constexpr std::chrono::seconds kCollectiveTimeoutMargin{10};

const char* kUsage = R"(usage: opcov [options]
Runs every sample of every op on DTensors (1-D and 2-D meshes, ranks as threads) and writes
coverage.json, summary.md and report.html.
  --out DIR               output directory (default: reports)
  --results DIR           read the records dtensor_ops_tests wrote there (DTENSOR_OPS_RESULTS_DIR)
                          for the hand-written samples instead of running them
  --ops REGEX             only ops whose key (aten::name.overload) matches
  --families LIST         only these families, comma-separated ("generated": schema samples)
  --no-generated          only ops with hand-written samples
  --meshes LIST           1d,2d (default: both)
  --world-size N          ranks (default: DTENSOR_WORLD_SIZE or 4)
  --device cpu|cuda       where local tensors live (default: cpu); with cuda every rank thread
                          runs its ops on CUDA device 0 (the collectives stay in memory)
  --timeout SECONDS       an op taking longer is recorded as a timeout (default: 120)
  --expected-failures F   default: suites/ops/expected_failures.txt of the source tree
  --previous FILE         an earlier coverage.json: report.html lists what changed since
  --exclusions F          overloads left out of the strict count, with reasons
                          (default: suites/ops/coverage_exclusions.txt of the source tree)
  --pytorch-ops F         PyTorch's DTensor op test expectations per OpInfo, compared with ours
                          (default: suites/ops/pytorch_dtensor_ops.txt; "" for none)
  --pytorch-registered F  the overloads PyTorch's DTensor registers strategies for, with our
                          status beside each (default: suites/ops/pytorch_registered_ops.txt;
                          "" for none)
  --pytorch-registered-exceptions F
                          those we leave out, with reasons (default:
                          suites/ops/pytorch_registered_exceptions.txt)
  --discovery F           tools/strategy_discovery's --json findings: the report's "Strategy
                          discovery" section
  --pytorch-strategies F  tools/opcov/pytorch_strategies.py's --out: PyTorch's DTensor on the
                          same samples and combinations, beside ours (needs --discovery)
  --print-failures        print every case that did not pass
  --quiet                 no progress line
)";

struct Options {
  std::string out = "reports";
  std::string results;
  std::optional<std::regex> ops;
  std::string ops_pattern;
  std::vector<std::string> families;
  bool generated = true;
  std::vector<std::string> meshes{"1d", "2d"};
  int world_size = 4;
  std::string device = "cpu";
  std::chrono::seconds timeout = kDefaultOpTimeout;
  std::string expected_failures;
  std::string exclusions;
  std::string pytorch_ops;
  std::string pytorch_registered, registered_exceptions;
  std::string discovery, pytorch_strategies;
  std::string previous;
  bool print_failures = false;
  bool quiet = false;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep))
    if (!part.empty()) out.push_back(part);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  if (const char* ws = std::getenv("DTENSOR_WORLD_SIZE")) o.world_size = std::atoi(ws);
  o.expected_failures = testing::default_expected_failures_path();
  o.exclusions = default_exclusions_path();
  o.pytorch_ops = default_pytorch_dtensor_ops_path();
  o.pytorch_registered = default_pytorch_registered_ops_path();
  o.registered_exceptions = default_pytorch_registered_exceptions_path();
  auto value = [&](int& i) -> std::string {
    TORCH_CHECK(i + 1 < argc, "opcov: ", argv[i], " needs a value\n", kUsage);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out") o.out = value(i);
    else if (a == "--results") o.results = value(i);
    else if (a == "--ops") {
      o.ops_pattern = value(i);
      try {
        o.ops = std::regex(o.ops_pattern);
      } catch (const std::regex_error& e) {
        TORCH_CHECK(false, "opcov: --ops '", o.ops_pattern, "' is not a valid regular expression: ", e.what());
      }
    } else if (a == "--families") o.families = split(value(i), ',');
    else if (a == "--no-generated") o.generated = false;
    else if (a == "--meshes") o.meshes = split(value(i), ',');
    else if (a == "--world-size") o.world_size = std::atoi(value(i).c_str());
    else if (a == "--device") o.device = value(i);
    else if (a == "--timeout") o.timeout = std::chrono::seconds(std::atoi(value(i).c_str()));
    else if (a == "--expected-failures") o.expected_failures = value(i);
    else if (a == "--exclusions") o.exclusions = value(i);
    else if (a == "--pytorch-ops") o.pytorch_ops = value(i);
    else if (a == "--pytorch-registered") o.pytorch_registered = value(i);
    else if (a == "--pytorch-registered-exceptions") o.registered_exceptions = value(i);
    else if (a == "--discovery") o.discovery = value(i);
    else if (a == "--pytorch-strategies") o.pytorch_strategies = value(i);
    else if (a == "--previous") o.previous = value(i);
    else if (a == "--print-failures") o.print_failures = true;
    else if (a == "--quiet") o.quiet = true;
    else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else TORCH_CHECK(false, "opcov: unknown argument '", a, "'\n", kUsage);
  }
  TORCH_CHECK(o.results.empty() || fs::is_directory(o.results), "opcov: --results ", o.results, " is not a directory");
  TORCH_CHECK(o.world_size >= 1, "opcov: --world-size must be >= 1");
  TORCH_CHECK(o.device == "cpu" || o.device == "cuda", "opcov: --device takes cpu or cuda, got '", o.device, "'");
  TORCH_CHECK(o.timeout.count() > 0, "opcov: --timeout must be > 0 seconds");
  for (const auto& m : o.meshes)
    TORCH_CHECK(m == "1d" || m == "2d", "opcov: --meshes takes 1d and/or 2d, got '", m, "'");
  return o;
}

struct Task {
  const OpInfo* op;
  std::string mesh;
};

bool selected(const Options& o, const OpInfo& info) {
  if (o.ops && !std::regex_search(info.op, *o.ops)) return false;
  if (!o.families.empty() && std::find(o.families.begin(), o.families.end(), info.family) == o.families.end())
    return false;
  return true;
}

std::vector<Task> make_tasks(const Options& o) {
  std::vector<const OpInfo*> ops;
  if (o.results.empty())
    for (const OpInfo& info : testing::op_db().ops())
      if (selected(o, info)) ops.push_back(&info);
  if (o.generated)
    for (const OpInfo& info : testing::generated_op_db().ops())
      if (selected(o, info)) ops.push_back(&info);
  std::vector<Task> tasks;
  for (const OpInfo* op : ops)
    for (const auto& m : o.meshes) tasks.push_back({op, m});
  return tasks;
}

// ---- the child (NOTE: [opcov child processes]) ------------------------------------------------

void write_line(int fd, const nlohmann::json& j) {
  const std::string line = j.dump() + "\n";
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::write(fd, line.data() + off, line.size() - off);
    if (n <= 0) ::_exit(4);  // the parent is gone
    off += static_cast<size_t>(n);
  }
}

[[noreturn]] void child_main(const Options& o, const std::vector<Task>& tasks, size_t start, int fd) {
  auto world = comm::ThreadWorld::create(o.world_size, o.timeout - kCollectiveTimeoutMargin);
  std::vector<std::thread> threads;
  for (int r = 0; r < o.world_size; ++r) {
    threads.emplace_back([&, r] {
      auto group = std::make_shared<comm::ThreadGroup>(world, r);
      comm::set_thread_default_group(group);
      size_t i = start;
      try {
        std::map<std::string, std::optional<DeviceMesh>> meshes;
        for (const auto& m : o.meshes) meshes[m] = testing::suite_mesh(m, group, o.device);
        for (; i < tasks.size(); ++i) {
          const Task& t = tasks[i];
          std::vector<CaseRecord> records;
          if (meshes.at(t.mesh)) {
            testing::OpCheckOptions opts = testing::suite_options(t.mesh);
            opts.stop_on_missing_rule = t.op->generated;
            testing::SuiteRunOptions run;
            run.retry_with_fallback = true;
            records = testing::run_op_suite(*meshes.at(t.mesh), t.mesh, {t.op}, opts, run);
          }
          if (r == 0) {
            for (const auto& rec : records) write_line(fd, {{"record", rec}});
            write_line(fd, {{"done", i}});
          }
          // No rank starts the next task before rank 0 said this one is done: a crash while
          // another rank thread makes the next task's samples would be blamed on this task
          // (narrow.Tensor took the blame for native_batch_norm's).
          group->barrier();
        }
      } catch (const std::exception& e) {
        // A collective broke (ranks diverged or timed out): every rank lands here.
        world->abort(std::string("rank ") + std::to_string(r) + " failed");
        if (r == 0) {
          const auto* ce = dynamic_cast<const c10::Error*>(&e);
          write_line(fd, {{"fatal", ce ? ce->what_without_backtrace() : e.what()}, {"task", i}});
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ::_exit(0);
}

// ---- the parent ---------------------------------------------------------------------------------

std::string clock_string(double seconds) {
  const int s = static_cast<int>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

class Progress {
 public:
  Progress(size_t total, bool enabled)
      : total_(total), tty_(enabled && ::isatty(2)), enabled_(enabled), t0_(std::chrono::steady_clock::now()) {}
  void update(size_t done, const std::string& op) {
    if (!enabled_ || total_ == 0) return;
    const double elapsed = seconds();
    const double left = done ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - done) : 0;
    const int percent = static_cast<int>(100 * done / total_);
    if (tty_) {
      std::fprintf(stderr, "\r[opcov] %zu/%zu (op, mesh) checks (%d%%), %s elapsed, ~%s left  %-40.40s", done, total_,
                   percent, clock_string(elapsed).c_str(), clock_string(left).c_str(), op.c_str());
      if (done == total_) std::fprintf(stderr, "\n");
    } else if (percent / 10 != last_decile_ || done == total_) {
      last_decile_ = percent / 10;
      std::fprintf(stderr, "[opcov] %zu/%zu (%d%%), %s elapsed, ~%s left\n", done, total_, percent,
                   clock_string(elapsed).c_str(), clock_string(left).c_str());
    }
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  size_t total_;
  bool tty_, enabled_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point t0_;
};

// Records for a task whose child crashed or hung: every sample, both directions.
void add_broken_task(const Task& t, const std::string& status, const std::string& reason,
                     std::vector<CaseRecord>& out) {
  // A generated op has one sample, "generated"; making it would run the op (NOTE: [Generated
  // samples that do work]), which is what crashed: never in this process.
  std::vector<std::string> variants;
  if (t.op->generated) variants = {"generated"};
  else
    for (const auto& s : t.op->make_samples()) variants.push_back(s.variant);
  for (const std::string& variant : variants) {
    for (const char* dir : {"fwd", "bwd"}) {
      CaseRecord r;
      r.op = t.op->op;
      r.family = t.op->family;
      r.variant = variant;
      r.mesh = t.mesh;
      r.direction = dir;
      r.status = status;
      r.reason = reason;
      r.generated = t.op->generated;
      out.push_back(std::move(r));
    }
  }
}

std::vector<CaseRecord> run_tasks(const Options& o, const std::vector<Task>& tasks) {
  std::vector<CaseRecord> records;
  Progress progress(tasks.size(), !o.quiet);
  size_t next = 0;
  while (next < tasks.size()) {
    int fds[2];
    TORCH_CHECK(::pipe(fds) == 0, "opcov: pipe failed: ", std::strerror(errno));
    std::cout.flush();
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    TORCH_CHECK(pid >= 0, "opcov: fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::close(fds[0]);
      child_main(o, tasks, next, fds[1]);
    }
    ::close(fds[1]);
    std::string buf;
    std::string fatal;
    bool timed_out = false;
    auto last = std::chrono::steady_clock::now();
    for (;;) {
      pollfd p{fds[0], POLLIN, 0};
      const int rc = ::poll(&p, 1, 1000);
      if (rc > 0) {
        char chunk[65536];
        const ssize_t n = ::read(fds[0], chunk, sizeof chunk);
        if (n <= 0) break;  // the child closed the pipe (exited)
        buf.append(chunk, static_cast<size_t>(n));
        last = std::chrono::steady_clock::now();
        size_t nl;
        while ((nl = buf.find('\n')) != std::string::npos) {
          const nlohmann::json j = nlohmann::json::parse(buf.substr(0, nl));
          buf.erase(0, nl + 1);
          if (j.contains("record")) records.push_back(j.at("record").get<CaseRecord>());
          else if (j.contains("done")) {
            next = j.at("done").get<size_t>() + 1;
            progress.update(next, next < tasks.size() ? tasks[next].op->op : "");
          } else if (j.contains("fatal")) {
            fatal = j.at("fatal").get<std::string>();
          }
        }
      } else if (std::chrono::steady_clock::now() - last > o.timeout) {
        ::kill(pid, SIGKILL);
        timed_out = true;
        break;
      }
    }
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (next >= tasks.size()) break;
    // The child stopped before the end: the task it was on is the culprit.
    const Task& t = tasks[next];
    if (timed_out) {
      add_broken_task(t, "timeout", "no progress for " + std::to_string(o.timeout.count()) + " s", records);
    } else if (!fatal.empty()) {
      add_broken_task(t, "error", "the ranks broke off: " + fatal, records);
    } else if (WIFSIGNALED(status)) {
      add_broken_task(t, "error", std::string("crashed: killed by signal ") + strsignal(WTERMSIG(status)), records);
    } else {
      add_broken_task(t, "error", "crashed: the process exited with code " + std::to_string(WEXITSTATUS(status)),
                      records);
    }
    ++next;
    progress.update(next, next < tasks.size() ? tasks[next].op->op : "");
  }
  return records;
}

std::vector<CaseRecord> read_results(const std::string& dir) {
  std::vector<CaseRecord> out;
  TORCH_CHECK(fs::is_directory(dir), "opcov: --results ", dir, " is not a directory");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  TORCH_CHECK(!files.empty(), "opcov: no .json results in ", dir,
              " (run dtensor_ops_tests with DTENSOR_OPS_RESULTS_DIR=", dir, ")");
  for (const auto& f : files) {
    std::ifstream in(f);
    nlohmann::json j;
    try {
      in >> j;
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "opcov: ", f.string(), " is not valid JSON: ", e.what());
    }
    TORCH_CHECK(j.value("schema_version", 0) == 1, "opcov: ", f.string(), " has schema_version ",
                j.value("schema_version", 0), "; this opcov reads 1");
    for (const auto& r : j.at("records")) out.push_back(r.get<CaseRecord>());
  }
  return out;
}

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  TORCH_CHECK(out.good(), "opcov: cannot write ", p.string());
  out << text;
}

// CUDA devices, counted in a throwaway child: this process forks the case runners, and a
// process that touched CUDA cannot give it to its forked children.
int probe_gpu_count() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(comm::cuda_device_count(), 100));
  int st = 0;
  if (pid < 0 || ::waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 0;
  return WEXITSTATUS(st);
}

int run(int argc, char** argv) {
  Progress clock(0, false);  // measures the whole run
  const Options o = parse(argc, argv);
  TORCH_CHECK(o.device != "cuda" || probe_gpu_count() > 0,
              "opcov: --device cuda, but this machine has no CUDA device (or libtorch was built without CUDA)");
  RunInfo info;
  info.started = now_iso();
  info.world_size = o.world_size;
  info.libtorch = TORCH_VERSION;
  for (int i = 0; i < argc; ++i) info.command += (i ? " " : "") + std::string(argv[i]);
  info.source = o.results.empty() ? "every sample run by opcov"
                                  : "hand-written samples from " + o.results + ", generated ones run by opcov";
  const auto xf = testing::ExpectedFailures::load(o.expected_failures);
  const Exclusions exclusions = Exclusions::load(o.exclusions);
  if (!o.pytorch_ops.empty())  // NOTE: [PyTorch's DTensor op test beside ours]
    info.pytorch_ops = parse_pytorch_dtensor_ops(testing::read_listing(o.pytorch_ops, "PyTorch DTensor ops"), o.pytorch_ops);
  if (!o.pytorch_registered.empty()) {  // NOTE: [Overloads PyTorch's DTensor registers]
    info.pytorch_registered = parse_pytorch_registered_ops(
        testing::read_listing(o.pytorch_registered, "PyTorch registered ops"), o.pytorch_registered);
    info.registered_exceptions = Exclusions::parse(
        testing::read_listing(o.registered_exceptions, "PyTorch registered ops' exceptions"), o.registered_exceptions);
  }
  TORCH_CHECK(o.pytorch_strategies.empty() || !o.discovery.empty(),
              "opcov: --pytorch-strategies needs --discovery (PyTorch's side is compared with ours)");
  if (!o.discovery.empty()) info.discovery = load_discovery(o.discovery);  // before the long run: a bad file fails fast
  if (!o.pytorch_strategies.empty()) info.pytorch_strategies = load_pytorch_strategies(o.pytorch_strategies);
  if (!o.previous.empty()) {
    std::ifstream in(o.previous);
    TORCH_CHECK(in.good(), "opcov: cannot read --previous ", o.previous);
    nlohmann::json j;
    try {
      in >> j;
      for (const auto& op : j.at("ops")) info.previous_status[op.at("op").get<std::string>()] = op.at("status").get<std::string>();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "opcov: --previous ", o.previous, " is not a coverage.json: ", e.what());
    }
  }
  const std::vector<Task> tasks = make_tasks(o);
  std::cerr << "[opcov] " << tasks.size() << " (op, mesh) tasks, world size " << o.world_size << "\n";
  std::vector<CaseRecord> records = run_tasks(o, tasks);
  if (!o.results.empty()) {
    std::vector<CaseRecord> suite = read_results(o.results);
    for (auto& r : suite)
      if (!o.ops || std::regex_search(r.op, *o.ops)) records.push_back(std::move(r));
  }
  testing::apply_expected_failures(records, xf);
  info.duration_s = clock.seconds();
  const std::vector<OpRow> rows = classify_ops(records, exclusions);
  Summary s = summarize(records, rows);
  fs::create_directories(o.out);
  write_file(fs::path(o.out) / "coverage.json", coverage_json(info, records, rows, s).dump(1) + "\n");
  write_file(fs::path(o.out) / "summary.md", summary_markdown(info, records, rows, s));
  write_file(fs::path(o.out) / "report.html", report_html(info, records, rows, s));
  if (o.print_failures)
    for (const auto& r : records)
      if (r.status != "pass" && r.status != "skip")
        std::cout << r.op << " [" << r.variant << ", " << r.mesh << ", " << r.direction << "] " << r.status
                  << (r.failing_placements.empty() ? "" : " with " + r.failing_placements) << ": " << r.reason << "\n";
  std::cout << "[opcov] cases:";
  for (const auto& kv : s.cases_by_status) std::cout << " " << kv.first << " " << kv.second;
  std::cout << "\n[opcov] verified op names (strict): forward " << s.verified_names["1d fwd"] << " (1-D) / "
            << s.verified_names["2d fwd"] << " (2-D), backward " << s.verified_names["1d bwd"] << " / "
            << s.verified_names["2d bwd"] << "; loose (previous definitions): " << s.op_names_covered_loose
            << " names covered\n";
  std::cout << "[opcov] " << headline(s) << "\n";
  std::cout << "[opcov] " << s.op_names_covered << " of " << s.op_names << " ops covered (strict); report: "
            << fs::absolute(fs::path(o.out) / "report.html").string() << " (also coverage.json, summary.md), "
            << std::fixed << std::setprecision(1) << info.duration_s << " s\n";
  return 0;
}

}  // namespace
}  // namespace opcov
}  // namespace dtensor

int main(int argc, char** argv) {
  return dtensor::testing::main_with_harness(
      argc, argv,
      [](int& ac, char** av) {
        try {
          return dtensor::opcov::run(ac, av);
        } catch (const c10::Error& e) {
          std::cerr << e.what_without_backtrace() << "\n";
          return 2;
        }
      },
      /*fork_server=*/false);
}
