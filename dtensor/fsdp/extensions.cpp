// dtensor/fsdp/extensions.cpp: see extensions.h.
#include "dtensor/fsdp/extensions.h"

#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <sstream>

namespace dtensor {
namespace fsdp {

namespace {

const DeviceMesh& mesh_1d(const at::Tensor& dtensor, const char* what) {
  TORCH_CHECK(is_dtensor(dtensor), what, ": expected a DTensor");
  const DeviceMesh& mesh = get_spec(dtensor).mesh;
  TORCH_CHECK(mesh.ndim() == 1, what, ": Only 1D DeviceMeshes currently handled, got ", mesh.to_string(),
              " with placements ", to_string(get_spec(dtensor).placements));
  return mesh;
}

int global_rank(const comm::Group& g, int group_rank) { return g.global_ranks()[static_cast<size_t>(group_rank)]; }

// PyTorch's _get_remote_device_str: CUDA shards on device (global rank % devices per node).
c10::Device device_of(int global, c10::Device device, int num_devices_per_node) {
  if (device.is_cpu() || num_devices_per_node <= 0) return device.is_cpu() ? device : c10::Device(device.type());
  return c10::Device(device.type(), static_cast<c10::DeviceIndex>(global % num_devices_per_node));
}

}  // namespace

// ---- Plain FSDP's defaults ------------------------------------------------------------------------

sharded::ShardedTensor _create_chunk_sharded_tensor(const at::Tensor& tensor, int rank, int world_size,
                                                    int num_devices_per_node, const comm::GroupPtr& pg,
                                                    std::optional<c10::Device> device) {
  TORCH_CHECK(pg != nullptr, "_create_chunk_sharded_tensor: no process group");
  TORCH_CHECK(world_size == pg->size() && rank == pg->rank(), "_create_chunk_sharded_tensor: rank ", rank,
              " of world_size ", world_size, " is not this rank of the group (rank ", pg->rank(), " of ", pg->size(), ")");
  TORCH_CHECK(tensor.dim() >= 1 && !is_dtensor(tensor), "_create_chunk_sharded_tensor: expected a plain tensor with at "
              "least one dim, got ", is_dtensor(tensor) ? "a DTensor" : "a 0-dim tensor");
  // torch.chunk: fewer chunks than ranks when dim 0 is short; the ranks past them hold nothing.
  const std::vector<at::Tensor> chunks = tensor.detach().chunk(world_size, 0);
  const c10::Device dev = device.value_or(tensor.device());
  std::vector<sharded::ShardMetadata> shards;
  int64_t offset = 0;
  for (const auto r : c10::irange(chunks.size())) {
    std::vector<int64_t> offsets(static_cast<size_t>(tensor.dim()), 0);
    offsets[0] = offset;
    const int g = global_rank(*pg, static_cast<int>(r));
    shards.emplace_back(offsets, chunks[r].sizes().vec(), sharded::RemoteDevice(g, device_of(g, dev, num_devices_per_node)));
    offset += chunks[r].size(0);
  }
  std::vector<sharded::Shard> local;
  if (rank < static_cast<int>(chunks.size()))
    local.emplace_back(chunks[static_cast<size_t>(rank)].clone(at::MemoryFormat::Contiguous),
                       shards[static_cast<size_t>(rank)]);
  sharded::ShardedTensorMetadata md;
  md.shards_metadata = std::move(shards);
  md.size = tensor.sizes().vec();
  md.tensor_properties = sharded::TensorProperties::create_from_tensor(tensor);
  md.tensor_properties.requires_grad = false;
  return sharded::ShardedTensor::init_from_local_shards_and_global_metadata(std::move(local), std::move(md), pg);
}

at::Tensor _create_chunk_dtensor(const at::Tensor& tensor, int /*rank*/, const DeviceMesh& device_mesh) {
  const at::Tensor t = tensor.detach().clone();
  const auto n = static_cast<size_t>(device_mesh.ndim());
  const std::vector<Placement> replicate(n, Replicate{});
  std::vector<Placement> shard = replicate;
  shard[n - 1] = Shard{0};
  return redistribute(from_local(t, device_mesh, replicate), device_mesh, shard);
}

at::Tensor _all_gather_dtensor_last_dim(const at::Tensor& tensor, const std::optional<DeviceMesh>& root_mesh) {
  TORCH_CHECK(is_dtensor(tensor), "_all_gather_dtensor: expected a DTensor");
  const DTensorSpec& spec = get_spec(tensor);
  TORCH_CHECK(root_mesh.has_value() && *root_mesh == spec.mesh, "_all_gather_dtensor: The device mesh of a tensor should "
              "be a root mesh (the tensor's mesh is ", spec.mesh.to_string(), ", given ",
              root_mesh ? root_mesh->to_string() : std::string("none"), ")");
  std::vector<Placement> placements = spec.placements;
  placements[placements.size() - 1] = Replicate{};
  return to_local(redistribute(tensor, spec.mesh, placements));
}

// ---- The helpers of PyTorch's tensor/parallel/fsdp.py -------------------------------------------

std::pair<at::Tensor, ParamExtension> _flatten_tensor(const at::Tensor& tensor) {
  if (!is_dtensor(tensor)) return {tensor, std::nullopt};
  at::Tensor local = local_tensor(tensor);
  if (local.is_leaf() && !local.requires_grad() && local.is_floating_point()) local.requires_grad_(true);
  return {local, get_spec(tensor)};
}

at::Tensor _unflatten_tensor(const at::Tensor& tensor, const DTensorSpec& spec) {
  FromLocalOptions options;
  options.shape = spec.tensor_meta.shape;
  options.stride = spec.tensor_meta.stride;
  at::Tensor result = from_local(tensor, spec.mesh, spec.placements, options);
  if (result.requires_grad()) {
    // PyTorch's grad_layout_hook: FSDP expects the gradient in the parameter's layout.
    const DeviceMesh mesh = spec.mesh;
    const std::vector<Placement> placements = spec.placements;
    result.register_hook([mesh, placements](const at::Tensor& grad) -> at::Tensor {
      if (is_dtensor(grad) && get_spec(grad).placements != placements) return redistribute(grad, mesh, placements);
      return grad;
    });
  }
  return result;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> _get_box(const at::Tensor& dtensor) {
  const DeviceMesh& mesh = mesh_1d(dtensor, "_get_box");
  const Placement& p = get_spec(dtensor).placements[0];
  std::vector<int64_t> offsets(static_cast<size_t>(dtensor.dim()), 0);
  if (is_shard(p)) {
    const int64_t d = std::get<Shard>(p).dim;
    const int64_t k = mesh.size(0);
    offsets[static_cast<size_t>(d)] = (dtensor.size(d) + k - 1) / k;
  }
  return {offsets, local_tensor(dtensor).sizes().vec()};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> _get_box_for(const at::Tensor& dtensor, int64_t idx) {
  const DeviceMesh& mesh = mesh_1d(dtensor, "_get_box_for");
  const Placement& p = get_spec(dtensor).placements[0];
  std::vector<int64_t> offsets(static_cast<size_t>(dtensor.dim()), 0);
  std::vector<int64_t> sizes = dtensor.sizes().vec();
  if (is_shard(p)) {
    const int64_t d = std::get<Shard>(p).dim;
    const auto so = shard_size_and_offset(dtensor.size(d), mesh.size(0), idx);
    offsets[static_cast<size_t>(d)] = so.second;
    sizes[static_cast<size_t>(d)] = so.first;
  } else {
    TORCH_CHECK(idx == 0, "_get_box_for: a ", to_string(p), " DTensor has one box, index 0, not ", idx);
  }
  return {offsets, sizes};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> _get_local_box(const at::Tensor& dtensor) {
  const DeviceMesh& mesh = mesh_1d(dtensor, "_get_local_box");
  const auto& coord = mesh.get_coordinate();
  TORCH_CHECK(coord.has_value(), "_get_local_box: rank ", mesh.get_rank(), " is not in ", mesh.to_string());
  return _get_box_for(dtensor, is_shard(get_spec(dtensor).placements[0]) ? (*coord)[0] : 0);
}

sharded::ShardMetadata _create_shard_md_from_dt(const at::Tensor& dtensor, int current_rank) {
  auto box = _get_local_box(dtensor);
  return sharded::ShardMetadata(box.first, box.second,
                                sharded::RemoteDevice(current_rank, local_tensor(dtensor).device()));
}

// NOTE: [Scapegoat rank]
// FSDP1 needs a ShardedTensor that covers the whole parameter although this rank knows only its
// own TP shard, without communicating. So the metadata lists every box of the parameter, places
// this rank's box on this rank and every other box on one other rank, the "scapegoat" (group
// rank 0, or 1 when this rank is 0), whose data nobody reads here. Each rank's metadata is thus
// its own: valid for this rank's local shard, not a layout the ranks agree on.
sharded::ShardedTensorMetadata _create_sharded_tensor_md_from_dt(const at::Tensor& dtensor,
                                                                  const comm::GroupPtr& dt_pg) {
  const DeviceMesh& mesh = mesh_1d(dtensor, "_create_sharded_tensor_md_from_dt");
  TORCH_CHECK(dt_pg != nullptr && dt_pg->size() == mesh.size(0), "_create_sharded_tensor_md_from_dt: the group must be "
              "that of ", mesh.to_string());
  const int my_rank = dt_pg->rank();
  const int scapegoat_rank = my_rank > 0 ? 0 : 1;
  const bool sharded = is_shard(get_spec(dtensor).placements[0]);
  const int shard_count = sharded ? dt_pg->size() : 1;
  const int mine = sharded ? static_cast<int>((*mesh.get_coordinate())[0]) : 0;
  const c10::Device device = local_tensor(dtensor).device();
  sharded::ShardedTensorMetadata md;
  for (int i = 0; i < shard_count; ++i) {
    auto box = _get_box_for(dtensor, i);
    const int owner = global_rank(*dt_pg, i == mine ? my_rank : scapegoat_rank);
    md.shards_metadata.emplace_back(box.first, box.second, sharded::RemoteDevice(owner, device));
  }
  md.size = dtensor.sizes().vec();
  md.tensor_properties.dtype = dtensor.scalar_type();
  md.tensor_properties.layout = c10::kStrided;
  md.tensor_properties.requires_grad = dtensor.requires_grad();
  return md;
}

comm::GroupPtr _get_dt_pg(const at::Tensor& dtensor) { return mesh_1d(dtensor, "_get_dt_pg").get_group(0); }

std::shared_ptr<const sharded::ShardingSpec> _rewrite_spec_if_needed(
    const std::shared_ptr<const sharded::ShardingSpec>& spec, const at::Tensor& tensor, int rank) {
  const auto* chunk = dynamic_cast<const sharded::ChunkShardingSpec*>(spec.get());
  if (chunk == nullptr) return spec;
  std::vector<sharded::RemoteDevice> placements = chunk->placements();
  bool rewrite = false;
  for (auto& p : placements) {
    if (p.rank() == rank && p.device() != tensor.device()) {
      p = sharded::RemoteDevice(rank, tensor.device());
      rewrite = true;
    }
  }
  if (!rewrite) return spec;
  return std::make_shared<const sharded::ChunkShardingSpec>(chunk->dim(), std::move(placements));
}

sharded::ShardedTensor _chunk_tensor(const at::Tensor& tensor, int rank, int world_size, int num_devices_per_node,
                                     const comm::GroupPtr& pg) {
  if (!is_dtensor(tensor)) return _create_chunk_sharded_tensor(tensor, rank, world_size, num_devices_per_node, pg);
  mesh_1d(tensor, "_chunk_tensor");
  // NOTE: [Nested ShardedTensors]: the TP shard chunked over the FSDP group, inside a
  // ShardedTensor over the TP group that covers the parameter (NOTE: [Scapegoat rank]).
  sharded::ShardedTensor inner =
      _create_chunk_sharded_tensor(local_tensor(tensor), rank, world_size, num_devices_per_node, pg);
  const comm::GroupPtr dt_pg = _get_dt_pg(tensor);
  std::vector<sharded::Shard> shards;
  shards.emplace_back(inner, _create_shard_md_from_dt(tensor, global_rank(*dt_pg, dt_pg->rank())));
  sharded::ShardedTensorMetadata md = _create_sharded_tensor_md_from_dt(tensor, dt_pg);
  md.tensor_properties.requires_grad = false;
  return sharded::ShardedTensor::init_from_local_shards_and_global_metadata(std::move(shards), std::move(md), dt_pg);
}

sharded::ShardedTensor _chunk_tensor(const sharded::ShardedTensor& tensor, int rank, int world_size,
                                     int num_devices_per_node, const comm::GroupPtr& pg) {
  TORCH_CHECK(tensor.local_shards().size() == 1, "_chunk_tensor: a ShardedTensor parameter must have exactly one local "
              "shard, this rank has ", tensor.local_shards().size());
  sharded::ShardedTensor inner =
      _create_chunk_sharded_tensor(tensor.local_tensor(), rank, world_size, num_devices_per_node, pg);
  std::vector<sharded::Shard> shards;
  shards.emplace_back(inner, tensor.local_shards()[0].metadata);
  sharded::ShardedTensorMetadata md = tensor.metadata();
  md.tensor_properties.requires_grad = false;
  return sharded::ShardedTensor::init_from_local_shards_and_global_metadata(std::move(shards), std::move(md),
                                                                            tensor.process_group());
}

at::Tensor _chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh) {
  return _chunk_dtensor(tensor, rank, device_mesh, device_mesh.get_parent_mesh());
}

at::Tensor _chunk_dtensor(const at::Tensor& tensor, int /*rank*/, const DeviceMesh& device_mesh,
                          const std::optional<DeviceMesh>& parent_mesh) {
  TORCH_CHECK(parent_mesh.has_value(), "No parent device_mesh is found for FSDP device_mesh. (",
              device_mesh.to_string(), " was not sliced from a mesh: build the FSDP mesh as mesh[\"dp\"] of a 2-D mesh)");
  TORCH_CHECK(parent_mesh->ndim() >= 2, "Found parent device_mesh of ndim=", parent_mesh->ndim(),
              ", but meshes must be at least 2D. (", parent_mesh->to_string(), ")");
  const DeviceMesh& parent = *parent_mesh;
  const auto n = static_cast<size_t>(parent.ndim());
  std::vector<Placement> replicate(n, Replicate{});
  std::vector<Placement> shard(n, Replicate{});
  if (!is_dtensor(tensor)) {
    // Not tensor parallel: replicated over tp, sharded over the FSDP (outer) dim.
    shard[0] = Shard{0};
    at::Tensor t = tensor.detach().clone();
    return redistribute(from_local(t, parent, replicate), parent, shard);
  }
  // Tensor parallel: sharded over tp first, then over FSDP (TP inner, FSDP outer); HSDP adds
  // Replicate in front.
  const DTensorSpec& spec = get_spec(tensor);
  TORCH_CHECK(spec.mesh.ndim() == 1, "_chunk_dtensor: a tensor-parallel parameter must be on a 1-D mesh, got ",
              spec.mesh.to_string());
  const Placement tp_placement = spec.placements[0];
  replicate.back() = tp_placement;
  shard[n - 2] = Shard{0};
  shard.back() = tp_placement;
  at::Tensor local = local_tensor(tensor).detach().clone();
  return redistribute(from_local(local, parent, replicate, FromLocalOptions::contiguous(tensor.sizes().vec())), parent, shard);
}

std::pair<sharded::ShardedTensor, std::vector<sharded::Shard>> _pre_load_state_dict(const sharded::ShardedTensor& tensor) {
  const auto& shards = tensor.local_shards();
  if (shards.size() == 1 && shards[0].is_nested()) {
    const sharded::ShardedTensor& inner = *shards[0].nested;
    return {inner, inner.local_shards()};
  }
  return {tensor, shards};
}

at::Tensor _all_gather_dtensor(const at::Tensor& tensor, const std::optional<DeviceMesh>& parent_mesh) {
  TORCH_CHECK(is_dtensor(tensor), "_all_gather_dtensor: expected a DTensor");
  const DTensorSpec& spec = get_spec(tensor);
  TORCH_CHECK(parent_mesh.has_value() && *parent_mesh == spec.mesh, "_all_gather_dtensor: parent_mesh ",
              parent_mesh ? parent_mesh->to_string() : std::string("none"), " is not the tensor's mesh ",
              spec.mesh.to_string());
  // FSDP + TP: [Shard(0), tp] -> [Replicate(), tp]; HSDP + TP: [R, S(0), tp] -> [R, R, tp].
  std::vector<Placement> placements = spec.placements;
  for (size_t i = 0; i + 1 < placements.size(); ++i) placements[i] = Replicate{};
  return to_local(redistribute(tensor, spec.mesh, placements));
}

bool _is_nested_tensor(const sharded::ShardedTensor& value) {
  const auto& shards = value.local_shards();
  if (shards.empty()) return false;
  if (shards[0].is_nested()) return true;
  TORCH_CHECK(!is_dtensor(shards[0].tensor), "Cannot handle DTensor nested insided ShardedTensor");
  return false;
}

bool _is_nested_tensor(const at::Tensor& value) {
  TORCH_CHECK(!(is_dtensor(value) && is_dtensor(local_tensor(value))), "Cannot handle nested DTensor");
  return false;
}

// ---- DTensorExtensions ------------------------------------------------------------------------------

std::pair<at::Tensor, ParamExtension> DTensorExtensions::pre_flatten_transform(const at::Tensor& tensor) const {
  return _flatten_tensor(tensor);
}

at::Tensor DTensorExtensions::post_unflatten_transform(const at::Tensor& tensor,
                                                       const ParamExtension& param_extension) const {
  TORCH_CHECK(param_extension.has_value(), "DTensorExtensions.post_unflatten_transform: no DTensorSpec for the tensor "
              "(pre_flatten_transform gave none: it was not a DTensor)");
  return _unflatten_tensor(tensor, *param_extension);
}

sharded::ShardedTensor DTensorExtensions::chunk_tensor(const at::Tensor& tensor, int rank, int world_size,
                                                       int num_devices_per_node, const comm::GroupPtr& pg,
                                                       std::optional<c10::Device> /*device*/) const {
  return _chunk_tensor(tensor, rank, world_size, num_devices_per_node, pg);
}

sharded::ShardedTensor DTensorExtensions::chunk_tensor(const sharded::ShardedTensor& tensor, int rank, int world_size,
                                                       int num_devices_per_node, const comm::GroupPtr& pg,
                                                       std::optional<c10::Device> /*device*/) const {
  return _chunk_tensor(tensor, rank, world_size, num_devices_per_node, pg);
}

at::Tensor DTensorExtensions::chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh) const {
  return _chunk_dtensor(tensor, rank, device_mesh);
}

std::pair<sharded::ShardedTensor, std::vector<sharded::Shard>> DTensorExtensions::pre_load_state_dict_transform(
    const sharded::ShardedTensor& tensor) const {
  return _pre_load_state_dict(tensor);
}

at::Tensor DTensorExtensions::all_gather_dtensor(const at::Tensor& tensor,
                                                 const std::optional<DeviceMesh>& parent_mesh) const {
  return _all_gather_dtensor(tensor, parent_mesh);
}

// ---- set_fsdp_extensions ------------------------------------------------------------------------------

namespace {
thread_local std::shared_ptr<const FSDPExtensions> t_extensions;  // per rank (thread ranks too)
}  // namespace

void set_fsdp_extensions(std::shared_ptr<const FSDPExtensions> extensions) { t_extensions = std::move(extensions); }
std::shared_ptr<const FSDPExtensions> get_fsdp_extensions() { return t_extensions; }

// ---- ext_* ------------------------------------------------------------------------------------------

std::pair<at::Tensor, ParamExtension> ext_pre_flatten_transform(const at::Tensor& tensor, const FSDPExtensions* ext) {
  if (ext != nullptr) {
    auto r = ext->pre_flatten_transform(tensor);
    if (r.second.has_value()) return r;
  }
  return {tensor, std::nullopt};
}

at::Tensor ext_post_unflatten_transform(const at::Tensor& tensor, const ParamExtension& param_extension,
                                        const FSDPExtensions* ext) {
  if (ext != nullptr && param_extension.has_value()) return ext->post_unflatten_transform(tensor, param_extension);
  return tensor;
}

sharded::ShardedTensor ext_chunk_tensor(const at::Tensor& tensor, int rank, int world_size, int num_devices_per_node,
                                        const comm::GroupPtr& pg, const FSDPExtensions* ext) {
  if (ext != nullptr) return ext->chunk_tensor(tensor, rank, world_size, num_devices_per_node, pg);
  return _create_chunk_sharded_tensor(tensor, rank, world_size, num_devices_per_node, pg);
}

at::Tensor ext_chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh,
                             const FSDPExtensions* ext) {
  if (ext != nullptr) return ext->chunk_dtensor(tensor, rank, device_mesh);
  return _create_chunk_dtensor(tensor, rank, device_mesh);
}

std::pair<sharded::ShardedTensor, std::vector<sharded::Shard>> ext_pre_load_state_dict_transform(
    const sharded::ShardedTensor& tensor, const FSDPExtensions* ext) {
  if (ext != nullptr) return ext->pre_load_state_dict_transform(tensor);
  return {tensor, tensor.local_shards()};
}

at::Tensor ext_all_gather_dtensor(const at::Tensor& tensor, const std::optional<DeviceMesh>& parent_mesh,
                                  const FSDPExtensions* ext) {
  if (ext != nullptr) return ext->all_gather_dtensor(tensor, parent_mesh);
  return _all_gather_dtensor_last_dim(tensor, parent_mesh);
}

}  // namespace fsdp
}  // namespace dtensor
