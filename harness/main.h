// harness/main.h: the harness's main, for programs that write their own main():
//
//   int main(int argc, char** argv) { return dtensor::testing::main(argc, argv); }
//
// It must run first thing in main (before any thread exists): a rank process started by the
// harness becomes that rank here, and otherwise the fork server is forked here.
#pragma once

namespace dtensor {
namespace testing {
int main(int argc, char** argv);
}
}  // namespace dtensor
