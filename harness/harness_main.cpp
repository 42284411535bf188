// harness/harness_main.cpp: dtensor::testing::main.
#include "harness/main.h"

#include "harness/internal/external.h"
#include "harness/internal/launcher.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace dtensor {
namespace testing {

int main(int argc, char** argv) {
  // 1. A rank started by spawn: become that rank (never returns).
  if (const char* req = std::getenv("DTENSOR_RANK_REQUEST")) {
    auto request = nlohmann::json::parse(req).get<internal::RankRequest>();
    ::unsetenv("DTENSOR_RANK_REQUEST");
    internal::rank_process_main(request);
  }
  // 2. Fork the fork server while this process has one thread. Not needed to list tests or
  //    under an external launcher (there this process is a rank).
  bool list_only = false;
  for (int i = 1; i < argc; ++i) list_only = list_only || std::strcmp(argv[i], "--gtest_list_tests") == 0;
  const bool external = internal::external_launcher_detected();
  if (!list_only && !external) internal::start_fork_server();
  ::testing::InitGoogleTest(&argc, argv);
  if (external) internal::init_external_launcher();
  const int rc = RUN_ALL_TESTS();
  internal::discard_worker_pool();
  internal::stop_fork_server();
  internal::shutdown_external();
  return rc;
}

}  // namespace testing
}  // namespace dtensor
