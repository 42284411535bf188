// dtensor/sharded/sharded_tensor.cpp: ShardedTensor construction and validation, gather,
// reshard, the DTensor bridge and saving.
#include "dtensor/sharded/sharded_tensor.h"

#include "dtensor/comm/object_collectives.h"
#include "dtensor/sharded/api.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>
#include <sstream>

namespace dtensor {
namespace sharded {

struct ShardedTensor::State {
  std::vector<Shard> local_shards;
  // local_index[k]: the entry of metadata.shards_metadata that local shard k is.
  std::vector<size_t> local_index;
  ShardedTensorMetadata metadata;
  std::shared_ptr<const ShardingSpec> spec;
  comm::GroupPtr group;
};

namespace {

template <class T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
std::string str(const std::vector<int64_t>& v) { return str(c10::IntArrayRef(v)); }
std::string str(bool b) { return b ? "True" : "False"; }

// Python's _raise_if_mismatch for one local shard against the global metadata.
template <class T>
void check_local_property(const T& expected, const T& actual, const std::string& prop, int rank, bool is_property,
                          const ShardMetadata& shard) {
  const std::string what = is_property ? "tensor property" : "local ShardMetadata";
  TORCH_CHECK(expected == actual, "Local shards' tensor ", prop, " property is incompatible with ", what, " on rank ",
              rank, ": ", what, " ", prop, "=", str(expected), ", local shard tensor ", prop, "=", str(actual),
              " (shard at offsets ", str(shard.shard_offsets()), ")");
}

// Python's _raise_if_mismatch between the local shards of one rank.
template <class T>
void check_same_locally(const T& expected, const T& actual, const std::string& prop, int rank) {
  TORCH_CHECK(expected == actual, "Local shards' tensor ", prop, " property need to be the same on rank:", rank,
              "! Found one local shard tensor ", prop, "=", str(expected), ", the other local shard tensor ", prop,
              "=", str(actual), ".");
}

// ... and between ranks.
template <class T>
void check_same_across_ranks(const T& expected, const T& actual, const std::string& prop, int rank0, int rank) {
  TORCH_CHECK(expected == actual, "ShardedTensor ", prop, " property does not match from different ranks! Found ",
              prop, "=", str(expected), " on rank:", rank0, ", and ", prop, "=", str(actual), " on rank:", rank, ".");
}

int global_rank_of(const comm::Group& g) { return g.global_ranks()[g.rank()]; }

// [lo, hi) per dim of the intersection of two shards; nullopt when empty.
std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> intersect(const ShardMetadata& a,
                                                                                 const ShardMetadata& b) {
  const size_t n = a.shard_offsets().size();
  std::vector<int64_t> lo(n), hi(n);
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(a.shard_offsets()[d], b.shard_offsets()[d]);
    hi[d] = std::min(a.shard_offsets()[d] + a.shard_sizes()[d], b.shard_offsets()[d] + b.shard_sizes()[d]);
    if (hi[d] <= lo[d]) return std::nullopt;
  }
  return std::make_pair(lo, hi);
}

int64_t box_numel(const std::pair<std::vector<int64_t>, std::vector<int64_t>>& box) {
  int64_t n = 1;
  for (size_t d = 0; d < box.first.size(); ++d) n *= box.second[d] - box.first[d];
  return n;
}

// The part [lo, hi) (global coordinates) of `t`, the tensor of shard `m`.
at::Tensor box_of(at::Tensor t, const ShardMetadata& m, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi) {
  for (size_t d = 0; d < lo.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), lo[d] - m.shard_offsets()[d], hi[d] - lo[d]);
  return t;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  auto s = c10::contiguous_strides(sizes);
  return std::vector<int64_t>(s.begin(), s.end());
}

// The device of a shard placed on `global_rank` when only this rank's device is known (used by
// from_dtensor): the CPU, or rank r on device r modulo the device count (the harness's rule).
c10::Device device_of_rank(c10::Device mine, int global_rank) {
  if (mine.is_cpu()) return mine;
  c10::impl::VirtualGuardImpl impl(mine.type());
  const int n = std::max<int>(impl.deviceCount(), 1);
  return c10::Device(mine.type(), static_cast<c10::DeviceIndex>(global_rank % n));
}

// NOTE: [Nested ShardedTensors]: what needs the shards' data refuses nested shards.
void check_not_nested(const std::vector<Shard>& shards, const char* what, const comm::Group& group) {
  for (const Shard& s : shards)
    TORCH_CHECK(!s.is_nested(), "ShardedTensor.", what, ": the local shard at offsets ", str(s.metadata.shard_offsets()),
                " on rank ", global_rank_of(group),
                " is a nested ShardedTensor (FSDP x TP); use its inner tensor (local_shards()[0].nested, or "
                "dtensor::fsdp::_pre_load_state_dict)");
}

}  // namespace

