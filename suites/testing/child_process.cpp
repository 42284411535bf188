// suites/testing/child_process.cpp
#define BOOST_PROCESS_USE_STD_FS
#include "suites/testing/child_process.h"

#include <boost/process.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace bp = boost::process;
namespace fs = std::filesystem;

namespace dtensor {
namespace testing {

ChildRun run_self(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                  std::chrono::seconds limit) {
  return run_program("/proc/self/exe", args, env, limit);
}

ChildRun run_program(const std::string& exe, const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env, std::chrono::seconds limit) {
  TempDir out_dir;
  const std::string out_path = out_dir.path() + "/out.txt";
  auto e = boost::this_process::environment();
  bp::environment child_env = e;
  for (const char* name : {"DTENSOR_WORLD_SIZE", "DTENSOR_RANK_KIND"})
    if (child_env.find(name) != child_env.end()) child_env.erase(name);
  for (auto& kv : env) child_env[kv.first] = kv.second;
  const auto t0 = std::chrono::steady_clock::now();
  // Output goes to a file: a pipe over 64 KiB would block the child (DESIGN.md D3).
  bp::child c(bp::exe = exe, bp::args = args, child_env,
              (bp::std_out & bp::std_err) > out_path, bp::std_in < bp::null);
  ChildRun run;
  std::error_code ec;
  // A poll loop, not wait_for: concurrent wait_for calls from several threads miss SIGCHLD
  // (DESIGN.md D3), and callers run children from several threads.
  const auto deadline = t0 + limit;
  while (c.running(ec) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (c.running(ec)) {
    c.terminate(ec);
    run.exit_code = -9;  // killed by us
  } else {
    run.exit_code = c.exit_code();
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.output = read_file(out_path);
  return run;
}

TempDir::TempDir() {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/dtensor-test-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::vector<std::string> TempDir::entries() const {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace testing
}  // namespace dtensor
