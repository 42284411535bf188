// dtensor/checkpoint/dist_wrapper.cpp: the collectives of DistWrapper, in json.
//
// Every value a step moves is wrapped in a small json object, so that a failure can take its
// place in the same collective (NOTE: [Exception-robust steps]):
//   {"v": value}                              a value
//   {"f": WrappedException}                   a rank's failure in map_fun (gathered values)
//   {"x": {"step": s, "failures": {...}}}     a CheckpointException for every rank (results)
//   {"e": message}                            a caller error found on the coordinator
#include "dtensor/checkpoint/dist_wrapper.h"

#include "dtensor/comm/object_collectives.h"

#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

namespace dtensor {
namespace checkpoint {

namespace {

using json = nlohmann::json;

json ok(json v) { return json{{"v", std::move(v)}}; }
json failure(const std::exception_ptr& e) { return json{{"f", wrap_exception(e)}}; }
json checkpoint_exception(const std::string& step, const std::map<int, WrappedException>& failures) {
  return json{{"x", {{"step", step}, {"failures", failures}}}};
}
json caller_error(const std::string& message) { return json{{"e", message}}; }

// Python: _get_failure_dict.
std::map<int, WrappedException> failure_dict(const std::vector<json>& all) {
  std::map<int, WrappedException> failures;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].contains("f")) failures[static_cast<int>(r)] = all[r]["f"].get<WrappedException>();
  return failures;
}

std::vector<json> values_of(const std::vector<json>& all) {
  std::vector<json> values;
  values.reserve(all.size());
  for (const auto& a : all) values.push_back(a.at("v"));
  return values;
}

// The value of a result payload, or the error it carries, thrown.
json unwrap(const json& payload) {
  if (payload.contains("x")) {
    const json& x = payload["x"];
    throw CheckpointException(x.at("step").get<std::string>(), x.at("failures").get<std::map<int, WrappedException>>());
  }
  if (payload.contains("e")) TORCH_CHECK(false, payload["e"].get<std::string>());
  return payload.at("v");
}

template <class Fn>
json run_map(const Fn& map_fun) {
  try {
    return ok(map_fun());
  } catch (...) {
    return failure(std::current_exception());
  }
}

}  // namespace

DistWrapper::DistWrapper(comm::GroupPtr group, bool use_dist, int coordinator_rank)
    : group_(use_dist ? std::move(group) : nullptr), use_dist_(use_dist), coordinator_rank_(coordinator_rank) {
  if (!use_dist_) return;  // a world of one: rank 0, the coordinator
  if (!group_) group_ = comm::default_group();
  comm::detail::check_rank_arg(*group_, "DistWrapper", "coordinator_rank", coordinator_rank);
  rank_ = group_->rank();
  is_coordinator_ = rank_ == coordinator_rank;
}

void DistWrapper::barrier() const {
  if (use_dist_) group_->barrier();
}

int DistWrapper::get_world_size() const { return use_dist_ ? group_->size() : 1; }

// ---- object collectives --------------------------------------------------------------------

json DistWrapper::broadcast_json(const std::optional<json>& object) const {
  json payload;
  if (is_coordinator_)
    payload = object ? ok(*object)
                     : caller_error("DistWrapper.broadcast_object: the coordinator (rank " +
                                    std::to_string(coordinator_rank_) + ") passed no object");
  if (use_dist_) payload = comm::broadcast_object(*group_, payload, coordinator_rank_);
  return unwrap(payload);
}

std::optional<std::vector<json>> DistWrapper::gather_json(const json& object) const {
  if (!use_dist_) return std::vector<json>{object};
  return comm::gather_object(*group_, object, coordinator_rank_);
}

std::vector<json> DistWrapper::all_gather_json(const json& object) const {
  if (!use_dist_) return {object};
  return comm::all_gather_object(*group_, object);
}

json DistWrapper::scatter_json(const std::optional<std::vector<json>>& objects) const {
  std::vector<json> payloads;
  if (is_coordinator_) {
    const int world = get_world_size();
    const std::string who =
        "DistWrapper.scatter_object: the coordinator (rank " + std::to_string(coordinator_rank_) + ")";
    if (!objects) {
      payloads.assign(world, caller_error(who + " passed no object list"));
    } else if (static_cast<int>(objects->size()) != world) {
      payloads.assign(world, caller_error(who + " passed " + std::to_string(objects->size()) + " objects for " +
                                          std::to_string(world) + " ranks"));
    } else {
      for (const auto& o : *objects) payloads.push_back(ok(o));
    }
  }
  if (!use_dist_) return unwrap(payloads[0]);
  return unwrap(comm::scatter_object(*group_, payloads, coordinator_rank_));
}

