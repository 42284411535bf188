// dtensor/checkpoint/dist_wrapper.h
//
// DistWrapper: object collectives over a group, or over no group at all (a single process:
// every collective becomes a local no-op), and the exception-robust steps a distributed
// checkpoint is made of (torch.distributed.checkpoint.utils._DistWrapper).
//
//   DistWrapper dist(group, /*use_dist=*/true, /*coordinator_rank=*/0);
//   // every rank plans, rank 0 merges the plans, every rank gets its part back:
//   LocalPlan mine = dist.reduce_scatter(
//       "plan",
//       [&] { return make_local_plan(); },                                   // map, every rank
//       [&](std::vector<LocalPlan> all) { return make_global_plan(all); });  // reduce, rank 0
//
// Values are anything nlohmann::json converts (see comm/object_collectives.h).
//
// NOTE: [Exception-robust steps]
// reduce_scatter, all_reduce, all_gather and broadcast take functions. An exception thrown by
// `map_fun` on any rank, or by `reduce_fun` on the coordinator (a wrong number of results
// included), does not leave the other ranks waiting: it is caught, sent along in place of the
// value through the same collectives the step makes anyway, and then EVERY rank throws one
// CheckpointException(step, {rank: error, ...}) listing every failing rank. Failures in map
// are all collected; reduce runs only when no map failed.
//
// Every method is collective when use_dist (all ranks call it, in the same order, with the
// same step); the coordinator is a rank of the group.
#pragma once

#include "dtensor/checkpoint/api.h"
#include "dtensor/comm/group.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dtensor {
namespace checkpoint {

class DistWrapper {
 public:
  // With use_dist, `group` (nullptr: the default group) carries the collectives and
  // `coordinator_rank` must be one of its ranks; without, rank 0 of a world of 1 is the
  // coordinator and `group` is not used.
  DistWrapper(comm::GroupPtr group, bool use_dist, int coordinator_rank = 0);

  int get_rank() const { return rank_; }
  int get_world_size() const;
  bool is_coordinator() const { return is_coordinator_; }
  int coordinator_rank() const { return coordinator_rank_; }
  bool use_dist() const { return use_dist_; }
  // nullptr without use_dist.
  const comm::GroupPtr& group() const { return group_; }

  // Not collective: runs `fn`, the same deterministic computation on every rank from values
  // every rank has. Its error is raised as the coordinator's failure of `step`: a
  // CheckpointException, the same on every rank.
  template <class Fn>
  auto on_every_rank(const std::string& step, Fn&& fn) const {
    try {
      return fn();
    } catch (const CheckpointException&) {
      throw;
    } catch (...) {
      throw CheckpointException(step, {{coordinator_rank_, wrap_exception(std::current_exception())}});
    }
  }

  // Collective when use_dist(): every rank of the group waits until all have called it
  // (PyTorch: _DistWrapper.barrier()). Without use_dist, nothing.
  void barrier() const;

  // ---- object collectives (c10d's *_object without distributed enabled) --------------------

  // Every rank gets the coordinator's object (the others' argument is ignored). When the
  // coordinator passes none, every rank throws.
  template <class T>
  T broadcast_object(const std::optional<T>& object) const {
    return decode<T>(broadcast_json(object ? std::optional<nlohmann::json>(*object) : std::nullopt));
  }
  // The objects of every rank on the coordinator, nullopt elsewhere.
  template <class T>
  std::optional<std::vector<T>> gather_object(const T& object) const {
    auto all = gather_json(nlohmann::json(object));
    if (!all) return std::nullopt;
    return decode_all<T>(*all);
  }
  template <class T>
  std::vector<T> all_gather_object(const T& object) const {
    return decode_all<T>(all_gather_json(nlohmann::json(object)));
  }
  // Rank r gets object_list[r] of the coordinator, which must pass get_world_size() objects
  // (others' argument is ignored); otherwise every rank throws.
  template <class T>
  T scatter_object(const std::optional<std::vector<T>>& object_list) const {
    std::optional<std::vector<nlohmann::json>> js;
    if (object_list) js = std::vector<nlohmann::json>(object_list->begin(), object_list->end());
    return decode<T>(scatter_json(js));
  }

  // ---- exception-robust steps (NOTE: [Exception-robust steps]) -----------------------------

  // map_fun on every rank; the coordinator gathers the values and calls
  // reduce_fun(std::vector<T>) -> std::vector<R> with one result per rank; rank r returns
  // result r.
  template <class MapFn, class ReduceFn>
  auto reduce_scatter(const std::string& step, MapFn&& map_fun, ReduceFn&& reduce_fun) const {
    using T = std::decay_t<std::invoke_result_t<MapFn&>>;
    using Rs = std::decay_t<std::invoke_result_t<ReduceFn&, std::vector<T>>>;
    using R = typename Rs::value_type;
    nlohmann::json result = reduce_scatter_json(step, json_map(map_fun), [&](std::vector<nlohmann::json> all) {
      Rs rs = reduce_fun(decode_all<T>(all));
      return std::vector<nlohmann::json>(rs.begin(), rs.end());
    });
    return decode<R>(result);
  }