// ---- Shard ---------------------------------------------------------------------------------------

Shard::Shard(at::Tensor tensor_, ShardMetadata metadata_) : tensor(std::move(tensor_)), metadata(std::move(metadata_)) {
  TORCH_CHECK(tensor.defined(), "Shard: the tensor is undefined (", metadata, ")");
  TORCH_CHECK(tensor.sizes().vec() == metadata.shard_sizes(),
              "Shard tensor size does not match with metadata.shard_lengths! Found shard tensor size: ",
              tensor.sizes(), ", metadata.shard_lengths: ", str(metadata.shard_sizes()));
  if (metadata.placement())
    TORCH_CHECK(metadata.placement()->device() == tensor.device(),
                "Local shard tensor device does not match with local Shard's placement! Found local shard tensor "
                "device: ",
                tensor.device(), ", local shard metadata placement device: ", metadata.placement()->device());
}

Shard::Shard(ShardedTensor nested_, ShardMetadata metadata_)
    : metadata(std::move(metadata_)), nested(std::make_shared<const ShardedTensor>(std::move(nested_))) {
  TORCH_CHECK(nested->size() == metadata.shard_sizes(),
              "Shard: a nested ShardedTensor of size ", str(nested->size()), " does not match metadata.shard_lengths ",
              str(metadata.shard_sizes()));
}

Shard Shard::from_tensor_and_offsets(const at::Tensor& tensor, std::vector<int64_t> shard_offsets, int rank) {
  return Shard(tensor,
               ShardMetadata(std::move(shard_offsets), tensor.sizes().vec(), RemoteDevice(rank, tensor.device())));
}

// ---- construction ------------------------------------------------------------------------------

