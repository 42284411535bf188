// dtensor/nn/clip_grad.cpp: see clip_grad.h (NOTE: [Gradient norms of DTensors]).
#include "dtensor/nn/clip_grad.h"

#include "dtensor/comm/group.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>

namespace dtensor {
namespace nn {

namespace {

// Per mesh: the local contributions, by the set of mesh dims they are sharded over (a bit mask).
struct MeshSums {
  DeviceMesh mesh;
  std::map<uint64_t, at::Tensor> by_dims;  // 0-dim float64 tensors
};

bool is_inf(double p) { return std::isinf(p) && p > 0; }

// sum(|x|^p), or max |x| for the infinity norm, in float64.
at::Tensor local_power_sum(const at::Tensor& x, double p) {
  at::NoGradGuard no_grad;
  const at::Tensor a = x.detach().abs().to(at::kDouble);
  if (a.numel() == 0) return at::zeros({}, a.options());
  if (is_inf(p)) return a.max();
  return p == 1 ? a.sum() : a.pow(p).sum();
}

// Combines two contributions.
at::Tensor combine(const at::Tensor& a, const at::Tensor& b, double p) { return is_inf(p) ? at::maximum(a, b) : a + b; }

// Reduces each mesh's contributions, one all-reduce per mesh dim over the groups sharded along
// it, and folds them into one value.
at::Tensor reduce_over_meshes(std::vector<MeshSums>& meshes, at::Tensor total, double p) {
  const comm::ReduceOp op = is_inf(p) ? comm::ReduceOp::MAX : comm::ReduceOp::SUM;
  for (auto& m : meshes) {
    for (int64_t d = 0; d < m.mesh.ndim(); ++d) {
      std::vector<at::Tensor> parts;
      std::vector<uint64_t> keys;
      for (auto& [dims, v] : m.by_dims) {
        if (!(dims >> d & 1)) continue;
        parts.push_back(v.reshape({1}));
        keys.push_back(dims);
      }
      if (parts.empty()) continue;
      at::Tensor buf = at::cat(parts);
      m.mesh.get_group(d)->all_reduce(buf, op);
      for (size_t i = 0; i < keys.size(); ++i) m.by_dims[keys[i]] = buf[static_cast<int64_t>(i)];
    }
    for (auto& [dims, v] : m.by_dims) total = combine(total, v, p);
  }
  return total;
}

}  // namespace

at::Tensor get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type, bool error_if_nonfinite) {
  const double p = norm_type;
  TORCH_CHECK(is_inf(p) || (std::isfinite(p) && p > 0), "get_total_norm: norm_type must be positive or infinity, got ",
              p);
  if (tensors.empty()) return at::zeros({});
  at::NoGradGuard no_grad;
  std::vector<MeshSums> meshes;
  at::Tensor plain = at::zeros({}, at::TensorOptions().dtype(at::kDouble));
  for (const at::Tensor& t0 : tensors) {
    TORCH_CHECK(t0.defined(), "get_total_norm: a tensor is undefined");
    if (!is_dtensor(t0)) {
      plain = combine(plain, local_power_sum(t0, p).to(at::kCPU), p);
      continue;
    }
    at::Tensor t = t0;
    const DTensorSpec& spec0 = get_spec(t);
    if (spec0.has_partial()) {  // the norm of a partial sum needs the sum
      std::vector<Placement> pl = spec0.placements;
      for (auto& x : pl)
        if (is_partial(x)) x = Replicate{};
      t = redistribute(t, spec0.mesh, pl);
    }
    const DTensorSpec& spec = get_spec(t);
    uint64_t dims = 0;
    for (size_t d = 0; d < spec.placements.size(); ++d)
      if (is_shard(spec.placements[d])) dims |= uint64_t{1} << d;
    auto it = std::find_if(meshes.begin(), meshes.end(), [&](const MeshSums& m) { return m.mesh == spec.mesh; });
    if (it == meshes.end()) it = meshes.insert(meshes.end(), MeshSums{spec.mesh, {}});
    at::Tensor v = local_power_sum(local_tensor(t), p).to(at::kCPU);
    auto slot = it->by_dims.find(dims);
    if (slot == it->by_dims.end()) it->by_dims.emplace(dims, v);
    else slot->second = combine(slot->second, v, p);
  }
  at::Tensor total = reduce_over_meshes(meshes, plain, p);
  if (!is_inf(p)) total = total.pow(1.0 / p);
  const at::Tensor first = is_dtensor(tensors[0]) ? local_tensor(tensors[0]) : tensors[0];
  const at::ScalarType dtype = at::isFloatingType(first.scalar_type()) ? first.scalar_type() : at::kFloat;
  total = total.to(first.device(), dtype);
  if (error_if_nonfinite) {
    const double v = total.item<double>();
    TORCH_CHECK(std::isfinite(v), "The total norm of order ", p,
                " for gradients from `parameters` is non-finite, so it cannot be clipped. To disable this error and "
                "scale the gradients by the non-finite norm anyway, set error_if_nonfinite=false");
  }
  return total;
}

void clip_grads_with_norm_(const std::vector<at::Tensor>& parameters, double max_norm, const at::Tensor& total_norm) {
  at::NoGradGuard no_grad;
  const at::Tensor coef = (max_norm / (total_norm.to(at::kDouble) + 1e-6)).clamp_max(1.0);
  for (const at::Tensor& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const at::Tensor& local = is_dtensor(g) ? local_tensor(g) : g;
    local.mul_(coef.to(local.device(), local.scalar_type()));
  }
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type,
                           bool error_if_nonfinite) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return at::zeros({});
  at::Tensor total = get_total_norm(grads, norm_type, error_if_nonfinite);
  clip_grads_with_norm_(parameters, max_norm, total);
  return total;
}

}  // namespace nn
}  // namespace dtensor
