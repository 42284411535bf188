// converters/source_dir.cpp: NOTE: [Checkout paths in one small file].
#include "converters/source_dir_internal.h"

#ifndef DTENSOR_SOURCE_DIR
#define DTENSOR_SOURCE_DIR "."
#endif

namespace dtensor {
namespace testing {
namespace internal {

const char* source_dir() { return DTENSOR_SOURCE_DIR; }

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