ShardedTensor ShardedTensor::init_from_local_shards_and_global_metadata(
    std::vector<Shard> local_shards, ShardedTensorMetadata metadata, comm::GroupPtr group,
    std::shared_ptr<const ShardingSpec> sharding_spec) {
  if (!group) group = comm::default_group();
  const comm::Group& g = *group;
  const int me = global_rank_of(g);
  const auto& all = metadata.shards_metadata;
  const std::vector<int> owners = placement_group_ranks(all, g);
  std::vector<size_t> mine;
  for (size_t i = 0; i < all.size(); ++i)
    if (owners[i] == g.rank()) mine.push_back(i);
  TORCH_CHECK(local_shards.size() == mine.size(), "Number of local shards (", local_shards.size(),
              ") does not match number of local shards metadata in sharded_tensor_metadata (", mine.size(),
              ") on rank (", me, ")");
  TORCH_CHECK(!all.empty(), "shards_metadata must not be empty!");
  const TensorProperties& props = metadata.tensor_properties;
  TORCH_CHECK(props.layout == c10::kStrided, "Only torch.strided layout is currently supported");

  std::vector<size_t> local_index;
  for (const Shard& shard : local_shards) {
    const ShardMetadata& sm = shard.metadata;
    TORCH_CHECK(sm.placement().has_value(), "Must specify placement for `Shard`! (local shard ", sm, " on rank ", me,
                ")");
    // The global entry of this shard: this rank's entry at the same offsets.
    auto it = std::find_if(mine.begin(), mine.end(), [&](size_t i) {
      return all[i].shard_offsets() == sm.shard_offsets() &&
             std::find(local_index.begin(), local_index.end(), i) == local_index.end();
    });
    if (it == mine.end()) {
      std::ostringstream listed;
      for (size_t i : mine) listed << "\n  " << all[i];
      TORCH_CHECK(false, "Local shard ", sm, " on rank ", me,
                  " is not one of this rank's shards in the global metadata, which are:", listed.str());
    }
    const ShardMetadata& global = all[*it];
    if (shard.is_nested()) {  // NOTE: [Nested ShardedTensors]
      check_local_property(global.shard_sizes(), shard.nested->size(), "size", me, false, global);
      check_local_property(props.dtype, shard.nested->dtype(), "dtype", me, true, global);
      check_local_property(props.requires_grad, shard.nested->metadata().tensor_properties.requires_grad,
                           "requires_grad", me, true, global);
      local_index.push_back(*it);
      continue;
    }
    const at::Tensor& t = shard.tensor;
    check_local_property(props.layout, t.layout(), "layout", me, true, global);
    TORCH_CHECK(t.is_contiguous(), "Only torch.contiguous_format memory_format is currently supported (local shard at ",
                "offsets ", str(global.shard_offsets()), " on rank ", me, ")");
    check_local_property(global.shard_sizes(), t.sizes().vec(), "size", me, false, global);
    check_local_property(props.pin_memory, t.is_pinned(), "pin_memory", me, true, global);
    check_local_property(global.placement()->device(), t.device(), "device", me, false, global);
    check_local_property(props.dtype, t.scalar_type(), "dtype", me, true, global);
    check_local_property(props.requires_grad, t.requires_grad(), "requires_grad", me, true, global);
    local_index.push_back(*it);
  }
  validate_non_overlapping_shards_metadata(all);
  check_tensor(all, metadata.size);

  auto state = std::make_shared<State>();
  state->spec = sharding_spec ? std::move(sharding_spec) : infer_sharding_spec(all, metadata.size);
  state->local_shards = std::move(local_shards);
  state->local_index = std::move(local_index);
  state->metadata = std::move(metadata);
  state->group = std::move(group);
  return ShardedTensor(std::move(state));
}

