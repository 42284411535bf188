// suites/testing/build_paths.cpp: see build_paths.h. suites/CMakeLists.txt gives this file
// (and no other) the definitions below.
#include "suites/testing/build_paths.h"

namespace dtensor {
namespace testing {
namespace build_paths {

const char* dcp_tool() { return DTENSOR_DCP_TOOL_PATH; }
const char* opcov() { return DTENSOR_OPCOV_PATH; }
const char* strategy_discovery() { return DTENSOR_STRATEGY_DISCOVERY_PATH; }
const char* pytorch_strategies_script() { return DTENSOR_PYTORCH_STRATEGIES_SCRIPT; }
const char* dcp_interop_script() { return DTENSOR_DCP_INTEROP_SCRIPT; }
const char* dcp_interop_cache() { return DTENSOR_DCP_INTEROP_CACHE; }
const char* line_info_faults() { return DTENSOR_LINE_INFO_FAULTS; }
const char* line_info_faults_source() { return DTENSOR_LINE_INFO_FAULTS_SOURCE; }

}  // namespace build_paths
}  // namespace testing
}  // namespace dtensor
