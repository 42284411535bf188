// harness/internal/external.cpp
#include "harness/internal/external.h"

#include "dtensor/comm/object_collectives.h"
#include "dtensor/comm/rendezvous.h"
#include "harness/internal/rank_run.h"

#include <gtest/gtest.h>

namespace dtensor {
namespace testing {
namespace internal {

namespace {
std::optional<comm::RendezvousInfo> g_info;
comm::GroupPtr g_group;
bool g_checked = false;
}  // namespace

bool external_launcher_detected() {
  if (!g_checked) {
    g_checked = true;
    g_info = comm::rendezvous_from_env();
  }
  return g_info.has_value();
}

bool external_launcher_active() { return g_group != nullptr; }

void init_external_launcher() {
  if (!external_launcher_detected()) return;
  comm::InitOptions o;
  o.backend = env_or("DTENSOR_BACKEND", "gloo");
  g_group = comm::init_process_group(o);
  if (g_info->rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    delete listeners.Release(listeners.default_xml_generator());
  }
}

void run_external(const std::string& test_id, std::chrono::milliseconds timeout) {
  RankResult mine;
  {
    auto sink = std::make_shared<RankSink>();
    RankCapture capture(sink);
    mine = run_rank_body(test_id, g_group->rank(), g_group, *sink);
  }
  std::vector<RankOutcome> outcomes;
  try {
    auto all = comm::all_gather_object(*g_group, nlohmann::json(mine));
    for (size_t r = 0; r < all.size(); ++r) {
      RankOutcome o;
      o.rank = static_cast<int>(r);
      o.result = all[r].get<RankResult>();
      outcomes.push_back(std::move(o));
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "[rank " << g_group->rank() << "] could not exchange results after "
                  << test_id << ": " << e.what();
    RankOutcome o;
    o.rank = g_group->rank();
    o.result = mine;
    outcomes.push_back(std::move(o));
  }
  report_outcomes(test_id, outcomes, timeout, "");
}

void shutdown_external() {
  if (!g_group) return;
  try {
    g_group->barrier();
  } catch (...) {
  }
  comm::destroy_process_group();
  g_group.reset();
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
