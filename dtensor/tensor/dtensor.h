// dtensor/tensor/dtensor.h
//
// DTensor: an at::Tensor sharded over a DeviceMesh (DESIGN.md D1). A DTensor is a plain
// at::Tensor whose TensorImpl (DTensorImpl) holds this rank's local tensor and the
// DTensorSpec; it reports the GLOBAL shape, and every aten op on it goes through the
// dispatcher fallback that propagates sharding (dtensor/ops), so torch::nn modules and
// autograd work unchanged.
//
//   auto mesh = dtensor::init_device_mesh("cpu", {4});
//   at::Tensor x = dtensor::distribute_tensor(at::randn({8, 4}), mesh, {dtensor::Shard{0}});
//   at::Tensor y = (x * 2).sum();                      // a DTensor with Partial(sum)
//   at::Tensor r = dtensor::full_tensor(y);            // plain tensor, equal on every rank
//
// Calls marked "collective" must be made by every rank of the mesh with the same arguments.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/TensorOptions.h>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace dtensor {

// True when `t` is a DTensor.
bool is_dtensor(const at::Tensor& t);
// The spec of a DTensor; throws naming the op when `t` is not one.
const DTensorSpec& get_spec(const at::Tensor& t);
// This rank's shard, WITHOUT autograd (the tensor the DTensor holds).
const at::Tensor& local_tensor(const at::Tensor& t);

// Collective. Shards (or replicates) `tensor` from the mesh's first rank: every rank passes a
// tensor of the same shape and dtype; the values of the mesh's first rank are used. The result
// is a leaf that requires grad when `tensor` does.
at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                             std::vector<Placement> placements);

// Wraps this rank's `local` shard. Differentiable: the gradient of the DTensor flows back to
// `local`. With run_check (collective) every rank checks that the ranks agree on dtype, and on
// shape where the placements require it; a mismatch raises on EVERY rank naming the ranks.
// Global shape: computed from the local shapes (shards may be uneven: it gathers the local
// sizes when `shape` is not given and some dim is sharded).
at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                      std::vector<Placement> placements, bool run_check = false,
                      std::optional<std::vector<int64_t>> shape = std::nullopt);

// This rank's shard as a plain tensor. Differentiable (the gradient comes back as a DTensor
// with the same placements).
at::Tensor to_local(const at::Tensor& dtensor);

// Collective. The same global tensor with other placements (every transition, uneven shards
// included). Differentiable: the gradient is redistributed back (Partial inputs get a
// Replicate gradient).
at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh,
                        std::vector<Placement> placements);
at::Tensor redistribute(const at::Tensor& dtensor, std::vector<Placement> placements);

// Collective. The whole tensor on every rank, as a plain tensor. Differentiable.
at::Tensor full_tensor(const at::Tensor& dtensor);

// "DTensor(local_tensor=..., device_mesh=..., placements=(Shard(dim=0),), shape=[8, 4])"
std::string to_string(const at::Tensor& dtensor);
void print(std::ostream& os, const at::Tensor& dtensor);

// ---- Factories (torch.distributed.tensor.zeros / ones / empty / full) ---------------------
//
// A DTensor of global shape `size` laid out by `placements`, each rank creating only its own
// shard: no communication, and nothing global is allocated (arange excepted, see below).
// `options` gives dtype, device (default: the mesh's device type) and requires_grad (the
// result is then a leaf). Placements are Shard or Replicate; zeros and empty also accept
// Partial (zeros sum to zeros), the others reject it naming the placements.
//
//   auto w = dtensor::zeros({10, 4}, mesh, {dtensor::Shard{0}});  // rows 3,3,3,1 on 4 ranks
//   auto r = dtensor::arange(0, 10, 1, mesh, {dtensor::Shard{0}}, at::kLong);
//
// NOTE: the aten factories (at::zeros, at::arange, ...) have no tensor argument, so they never
// reach the DTensor dispatcher fallback and always give plain tensors (NOTE: [Factories and
// the DTensor key] in dispatch.cpp); these functions are how a sharded factory tensor is made.
at::Tensor zeros(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                 at::TensorOptions options = {});
at::Tensor ones(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                at::TensorOptions options = {});
// Values unspecified (as at::empty).
at::Tensor empty(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                 at::TensorOptions options = {});
at::Tensor full(c10::IntArrayRef size, const at::Scalar& fill_value, const DeviceMesh& mesh,
                std::vector<Placement> placements, at::TensorOptions options = {});
// The values of at::arange(start, end, step) (1-D). Each rank computes the whole range and
// keeps its piece, so the values are bit-identical to at::arange's.
at::Tensor arange(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                  const DeviceMesh& mesh, std::vector<Placement> placements,
                  at::TensorOptions options = {});

// PyTorch spelling: DTensor::from_local(...) etc.
struct DTensor {
  static at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                               std::vector<Placement> placements, bool run_check = false,
                               std::optional<std::vector<int64_t>> shape = std::nullopt) {
    return dtensor::from_local(local, mesh, std::move(placements), run_check, std::move(shape));
  }
};

// While alive (per thread), plain tensors mixed with DTensors in an op are treated as
// Replicate instead of raising (PyTorch's implicit_replication()).
class ImplicitReplicationGuard {
 public:
  ImplicitReplicationGuard();
  ~ImplicitReplicationGuard();
  ImplicitReplicationGuard(const ImplicitReplicationGuard&) = delete;
  ImplicitReplicationGuard& operator=(const ImplicitReplicationGuard&) = delete;
  static bool enabled();

 private:
  bool prev_;
};

}  // namespace dtensor
