// suites/testing/rank_modes.h: one test body run both as gloo processes and as threads.
//
//   DTENSOR_RANK_FIXTURES(FooGloo, FooThreads);             // or fixtures of your own
//   DTENSOR_TEST_BOTH(FooGloo, FooThreads, Behaviour) {   // `t` is the rank's fixture
//     t.group().barrier();
//   }
#pragma once

#include "harness/multi_rank_test.h"

#include <string>

#define DTENSOR_TEST_BOTH(process_fixture, thread_fixture, name)                \
  static void process_fixture##_##name##_body(::dtensor::testing::MultiRankTest& t); \
  DTENSOR_TEST_F(process_fixture, name) { process_fixture##_##name##_body(*this); } \
  DTENSOR_TEST_F(thread_fixture, name) { process_fixture##_##name##_body(*this); }  \
  static void process_fixture##_##name##_body(::dtensor::testing::MultiRankTest& t)

// World-size requirements (NOTE: [Tests at any world size] in harness/multi_rank_test.cpp) as
// the first statement of a DTENSOR_TEST_BOTH body, whose fixture is `t` (the harness's
// DTENSOR_REQUIRE_WORLD_SIZE* read `this`): skip in every rank, with the reason, unless the
// world has the ranks the test needs.
#define DTENSOR_BOTH_REQUIRE_WORLD_SIZE(n) DTENSOR_REQUIRE_RANKS_(t.ranks(), (n), "exactly")
#define DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(n) DTENSOR_REQUIRE_RANKS_(t.ranks(), (n), "at least")
#define DTENSOR_BOTH_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(n) DTENSOR_REQUIRE_RANKS_(t.ranks(), (n), "a multiple of")

// The two plain fixtures DTENSOR_TEST_BOTH needs.
#define DTENSOR_RANK_FIXTURES(process_fixture, thread_fixture)             \
  class process_fixture : public ::dtensor::testing::MultiProcessTest {}; \
  class thread_fixture : public ::dtensor::testing::MultiThreadedTest {}
