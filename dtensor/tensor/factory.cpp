// dtensor/tensor/factory.cpp: zeros / ones / empty / full / arange as DTensors (dtensor.h),
// each rank creating its own shard.
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>

namespace dtensor {

namespace {

using MakeLocal = std::function<at::Tensor(c10::IntArrayRef local_shape, c10::IntArrayRef global_offset,
                                           const at::TensorOptions& options)>;

// Checks the placements, then wraps this rank's `make_local(local_shape, offset, options)`.
at::Tensor make_factory(const char* name, c10::IntArrayRef size, const DeviceMesh& mesh,
                        std::vector<Placement> placements, at::TensorOptions options, bool partial_ok,
                        const MakeLocal& make_local) {
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "dtensor::", name, ": ", placements.size(),
              " placements for the ", mesh.ndim(), "-D mesh ", mesh.to_string(), "; pass one per mesh dim");
  for (const Placement& p : placements)
    TORCH_CHECK(partial_ok || !is_partial(p), "dtensor::", name, ": placements ", to_string(placements),
                " on ", mesh.to_string(), " hold a Partial, but the sum over ranks of identical ", name,
                " values is not the tensor; use Shard or Replicate (then redistribute)");
  for (int64_t s : size) TORCH_CHECK(s >= 0, "dtensor::", name, ": negative size in ", size);
  try {
    placements = normalize_placements(placements, static_cast<int64_t>(size.size()));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "dtensor::", name, ": ", e.what_without_backtrace());
  }
  if (options.has_device()) {
    TORCH_CHECK(options.device().type() == at::kMeta || options.device().type() == mesh.device().type(),
                "dtensor::", name, ": the options ask for device ", options.device(), " but ", mesh.to_string(),
                " keeps local tensors on ", mesh.device_type(), "; drop the device from the options (the mesh "
                "decides) or use a mesh of that device type");
    if (options.device().type() != at::kMeta) options = options.device(mesh.device());
  } else {
    options = options.device(mesh.device());
  }
  const bool requires_grad = options.requires_grad();
  const at::TensorOptions local_options = options.requires_grad(false);
  const auto [local_shape, offset] = compute_local_shape_and_global_offset(size, mesh, placements);
  at::Tensor local = make_local(local_shape, offset, local_options);
  auto strides = c10::contiguous_strides(size);
  DTensorSpec spec(mesh, placements,
                   TensorMeta{size.vec(), std::vector<int64_t>(strides.begin(), strides.end()), local.scalar_type()});
  at::Tensor out = make_dtensor(local, std::move(spec));
  if (requires_grad) out.set_requires_grad(true);
  return out;
}

}  // namespace

at::Tensor zeros(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                 at::TensorOptions options) {
  return make_factory("zeros", size, mesh, std::move(placements), options, /*partial_ok=*/true,
                      [](c10::IntArrayRef s, c10::IntArrayRef, const at::TensorOptions& o) { return at::zeros(s, o); });
}

at::Tensor ones(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                at::TensorOptions options) {
  return make_factory("ones", size, mesh, std::move(placements), options, /*partial_ok=*/false,
                      [](c10::IntArrayRef s, c10::IntArrayRef, const at::TensorOptions& o) { return at::ones(s, o); });
}

at::Tensor empty(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                 at::TensorOptions options) {
  return make_factory("empty", size, mesh, std::move(placements), options, /*partial_ok=*/true,
                      [](c10::IntArrayRef s, c10::IntArrayRef, const at::TensorOptions& o) { return at::empty(s, o); });
}

at::Tensor full(c10::IntArrayRef size, const at::Scalar& fill_value, const DeviceMesh& mesh,
                std::vector<Placement> placements, at::TensorOptions options) {
  return make_factory("full", size, mesh, std::move(placements), options, /*partial_ok=*/false,
                      [&](c10::IntArrayRef s, c10::IntArrayRef, const at::TensorOptions& o) {
                        return at::full(s, fill_value, o);  // the dtype follows the value when none is given
                      });
}

at::Tensor arange(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, const DeviceMesh& mesh,
                  std::vector<Placement> placements, at::TensorOptions options) {
  const at::TensorOptions plain = (options.has_device() ? options : options.device(mesh.device()))
                                      .requires_grad(false);
  at::Tensor whole = at::arange(start, end, step, plain);
  return make_factory("arange", whole.sizes(), mesh, std::move(placements), options.dtype(whole.scalar_type()),
                      /*partial_ok=*/false,
                      [&](c10::IntArrayRef local_shape, c10::IntArrayRef offset, const at::TensorOptions&) {
                        return whole.narrow(0, std::min(offset[0], whole.size(0)), local_shape[0]).clone();
                      });
}

}  // namespace dtensor
