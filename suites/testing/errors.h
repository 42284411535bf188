// suites/testing/errors.h: assertions on error messages (STYLE.md rule 7: assert the specific
// error, not just "throws").
#pragma once

#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace dtensor {
namespace testing {

// The message of the c10::Error `f` throws, without backtrace; "<no error>" if none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no error>";
}

// For EXPECT_PRED2: the failure message shows both strings.
inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace testing
}  // namespace dtensor
