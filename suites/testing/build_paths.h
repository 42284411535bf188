// suites/testing/build_paths.h: the programs of this build the tests run, and the source files
// they read, by absolute path (NOTE: [Checkout paths in one small file] in
// converters/source_dir_internal.h: they are compiled into build_paths.cpp alone).
#pragma once

namespace dtensor {
namespace testing {
namespace build_paths {

const char* dcp_tool();                  // tools/dcp
const char* opcov();                     // tools/opcov
const char* strategy_discovery();        // tools/strategy_discovery
const char* pytorch_strategies_script(); // tools/opcov/pytorch_strategies.py
const char* dcp_interop_script();        // suites/checkpoint/dcp_interop.py
const char* dcp_interop_cache();         // the checkpoints PyTorch's side wrote, kept between runs
const char* line_info_faults();          // the test program built with line tables
const char* line_info_faults_source();   // suites/harness/line_info_faults.cpp

}  // namespace build_paths
}  // namespace testing
}  // namespace dtensor
