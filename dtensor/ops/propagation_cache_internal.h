// dtensor/ops/propagation_cache_internal.h: the propagation cache (NOTE: [Propagation cache keys
// are exact] in propagation_cache.cpp) and the bytes of its keys.
#pragma once

#include "dtensor/ops/registry.h"

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

namespace dtensor {
namespace ops {

// The process's cache of chosen strategies, least recently used first out.
class PropagationCache {
 public:
  static PropagationCache& instance();
  // The cached strategy for `key` (now the most recently used), or nullopt.
  std::optional<OutputSharding> find(const std::string& key);
  void insert(std::string key, OutputSharding value);
  size_t set_capacity(size_t capacity);
  void clear();
  CacheStats stats() const;

 private:
  PropagationCache() = default;
  void evict_beyond(size_t capacity);  // mu_ held

  mutable std::mutex mu_;
  // Most recently used first; the index points into it (list iterators stay valid).
  std::list<std::pair<std::string, OutputSharding>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, OutputSharding>>::iterator> index_;
  CacheStats stats_;
};

// The bytes of a propagation cache key.
struct CacheKey {
  std::string bytes;
  void put(int64_t v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void put_str(const std::string& s) {
    put(static_cast<int64_t>(s.size()));
    bytes += s;
  }
  void put_ints(c10::IntArrayRef vs) {
    put(static_cast<int64_t>(vs.size()));
    for (int64_t v : vs) put(v);
  }
  void put_spec(const DTensorSpec& spec);
  // A non-DTensor argument: its type, then its value.
  void put_value(const c10::IValue& v);
};

}  // namespace ops
}  // namespace dtensor
