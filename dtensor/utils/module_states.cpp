// dtensor/utils/module_states.cpp: cross-rank checks and bucketed broadcast of module states.
#include "dtensor/utils/module_states.h"

#include "dtensor/comm/object_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <sstream>
#include <tuple>

namespace dtensor {
namespace utils {

namespace {

// What verify_param_shape_across_processes compares, per tensor.
struct ParamDescription {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  std::string dtype;
  bool operator==(const ParamDescription& o) const {
    return std::tie(sizes, strides, dtype) == std::tie(o.sizes, o.strides, o.dtype);
  }
};
void to_json(nlohmann::json& j, const ParamDescription& d) { j = {d.sizes, d.strides, d.dtype}; }
void from_json(const nlohmann::json& j, ParamDescription& d) {
  j.at(0).get_to(d.sizes);
  j.at(1).get_to(d.strides);
  j.at(2).get_to(d.dtype);
}

std::string describe(const ParamDescription& d) {
  std::ostringstream os;
  os << "sizes " << c10::IntArrayRef(d.sizes) << ", strides " << c10::IntArrayRef(d.strides) << ", dtype " << d.dtype;
  return os.str();
}

// Python's dict-key grouping in c10d's take_tensors: tensors of one dtype, device and layout
// share buckets.
struct BucketKey {
  at::ScalarType dtype;
  c10::Device device;
  bool operator==(const BucketKey& o) const { return dtype == o.dtype && device == o.device; }
};

struct Bucket {
  BucketKey key;
  std::vector<at::Tensor> tensors;
  int64_t bytes = 0;
};

// c10d's take_tensors: per (dtype, device), tensors accumulate in order until the bucket holds
// at least `limit` bytes; then it is closed. Open buckets are closed at the end, in the order
// their first tensor came.
std::vector<Bucket> take_tensors(const std::vector<at::Tensor>& tensors, int64_t limit) {
  std::vector<Bucket> closed;
  std::vector<Bucket> open;
  for (const at::Tensor& t : tensors) {
    BucketKey key{t.scalar_type(), t.device()};
    auto it = std::find_if(open.begin(), open.end(), [&](const Bucket& b) { return b.key == key; });
    if (it == open.end()) {
      open.push_back(Bucket{key, {}, 0});
      it = std::prev(open.end());
    }
    it->tensors.push_back(t);
    it->bytes += static_cast<int64_t>(t.numel() * t.element_size());
    if (it->bytes >= limit) {
      closed.push_back(std::move(*it));
      open.erase(it);
    }
  }
  for (auto& b : open) closed.push_back(std::move(b));
  return closed;
}

int64_t numel_of(const Bucket& b) {
  int64_t n = 0;
  for (const auto& t : b.tensors) n += t.numel();
  return n;
}

// A bucket of one contiguous tensor is broadcast in place; others go through a flat buffer.
bool needs_staging(const Bucket& b) { return !(b.tensors.size() == 1 && b.tensors[0].is_contiguous()); }

// One broadcast for the bucket: packed into `flat` (on src), broadcast, unpacked (elsewhere).
void broadcast_bucket(comm::Group& group, Bucket& bucket, at::Tensor flat, int src) {
  if (!needs_staging(bucket)) {
    group.broadcast(bucket.tensors[0], src);
    return;
  }
  const bool is_src = group.rank() == src;
  int64_t offset = 0;
  if (is_src)
    for (const auto& t : bucket.tensors) {
      flat.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
      offset += t.numel();
    }
  group.broadcast(flat, src);
  if (is_src) return;
  offset = 0;
  for (auto& t : bucket.tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace

void verify_param_shape_across_processes(comm::Group& group, const std::vector<at::Tensor>& tensors,
                                         const std::vector<std::string>& names) {
  TORCH_CHECK(names.empty() || names.size() == tensors.size(), "verify_param_shape_across_processes: got ",
              names.size(), " names for ", tensors.size(), " tensors (pass one name per tensor, or none)");
  std::vector<ParamDescription> mine;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.defined(), "verify_param_shape_across_processes: tensor ", mine.size(), " is undefined");
    mine.push_back({t.sizes().vec(), t.strides().vec(), std::string(c10::toString(t.scalar_type()))});
  }
  const auto all = comm::all_gather_object(group, mine);
  const auto& ref = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    TORCH_CHECK(all[r].size() == ref.size(), "DDP expects same model across all ranks, but rank ", r, " has ",
                all[r].size(), " params, while rank 0 has inconsistent ", ref.size(), " params (on ",
                group.describe(), ")");
    for (size_t i = 0; i < ref.size(); ++i) {
      if (all[r][i] == ref[i]) continue;
      std::string name = names.empty() ? "" : " ('" + names[i] + "')";
      TORCH_CHECK(false, "params[", i, "]", name, " on rank ", r, " has ", describe(all[r][i]),
                  ", which do not match ", describe(ref[i]), " of the same param on rank 0 (on ", group.describe(),
                  "): every rank must build the same model");
    }
  }
}

void broadcast_coalesced(comm::Group& group, const std::vector<at::Tensor>& tensors, int64_t buffer_size, int src) {
  comm::detail::check_rank_arg(group, "broadcast_coalesced", "src", src);
  TORCH_CHECK(buffer_size > 0, "broadcast_coalesced: buffer_size must be positive, got ", buffer_size);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined() && t.layout() == at::kStrided && t.has_storage(), "broadcast_coalesced: tensor ", i,
                " is ", t.defined() ? "not a dense tensor with storage (sparse, or a DTensor?)" : "undefined",
                "; only dense tensors can be broadcast");
  }
  at::NoGradGuard no_grad;
  std::vector<Bucket> buckets = take_tensors(tensors, buffer_size);
  // One staging buffer per dtype and device, as large as the largest bucket that needs one,
  // reused by every bucket (fresh memory is paid for in page faults, so allocate it once).
  std::vector<std::pair<BucketKey, at::Tensor>> staging;
  for (const Bucket& b : buckets) {
    if (!needs_staging(b)) continue;
    auto it = std::find_if(staging.begin(), staging.end(), [&](const auto& s) { return s.first == b.key; });
    if (it == staging.end()) {
      staging.emplace_back(b.key, at::Tensor());
      it = std::prev(staging.end());
    }
    if (!it->second.defined() || it->second.numel() < numel_of(b))
      it->second = at::empty({numel_of(b)}, at::TensorOptions().dtype(b.key.dtype).device(b.key.device));
  }
  for (Bucket& b : buckets) {
    at::Tensor flat;
    if (needs_staging(b)) {
      auto it = std::find_if(staging.begin(), staging.end(), [&](const auto& s) { return s.first == b.key; });
      flat = it->second.narrow(0, 0, numel_of(b));
    }
    broadcast_bucket(group, b, flat, src);
  }
}

