// dtensor/checkpoint/json_internal.h: integers read from JSON files (`.metadata`, safetensors
// headers) without undefined behaviour. Internal: not part of the API.
//
// nlohmann::json's get<int64_t>() / get<uint32_t>() convert with static_cast: a number out of
// the type's range (1e300, 2^64 - 1 into an int64_t, -1 into a uint32_t) is undefined behaviour
// or wraps. These accept whole numbers in range only (a float with an integral value too, as
// get<> did: "12.0") and otherwise throw a c10::Error naming the field.
#pragma once

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace dtensor {
namespace checkpoint {
namespace detail {

template <class T>
T json_integer(const nlohmann::json& j, const char* field) {
  static_assert(std::is_integral<T>::value && sizeof(T) <= 8, "json_integer reads integers of up to 64 bits");
  constexpr T lo = std::numeric_limits<T>::min();
  constexpr T hi = std::numeric_limits<T>::max();
  bool ok = false;
  T v = 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    ok = u <= uint64_t(hi);
    v = T(u);
  } else if (j.is_number_integer()) {
    const int64_t i = j.get<int64_t>();
    ok = (lo == 0 ? i >= 0 : i >= int64_t(lo)) && (hi >= T(std::numeric_limits<int64_t>::max()) || i <= int64_t(hi));
    v = T(i);
  } else if (j.is_number_float()) {
    // 2^63 and 2^64 are exact doubles; every whole double below them converts.
    const double d = j.get<double>();
    const double top = std::is_signed<T>::value ? std::ldexp(1.0, 8 * int(sizeof(T)) - 1) : std::ldexp(1.0, 8 * int(sizeof(T)));
    ok = std::isfinite(d) && d == std::trunc(d) && d >= double(lo) && d < top;
    if (ok) v = T(d);
  }
  TORCH_CHECK(ok, field, " must be an integer in [", +lo, ", ", +hi, "], got ", j.dump());
  return v;
}

template <class T>
std::vector<T> json_integers(const nlohmann::json& j, const char* field) {
  TORCH_CHECK(j.is_array(), field, " must be an array of integers, got a ", j.type_name());
  std::vector<T> out;
  out.reserve(j.size());
  for (const auto& x : j) out.push_back(json_integer<T>(x, field));
  return out;
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
