// dtensor/mesh/mesh_collectives.cpp: collectives along mesh dims (see the header).
#include "dtensor/mesh/mesh_collectives.h"

#include <c10/util/Exception.h>

#include <functional>

namespace dtensor {

namespace {

comm::GroupPtr dim_group(const DeviceMesh& mesh, int64_t mesh_dim, int group_src, const char* op) {
  TORCH_CHECK(mesh.get_coordinate().has_value(), op, ": rank ", mesh.get_rank(), " is not in ", mesh.to_string(),
              "; only the ranks of the mesh take part in its collectives");
  comm::GroupPtr g = mesh.get_group(mesh_dim);
  TORCH_CHECK(group_src >= 0 && group_src < g->size(), op, ": group_src ", group_src, " is not a rank of mesh dim ",
              mesh_dim, " of ", mesh.to_string(), " (valid: 0..", g->size() - 1, ")");
  return g;
}

}  // namespace

void mesh_broadcast(at::Tensor& tensor, const DeviceMesh& mesh, int64_t mesh_dim, int group_src) {
  TORCH_CHECK(tensor.defined(), "mesh_broadcast: the tensor is undefined");
  if (tensor.is_meta()) return;
  dim_group(mesh, mesh_dim, group_src, "mesh_broadcast")->broadcast(tensor, group_src);
}

void mesh_scatter(at::Tensor& output, const std::vector<at::Tensor>& scatter_list, const DeviceMesh& mesh,
                  int64_t mesh_dim, int group_src) {
  TORCH_CHECK(output.defined(), "mesh_scatter: the output tensor is undefined");
  if (output.is_meta()) return;
  comm::GroupPtr g = dim_group(mesh, mesh_dim, group_src, "mesh_scatter");
  if (g->rank() == group_src) {
    TORCH_CHECK(static_cast<int>(scatter_list.size()) == g->size(), "mesh_scatter: the source rank ",
                mesh.get_rank(), " passed ", scatter_list.size(), " tensors for the ", g->size(),
                " ranks of mesh dim ", mesh_dim, " of ", mesh.to_string(), "; pass one per rank");
    g->scatter(output, scatter_list, group_src);
  } else {
    g->scatter(output, {}, group_src);
  }
}

namespace detail {

std::vector<nlohmann::json> mesh_all_gather_json(const DeviceMesh& mesh, const nlohmann::json& value) {
  TORCH_CHECK(mesh.get_coordinate().has_value(), "mesh_all_gather_object: rank ", mesh.get_rank(), " is not in ",
              mesh.to_string());
  nlohmann::json nested = value;
  for (int64_t d = mesh.ndim() - 1; d >= 0; --d) nested = nlohmann::json(comm::all_gather_object(*mesh.get_group(d), nested));
  std::vector<nlohmann::json> out;
  // Depth-first over mesh.ndim() levels of arrays = row-major order.
  std::function<void(const nlohmann::json&, int64_t)> walk = [&](const nlohmann::json& j, int64_t depth) {
    if (depth == mesh.ndim()) {
      out.push_back(j);
      return;
    }
    for (const auto& e : j) walk(e, depth + 1);
  };
  walk(nested, 0);
  return out;
}

}  // namespace detail
}  // namespace dtensor