void sync_params_and_buffers(comm::Group& group, const std::vector<at::Tensor>& module_states,
                             int64_t broadcast_bucket_size, int src) {
  if (!module_states.empty()) broadcast_coalesced(group, module_states, broadcast_bucket_size, src);
}

void sync_module_states(torch::nn::Module& module, comm::Group& group, const SyncModuleStatesOptions& options) {
  comm::detail::check_rank_arg(group, "sync_module_states", "src", options.src);
  std::vector<at::Tensor> states;
  std::vector<std::string> names;
  auto take = [&](const torch::OrderedDict<std::string, at::Tensor>& named) {
    for (const auto& item : named) {
      if (options.params_and_buffers_to_ignore.count(item.key())) continue;
      if (!item.value().defined()) continue;
      names.push_back(item.key());
      states.push_back(item.value().detach());
    }
  };
  take(module.named_parameters());
  if (options.broadcast_buffers) take(module.named_buffers());
  if (options.verify) verify_param_shape_across_processes(group, states, names);
  sync_params_and_buffers(group, states, options.broadcast_bucket_size, options.src);
}

namespace detail {
void check_distinct_prefixes(const std::string& old_prefix, const std::string& new_prefix) {
  TORCH_CHECK(old_prefix != new_prefix, "replace_by_prefix: old_prefix and new_prefix must be distinct, both are '",
              old_prefix, "'");
}
}  // namespace detail

void replace_by_prefix(torch::OrderedDict<std::string, at::Tensor>& state_dict, const std::string& old_prefix,
                       const std::string& new_prefix) {
  detail::check_distinct_prefixes(old_prefix, new_prefix);
  for (const std::string& key : state_dict.keys()) {
    if (key.compare(0, old_prefix.size(), old_prefix) != 0) continue;
    at::Tensor moved = state_dict[key];  // present: only renaming removes keys, each once
    const std::string new_key = new_prefix + key.substr(old_prefix.size());
    if (at::Tensor* existing = state_dict.find(new_key))
      *existing = moved;
    else
      state_dict.insert(new_key, std::move(moved));
    state_dict.erase(key);
  }
}

}  // namespace utils
}  // namespace dtensor
