// harness/subtests.h
//
// run_subtests: PyTorch's DTensorTestBase.run_subtests. Runs `fn` once for every element of
// the cartesian product of named parameter lists, inside the current test (so inside one
// process-group lifetime). Each subtest's failures carry its parameters
// ("subtest: dtype=float, reshard=true"), an exception in one subtest is reported and does not
// stop the others, and ASSERT_* in `fn` ends only that subtest.
//
//   run_subtests({{"dtype", {"float", "double"}}, {"dim", {0, 1}}},
//                [&](const SubtestParams& p) {
//                  auto dim = p.get<int64_t>("dim");
//                  ...
//                });
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dtensor {
namespace testing {

class SubtestValue {
 public:
  SubtestValue(bool v) : v_(v) {}
  SubtestValue(int v) : v_(static_cast<int64_t>(v)) {}
  SubtestValue(int64_t v) : v_(v) {}
  SubtestValue(double v) : v_(v) {}
  SubtestValue(const char* v) : v_(std::string(v)) {}
  SubtestValue(std::string v) : v_(std::move(v)) {}
  template <class T>
  T get() const;  // bool, int, int64_t, double, std::string; wrong type throws naming both
  std::string to_string() const;

 private:
  std::variant<bool, int64_t, double, std::string> v_;
};

class SubtestParams {
 public:
  void add(std::string name, SubtestValue value) { values_.emplace_back(std::move(name), std::move(value)); }
  const SubtestValue& at(const std::string& name) const;  // unknown name throws listing the names
  template <class T>
  T get(const std::string& name) const {
    return at(name).get<T>();
  }
  std::string to_string() const;  // "dtype=float, dim=0"

 private:
  std::vector<std::pair<std::string, SubtestValue>> values_;
};

using SubtestConfig = std::vector<std::pair<std::string, std::vector<SubtestValue>>>;

// Runs fn over the product of `config`; returns how many subtests ran. An empty value list
// is an error (it would silently run nothing).
int run_subtests(const SubtestConfig& config, const std::function<void(const SubtestParams&)>& fn);

}  // namespace testing
}  // namespace dtensor
