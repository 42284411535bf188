// dtensor/sharded/sharded_tensor.h
//
// ShardedTensor: a tensor cut into shards held by the ranks of a group, each rank holding its
// local shards and everyone knowing the global metadata (torch.distributed._shard.
// sharded_tensor.ShardedTensor).
//
//   ChunkShardingSpec spec(0, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
//   ShardedTensor st = shard_tensor(at::randn({10, 4}), spec);   // collective (api.h)
//   st.local_tensor();                        // this rank's rows
//   at::Tensor full = st.gather(/*dst=*/0);   // collective: the whole tensor on rank 0
//   st.reshard(ChunkShardingSpec(1, ...));    // collective, in place
//
// A ShardedTensor is a cheap handle to shared state (like a Python object): copies see the
// same shards, and reshard changes them for every copy. Calls marked "collective" must be
// made by every rank of the tensor's group.
//
// NOTE: [ShardedTensor and DTensor]
// A ShardedTensor is not an at::Tensor: aten ops do not run on it. A ShardedTensor that is a
// torch.chunk layout with one shard per rank (what ChunkShardingSpec::shard makes) is the
// same thing as a DTensor with placement Shard(dim) on a 1-D DeviceMesh whose ranks are the
// spec's placements in order; to_dtensor / from_dtensor convert without copying the shard.
// That is how ShardedTensor parameters live in torch::nn modules (shard_parameter, api.h) and
// how modules with them run: through DTensor's sharding propagation.
#pragma once

#include "dtensor/comm/group.h"
#include "dtensor/sharded/metadata.h"
#include "dtensor/sharded/sharding_spec.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

namespace dtensor {

class DeviceMesh;

namespace sharded {

class ShardedTensor;

// One local shard: the tensor and where it sits (torch.distributed._shard.sharded_tensor.Shard).
//
// NOTE: [Nested ShardedTensors]
// FSDP over a module that tensor parallel sharded with shard_module (PyTorch's FSDP extensions,
// dtensor/fsdp/extensions.h: _chunk_tensor) builds a ShardedTensor whose local shard is itself
// a ShardedTensor: the outer one says where this rank's TP shard sits in the parameter, the
// inner one chunks that TP shard over the FSDP group. Python stores the inner ShardedTensor in
// Shard.tensor; here Shard.tensor is an at::Tensor, so a nested shard keeps the inner tensor
// in `nested` and leaves `tensor` undefined. Only construction from local shards and global
// metadata (not collective) and the accessors take nested shards; local_tensor(), gather,
// reshard, to_dtensor and state() refuse them, naming the way out (_pre_load_state_dict
// unwraps the inner tensor). PyTorch's helpers (tensor/parallel/fsdp.py) nest on every rank of the group, so the
// collectives refuse on every rank.
struct Shard {
  // Throws unless the tensor's sizes are the metadata's and its device is the placement's.
  Shard(at::Tensor tensor, ShardMetadata metadata);
  // A nested shard (NOTE: [Nested ShardedTensors]). Throws unless the inner tensor's global
  // size is the metadata's sizes.
  Shard(ShardedTensor nested, ShardMetadata metadata);
  // A shard of `tensor` at `shard_offsets`, placed on "rank:<rank>/<tensor's device>".
  static Shard from_tensor_and_offsets(const at::Tensor& tensor, std::vector<int64_t> shard_offsets, int rank);

  bool is_nested() const { return nested != nullptr; }

  at::Tensor tensor;  // undefined for a nested shard
  ShardMetadata metadata;
  std::shared_ptr<const ShardedTensor> nested;  // set for a nested shard
};

// What a ShardedTensor saves (Python's __getstate__): shards, metadata, spec and the ranks it
// was saved under. Loading (from_state) checks them against the current group.
struct ShardedTensorState {
  std::vector<Shard> local_shards;
  ShardedTensorMetadata metadata;
  std::shared_ptr<const ShardingSpec> sharding_spec;
  int local_rank = 0;
  int global_rank = 0;
  int local_world_size = 1;
  int global_world_size = 1;
};

class ShardedTensor {
 public:
  // Not collective. `local_shards` must be exactly this rank's shards of `metadata` (the
  // entries placed on its global rank); each must be contiguous, strided and match the
  // metadata's sizes, device and properties (dtype, requires_grad, pin_memory); the shards of
  // `metadata` must not overlap and must cover the tensor. Errors name the rank and the shard.
  // `sharding_spec`: nullptr infers a ChunkShardingSpec when the shards form one.
  // (PyTorch: ShardedTensor._init_from_local_shards_and_global_metadata.)
  static ShardedTensor init_from_local_shards_and_global_metadata(
      std::vector<Shard> local_shards, ShardedTensorMetadata metadata, comm::GroupPtr group = nullptr,
      std::shared_ptr<const ShardingSpec> sharding_spec = nullptr);

