// suites/testing/shared_dir.h: a directory every rank of a group sees, for checkpoint tests.
#pragma once

#include "dtensor/comm/comm.h"
#include "suites/testing/child_process.h"

#include <filesystem>
#include <memory>
#include <string>

namespace dtensor {
namespace testing {

// Rank 0's temporary directory, its path given to every rank (collective); removed when the
// test ends, after every rank is done with it (the destructor is a barrier).
class SharedDir {
 public:
  explicit SharedDir(comm::Group& g) : group_(g) {
    if (g.rank() == 0) owned_ = std::make_unique<TempDir>();
    path_ = comm::all_gather_object(g, owned_ ? owned_->path() : std::string())[0];
  }
  ~SharedDir() { group_.barrier(); }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  comm::Group& group_;
  std::unique_ptr<TempDir> owned_;
  std::string path_;
};

}  // namespace testing
}  // namespace dtensor
