// converters/source_dir_internal.h: the source tree this library was built from, where the op
// suite and the op-coverage report find their checked-in lists by default.
#pragma once

namespace dtensor {
namespace testing {
namespace internal {

// NOTE: [Checkout paths in one small file]
// A compile definition holding a path of the checkout (the source tree, a program of the build)
// differs in every clone, and ccache misses every file compiled with it: a fresh clone in CI
// recompiled the op and checkpoint suites' largest files in each of its builds. Such paths live
// in small files of their own (this one's source_dir.cpp; suites/testing/build_paths.cpp), which
// compile in a moment when they miss.
const char* source_dir();

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
