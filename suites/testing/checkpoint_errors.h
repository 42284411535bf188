// suites/testing/checkpoint_errors.h: test helpers for CheckpointException (the checkpoint suites).
#pragma once

#include "dtensor/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <optional>
#include <vector>

namespace dtensor {
namespace testing {

// The CheckpointException `f` throws; fails the test when it throws nothing or something else.
inline std::optional<checkpoint::CheckpointException> checkpoint_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const checkpoint::CheckpointException& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a CheckpointException, got: " << e.what();
    return std::nullopt;
  }
  ADD_FAILURE() << "expected a CheckpointException, nothing was thrown";
  return std::nullopt;
}

// The ranks an exception names as failing, in order.
inline std::vector<int> failing_ranks(const checkpoint::CheckpointException& e) {
  std::vector<int> ranks;
  for (const auto& kv : e.failures()) ranks.push_back(kv.first);
  return ranks;
}

}  // namespace testing
}  // namespace dtensor
