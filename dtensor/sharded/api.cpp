// dtensor/sharded/api.cpp: shard_tensor and the load-time process group.
#include "dtensor/sharded/api.h"

#include "dtensor/comm/object_collectives.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace dtensor {
namespace sharded {

namespace {

thread_local comm::GroupPtr t_current_process_group;

std::string sizes_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << c10::IntArrayRef(v);
  return os.str();
}

}  // namespace

namespace detail {

// shard_tensor with the caller's own local checks folded into the one all_gather: a rank whose
// `local_error` is not empty makes every rank raise it. `what` names the tensor in messages
// ("input tensor", "param: weight").
ShardedTensor shard_tensor_checked(const at::Tensor& tensor, const ShardingSpec& spec, int src_rank,
                                   comm::GroupPtr group, const std::string& what, const std::string& local_error) {
  if (!group) group = comm::default_group();
  comm::Group& g = *group;
  nlohmann::json mine;
  mine["src_rank"] = src_rank;
  mine["spec"] = spec.to_json();
  mine["spec_str"] = spec.to_string();
  if (!local_error.empty()) {
    mine["error"] = local_error;
  } else if (!tensor.defined()) {
    mine["error"] = what + " is undefined";
  } else {
    mine["sizes"] = tensor.sizes().vec();
    mine["dtype"] = std::string(c10::toString(tensor.scalar_type()));
    mine["contiguous"] = tensor.is_contiguous();
  }
  const auto all = comm::all_gather_object(g, mine);
  const int current_rank = g.rank();
  for (size_t idx = 0; idx < all.size(); ++idx)
    TORCH_CHECK(!all[idx].contains("error"), "shard_tensor: rank ", g.global_ranks()[idx], ": ",
                all[idx]["error"].get<std::string>());
  for (size_t idx = 0; idx < all.size(); ++idx)
    TORCH_CHECK(all[idx]["contiguous"].get<bool>(), what, " is not a contiguous Tensor (on rank ",
                g.global_ranks()[idx], ")");
  for (size_t idx = 0; idx < all.size(); ++idx) {
    const nlohmann::json& entry = all[idx];
    TORCH_CHECK(entry["src_rank"].get<int>() == src_rank, "src_rank=", src_rank, " on rank: ", current_rank,
                " does not match with src_rank=", entry["src_rank"].get<int>(), " on rank: ", idx);
    TORCH_CHECK(entry["spec"] == mine["spec"], "sharding_spec=", spec.to_string(), " on rank: ", current_rank,
                " does not match with sharding_spec=", entry["spec_str"].get<std::string>(), " on rank: ", idx);
  }
  for (size_t idx = 1; idx < all.size(); ++idx)
    TORCH_CHECK(all[idx]["sizes"] == all[0]["sizes"] && all[idx]["dtype"] == all[0]["dtype"], "shard_tensor: ",
                what, " has size ", sizes_str(all[idx]["sizes"].get<std::vector<int64_t>>()), " and dtype ",
                all[idx]["dtype"].get<std::string>(), " on rank: ", idx, ", but size ",
                sizes_str(all[0]["sizes"].get<std::vector<int64_t>>()), " and dtype ",
                all[0]["dtype"].get<std::string>(), " on rank: 0 (every rank passes a tensor of the same size and ",
                "dtype; the values of src_rank are used)");
  return spec.shard(tensor, src_rank, group);
}

}  // namespace detail

ShardedTensor shard_tensor(const at::Tensor& tensor, const ShardingSpec& sharding_spec, int src_rank,
                           comm::GroupPtr group) {
  return detail::shard_tensor_checked(tensor, sharding_spec, src_rank, std::move(group), "input tensor", "");
}

LoadWithProcessGroupGuard::LoadWithProcessGroupGuard(comm::GroupPtr group) : group_(std::move(group)) {
  TORCH_CHECK(group_ != nullptr, "load_with_process_group: the process group is null");
  TORCH_CHECK(t_current_process_group == nullptr,
              "ProcessGroup already set by previous \"load_with_process_group\" context manager");
  t_current_process_group = group_;
}

LoadWithProcessGroupGuard::~LoadWithProcessGroupGuard() { t_current_process_group = nullptr; }

comm::GroupPtr get_current_process_group() {
  return t_current_process_group ? t_current_process_group : comm::default_group();
}

}  // namespace sharded
}  // namespace dtensor