// ---- exception-robust steps ------------------------------------------------------------------

json DistWrapper::reduce_scatter_json(const std::string& step, const JsonMap& map_fun,
                                      const JsonReduceScatter& reduce_fun) const {
  // 1. map on every rank; 2. gather on the coordinator; 3. reduce there unless a map failed;
  // 4. scatter the results, or the CheckpointException to every rank.
  std::optional<std::vector<json>> all = gather_json(run_map(map_fun));
  std::vector<json> results;
  if (is_coordinator_) {
    std::map<int, WrappedException> failures = failure_dict(*all);
    const int world = get_world_size();
    if (failures.empty()) {
      try {
        for (json& r : reduce_fun(values_of(*all))) results.push_back(ok(std::move(r)));
        TORCH_CHECK(static_cast<int>(results.size()) == world, "reduce_fun of step '", step, "' returned ",
                    results.size(), " results for ", world, " ranks (reduce_scatter needs one per rank)");
      } catch (...) {
        failures[rank_] = wrap_exception(std::current_exception());
      }
    }
    if (!failures.empty()) results.assign(world, checkpoint_exception(step, failures));
  }
  if (!use_dist_) return unwrap(results[0]);
  return unwrap(comm::scatter_object(*group_, results, coordinator_rank_));
}

json DistWrapper::all_reduce_json(const std::string& step, const JsonMap& map_fun, const JsonReduce& reduce_fun) const {
  // 1. map on every rank; 2. gather on the coordinator; 3. reduce there unless a map failed;
  // 4. broadcast the result, or the CheckpointException.
  std::optional<std::vector<json>> all = gather_json(run_map(map_fun));
  json result;
  if (is_coordinator_) {
    std::map<int, WrappedException> failures = failure_dict(*all);
    if (failures.empty()) {
      try {
        result = ok(reduce_fun(values_of(*all)));
      } catch (...) {
        failures[rank_] = wrap_exception(std::current_exception());
      }
    }
    if (!failures.empty()) result = checkpoint_exception(step, failures);
  }
  if (use_dist_) result = comm::broadcast_object(*group_, result, coordinator_rank_);
  return unwrap(result);
}

std::vector<json> DistWrapper::all_gather_step_json(const std::string& step, const JsonMap& map_fun) const {
  std::vector<json> all = all_gather_json(run_map(map_fun));
  std::map<int, WrappedException> failures = failure_dict(all);
  if (!failures.empty()) throw CheckpointException(step, failures);
  return values_of(all);
}

std::optional<std::vector<json>> DistWrapper::all_gather_unless_quiet_json(
    const std::string& step, const JsonMap& map_fun, const std::function<bool(const json&)>& quiet) const {
  json mine = run_map(map_fun);
  bool loud = true;
  if (!mine.contains("f")) {
    try {
      loud = !quiet(mine["v"]);
    } catch (...) {
      mine = failure(std::current_exception());
    }
  }
  if (use_dist_) {
    // Whether any rank has something to say (a value that is not quiet, or a failure).
    at::Tensor flag = at::full({1}, loud ? 1 : 0, at::kLong);
    group_->all_reduce(flag, comm::ReduceOp::MAX);
    loud = flag.item<int64_t>() != 0;
  }
  if (!loud) return std::nullopt;
  std::vector<json> all = all_gather_json(mine);
  std::map<int, WrappedException> failures = failure_dict(all);
  if (!failures.empty()) throw CheckpointException(step, failures);
  return values_of(all);
}

json DistWrapper::broadcast_step_json(const std::string& step, const JsonMap& map_fun) const {
  json result;
  if (is_coordinator_) {
    result = run_map(map_fun);
    if (result.contains("f")) result = checkpoint_exception(step, {{rank_, result["f"].get<WrappedException>()}});
  }
  if (use_dist_) result = comm::broadcast_object(*group_, result, coordinator_rank_);
  return unwrap(result);
}

}  // namespace checkpoint
}  // namespace dtensor
