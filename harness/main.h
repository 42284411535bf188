// harness/main.h: the harness's main, for programs that write their own main():
//
//   int main(int argc, char** argv) { return dtensor::testing::main(argc, argv); }
//
// It must run first thing in main (before any thread exists): a rank process started by the
// harness becomes that rank here, and otherwise the fork server is forked here.
#pragma once

#include <functional>

namespace dtensor {
namespace testing {

// GoogleTest's main with the harness around it.
int main(int argc, char** argv);

// Any program that starts ranks through the harness (benchmarks, tools): handles a spawned
// rank, starts the fork server (unless `fork_server` is false), runs `body`, then stops the
// worker pool and the fork server.
int main_with_harness(int argc, char** argv, const std::function<int(int&, char**)>& body,
                      bool fork_server = true);

}  // namespace testing
}  // namespace dtensor