ShardedTensor ShardedTensor::init_from_local_shards(std::vector<Shard> local_shards, std::vector<int64_t> global_size,
                                                    comm::GroupPtr group) {
  if (!group) group = comm::default_group();
  const comm::Group& g = *group;
  const int me = global_rank_of(g);
  // 1. This rank's shards, checked locally; a failure travels with the gathered metadata so
  //    that every rank raises (no rank waits in a collective the others left).
  nlohmann::json local;
  try {
    if (!local_shards.empty()) {
      std::vector<ShardMetadata> metas;
      const at::Tensor& first = local_shards[0].tensor;
      for (const Shard& s : local_shards) {
        TORCH_CHECK(!s.is_nested(), "ShardedTensor.init_from_local_shards: the local shard at offsets ",
                    str(s.metadata.shard_offsets()), " on rank ", me, " is a nested ShardedTensor; build it with "
                    "init_from_local_shards_and_global_metadata (NOTE: [Nested ShardedTensors])");
        const at::Tensor& t = s.tensor;
        placement_group_ranks({s.metadata}, g);
        TORCH_CHECK(t.layout() == c10::kStrided, "Only torch.strided layout is currently supported, but found ",
                    t.layout(), " on rank:", me, "!");
        TORCH_CHECK(t.is_contiguous(), "Only torch.contiguous_format memory_format is currently supported! (rank ", me,
                    ", shard at offsets ", str(s.metadata.shard_offsets()), ")");
        TORCH_CHECK(*s.metadata.placement()->rank() == me,
                    "Local shard metadata's rank does not match with the rank in its process group! Found current "
                    "rank in the process group: ",
                    me, ", local ShardMetadata placement's rank: ", *s.metadata.placement()->rank());
        check_same_locally(first.is_pinned(), t.is_pinned(), "pin_memory", me);
        check_same_locally(first.scalar_type(), t.scalar_type(), "dtype", me);
        check_same_locally(first.requires_grad(), t.requires_grad(), "requires_grad", me);
        metas.push_back(s.metadata);
      }
      ShardedTensorMetadata m;
      m.shards_metadata = std::move(metas);
      m.size = global_size;
      m.tensor_properties = TensorProperties::create_from_tensor(first);
      local["metadata"] = m;
    }
  } catch (const c10::Error& e) {
    local["error"] = e.what_without_backtrace();
  }
  // 2. Gather and build the global metadata (PyTorch: build_global_metadata), identically on
  //    every rank.
  const std::vector<nlohmann::json> gathered = comm::all_gather_object(*group, local);
  for (size_t r = 0; r < gathered.size(); ++r)
    TORCH_CHECK(!gathered[r].contains("error"), "ShardedTensor.init_from_local_shards: the local shards of rank ",
                g.global_ranks()[r], " are invalid: ", gathered[r]["error"].get<std::string>());
  std::optional<ShardedTensorMetadata> global;
  int global_rank0 = 0;
  for (size_t r = 0; r < gathered.size(); ++r) {
    if (!gathered[r].contains("metadata")) continue;
    auto m = gathered[r]["metadata"].get<ShardedTensorMetadata>();
    if (!global) {
      global = std::move(m);
      global_rank0 = static_cast<int>(r);
      continue;
    }
    const int rr = static_cast<int>(r);
    check_same_across_ranks(global->size, m.size, "global_size", global_rank0, rr);
    check_same_across_ranks(global->tensor_properties.dtype, m.tensor_properties.dtype, "dtype", global_rank0, rr);
    check_same_across_ranks(global->tensor_properties.requires_grad, m.tensor_properties.requires_grad,
                            "requires_grad", global_rank0, rr);
    check_same_across_ranks(global->tensor_properties.pin_memory, m.tensor_properties.pin_memory, "pin_memory",
                            global_rank0, rr);
    global->shards_metadata.insert(global->shards_metadata.end(), m.shards_metadata.begin(), m.shards_metadata.end());
  }
  TORCH_CHECK(global.has_value(), "ShardedTensor have no local shards on all ranks!");
  validate_non_overlapping_shards_metadata(global->shards_metadata);
  check_tensor(global->shards_metadata, global->size);
  return init_from_local_shards_and_global_metadata(std::move(local_shards), std::move(*global), group);
}

// ---- accessors -------------------------------------------------------------------------------------

const std::vector<Shard>& ShardedTensor::local_shards() const { return state_->local_shards; }

at::Tensor ShardedTensor::local_tensor() const {
  TORCH_CHECK(state_->local_shards.size() == 1, "ShardedTensor.local_tensor: only works with exactly one local shard, ",
              "rank ", global_rank_of(*state_->group), " has ", state_->local_shards.size(), " (use local_shards())");
  check_not_nested(state_->local_shards, "local_tensor", *state_->group);
  return state_->local_shards[0].tensor;
}

const ShardedTensorMetadata& ShardedTensor::metadata() const { return state_->metadata; }
const std::vector<int64_t>& ShardedTensor::size() const { return state_->metadata.size; }
int64_t ShardedTensor::size(int64_t d) const {
  const int64_t n = dim();
  TORCH_CHECK(d >= -n && d < n, "ShardedTensor.size: dim ", d, " is out of range for a tensor of ", n, " dims");
  return state_->metadata.size[d < 0 ? d + n : d];
}
int64_t ShardedTensor::dim() const { return static_cast<int64_t>(state_->metadata.size.size()); }
at::ScalarType ShardedTensor::dtype() const { return state_->metadata.tensor_properties.dtype; }
std::shared_ptr<const ShardingSpec> ShardedTensor::sharding_spec() const { return state_->spec; }
const comm::GroupPtr& ShardedTensor::process_group() const { return state_->group; }

