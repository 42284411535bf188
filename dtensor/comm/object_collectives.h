// dtensor/comm/object_collectives.h
//
// Collectives of C++ values (PyTorch's all_gather_object & co.). A value is anything
// nlohmann::json can convert (numbers, strings, bools, std::vector/std::map of those, and
// types with to_json/from_json); it travels as CBOR bytes in a uint8 tensor.
//
//   auto names = dtensor::comm::all_gather_object(*g, std::string("rank") + ...);  // collective
#pragma once

#include "dtensor/comm/group.h"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace dtensor {
namespace comm {
namespace detail {
// Byte-level collectives behind the templates below (all collective).
std::vector<std::string> all_gather_bytes(Group& g, const std::string& bytes);
std::string broadcast_bytes(Group& g, const std::string& bytes, int src);
std::vector<std::string> gather_bytes(Group& g, const std::string& bytes, int dst);
std::string scatter_bytes(Group& g, const std::vector<std::string>& bytes, int src);

template <class T>
std::string encode(const T& v) {
  auto b = nlohmann::json::to_cbor(nlohmann::json(v));
  return std::string(b.begin(), b.end());
}
template <class T>
T decode(const std::string& s) {
  return nlohmann::json::from_cbor(s).template get<T>();
}
}  // namespace detail

// Collective: element r is rank r's value.
template <class T>
std::vector<T> all_gather_object(Group& g, const T& value) {
  std::vector<T> out;
  for (auto& b : detail::all_gather_bytes(g, detail::encode(value))) out.push_back(detail::decode<T>(b));
  return out;
}

// Collective: every rank returns rank `src`'s value (others' `value` is ignored).
template <class T>
T broadcast_object(Group& g, const T& value, int src) {
  return detail::decode<T>(detail::broadcast_bytes(g, g.rank() == src ? detail::encode(value) : "", src));
}

// Collective: on `dst` the values of every rank, elsewhere nullopt.
template <class T>
std::optional<std::vector<T>> gather_object(Group& g, const T& value, int dst) {
  auto bytes = detail::gather_bytes(g, detail::encode(value), dst);
  if (g.rank() != dst) return std::nullopt;
  std::vector<T> out;
  for (auto& b : bytes) out.push_back(detail::decode<T>(b));
  return out;
}

// Collective: rank r returns values[r] of rank `src` (values must have size() entries there).
template <class T>
T scatter_object(Group& g, const std::vector<T>& values, int src) {
  std::vector<std::string> bytes;
  if (g.rank() == src)
    for (auto& v : values) bytes.push_back(detail::encode(v));
  return detail::decode<T>(detail::scatter_bytes(g, bytes, src));
}

}  // namespace comm
}  // namespace dtensor
