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

// Collective. Shards (or replicates) `tensor`: every rank passes a tensor of the same shape and
// dtype; the values of the source rank are used. The source is the rank at coordinate
// `src_data_rank` on every mesh dim (default 0: the mesh's first rank, as PyTorch). With
// src_data_rank = nullopt there is NO communication: each rank keeps its own piece of the
// tensor it passed (PyTorch's src_data_rank=None). The result is a leaf that requires grad when
// `tensor` does.
at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                             std::vector<Placement> placements,
                             std::optional<int64_t> src_data_rank = 0);
// The same on the current mesh (DeviceMeshGuard); no placements: Replicate on every mesh dim.
at::Tensor distribute_tensor(const at::Tensor& tensor, std::vector<Placement> placements = {});

// Options of from_local (PyTorch's keyword arguments run_check, shape, stride).
struct FromLocalOptions {
  // Collective: every rank checks that the ranks agree on dtype and requires_grad (and on the
  // local shape when `shape` is not given, as PyTorch's check_tensor_meta); a mismatch raises on
  // EVERY rank naming the ranks. Replicate mesh dims then take the values of their first rank
  // (a broadcast, as PyTorch).
  bool run_check = false;
  // Global shape and stride. Give both or neither (as PyTorch). Without them the local tensors
  // are assumed even: shape = local shape times the mesh size on sharded dims, stride = the
  // local strides rescaled (PyTorch's compute_global_tensor_info).
  std::optional<std::vector<int64_t>> shape;
  std::optional<std::vector<int64_t>> stride;

  // Global `shape` with contiguous strides (the layout of a tensor made with that shape).
  static FromLocalOptions contiguous(std::vector<int64_t> shape, bool run_check = false);
};

// Wraps this rank's `local` shard. Differentiable: the gradient of the DTensor flows back to
// `local` (a Partial gradient of a Partial DTensor stays Partial: the local gradient is this
// rank's partial value, no collective, as PyTorch).
at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                      std::vector<Placement> placements, const FromLocalOptions& options = {});
// from_local(local, mesh, placements, run_check): PyTorch's run_check keyword, positionally.
at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                      std::vector<Placement> placements, bool run_check);
// The same on the current mesh (DeviceMeshGuard); no placements: Replicate on every mesh dim.
at::Tensor from_local(const at::Tensor& local, std::vector<Placement> placements = {},
                      const FromLocalOptions& options = {});

// This rank's shard as a plain tensor. Differentiable: the gradient comes back as a DTensor
// with `grad_placements` (PyTorch's hint for a gradient laid out differently from the DTensor),
// by default the DTensor's own placements.
at::Tensor to_local(const at::Tensor& dtensor,
                    std::optional<std::vector<Placement>> grad_placements = std::nullopt);

// Options of redistribute (PyTorch's keyword arguments).
struct RedistributeOptions {
  // Return at once with the last collective in flight (PyTorch's AsyncCollectiveTensor):
  // collectives before it complete first, the last one is issued asynchronously (NOTE: [Async
  // collectives] in dtensor/comm/work.h) and runs while the caller goes on; the first use of the
  // result (any op on it, to_local, full_tensor, redistribute, printing, wait_tensor) waits for
  // it and runs the local steps after it. A result dropped unused is waited for when its last
  // handle goes away, so every rank still completes the collective. Later collectives on the
  // same groups may be issued before waiting: they run after it, in issue order.
  // Unlike PyTorch, to_local() and view ops wait too (a plain at::Tensor cannot wait lazily).
  // Without communication (same placements, ranks outside the mesh) the result is not async.
  bool async_op = false;
  // The local tensor is cast to forward_dtype before the collectives; the result has it.
  std::optional<at::ScalarType> forward_dtype;
  // The gradient is cast to backward_dtype before its collectives, then back to the input's
  // dtype (default: the input's dtype).
  std::optional<at::ScalarType> backward_dtype;
};

// Collective. The same global tensor with other placements (every transition, uneven shards
// included). A Partial target is accepted only where the placement already is that Partial:
// redistributing to Partial raises "Can not redistribute from X to Partial(...)" as PyTorch
// (Partial is what ops produce, not a layout to ask for). Differentiable: the gradient is
// redistributed back to the input's placements, except that a Partial input placement gets a
// Replicate gradient unless the gradient already is that Partial (then it stays Partial, with
// no collective), as PyTorch.
at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh,
                        std::vector<Placement> placements, const RedistributeOptions& options = {});
at::Tensor redistribute(const at::Tensor& dtensor, std::vector<Placement> placements,
                        const RedistributeOptions& options = {});

