// harness/internal/symbolise.h: a crashed or stuck rank's stack, symbolised (NOTE: [Symbolised
// user frames] in symbolise.cpp), and the user's frames in it.
#pragma once

#include <string>
#include <vector>

namespace dtensor {
namespace testing {
namespace internal {

struct Frame {
  std::string module, function, file;
  int line = -1;
  long offset = -1;  // of the return address in the function, when it has no line
};

// The frames of the last "[dtensor] frames:" line of a rank's output.
std::vector<Frame> symbolise_stack(const std::string& output);
// Whether `file` is one of the harness's own sources.
bool in_harness_source(const std::string& file);
// A frame of the harness, gtest, the standard library or a system library.
bool harness_or_library(const Frame& f);
// The user's frame: the first one with a function that is not the harness's, gtest's, or in
// a system library or libtorch (those were not symbolised); nullptr when none.
const Frame* user_frame(const std::vector<Frame>& frames);
// "function (file:line)", or "function+0x<offset>" without a line table.
std::string frame_str(const Frame& f);

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
