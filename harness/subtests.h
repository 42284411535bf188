// harness/subtests.h
//
// run_subtests: PyTorch's DTensorTestBase.run_subtests. Runs `fn` once for every element of
// the cartesian product of named parameter lists, inside the current test (so inside one
// process-group lifetime). Each subtest's failures carry its parameters
// ("subtest: dtype=Float, reshard=true"), an exception in one subtest is reported and does not
// stop the others, and ASSERT_* in `fn` ends only that subtest. Inside a multi-rank test
// every rank must call it with the same config: after each subtest the ranks meet at a barrier
// of the rank's default group (as PyTorch's c10d.barrier()), so no rank starts subtest k+1
// while another still runs subtest k.
//
// Values may be of any type that can be printed (operator<< or a dtensor::to_string overload):
// numbers, strings, at::ScalarType, placements, vectors of those.
//
//   run_subtests({{"dtype", {at::kFloat, at::kDouble}}, {"dim", {0, 1}},
//                 {"placements", {std::vector<Placement>{Shard{0}}, std::vector<Placement>{Replicate{}}}}},
//                [&](const SubtestParams& p) {
//                  auto dim = p.get<int64_t>("dim");
//                  auto dtype = p.get<at::ScalarType>("dtype");
//                  ...
//                });
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace dtensor {
namespace testing {

namespace internal {
template <class T, class = void>
struct Streamable : std::false_type {};
template <class T>
struct Streamable<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<const T&>())>>
    : std::true_type {};

template <class T>
std::string print_value(const T& v) {
  std::ostringstream os;
  if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (Streamable<T>::value) {
    os << v;
  } else {
    using std::to_string;
    os << to_string(v);
  }
  return os.str();
}
template <class T>
std::string print_value(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + print_value(v[i]);
  return out + "]";
}
[[noreturn]] void throw_wrong_subtest_type(const std::string& value, const char* held, const char* requested);
}  // namespace internal

// One parameter value: any printable type, kept as given (int is kept as int64_t, a string
// literal as std::string); get<T>() returns it, throwing naming both types when T differs.
class SubtestValue {
 public:
  SubtestValue(int v) : SubtestValue(static_cast<int64_t>(v)) {}
  SubtestValue(const char* v) : SubtestValue(std::string(v)) {}
  template <class T, class D = std::decay_t<T>,
            class = std::enable_if_t<!std::is_same_v<D, SubtestValue> && !std::is_same_v<D, int> &&
                                     !std::is_same_v<D, const char*> && !std::is_array_v<std::remove_reference_t<T>>>>
  SubtestValue(T&& v) : repr_(internal::print_value(static_cast<const D&>(v))), v_(D(std::forward<T>(v))) {}

  template <class T>
  T get() const {
    if constexpr (std::is_same_v<T, int>) {
      return static_cast<int>(get<int64_t>());
    } else {
      const T* p = std::any_cast<T>(&v_);
      if (p == nullptr) internal::throw_wrong_subtest_type(repr_, v_.type().name(), typeid(T).name());
      return *p;
    }
  }
  const std::string& to_string() const { return repr_; }

 private:
  std::string repr_;
  std::any v_;
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
// is an error (it would silently run nothing). Collective when the calling thread has a
// default process group (a rank of a multi-rank test): a barrier follows every subtest.
int run_subtests(const SubtestConfig& config, const std::function<void(const SubtestParams&)>& fn);

}  // namespace testing
}  // namespace dtensor