// ---- gather --------------------------------------------------------------------------------------

void ShardedTensor::gather(int dst, const std::optional<at::Tensor>& out) const {
  check_not_nested(state_->local_shards, "gather", *state_->group);
  comm::Group& g = *state_->group;
  comm::detail::check_rank_arg(g, "ShardedTensor.gather", "dst", dst);
  const auto& all = state_->metadata.shards_metadata;
  const std::vector<int> owners = placement_group_ranks(all, g);
  // 1. Where each shard sits in its rank's flat buffer.
  std::vector<int64_t> rank_numel(g.size(), 0), offset_in_rank(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    offset_in_rank[i] = rank_numel[owners[i]];
    rank_numel[owners[i]] += all[i].numel();
  }
  const int64_t max_numel = *std::max_element(rank_numel.begin(), rank_numel.end());
  // 2. Check `out`; a mistake is raised after the gather (PyTorch raises before it, which
  //    leaves the other ranks waiting).
  std::string out_error;
  const bool has_out = out.has_value() && out->defined();
  if (g.rank() == dst) {
    if (!has_out)
      out_error = "Argument ``dst_tensor`` must be specified on destination rank " + std::to_string(dst);
    else if (out->sizes().vec() != size())
      out_error = "Argument ``dst_tensor`` have size " + str(out->sizes()) + ", but should be " + str(size());
  } else if (has_out) {
    out_error = "Argument ``dst_tensor`` must NOT be specified on non-destination ranks.";
  }
  // 3. One gather of the flat buffers.
  at::NoGradGuard no_grad;
  const c10::Device device =
      state_->local_shards.empty() ? c10::Device(c10::kCPU) : state_->local_shards[0].tensor.device();
  at::Tensor data = at::empty({max_numel}, at::TensorOptions().dtype(dtype()).device(device));
  for (size_t k = 0; k < state_->local_shards.size(); ++k) {
    const size_t i = state_->local_index[k];
    data.narrow(0, offset_in_rank[i], all[i].numel()).copy_(state_->local_shards[k].tensor.reshape({-1}));
  }
  std::vector<at::Tensor> gathered;
  if (max_numel > 0) g.gather(data, gathered, dst);
  TORCH_CHECK(out_error.empty(), "ShardedTensor.gather on rank ", global_rank_of(g), ": ", out_error);
  if (g.rank() != dst) return;
  // 4. Each shard into its place.
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].numel() == 0) continue;
    at::Tensor piece = gathered[owners[i]].narrow(0, offset_in_rank[i], all[i].numel()).view(all[i].shard_sizes());
    std::vector<int64_t> hi(all[i].shard_offsets().size());
    for (size_t d = 0; d < hi.size(); ++d) hi[d] = all[i].shard_offsets()[d] + all[i].shard_sizes()[d];
    ShardMetadata whole(std::vector<int64_t>(hi.size(), 0), size());
    box_of(*out, whole, all[i].shard_offsets(), hi).copy_(piece);
  }
}

at::Tensor ShardedTensor::gather(int dst) const {
  check_not_nested(state_->local_shards, "gather", *state_->group);
  std::optional<at::Tensor> out;
  if (state_->group->rank() == dst) {
    const c10::Device device =
        state_->local_shards.empty() ? c10::Device(c10::kCPU) : state_->local_shards[0].tensor.device();
    out = at::empty(size(), at::TensorOptions().dtype(dtype()).device(device));
  }
  gather(dst, out);
  return out ? *out : at::Tensor();
}

// ---- reshard ---------------------------------------------------------------------------------------

