// dtensor/utils/module_states.h
//
// Keeping a module's parameters and buffers equal across ranks (what DDP and FSDP do at
// construction), and renaming state-dict keys. Counterparts of torch.distributed.utils'
// _verify_param_shape_across_processes, _sync_module_states, _sync_params_and_buffers,
// _replace_by_prefix, and of c10d's broadcast_coalesced.
//
//   // every rank, collective:
//   dtensor::utils::sync_module_states(*model, group);   // rank 0's values everywhere
//
// Calls marked "collective" must be made by every rank of the group, in the same order.
// NOTE: [Checked before broadcasting]
// A broadcast of mismatched tensors (another count, shape or dtype on some rank) would
// leave ranks waiting on each other or read garbage. So sync_module_states first gathers a
// description of every rank's states (one small object all_gather) and, when they differ,
// raises the same error on every rank before any tensor moves.
#pragma once

#include "dtensor/comm/group.h"

#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace dtensor {
namespace utils {

// DDP's default bucket (torch.nn.parallel.DistributedDataParallel: 250 MiB).
constexpr int64_t kDefaultBroadcastBucketSize = int64_t{250} * 1024 * 1024;

// Collective. Checks that every rank passed as many tensors, with the same sizes, strides and
// dtypes, as rank 0. On a mismatch EVERY rank throws the same error, naming the first rank
// that differs and the first differing tensor (by index, and by `names[i]` when given):
//   "DDP expects same model across all ranks, but rank 2 has 3 params, while rank 0 has
//    inconsistent 4 params"
//   "params[1] ('fc.weight') on rank 3 has sizes [4, 3], strides [3, 1], dtype float, which
//    do not match sizes [3, 4], strides [4, 1], dtype float of the same param on rank 0"
// (PyTorch: _verify_param_shape_across_processes -> c10d verify_params_across_processes.)
void verify_param_shape_across_processes(comm::Group& group, const std::vector<at::Tensor>& tensors,
                                         const std::vector<std::string>& names = {});

// Collective. Every rank's `tensors` (same count, shapes, dtypes on every rank) end equal to
// rank `src`'s, moved in buckets: tensors of one dtype and device are packed into one flat
// buffer until it holds at least `buffer_size` bytes, each bucket is one broadcast, then
// unpacked into the tensors (in place: pass detached parameters). A bucket of one contiguous
// tensor is broadcast in place. Not checked across ranks (see sync_module_states).
// (c10d: broadcast_coalesced.)
void broadcast_coalesced(comm::Group& group, const std::vector<at::Tensor>& tensors, int64_t buffer_size, int src);

// Collective. broadcast_coalesced when `module_states` is not empty.
// (PyTorch: _sync_params_and_buffers.)
void sync_params_and_buffers(comm::Group& group, const std::vector<at::Tensor>& module_states,
                             int64_t broadcast_bucket_size, int src);

struct SyncModuleStatesOptions {
  int64_t broadcast_bucket_size = kDefaultBroadcastBucketSize;
  // Group rank whose values are kept.
  int src = 0;
  // Fully qualified names (as in named_parameters()/named_buffers()) to leave alone.
  std::set<std::string> params_and_buffers_to_ignore;
  bool broadcast_buffers = true;
  // See NOTE: [Checked before broadcasting]. Turning it off saves one small all_gather when
  // the caller has just verified the same states.
  bool verify = true;
};

// Collective. Every rank's parameters (and buffers, with broadcast_buffers) not ignored end
// equal to rank `src`'s. (PyTorch: _sync_module_states.)
void sync_module_states(torch::nn::Module& module, comm::Group& group, const SyncModuleStatesOptions& options = {});

// Renames in place every key starting with `old_prefix` so that it starts with `new_prefix`
// instead. As with Python's OrderedDict, a renamed entry goes to the end, or replaces the value
// of an existing entry of its new name in that entry's place. Throws when the prefixes are
// equal. (PyTorch: _replace_by_prefix.)
void replace_by_prefix(torch::OrderedDict<std::string, at::Tensor>& state_dict, const std::string& old_prefix,
                       const std::string& new_prefix);

namespace detail {
void check_distinct_prefixes(const std::string& old_prefix, const std::string& new_prefix);
}

// The same for a sorted map (any value type).
template <class V>
void replace_by_prefix(std::map<std::string, V>& state_dict, const std::string& old_prefix,
                       const std::string& new_prefix) {
  detail::check_distinct_prefixes(old_prefix, new_prefix);
  std::vector<std::string> keys;
  for (const auto& kv : state_dict) keys.push_back(kv.first);
  for (const std::string& key : keys) {
    if (key.compare(0, old_prefix.size(), old_prefix) != 0) continue;
    auto it = state_dict.find(key);  // present: only renaming removes keys, each once
    V value = std::move(it->second);
    state_dict.erase(it);
    state_dict[new_prefix + key.substr(old_prefix.size())] = std::move(value);
  }
}

}  // namespace utils
}  // namespace dtensor
