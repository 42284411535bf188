// harness/internal/switchable_listener.h: a gtest listener that forwards to another only while
// switched on. Under an external launcher every rank records the results and only the reporter
// (rank 0, or who reports in its place) prints them and writes the XML.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <memory>

namespace dtensor {
namespace testing {
namespace internal {

class SwitchableListener : public ::testing::TestEventListener {
 public:
  explicit SwitchableListener(::testing::TestEventListener* inner) : inner_(inner) {}
  std::atomic<bool> on{false};
#define DTENSOR_FWD(name, T) \
  void name(T x) override {  \
    if (on) inner_->name(x); \
  }
  DTENSOR_FWD(OnTestProgramStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsSetUpStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsSetUpEnd, const ::testing::UnitTest&)
  DTENSOR_FWD(OnTestSuiteStart, const ::testing::TestSuite&)
  DTENSOR_FWD(OnTestStart, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestDisabled, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestPartResult, const ::testing::TestPartResult&)
  DTENSOR_FWD(OnTestEnd, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestSuiteEnd, const ::testing::TestSuite&)
  DTENSOR_FWD(OnEnvironmentsTearDownStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsTearDownEnd, const ::testing::UnitTest&)
  DTENSOR_FWD(OnTestProgramEnd, const ::testing::UnitTest&)
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  DTENSOR_FWD(OnTestCaseStart, const ::testing::TestCase&)
  DTENSOR_FWD(OnTestCaseEnd, const ::testing::TestCase&)
#endif
#undef DTENSOR_FWD
  void OnTestIterationStart(const ::testing::UnitTest& u, int i) override {
    if (on) inner_->OnTestIterationStart(u, i);
  }
  void OnTestIterationEnd(const ::testing::UnitTest& u, int i) override {
    if (on) inner_->OnTestIterationEnd(u, i);
  }

 private:
  std::unique_ptr<::testing::TestEventListener> inner_;
};

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