ShardedTensor& ShardedTensor::reshard(const ShardingSpec& spec) {
  check_not_nested(state_->local_shards, "reshard", *state_->group);
  comm::Group& g = *state_->group;
  // 1. Every rank must ask for the same layout (checked before any data moves).
  const auto specs = comm::all_gather_object(g, spec.to_json());
  for (size_t r = 1; r < specs.size(); ++r)
    TORCH_CHECK(specs[r] == specs[0], "ShardedTensor.reshard: rank ", g.global_ranks()[r], " passed ",
                specs[r].dump(), ", which differs from rank ", g.global_ranks()[0], "'s ", specs[0].dump(),
                " (every rank must pass the same spec)");
  if (state_->spec && *state_->spec == spec) return *this;
  ShardedTensorMetadata next = spec.build_metadata(size(), state_->metadata.tensor_properties);
  const auto& old_md = state_->metadata.shards_metadata;
  const auto& new_md = next.shards_metadata;
  const std::vector<int> old_owner = placement_group_ranks(old_md, g);
  const std::vector<int> new_owner = placement_group_ranks(new_md, g);
  std::vector<const at::Tensor*> old_local(old_md.size(), nullptr);
  for (size_t k = 0; k < state_->local_shards.size(); ++k)
    old_local[state_->local_index[k]] = &state_->local_shards[k].tensor;

  // 2. The pieces where an old shard of the sender meets a new shard of the receiver, in the
  //    order (other rank, new shard, old shard) on both sides: fn(other, j, i, box) for each
  //    piece this rank sends to (`sending`) or receives from `other`.
  at::NoGradGuard no_grad;
  const int n = g.size(), me = g.rank();
  auto for_each_piece = [&](bool sending, const auto& fn) {
    for (int other = 0; other < n; ++other)
      for (size_t j = 0; j < new_md.size(); ++j) {
        if (new_owner[j] != (sending ? other : me)) continue;
        for (size_t i = 0; i < old_md.size(); ++i)
          if (old_owner[i] == (sending ? me : other))
            if (auto box = intersect(old_md[i], new_md[j])) fn(other, j, i, *box);
      }
  };
  std::vector<int64_t> send_counts(n, 0), recv_counts(n, 0);
  std::vector<at::Tensor> send_pieces;
  for_each_piece(true, [&](int q, size_t, size_t i, const auto& box) {
    send_pieces.push_back(box_of(*old_local[i], old_md[i], box.first, box.second).reshape({-1}));
    send_counts[q] += send_pieces.back().numel();
  });
  for_each_piece(false, [&](int p, size_t, size_t, const auto& box) { recv_counts[p] += box_numel(box); });
  const auto opts = at::TensorOptions().dtype(dtype()).device(
      state_->local_shards.empty() ? c10::Device(c10::kCPU) : state_->local_shards[0].tensor.device());
  const int64_t total_recv = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  at::Tensor sent = send_pieces.empty() ? at::empty({0}, opts) : at::cat(send_pieces);
  at::Tensor received = at::empty({total_recv}, opts);
  int64_t global_numel = 1;
  for (int64_t s : size()) global_numel *= s;
  if (global_numel > 0) g.all_to_all_single(received, sent, recv_counts, send_counts);

  // 3. The new local shards.
  std::vector<Shard> shards;
  std::vector<size_t> index;
  std::vector<at::Tensor> fresh(new_md.size());
  for (size_t j = 0; j < new_md.size(); ++j)
    if (new_owner[j] == me) fresh[j] = at::empty(new_md[j].shard_sizes(), opts.device(new_md[j].placement()->device()));
  int64_t offset = 0;
  for_each_piece(false, [&](int, size_t j, size_t, const auto& box) {
    at::Tensor dst = box_of(fresh[j], new_md[j], box.first, box.second);
    dst.copy_(received.narrow(0, offset, dst.numel()).view(dst.sizes()));
    offset += dst.numel();
  });
  for (size_t j = 0; j < new_md.size(); ++j) {
    if (new_owner[j] != me) continue;
    fresh[j].set_requires_grad(next.tensor_properties.requires_grad);
    shards.emplace_back(fresh[j], new_md[j]);
    index.push_back(j);
  }
  state_->local_shards = std::move(shards);
  state_->local_index = std::move(index);
  state_->metadata = std::move(next);
  state_->spec = spec.clone();
  return *this;
}

