// harness/subtests.cpp
#include "harness/subtests.h"

#include "dtensor/comm/group.h"

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <gtest/gtest.h>

#include <sstream>

namespace dtensor {
namespace testing {

namespace internal {
void throw_wrong_subtest_type(const std::string& value, const char* held, const char* requested) {
  TORCH_CHECK(false, "subtest value ", value, " is a ", c10::demangle(held), ", not the requested ",
              c10::demangle(requested));
}
}  // namespace internal

namespace {
// The group subtests synchronise on: the calling rank's default group, if any.
comm::GroupPtr barrier_group() {
  try {
    return comm::default_group();
  } catch (const c10::Error&) {
    return nullptr;
  }
}
}  // namespace

const SubtestValue& SubtestParams::at(const std::string& name) const {
  for (auto& kv : values_)
    if (kv.first == name) return kv.second;
  std::ostringstream names;
  for (auto& kv : values_) names << " " << kv.first;
  TORCH_CHECK(false, "subtest has no parameter '", name, "'; it has:", names.str());
}

std::string SubtestParams::to_string() const {
  std::ostringstream os;
  for (size_t i = 0; i < values_.size(); ++i)
    os << (i ? ", " : "") << values_[i].first << "=" << values_[i].second.to_string();
  return os.str();
}

int run_subtests(const SubtestConfig& config, const std::function<void(const SubtestParams&)>& fn) {
  for (auto& kv : config)
    TORCH_CHECK(!kv.second.empty(), "run_subtests: parameter '", kv.first,
                "' has no values, so no subtest would run");
  std::vector<size_t> idx(config.size(), 0);
  int count = 0;
  for (;;) {
    SubtestParams p;
    for (size_t i = 0; i < config.size(); ++i) p.add(config[i].first, config[i].second[idx[i]]);
    {
      SCOPED_TRACE("subtest: " + p.to_string());
      try {
        fn(p);
      } catch (const c10::Error& e) {
        ADD_FAILURE() << "subtest (" << p.to_string() << ") threw: " << e.what_without_backtrace();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "subtest (" << p.to_string() << ") threw: " << e.what();
      }
    }
    ++count;
    // PyTorch's run_subtests ends each subtest with c10d.barrier().
    if (auto g = barrier_group()) g->barrier();
    size_t k = config.size();
    while (k > 0) {
      --k;
      if (++idx[k] < config[k].second.size()) break;
      idx[k] = 0;
      if (k == 0) return count;
    }
    if (config.empty()) return count;
  }
}

}  // namespace testing
}  // namespace dtensor
