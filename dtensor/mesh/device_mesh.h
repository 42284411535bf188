// dtensor/mesh/device_mesh.h
//
// DeviceMesh: an N-D arrangement of the ranks of a group, with one communication group per
// mesh dim (DESIGN.md layer mesh/). The counterpart of torch.distributed.device_mesh.
//
//   // On every rank of a 4-rank world (collective):
//   dtensor::DeviceMesh mesh = dtensor::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
//   mesh.get_coordinate();             // rank 2 -> {1, 0}
//   mesh.get_group("tp")->all_reduce(t);   // over the ranks of this rank's row
//   dtensor::DeviceMesh tp = mesh["tp"];   // 1-D sub-mesh, no new collectives
//
// Ranks in the mesh are ranks of the `world` group (its group ranks, which are the global
// ranks when `world` is the default group). The mesh may hold a SUBSET of the world (as in
// PyTorch, `DeviceMesh("cpu", {0, 2})` on 4 ranks): every rank of `world` still builds it
// (construction is collective over `world`), but a rank outside it holds nothing:
// get_coordinate() is nullopt, it has no dim groups, and DTensors on the mesh have empty
// local tensors there (no communication, no computation on that rank).
//
// Group ranks follow the mesh: the group of dim d is created from the ranks of this rank's
// slice along d in mesh order, so `get_group(d)->rank() == get_local_rank(d) ==
// get_coordinate()[d]`, even for a mesh whose ranks are not in increasing order. Collectives
// over a dim group (all_gather_into, ...) therefore produce shards in coordinate order.
//
// A DeviceMesh is a cheap copyable handle to immutable shared state; copies compare equal
// and share their groups. It is safe to use from several threads.
#pragma once

