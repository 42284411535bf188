// suites/testing/child_process.h: runs this test program again as a child (to test what the
// harness reports for a fault case, as a user would see it).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {

struct ChildRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  double seconds = 0;
};

// Runs `exe` with `args` and extra `env`, killing it after `limit`. The child runs with its
// fixtures' own rank count and rank kinds: DTENSOR_WORLD_SIZE and DTENSOR_RANK_KIND of this
// process (a CI pass at world size 2 or 8) are not passed on, unless `env` sets them; the
// fault programs it runs are written for their fixtures' ranks (a hang in rank 2, ...).
ChildRun run_program(const std::string& exe, const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env = {},
                     std::chrono::seconds limit = std::chrono::seconds(120));
// The same for this test program (/proc/self/exe).
ChildRun run_self(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
                  std::chrono::seconds limit = std::chrono::seconds(120));

// A fresh empty directory under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::vector<std::string> entries() const;  // names inside, sorted
 private:
  std::string path_;
};

std::string read_file(const std::string& path);

}  // namespace testing
}  // namespace dtensor
