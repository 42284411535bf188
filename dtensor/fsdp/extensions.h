// dtensor/fsdp/extensions.h
//
// The extension point through which FSDP handles parameters that tensor parallel already
// sharded (torch/distributed/tensor/parallel/fsdp.py, and
// torch/distributed/fsdp/_fsdp_extensions.py, _shard_utils.py, tensor/parallel/
// _data_parallel_utils.py). FSDPExtensions is the interface; DTensorExtensions implements it
// for DTensor (and ShardedTensor) parameters; the ext_* functions are what FSDP calls, with
// the plain-FSDP behaviour when no extension is given.
//
//   auto mesh = dtensor::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
//   dtensor::fsdp::DTensorExtensions ext;
//   // A TP parameter (Shard(0) over "tp") as a 2-D DTensor (Shard(0), Shard(0)) on (dp, tp):
//   at::Tensor p2d = ext.chunk_dtensor(tp_param, /*rank=*/0, mesh["dp"]);            // collective
//   at::Tensor full_tp = ext.all_gather_dtensor(p2d, mesh);  // this rank's TP shard, collective
//   // FSDP1-style state dict entry: a ShardedTensor over "tp" whose local shard is the
//   // ShardedTensor of this TP shard chunked over "dp" (NOTE: [Nested ShardedTensors]).
//   sharded::ShardedTensor st = ext.chunk_tensor(tp_param, dp_rank, 2, 0, mesh["dp"].get_group(0));
//
// Which calls are collective is said on each. Every rank of the groups involved must make the
// same calls with tensors of the same global shape.
//
// Differences from PyTorch, all deliberate:
// - _get_box / _get_box_for / _get_local_box give each shard its own torch.chunk offset and size
//   (PyTorch uses floor(size / n) as the offset step and the local size for every shard, wrong
//   for uneven shards).
// - _create_sharded_tensor_md_from_dt places the current rank's own box on it and every other
//   box on the scapegoat rank (PyTorch places box 0 on the current rank, which is its own box on
//   group rank 0 only); placements name global ranks (dtensor-cpp's ShardMetadata), the
//   scapegoat being group rank 0, or 1 for group rank 0.
// - _chunk_dtensor passes the TP parameter's global shape to from_local, so uneven TP shards
//   keep their global size.
// - No streams: DTensorExtensions has no device handle / compute stream (CPU and the harness's
//   CUDA path run on the current stream).
#pragma once

#include "dtensor/comm/group.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"
#include "dtensor/sharded/sharded_tensor.h"
#include "dtensor/sharded/sharding_spec.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace dtensor {
namespace fsdp {

// What pre_flatten_transform hands to post_unflatten_transform: the DTensor's spec, or nothing
// for a plain tensor (PyTorch: Optional[Any]).
using ParamExtension = std::optional<DTensorSpec>;

// PyTorch's FSDPExtensions (an abstract base, one extension per process).
class FSDPExtensions {
 public:
  virtual ~FSDPExtensions() = default;
  // Not collective. The plain tensor FSDP flattens for `tensor`, and what rebuilds it.
  virtual std::pair<at::Tensor, ParamExtension> pre_flatten_transform(const at::Tensor& tensor) const = 0;
  // Not collective. The parameter rebuilt from the plain `tensor` FSDP unflattened.
  virtual at::Tensor post_unflatten_transform(const at::Tensor& tensor, const ParamExtension& param_extension) const = 0;
  // Not collective (no data moves; the result's metadata is built locally). `tensor` chunked
  // along dim 0 over `pg` (of which this rank is group rank `rank`, `world_size` ranks).
  virtual sharded::ShardedTensor chunk_tensor(const at::Tensor& tensor, int rank, int world_size,
                                              int num_devices_per_node, const comm::GroupPtr& pg,
                                              std::optional<c10::Device> device = std::nullopt) const = 0;
  // The same for a ShardedTensor (TP done with shard_module): a nested ShardedTensor.
  virtual sharded::ShardedTensor chunk_tensor(const sharded::ShardedTensor& tensor, int rank, int world_size,
                                              int num_devices_per_node, const comm::GroupPtr& pg,
                                              std::optional<c10::Device> device = std::nullopt) const = 0;
  // Collective over the parent mesh of `device_mesh`. `tensor` sharded on dim 0 over the FSDP
  // mesh `device_mesh`, as a DTensor on its parent mesh.
  virtual at::Tensor chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh) const = 0;
  // Not collective. The tensor and shards a state-dict load copies into.
  virtual std::pair<sharded::ShardedTensor, std::vector<sharded::Shard>> pre_load_state_dict_transform(
      const sharded::ShardedTensor& tensor) const = 0;
  // Collective over `tensor`'s mesh. Its local tensor with every mesh dim but the last (TP)
  // gathered.
  virtual at::Tensor all_gather_dtensor(const at::Tensor& tensor, const std::optional<DeviceMesh>& parent_mesh) const = 0;
};