// ---- DTensor bridge (NOTE: [ShardedTensor and DTensor]) -----------------------------------------

bool ShardedTensor::is_dtensor_compatible() const {
  if (!dynamic_cast<const ChunkShardingSpec*>(state_->spec.get())) return false;
  const comm::Group& g = *state_->group;
  const auto& all = state_->metadata.shards_metadata;
  if (static_cast<int>(all.size()) != g.size()) return false;
  std::vector<int> owners = placement_group_ranks(all, g);
  std::sort(owners.begin(), owners.end());
  for (int r = 0; r < g.size(); ++r)
    if (owners[r] != r) return false;
  return true;
}

at::Tensor ShardedTensor::to_dtensor(const DeviceMesh* mesh) const {
  TORCH_CHECK(is_dtensor_compatible(), "ShardedTensor.to_dtensor: needs a ChunkShardingSpec layout with one shard on "
              "each rank of the ", state_->group->describe(), "; this tensor's spec is ",
              state_->spec ? state_->spec->to_string() : std::string("not a chunk layout"), " with ",
              state_->metadata.shards_metadata.size(), " shards");
  const auto& chunk = dynamic_cast<const ChunkShardingSpec&>(*state_->spec);
  const std::vector<int> owners = placement_group_ranks(state_->metadata.shards_metadata, *state_->group);
  std::vector<int64_t> order(owners.begin(), owners.end());
  at::Tensor ranks = at::tensor(order, at::kLong);
  const at::Tensor& local = local_tensor();
  std::optional<DeviceMesh> built;
  if (mesh) {
    TORCH_CHECK(mesh->ndim() == 1 && mesh->world()->global_ranks() == state_->group->global_ranks() &&
                    at::equal(mesh->mesh(), ranks),
                "ShardedTensor.to_dtensor: ", mesh->to_string(), " is not the 1-D mesh of the spec's ranks ",
                str(order), " over the tensor's ", state_->group->describe());
  } else {
    built.emplace(local.device().is_cpu() ? "cpu" : c10::DeviceTypeName(local.device().type(), true), ranks,
                  std::vector<std::string>{}, state_->group);
    mesh = &*built;
  }
  const int64_t ndim = dim();
  const int64_t d = chunk.dim() < 0 ? chunk.dim() + ndim : chunk.dim();
  TensorMeta meta;
  meta.shape = size();
  meta.stride = contiguous_strides(size());
  meta.dtype = dtype();
  at::Tensor out = make_dtensor(local.detach(), DTensorSpec(*mesh, {dtensor::Shard{d}}, meta));
  if (state_->metadata.tensor_properties.requires_grad) out.set_requires_grad(true);
  return out;
}