  // map_fun on every rank; the coordinator gathers the values and calls
  // reduce_fun(std::vector<T>) -> R; every rank returns R.
  template <class MapFn, class ReduceFn>
  auto all_reduce(const std::string& step, MapFn&& map_fun, ReduceFn&& reduce_fun) const {
    using T = std::decay_t<std::invoke_result_t<MapFn&>>;
    using R = std::decay_t<std::invoke_result_t<ReduceFn&, std::vector<T>>>;
    nlohmann::json result = all_reduce_json(step, json_map(map_fun), [&](std::vector<nlohmann::json> all) {
      return nlohmann::json(reduce_fun(decode_all<T>(all)));
    });
    return decode<R>(result);
  }

  // map_fun on every rank; every rank returns all values, element r being rank r's.
  template <class MapFn>
  auto all_gather(const std::string& step, MapFn&& map_fun) const {
    using T = std::decay_t<std::invoke_result_t<MapFn&>>;
    return decode_all<T>(all_gather_step_json(step, json_map(map_fun)));
  }

  // all_gather for a step whose values are usually all `quiet` (quiet(value) is true, e.g. a
  // result with nothing to report): when every rank's value is quiet and no rank failed, the
  // step is one all_reduce of a flag (one small collective, where an object all_gather takes
  // two of a few milliseconds each on a loaded host) and every rank returns nullopt. Otherwise
  // it goes on as all_gather: every rank gets all values, or every rank throws the
  // CheckpointException naming the failed ranks. An exception from `quiet` is its rank's
  // failure.
  template <class MapFn, class QuietFn>
  auto all_gather_unless_quiet(const std::string& step, MapFn&& map_fun, QuietFn&& quiet) const
      -> std::optional<std::vector<std::decay_t<std::invoke_result_t<MapFn&>>>> {
    using T = std::decay_t<std::invoke_result_t<MapFn&>>;
    auto all = all_gather_unless_quiet_json(step, json_map(map_fun),
                                            [&](const nlohmann::json& j) { return bool(quiet(j.get<T>())); });
    if (!all) return std::nullopt;
    return decode_all<T>(*all);
  }
  // map_fun on the coordinator only; every rank returns its value.
  template <class MapFn>
  auto broadcast(const std::string& step, MapFn&& map_fun) const {
    using T = std::decay_t<std::invoke_result_t<MapFn&>>;
    return decode<T>(broadcast_step_json(step, json_map(map_fun)));
  }

 private:
  using JsonMap = std::function<nlohmann::json()>;
  using JsonReduce = std::function<nlohmann::json(std::vector<nlohmann::json>)>;
  using JsonReduceScatter = std::function<std::vector<nlohmann::json>(std::vector<nlohmann::json>)>;

  template <class MapFn>
  static JsonMap json_map(MapFn& map_fun) {
    // The conversion to json runs inside the step's try: a value that cannot be encoded is
    // that rank's failure.
    return [&map_fun]() { return nlohmann::json(map_fun()); };
  }
  template <class T>
  static T decode(const nlohmann::json& j) {
    return j.get<T>();
  }
  template <class T>
  static std::vector<T> decode_all(const std::vector<nlohmann::json>& js) {
    std::vector<T> out;
    out.reserve(js.size());
    for (const auto& j : js) out.push_back(j.get<T>());
    return out;
  }

  nlohmann::json broadcast_json(const std::optional<nlohmann::json>& object) const;
  std::optional<std::vector<nlohmann::json>> gather_json(const nlohmann::json& object) const;
  std::vector<nlohmann::json> all_gather_json(const nlohmann::json& object) const;
  nlohmann::json scatter_json(const std::optional<std::vector<nlohmann::json>>& objects) const;

  nlohmann::json reduce_scatter_json(const std::string& step, const JsonMap& map_fun,
                                     const JsonReduceScatter& reduce_fun) const;
  nlohmann::json all_reduce_json(const std::string& step, const JsonMap& map_fun, const JsonReduce& reduce_fun) const;
  std::vector<nlohmann::json> all_gather_step_json(const std::string& step, const JsonMap& map_fun) const;
  std::optional<std::vector<nlohmann::json>> all_gather_unless_quiet_json(
      const std::string& step, const JsonMap& map_fun, const std::function<bool(const nlohmann::json&)>& quiet) const;
  nlohmann::json broadcast_step_json(const std::string& step, const JsonMap& map_fun) const;

  comm::GroupPtr group_;
  bool use_dist_;
  int coordinator_rank_;
  int rank_ = 0;
  bool is_coordinator_ = true;
};

// Collective over `group`: the keys of every rank's `local_dict`, sorted, each once.
// (PyTorch: _all_gather_keys.)
template <class Map>
std::vector<typename Map::key_type> all_gather_keys(const Map& local_dict, const comm::GroupPtr& group = nullptr) {
  using K = typename Map::key_type;
  std::vector<K> keys;
  for (const auto& kv : local_dict) keys.push_back(kv.first);
  DistWrapper dist(group, /*use_dist=*/true);
  std::set<K> all;
  for (const auto& rank_keys : dist.all_gather_object(keys)) all.insert(rank_keys.begin(), rank_keys.end());
  return std::vector<K>(all.begin(), all.end());
}

}  // namespace checkpoint
}  // namespace dtensor