// PyTorch's DTensorExtensions: tensor/parallel/fsdp.py's helpers below.
class DTensorExtensions : public FSDPExtensions {
 public:
  std::pair<at::Tensor, ParamExtension> pre_flatten_transform(const at::Tensor& tensor) const override;
  at::Tensor post_unflatten_transform(const at::Tensor& tensor, const ParamExtension& param_extension) const override;
  sharded::ShardedTensor chunk_tensor(const at::Tensor& tensor, int rank, int world_size, int num_devices_per_node,
                                      const comm::GroupPtr& pg,
                                      std::optional<c10::Device> device = std::nullopt) const override;
  sharded::ShardedTensor chunk_tensor(const sharded::ShardedTensor& tensor, int rank, int world_size,
                                      int num_devices_per_node, const comm::GroupPtr& pg,
                                      std::optional<c10::Device> device = std::nullopt) const override;
  at::Tensor chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh) const override;
  std::pair<sharded::ShardedTensor, std::vector<sharded::Shard>> pre_load_state_dict_transform(
      const sharded::ShardedTensor& tensor) const override;
  at::Tensor all_gather_dtensor(const at::Tensor& tensor, const std::optional<DeviceMesh>& parent_mesh) const override;
};

// ---- Which extension fully_shard uses (PyTorch: _set_fsdp_extensions, _init_extension) ------

// Not collective. The extension fully_shard uses on this rank (per process, or per rank thread
// under the thread harness) when FullyShardOptions::extensions is not given; nullptr restores
// the default. fully_shard resolves it once, when it is called: options.extensions, else this
// one, else DTensorExtensions when the FSDP mesh was sliced from a larger mesh (FSDP x TP,
// PyTorch's _init_extension), else none (plain FSDP, a DTensor parameter is then refused).
void set_fsdp_extensions(std::shared_ptr<const FSDPExtensions> extensions);
std::shared_ptr<const FSDPExtensions> get_fsdp_extensions();

// ---- What FSDP calls (PyTorch's _ext_* functions): `ext` may be nullptr (plain FSDP) ----------

std::pair<at::Tensor, ParamExtension> ext_pre_flatten_transform(const at::Tensor& tensor, const FSDPExtensions* ext);
at::Tensor ext_post_unflatten_transform(const at::Tensor& tensor, const ParamExtension& param_extension,
                                        const FSDPExtensions* ext);
// Default: _create_chunk_sharded_tensor.
sharded::ShardedTensor ext_chunk_tensor(const at::Tensor& tensor, int rank, int world_size, int num_devices_per_node,
                                        const comm::GroupPtr& pg, const FSDPExtensions* ext);
// Default: _create_chunk_dtensor.
at::Tensor ext_chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh,
                             const FSDPExtensions* ext);
// Default: the tensor and its local shards.
std::pair<sharded::ShardedTensor, std::vector<sharded::Shard>> ext_pre_load_state_dict_transform(
    const sharded::ShardedTensor& tensor, const FSDPExtensions* ext);
// Default: _all_gather_dtensor_last_dim (the last mesh dim gathered: plain FSDP / HSDP).
at::Tensor ext_all_gather_dtensor(const at::Tensor& tensor, const std::optional<DeviceMesh>& parent_mesh,
                                  const FSDPExtensions* ext);

// ---- Plain FSDP's defaults (torch/distributed/fsdp/_shard_utils.py) ------------------------------

// Not collective. `tensor` chunked along dim 0 like torch.chunk over the `world_size` ranks of
// `pg`: group rank `rank` keeps a copy of its chunk (none when torch.chunk gives fewer chunks
// than ranks); chunk r is placed on "rank:<global rank of r>/<device>" (device: `device`, else
// that of `tensor`; CUDA index = global rank % num_devices_per_node). Not requiring grad.
sharded::ShardedTensor _create_chunk_sharded_tensor(const at::Tensor& tensor, int rank, int world_size,
                                                    int num_devices_per_node, const comm::GroupPtr& pg,
                                                    std::optional<c10::Device> device = std::nullopt);
// Collective over `device_mesh`. `tensor` (every rank's copy) as a DTensor sharded on dim 0 over
// the last mesh dim, replicated over the others.
at::Tensor _create_chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh);
// Collective. The local tensor of `tensor` with its last mesh dim gathered (throws unless
// `root_mesh` is the tensor's mesh).
at::Tensor _all_gather_dtensor_last_dim(const at::Tensor& tensor, const std::optional<DeviceMesh>& root_mesh);

// ---- The helpers of PyTorch's tensor/parallel/fsdp.py ---------------------------------------

// Not collective. (local tensor, spec) of a DTensor (the local tensor made to require grad, as
// PyTorch does, when it is a leaf); (tensor, nullopt) otherwise.
std::pair<at::Tensor, ParamExtension> _flatten_tensor(const at::Tensor& tensor);
// Not collective. The DTensor of `spec` (shape and stride included) whose local tensor is
// `tensor`; when it requires grad, a hook redistributes its gradient to `spec`'s placements
// (PyTorch's grad_layout_hook: a Partial gradient of a Replicate parameter is reduced).
at::Tensor _unflatten_tensor(const at::Tensor& tensor, const DTensorSpec& spec);