ShardedTensor ShardedTensor::from_dtensor(const at::Tensor& dtensor) {
  TORCH_CHECK(is_dtensor(dtensor), "ShardedTensor.from_dtensor: the tensor is not a DTensor");
  const DTensorSpec& spec = get_spec(dtensor);
  const DeviceMesh& mesh = spec.mesh;
  TORCH_CHECK(mesh.ndim() == 1 && is_shard(spec.placements[0]),
              "ShardedTensor.from_dtensor: needs a DTensor with placement Shard(dim) on a 1-D mesh, got ",
              spec.to_string());
  const comm::GroupPtr& world = mesh.world();
  const at::Tensor& local = dtensor::local_tensor(dtensor);
  std::vector<RemoteDevice> placements;
  const at::Tensor ranks = mesh.mesh().flatten();
  for (int64_t i = 0; i < ranks.numel(); ++i) {
    const int global = world->global_ranks()[ranks[i].item<int64_t>()];
    placements.emplace_back(global, device_of_rank(local.device(), global));
  }
  const auto coordinate = mesh.get_coordinate();
  TORCH_CHECK(coordinate.has_value(), "ShardedTensor.from_dtensor: this rank is not in ", mesh.to_string());
  placements[(*coordinate)[0]] = RemoteDevice(global_rank_of(*world), local.device());
  auto chunk = std::make_shared<ChunkShardingSpec>(std::get<dtensor::Shard>(spec.placements[0]).dim, placements);
  TensorProperties props;
  props.dtype = spec.tensor_meta.dtype;
  ShardedTensorMetadata meta = chunk->build_metadata(spec.tensor_meta.shape, props);
  std::vector<Shard> shards;
  shards.emplace_back(local, meta.shards_metadata[(*coordinate)[0]]);
  return init_from_local_shards_and_global_metadata(std::move(shards), std::move(meta), world, chunk);
}

// ---- saving ------------------------------------------------------------------------------------------

ShardedTensorState ShardedTensor::state() const {
  check_not_nested(state_->local_shards, "state", *state_->group);
  ShardedTensorState s;
  s.local_shards = state_->local_shards;
  s.metadata = state_->metadata;
  s.sharding_spec = state_->spec;
  s.local_rank = state_->group->rank();
  s.local_world_size = state_->group->size();
  const comm::GroupPtr world = comm::default_group();
  s.global_rank = world->rank();
  s.global_world_size = world->size();
  return s;
}

ShardedTensor ShardedTensor::from_state(ShardedTensorState s) {
  TORCH_CHECK(comm::is_initialized(),
              "Need to initialize default process group using \"init_process_group\" before loading ShardedTensor");
  comm::GroupPtr group = get_current_process_group();
  TORCH_CHECK(s.local_rank == group->rank(), "Local rank at save time was ", s.local_rank, ", but at load time was ",
              group->rank());
  const comm::GroupPtr world = comm::default_group();
  TORCH_CHECK(s.global_rank == world->rank(), "Global rank at save time was ", s.global_rank,
              ", but at load time was ", world->rank());
  TORCH_CHECK(s.global_world_size == world->size(), "Global world size at save time was ", s.global_world_size,
              ", but at load time was ", world->size());
  return init_from_local_shards_and_global_metadata(std::move(s.local_shards), std::move(s.metadata), group,
                                                    std::move(s.sharding_spec));
}

// ---- spec inference --------------------------------------------------------------------------------

std::shared_ptr<const ShardingSpec> infer_sharding_spec(const std::vector<ShardMetadata>& shards,
                                                        const std::vector<int64_t>& size) {
  if (shards.empty()) return nullptr;
  for (const auto& s : shards)
    if (!s.placement() || s.shard_offsets().size() != size.size()) return nullptr;
  auto enumerable = [&]() -> std::shared_ptr<const ShardingSpec> {
    try {
      return std::make_shared<EnumerableShardingSpec>(shards);
    } catch (const c10::Error&) {
      return nullptr;  // overlapping shards: no spec describes them
    }
  };
  for (size_t d = 0; d < size.size(); ++d) {
    std::vector<ShardMetadata> order = shards;
    std::stable_sort(order.begin(), order.end(), [d](const ShardMetadata& a, const ShardMetadata& b) {
      return a.shard_offsets()[d] < b.shard_offsets()[d];
    });
    std::vector<RemoteDevice> placements;
    for (const auto& s : order) placements.push_back(*s.placement());
    auto spec = std::make_shared<ChunkShardingSpec>(static_cast<int64_t>(d), placements);
    if (spec->build_metadata(size, {}).shards_metadata == order) return spec;
  }
  return enumerable();
}

}  // namespace sharded
}  // namespace dtensor
