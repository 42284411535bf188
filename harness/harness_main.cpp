// harness/harness_main.cpp: dtensor::testing::main and main_with_harness.
#include "harness/main.h"

#include "dtensor/comm/c10d_guard.h"

#include "harness/internal/external.h"
#include "harness/internal/launcher.h"

#include <c10/util/Logging.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>

namespace dtensor {
namespace testing {

// NOTE: [C++ stack traces in test programs]
// Every c10::Error records a symbolised backtrace of where it was thrown, which costs about a
// millisecond here (dladdr over libtorch's ~285 shared libraries). Test programs throw and
// catch many errors on purpose (every expected-error test, every op sample a sharding rule
// rejects), so the harness records no backtrace unless DTENSOR_CPP_STACKTRACES=1. Crashes
// and hangs are unaffected: their stacks come from the harness's own signal handlers.
void install_stack_trace_policy() {
  const char* v = std::getenv("DTENSOR_CPP_STACKTRACES");
  if (v && std::string(v) == "1") return;
  c10::SetStackTraceFetcher([] { return std::string("(C++ stack trace not recorded; set DTENSOR_CPP_STACKTRACES=1)"); });
}

int main_with_harness(int argc, char** argv, const std::function<int(int&, char**)>& body, bool fork_server) {
  install_stack_trace_policy();
  // NOTE: [No SIGPIPE from a peer that is gone] (internal/launch_io.cpp).
  std::signal(SIGPIPE, SIG_IGN);
  // NOTE: [Call check] (dtensor/comm/c10d_guard.cpp): on in test programs.
  comm::set_check_collectives_default(true);
  // 1. A rank started by spawn: become that rank (never returns).
  if (const char* req = std::getenv("DTENSOR_RANK_REQUEST")) {
    auto request = nlohmann::json::parse(req).get<internal::RankRequest>();
    ::unsetenv("DTENSOR_RANK_REQUEST");
    internal::rank_process_main(request);
  }
  // 2. Fork the fork server while this process has one thread.
  if (fork_server) internal::start_fork_server();
  const int rc = body(argc, argv);
  internal::discard_worker_pool();
  internal::stop_fork_server();
  return rc;
}

int main(int argc, char** argv) {
  // Not needed to list tests, nor under an external launcher (there this process is a rank).
  bool list_only = false;
  for (int i = 1; i < argc; ++i) list_only = list_only || std::strcmp(argv[i], "--gtest_list_tests") == 0;
  const bool external = !std::getenv("DTENSOR_RANK_REQUEST") && internal::external_launcher_detected();
  return main_with_harness(
      argc, argv,
      [external](int& ac, char** av) {
        ::testing::InitGoogleTest(&ac, av);
        if (external) internal::init_external_launcher();
        const int rc = RUN_ALL_TESTS();
        internal::shutdown_external();
        return rc;
      },
      /*fork_server=*/!list_only && !external);
}

}  // namespace testing
}  // namespace dtensor
