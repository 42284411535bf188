// dtensor/experimental/local_map.cpp: see local_map.h.
#include "dtensor/experimental/local_map.h"

#include "dtensor/tensor/dtensor.h"

#include <c10/util/Exception.h>

#include <string>

namespace dtensor {
namespace experimental {

namespace {

std::string placements_str(const PlacementsOrNone& p) { return p ? to_string(*p) : std::string("None"); }

// Input i as `func` receives it: a DTensor checked against (or redistributed to) its declared
// placements, then its local tensor; a plain tensor as it is.
at::Tensor local_input(const at::Tensor& arg, size_t i, const LocalMapOptions& o, std::optional<DeviceMesh>& mesh) {
  const std::string which = "local_map: input " + std::to_string(i);
  if (!arg.defined() || !is_dtensor(arg)) {
    TORCH_CHECK(!o.in_placements || !(*o.in_placements)[i].has_value(), which,
                " is not a DTensor but in_placements gives it the placements ", placements_str((*o.in_placements)[i]),
                "; give None (nullopt) for a plain tensor");
    return arg;
  }
  const DTensorSpec& spec = get_spec(arg);
  if (!mesh) mesh = spec.mesh;
  TORCH_CHECK(spec.mesh == *mesh, which, " is a DTensor on ", spec.mesh.to_string(), " but local_map runs on ",
              mesh->to_string(), "; every DTensor input must be on that mesh");
  at::Tensor dt = arg;
  if (o.in_placements) {
    const PlacementsOrNone& want = (*o.in_placements)[i];
    TORCH_CHECK(want.has_value(), which, " is a DTensor ", to_string(spec.placements),
                " but in_placements gives it None (a plain tensor); give its placements");
    if (spec.placements != *want) {
      TORCH_CHECK(o.redistribute_inputs, which, " has placements ", to_string(spec.placements),
                  " but in_placements expects ", to_string(*want),
                  "; redistribute it first, or set LocalMapOptions::redistribute_inputs");
      dt = redistribute(dt, *mesh, *want);
    }
  }
  std::optional<std::vector<Placement>> grad;
  if (o.in_grad_placements) grad = (*o.in_grad_placements)[i];
  return to_local(dt, grad);
}

}  // namespace

std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> local_map(
    LocalFunction func, std::vector<PlacementsOrNone> out_placements, LocalMapOptions options) {
  TORCH_CHECK(func, "local_map: the function is empty");
  return [func = std::move(func), out_placements = std::move(out_placements),
          options = std::move(options)](const std::vector<at::Tensor>& args) {
    const size_t n = args.size();
    TORCH_CHECK(!options.in_placements || options.in_placements->size() == n, "local_map: in_placements has ",
                options.in_placements ? options.in_placements->size() : 0, " entries for ", n, " inputs");
    TORCH_CHECK(!options.in_grad_placements || options.in_grad_placements->size() == n,
                "local_map: in_grad_placements has ",
                options.in_grad_placements ? options.in_grad_placements->size() : 0, " entries for ", n, " inputs");
    bool any_dtensor = false;
    for (const auto& a : args) any_dtensor = any_dtensor || (a.defined() && is_dtensor(a));
    if (!any_dtensor) return func(args);  // PyTorch: plain inputs, plain outputs
    std::optional<DeviceMesh> mesh = options.device_mesh;
    std::vector<at::Tensor> local(n);
    for (size_t i = 0; i < n; ++i) local[i] = local_input(args[i], i, options, mesh);
    std::vector<at::Tensor> out = func(local);
    TORCH_CHECK(out.size() == out_placements.size(), "local_map: out_placements has ", out_placements.size(),
                " entries but the function returned ", out.size(), " outputs; give one per output");
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out_placements[i]) continue;
      TORCH_CHECK(out[i].defined(), "local_map: output ", i, " is undefined but out_placements gives it ",
                  to_string(*out_placements[i]));
      TORCH_CHECK(!is_dtensor(out[i]), "local_map: output ", i,
                  " is a DTensor; the function must return local tensors (it runs on the local tensors)");
      out[i] = from_local(out[i], *mesh, *out_placements[i], /*run_check=*/false);
    }
    return out;
  };
}

}  // namespace experimental
}  // namespace dtensor
