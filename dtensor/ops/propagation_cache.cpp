// dtensor/ops/propagation_cache.cpp
//
// NOTE: [Propagation cache keys are exact]
// The cache maps an exact description of the call (CacheKey: op name, every input's spec,
// every non-DTensor argument) to its strategy. It used to map a 64-bit combination of
// c10::hash_combine'd hashes; that combination collides for calls that differ in several
// places (a causal attention call with inputs (Shard(2), Shard(0), Shard(3)) took the strategy
// of a non-causal one with (Shard(2), Replicate, Shard(2))), and a collision silently gave the
// wrong sharding. Equal keys now mean equal calls. The cache is bounded (least recently used
// first out, kPropagationCacheCapacity in registry.h): keys hold shapes, so a job whose shapes
// keep changing would otherwise grow it without end.
#include "dtensor/ops/propagation_cache_internal.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <sstream>

namespace dtensor {
namespace ops {

PropagationCache& PropagationCache::instance() {
  static PropagationCache cache;
  return cache;
}

std::optional<OutputSharding> PropagationCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return std::nullopt;
  }
  ++stats_.hits;
  order_.splice(order_.begin(), order_, it->second);
  return it->second->second;
}

void PropagationCache::insert(std::string key, OutputSharding value) {
  std::lock_guard<std::mutex> lk(mu_);
  if (index_.count(key)) return;  // two threads missed the same key
  order_.emplace_front(std::move(key), std::move(value));
  index_.emplace(order_.front().first, order_.begin());
  evict_beyond(stats_.capacity);
}

size_t PropagationCache::set_capacity(size_t capacity) {
  TORCH_CHECK(capacity >= 1, "set_propagation_cache_capacity: the capacity must be at least 1, got ", capacity);
  std::lock_guard<std::mutex> lk(mu_);
  const size_t previous = stats_.capacity;
  stats_.capacity = capacity;
  evict_beyond(capacity);
  return previous;
}

void PropagationCache::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  index_.clear();
  order_.clear();
  const size_t capacity = stats_.capacity;
  stats_ = {};
  stats_.capacity = capacity;
}

CacheStats PropagationCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  CacheStats s = stats_;
  s.size = order_.size();
  return s;
}

void PropagationCache::evict_beyond(size_t capacity) {
  while (order_.size() > capacity) {
    index_.erase(order_.back().first);
    order_.pop_back();
    ++stats_.evictions;
  }
}

void CacheKey::put_spec(const DTensorSpec& spec) {
  put(static_cast<int64_t>(spec.mesh.hash()));
  put(spec.mesh.ndim());
  for (int64_t d = 0; d < spec.mesh.ndim(); ++d) put(spec.mesh.size(d));
  put(static_cast<int64_t>(spec.placements.size()));
  for (const Placement& p : spec.placements) {
    put(static_cast<int64_t>(p.index()));
    if (const Shard* sh = std::get_if<Shard>(&p)) {
      put(sh->dim);
      put(sh->split_factor);
    }
    if (const Partial* pa = std::get_if<Partial>(&p)) put(static_cast<int64_t>(pa->reduce_op));
  }
  put_ints(spec.tensor_meta.shape);
  put_ints(spec.tensor_meta.stride);
  put(spec.tensor_meta.storage_offset);
  put(static_cast<int64_t>(spec.tensor_meta.dtype));
}

void CacheKey::put_value(const c10::IValue& v) {
  if (v.isNone()) return put(int64_t{0});
  if (v.isInt()) {
    put(int64_t{1});
    return put(v.toInt());
  }
  if (v.isBool()) {
    put(int64_t{2});
    return put(int64_t{v.toBool()});
  }
  if (v.isDouble()) {
    put(int64_t{3});
    const double d = v.toDouble();
    int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    return put(bits);
  }
  // Which generator an op draws from does not change its sharding (and printing one would
  // make every generator object a new cache entry).
  if (v.isGenerator()) return put(int64_t{4});
  if (v.isIntList()) {
    put(int64_t{5});
    return put_ints(v.toIntVector());
  }
  if (v.isTensor()) {  // plain tensor argument (0-dim): its shape and dtype matter, not values
    const auto& t = v.toTensor();
    put(int64_t{6});
    put(int64_t{t.defined()});
    if (!t.defined()) return;
    put(static_cast<int64_t>(t.scalar_type()));
    return put_ints(t.sizes());
  }
  std::ostringstream os;
  os << v;
  put(int64_t{7});
  put_str(v.tagKind());
  put_str(os.str());
}

CacheStats propagation_cache_stats() { return PropagationCache::instance().stats(); }
void clear_propagation_cache() { PropagationCache::instance().clear(); }
size_t set_propagation_cache_capacity(size_t capacity) { return PropagationCache::instance().set_capacity(capacity); }

}  // namespace ops
}  // namespace dtensor