// Not collective. For a DTensor on a 1-D mesh (throws otherwise, naming the mesh):
// _get_box: the offset step of one shard (torch.chunk's ceil(size / n) on the shard dim, 0
// elsewhere) and this rank's local size; _get_box_for: (offsets, sizes) of shard `idx`;
// _get_local_box: those of this rank's shard.
std::pair<std::vector<int64_t>, std::vector<int64_t>> _get_box(const at::Tensor& dtensor);
std::pair<std::vector<int64_t>, std::vector<int64_t>> _get_box_for(const at::Tensor& dtensor, int64_t idx);
std::pair<std::vector<int64_t>, std::vector<int64_t>> _get_local_box(const at::Tensor& dtensor);
// Not collective. This rank's box of a 1-D DTensor placed on "rank:<current_rank>/<device>"
// (current_rank: a global rank).
sharded::ShardMetadata _create_shard_md_from_dt(const at::Tensor& dtensor, int current_rank);
// Not collective. Metadata covering the whole tensor in which only this rank's box is placed
// on this rank (NOTE: [Scapegoat rank]): a Shard placement gives one box per rank of `dt_pg`,
// Replicate one box, the whole tensor, on this rank.
sharded::ShardedTensorMetadata _create_sharded_tensor_md_from_dt(const at::Tensor& dtensor,
                                                                  const comm::GroupPtr& dt_pg);
// The group of a 1-D DTensor's mesh.
comm::GroupPtr _get_dt_pg(const at::Tensor& dtensor);
// Not collective. `spec` with this rank's placements moved to `tensor`'s device (a
// ChunkShardingSpec; any other spec is returned as is). `rank`: a global rank.
std::shared_ptr<const sharded::ShardingSpec> _rewrite_spec_if_needed(
    const std::shared_ptr<const sharded::ShardingSpec>& spec, const at::Tensor& tensor, int rank);
// Not collective. FSDP1's chunk of a parameter over `pg` as a ShardedTensor:
// - a plain tensor: _create_chunk_sharded_tensor;
// - a DTensor on a 1-D (TP) mesh: a ShardedTensor over the TP group covering the parameter
//   (_create_sharded_tensor_md_from_dt) whose local shard is this rank's TP shard chunked over
//   `pg` (a nested ShardedTensor, NOTE: [Nested ShardedTensors]);
// - a ShardedTensor with one local shard (TP by shard_module): the same metadata, its local
//   shard chunked over `pg`, nested.
sharded::ShardedTensor _chunk_tensor(const at::Tensor& tensor, int rank, int world_size, int num_devices_per_node,
                                     const comm::GroupPtr& pg);
sharded::ShardedTensor _chunk_tensor(const sharded::ShardedTensor& tensor, int rank, int world_size,
                                     int num_devices_per_node, const comm::GroupPtr& pg);
// Collective over the parent mesh of the FSDP mesh `device_mesh` (a slice of a mesh of 2 or
// more dims; otherwise "No parent device_mesh is found for FSDP device_mesh." or "Found parent
// device_mesh of ndim=1, but meshes must be at least 2D."). A plain tensor becomes
// (Shard(0), Replicate, ...) on the parent; a TP DTensor (on the last mesh dim) becomes
// (Replicate..., Shard(0), tp_placement). `parent_mesh` overrides the parent lookup (PyTorch's
// _mesh_resources), e.g. to check a mesh pair slicing cannot produce.
at::Tensor _chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh);
at::Tensor _chunk_dtensor(const at::Tensor& tensor, int rank, const DeviceMesh& device_mesh,
                          const std::optional<DeviceMesh>& parent_mesh);
// Not collective. When the only local shard of `tensor` is a nested ShardedTensor: that inner
// tensor and its local shards; otherwise `tensor` and its local shards.
std::pair<sharded::ShardedTensor, std::vector<sharded::Shard>> _pre_load_state_dict(const sharded::ShardedTensor& tensor);
// Collective over `tensor`'s mesh (which `parent_mesh` must be). Every mesh dim but the last
// gathered to Replicate; the local tensor (FSDP x TP: this rank's TP shard).
at::Tensor _all_gather_dtensor(const at::Tensor& tensor, const std::optional<DeviceMesh>& parent_mesh);
// A ShardedTensor whose first local shard is a nested ShardedTensor. Throws "Cannot handle
// DTensor nested insided ShardedTensor" (PyTorch's words) when that shard's tensor is a DTensor.
bool _is_nested_tensor(const sharded::ShardedTensor& value);
// A DTensor whose local tensor is a DTensor throws "Cannot handle nested DTensor"; any other
// tensor is not nested.
bool _is_nested_tensor(const at::Tensor& value);

}  // namespace fsdp
}  // namespace dtensor