  // Collective. Every rank passes its local shards (possibly none) and the same global size;
  // the global metadata is gathered and checked: ranks disagreeing on size, dtype,
  // requires_grad or pin_memory, overlapping shards or shards not covering the tensor raise
  // the same error on every rank, naming the ranks or shards; a rank whose own shards are
  // inconsistent (placement on another rank, wrong device, sizes that differ from the tensor,
  // non-contiguous) makes every rank raise, naming that rank. (PyTorch:
  // ShardedTensor._init_from_local_shards.)
  static ShardedTensor init_from_local_shards(std::vector<Shard> local_shards, std::vector<int64_t> global_size,
                                              comm::GroupPtr group = nullptr);

  const std::vector<Shard>& local_shards() const;
  // The only local shard's tensor; throws unless this rank has exactly one.
  at::Tensor local_tensor() const;
  const ShardedTensorMetadata& metadata() const;
  const std::vector<int64_t>& size() const;
  int64_t size(int64_t dim) const;
  int64_t dim() const;
  at::ScalarType dtype() const;
  // The spec it was sharded with, or inferred (a ChunkShardingSpec when the shards form one,
  // else an EnumerableShardingSpec of the shards, as in PyTorch).
  std::shared_ptr<const ShardingSpec> sharding_spec() const;
  const comm::GroupPtr& process_group() const;

  // Collective. Rank `dst` (a group rank) receives the whole tensor into `out`, which it must
  // pass, with the tensor's size; other ranks must pass nothing. One gather of each rank's
  // shards, flattened and padded to the largest rank's. A wrong `out` raises on that rank
  // after it has taken part in the gather (so no rank is left waiting).
  void gather(int dst, const std::optional<at::Tensor>& out) const;
  // The same, allocating `out` on dst: the whole tensor there, an undefined tensor elsewhere.
  at::Tensor gather(int dst = 0) const;

  // Collective. Moves the data to the layout of `spec` (every rank passes an equal spec; this is
  // checked first, raising on every rank) with one all_to_all of the pieces where old and new
  // shards intersect, then replaces the local shards, metadata and spec in place. Any layout
  // works, several or no shards per rank included. Returns *this. (PyTorch: reshard, which
  // needs one shard per rank.)
  ShardedTensor& reshard(const ShardingSpec& spec);

  // ---- NOTE: [ShardedTensor and DTensor] ----
  // True when to_dtensor works: a ChunkShardingSpec layout with exactly one shard on each rank
  // of the group.
  bool is_dtensor_compatible() const;
  // Collective when `mesh` is not given (it builds the 1-D mesh of the spec's ranks over the
  // group). The DTensor's local tensor shares memory with local_tensor(); it is a leaf that
  // requires grad when the shards do. Throws, saying why, unless is_dtensor_compatible() and,
  // with `mesh`, the mesh is that 1-D mesh.
  at::Tensor to_dtensor(const DeviceMesh* mesh = nullptr) const;
  // Not collective. A DTensor with placement Shard(d) on a 1-D mesh as a ShardedTensor over the
  // mesh's group with ChunkShardingSpec(d, the mesh's ranks): its local shard is the DTensor's
  // local tensor (shared memory, no autograd). Throws naming the placements otherwise.
  static ShardedTensor from_dtensor(const at::Tensor& dtensor);

  // ---- saving (Python's __getstate__ / __setstate__) ----
  ShardedTensorState state() const;
  // The ShardedTensor of a saved state, over get_current_process_group() (api.h: the group of
  // an enclosing LoadWithProcessGroupGuard, else the default group). Throws when the ranks or
  // the world size differ from those the state was saved with.
  static ShardedTensor from_state(ShardedTensorState state);

  struct State;  // internal

 private:
  explicit ShardedTensor(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// The ChunkShardingSpec `shards` form (the first dim along which they are exactly
// spec.build_metadata(size) for placements ordered by offset), else an EnumerableShardingSpec
// of them; nullptr for no shards, shards without placements or of another number of dims, or
// overlapping shards. (PyTorch: _infer_sharding_spec_from_shards_metadata.)
std::shared_ptr<const ShardingSpec> infer_sharding_spec(const std::vector<ShardMetadata>& shards,
                                                        const std::vector<int64_t>& size);

}  // namespace sharded
}  // namespace dtensor
