// dtensor/mesh/mesh_collectives.h
//
// Collectives along one dim of a DeviceMesh (PyTorch's torch.distributed.tensor's
// _collective_utils: mesh_broadcast, mesh_scatter), and an all_gather of values over every
// rank of a mesh (a mesh may hold a subset of the world, so the world group cannot be used).
//
//   // 2x2 mesh [[0, 1], [2, 3]]: along dim 1, rank 0 sends to 0/1 and rank 2 to 2/3.
//   dtensor::mesh_broadcast(t, mesh, /*mesh_dim=*/1);
//   dtensor::mesh_scatter(out, pieces, mesh, /*mesh_dim=*/0);   // pieces read on the source
//
// All are collective over the ranks of the mesh (every rank of the mesh calls them; ranks
// outside the mesh must not, and get an error if they do). Blocking: on return, outputs
// hold the result (PyTorch's async_op has no counterpart: our collectives are synchronous).
#pragma once

#include "dtensor/comm/object_collectives.h"
#include "dtensor/mesh/device_mesh.h"

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace dtensor {

// Every rank of this rank's slice along `mesh_dim` ends with the tensor of the rank at
// position `group_src` of that slice (default: the first). A meta tensor is left alone.
void mesh_broadcast(at::Tensor& tensor, const DeviceMesh& mesh, int64_t mesh_dim = 0, int group_src = 0);

// The rank at position `group_src` of this rank's slice along `mesh_dim` sends
// scatter_list[i] to the slice's i-th rank, which receives it into `output` (same shape and
// dtype on every rank). `scatter_list` is read on the source only and must hold one tensor
// per rank of the slice there. A meta `output` is left alone.
void mesh_scatter(at::Tensor& output, const std::vector<at::Tensor>& scatter_list, const DeviceMesh& mesh,
                  int64_t mesh_dim = 0, int group_src = 0);

namespace detail {
// Gathers `value` of every rank of the mesh, dim after dim (innermost first), into nested
// arrays; returns them flattened in row-major mesh order (element i: the value of the rank
// mesh.mesh().flatten()[i]). One all_gather per mesh dim.
std::vector<nlohmann::json> mesh_all_gather_json(const DeviceMesh& mesh, const nlohmann::json& value);
}  // namespace detail

// Collective over the ranks of `mesh`: element i is the value of the i-th rank of the mesh in
// row-major order (mesh.mesh().flatten()[i]), on every rank of the mesh.
template <class T>
std::vector<T> mesh_all_gather_object(const DeviceMesh& mesh, const T& value) {
  std::vector<T> out;
  for (const auto& j : detail::mesh_all_gather_json(mesh, nlohmann::json(value))) out.push_back(j.template get<T>());
  return out;
}

}  // namespace dtensor
