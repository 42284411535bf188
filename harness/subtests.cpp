// harness/subtests.cpp
#include "harness/subtests.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <sstream>

namespace dtensor {
namespace testing {

template <class T>
T SubtestValue::get() const {
  if constexpr (std::is_same_v<T, int>) {
    return static_cast<int>(get<int64_t>());
  } else {
    const T* p = std::get_if<T>(&v_);
    TORCH_CHECK(p != nullptr, "subtest value ", to_string(), " is not of the requested type");
    return *p;
  }
}
template bool SubtestValue::get<bool>() const;
template int SubtestValue::get<int>() const;
template int64_t SubtestValue::get<int64_t>() const;
template double SubtestValue::get<double>() const;
template std::string SubtestValue::get<std::string>() const;

std::string SubtestValue::to_string() const {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        if constexpr (std::is_same_v<std::decay_t<decltype(x)>, bool>) os << (x ? "true" : "false");
        else os << x;
      },
      v_);
  return os.str();
}

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