// For a DTensor from redistribute(..., {async_op = true}): waits for its collectives (PyTorch's
// AsyncCollectiveTensor.wait() / wait_tensor) and returns `dtensor`; rethrows their error.
// Any other tensor is returned as it is.
at::Tensor wait_tensor(const at::Tensor& dtensor);
// True while such a DTensor's result has not been waited for (PyTorch: `not t.completed`).
bool is_async_pending(const at::Tensor& dtensor);

// Collective. The whole tensor on every rank, as a plain tensor. Differentiable; the gradient
// of the result is taken as `grad_placements` (default Replicate on every mesh dim).
at::Tensor full_tensor(const at::Tensor& dtensor,
                       std::optional<std::vector<Placement>> grad_placements = std::nullopt);

// "DTensor(local_tensor=..., device_mesh=..., placements=(Shard(dim=0),), shape=[8, 4])"
std::string to_string(const at::Tensor& dtensor);
void print(std::ostream& os, const at::Tensor& dtensor);

// ---- Placement helpers (PyTorch's Shard._split_tensor / _unpad_tensor, shard_dim_alltoall,
// _shard_tensor) ----------------------------------------------------------------------------

// Not collective. `tensor` cut along `shard.dim` into `num_chunks` torch.chunk pieces (NOTE:
// [Uneven shards]: trailing pieces may be smaller or empty; there are always num_chunks). With
// `with_padding` every piece is zero-padded to the first piece's size and `pad_sizes` (when
// given) receives how much was added to each.
std::vector<at::Tensor> split_tensor(const Shard& shard, const at::Tensor& tensor, int64_t num_chunks,
                                     bool with_padding = false, std::vector<int64_t>* pad_sizes = nullptr);
// Not collective. `tensor` without the last `pad_size` entries of `shard.dim`.
at::Tensor unpad_tensor(const Shard& shard, const at::Tensor& tensor, int64_t pad_size);
// Collective over mesh dim `mesh_dim` (PyTorch's shard_dim_alltoall): `input` is this rank's
// piece of a tensor split EVENLY along `gather_dim` over that mesh dim; the result is its piece
// of the same tensor split along `shard_dim` instead (torch.chunk pieces), with one all_to_all.
// Plain local tensors in and out.
at::Tensor shard_dim_alltoall(const at::Tensor& input, int64_t gather_dim, int64_t shard_dim,
                              const DeviceMesh& mesh, int64_t mesh_dim);
// Not collective: the DTensor whose local tensor is this rank's piece of `full` (every rank
// passes the full tensor; PyTorch's _shard_tensor, distribute_tensor with src_data_rank=None).
at::Tensor _shard_tensor(const at::Tensor& full, std::vector<Placement> placements, const DeviceMesh& mesh);

namespace detail {
// redistribute without the refusal of Partial targets (PyTorch's internal Redistribute.apply):
// for ops, backward passes and tests of the Replicate -> Partial transition. Differentiable.
at::Tensor redistribute_to_any(const at::Tensor& dtensor, std::vector<Placement> placements);
}  // namespace detail

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

// PyTorch spelling: DTensor::from_local(...), and the DTensor constructor.
//
//   at::Tensor t = dtensor::DTensor(local, spec, /*requires_grad=*/true);
//
// The constructor wraps `local` as the DTensor `spec` describes, without communication and
// without autograd history (a leaf; PyTorch: DTensor(local_tensor, spec, requires_grad=...),
// which its docs reserve for internals: prefer from_local, which is differentiable). `local`
// must have this rank's local shape for the spec and the spec's dtype.
class DTensor {
 public:
  DTensor(const at::Tensor& local_tensor, const DTensorSpec& spec, bool requires_grad);
  operator at::Tensor() const { return tensor_; }

  static at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                               std::vector<Placement> placements, const FromLocalOptions& options = {}) {
    return dtensor::from_local(local, mesh, std::move(placements), options);
  }
  static at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                               std::vector<Placement> placements, bool run_check) {
    return dtensor::from_local(local, mesh, std::move(placements), run_check);
  }

 private:
  at::Tensor tensor_;
};

// The current mesh (PyTorch's `with mesh:`): while a guard is alive on this thread,
// distribute_tensor, from_local and parallelize_module may omit the mesh. Guards nest.
//
//   {
//     dtensor::DeviceMeshGuard use(mesh);
//     at::Tensor x = dtensor::distribute_tensor(t, {dtensor::Shard{0}});   // on `mesh`
//   }
class DeviceMeshGuard {
 public:
  explicit DeviceMeshGuard(const DeviceMesh& mesh);
  ~DeviceMeshGuard();
  DeviceMeshGuard(const DeviceMeshGuard&) = delete;
  DeviceMeshGuard& operator=(const DeviceMeshGuard&) = delete;
};
// The innermost DeviceMeshGuard's mesh on this thread; throws saying how to set one when none.
const DeviceMesh& current_mesh();
bool has_current_mesh();

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