#include "dtensor/comm/group.h"

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace dtensor {

class DeviceMesh {
 public:
  // Collective over `world` (default: comm::default_group()): every rank of `world` must
  // call it, in the same order relative to its other collectives, with the same
  // `device_type`, `mesh` and `mesh_dim_names`.
  //
  // `device_type`: "cpu" or "cuda"; "meta" on a fake world (comm::FakeGroup), whose local
  // tensors, factories and fully_shard buffers are then meta tensors (NOTE: [Fake world]).
  // `mesh`: integer tensor of world ranks, any number of dims >= 1, numel <= world->size(),
  // each rank at most once. `mesh_dim_names`: empty, or one unique name per mesh dim.
  //
  // Steps:
  //   1. Local argument checks (identical on every rank, so every rank throws alike).
  //   2. One all_reduce of a fingerprint of the arguments: if ranks passed different meshes,
  //      every rank throws instead of some ranks hanging in step 3.
  //   3. For each dim d, for each 1-D slice along d (the rows of mesh.swapdims(d, -1)
  //      flattened to 2-D, in order): world->new_subgroup(slice); the rank keeps the one
  //      it belongs to.
  DeviceMesh(std::string device_type, const at::Tensor& mesh,
             std::vector<std::string> mesh_dim_names = {}, comm::GroupPtr world = nullptr);

  const std::string& device_type() const;
  // Where this rank's local tensors live: cpu for a "cpu" mesh, this rank's CUDA device (the
  // current one, NOTE: [Rank devices] in dtensor/comm/device.h) for a "cuda" mesh.
  // distribute_tensor, from_local and the dtensor factories put local tensors there. A
  // "cuda" mesh on a machine without GPUs throws here, naming the mesh.
  c10::Device device() const;
  // The rank tensor: int64, contiguous, on CPU. Shared: do not modify it.
  const at::Tensor& mesh() const;
  int64_t ndim() const;
  // Number of ranks in the mesh.
  int64_t size() const;
  // Ranks along `dim` (negative dims count from the end).
  int64_t size(int64_t dim) const;
  std::vector<int64_t> shape() const;
  // Empty when the mesh was built without names.
  const std::vector<std::string>& mesh_dim_names() const;

  // This rank's position in the mesh, or nullopt if this rank is not in it.
  const std::optional<std::vector<int64_t>>& get_coordinate() const;
  // This rank's coordinate along a dim (== get_group(dim)->rank()). Without a dim: the only
  // dim of a 1-D mesh (an N-D mesh throws, as in PyTorch). A name may also be the name of a
  // flattened dim of this mesh's root (see _flatten).
  int64_t get_local_rank() const;
  int64_t get_local_rank(int64_t dim) const;
  int64_t get_local_rank(const std::string& mesh_dim_name) const;
  // The group of this rank's slice along a dim. Never null for a rank in the mesh; a rank
  // outside the mesh gets an error. Without a dim and by name: as get_local_rank.
  comm::GroupPtr get_group() const;
  comm::GroupPtr get_group(int64_t dim) const;
  comm::GroupPtr get_group(const std::string& mesh_dim_name) const;
  std::vector<comm::GroupPtr> get_all_groups() const;
  // The mesh dim called `mesh_dim_name`; throws naming the known names if there is none.
  int64_t get_mesh_dim(const std::string& mesh_dim_name) const;
  // This process's rank in `world` (the rank numbering used by mesh()).
  int get_rank() const;
  // The group the mesh was built over.
  const comm::GroupPtr& world() const;

  // Slicing (not collective): the sub-mesh over the given dims that contains this rank,
  // e.g. for mesh [[0, 1], [2, 3]] ('dp', 'tp'), rank 2 gets mesh["tp"] == [2, 3]. The
  // sub-mesh reuses this mesh's groups of those dims and remembers this mesh as its parent.
  // Names must be distinct and in this mesh's dim order (as in PyTorch); naming every dim
  // in order returns this mesh itself. On a root mesh (one built by the constructor) a name
  // may be a flattened dim made by _flatten (mesh_3d["dp_cp", "tp"]); its position in the
  // order is that of its last flattened dim. A rank outside the mesh gets an error.
  DeviceMesh operator[](const std::string& mesh_dim_name) const;
  DeviceMesh operator[](std::initializer_list<std::string> mesh_dim_names) const;
  DeviceMesh operator[](const std::vector<std::string>& mesh_dim_names) const;

  // The mesh this one was sliced from (nullopt for a mesh built by the constructor); for a
  // mesh made by _flatten, the root mesh.
  std::optional<DeviceMesh> get_parent_mesh() const;
  // For a sliced mesh, the parent's dim of each of this mesh's dims (-1 for a dim that is a
  // flattened dim of the parent); empty otherwise (also for a mesh made by _flatten).
  const std::vector<int64_t>& get_parent_mesh_dims() const;
  // The mesh at the top of the get_parent_mesh() chain (this mesh for a root mesh).
  DeviceMesh get_root_mesh() const;

  // PyTorch's DeviceMesh._flatten: a 1-D mesh over the ranks of this mesh's dims, in
  // row-major order, with a new group, registered on the root mesh under `mesh_dim_name`
  // (default: this mesh's dim names joined by "_"), so that root[mesh_dim_name],
  // root.get_group(mesh_dim_name) and get_local_rank(mesh_dim_name) find it. E.g. on
  // mesh_3d [[[0, 1], [2, 3]], [[4, 5], [6, 7]]] ('dp', 'cp', 'tp'),
  // mesh_3d["dp", "cp"]._flatten() is [0, 2, 4, 6] ('dp_cp',) on ranks 0, 2, 4, 6.
  // Collective over the world the first time a name is flattened (every rank of the world
  // calls it with the same dims and name; ranks that disagree all throw); later calls with
  // the same name and dims return the registered mesh without communication. A 1-D mesh
  // flattened under its own name is itself. Throws (on every rank, before communicating)
  // for a mesh without names, a name that is a dim of the root, or a name registered for
  // other dims. A rank outside the root mesh takes part in creating the groups, then throws.
  DeviceMesh _flatten(const std::string& mesh_dim_name = "") const;
  DeviceMesh flatten(const std::string& mesh_dim_name = "") const { return _flatten(mesh_dim_name); }

  // PyTorch's DeviceMesh._unflatten: this mesh with dim `dim` split into dims of sizes
  // `mesh_sizes` (their product is size(dim)) named `mesh_dim_names`, ranks in row-major order:
  // on the 1-D mesh [0..7] ('world',), _unflatten(0, {2, 2, 2}, {"dp", "cp", "tp"}) is
  // [[[0, 1], [2, 3]], [[4, 5], [6, 7]]] ('dp', 'cp', 'tp'). The other dims keep their names; the
  // result is a new root mesh over the same world (its groups are new: collective over the world,
  // as the constructor is). A root mesh only (the same on every rank); a negative dim counts
  // from the end. Throws, on every rank, for sizes whose product is not size(dim), names that
  // are not one per size or that clash with the other dims, or a mesh without names.
  DeviceMesh _unflatten(int64_t dim, const std::vector<int64_t>& mesh_sizes,
                        const std::vector<std::string>& mesh_dim_names) const;
  DeviceMesh _unflatten(const std::string& mesh_dim_name, const std::vector<int64_t>& mesh_sizes,
                        const std::vector<std::string>& mesh_dim_names) const {
    return _unflatten(get_mesh_dim(mesh_dim_name), mesh_sizes, mesh_dim_names);
  }

  // PyTorch's repr: DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))
  std::string to_string() const;

  // Same device type, rank tensor and dim names (groups and parents are not compared).
  bool operator==(const DeviceMesh& other) const;
  bool operator!=(const DeviceMesh& other) const { return !(*this == other); }

  // Consistent with operator==; computed once at construction.
  std::size_t hash() const;

  struct State;  // internal

 private:
  explicit DeviceMesh(std::shared_ptr<const State> state);
  DeviceMesh slice(const std::vector<std::string>& names) const;
  int64_t checked_dim(int64_t dim, const char* op) const;
  // A flattened dim registered on this mesh's root under `name`, or nullptr.
  std::shared_ptr<const State> find_flattened(const std::string& name) const;

  std::shared_ptr<const State> state_;
};

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh);
inline std::size_t hash_value(const DeviceMesh& mesh) { return mesh.hash(); }

// Collective over `world` (default: comm::default_group()): a mesh of shape `mesh_shape`
// holding ranks 0..n-1 in row-major order; n may be at most world->size() (ranks n.. are
// outside the mesh, as in PyTorch).
DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int64_t> mesh_shape,
                            std::vector<std::string> mesh_dim_names = {},
                            comm::GroupPtr world = nullptr);

}  // namespace dtensor

namespace std {
template <>
struct hash<dtensor::DeviceMesh> {
  size_t operator()(const dtensor::DeviceMesh& m) const noexcept { return m.hash(); }
};
}  // namespace std
