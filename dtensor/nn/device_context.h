// dtensor/nn/device_context.h
//
// Building a model without allocating it: the C++ counterpart of PyTorch's
// `with torch.device("meta"): model = Transformer(args)` (torch/utils/_device.py's
// DeviceContext). libtorch modules allocate and initialise their parameters when constructed;
// inside a DeviceContext on the meta device they get meta tensors instead, so a model of any
// size is built in microseconds, then sharded (fully_shard, Transformer::parallelize) and,
// for a real run, materialised shard by shard (nn::to_empty, then reset_parameters), as
// NOTE: [FSDP on the meta device] in dtensor/fsdp/fsdp_state.cpp describes.
//
//   {
//     dtensor::nn::DeviceContext meta(c10::kMeta);
//     model = dtensor::models::Transformer(args);       // every parameter is a meta tensor
//   }
//
// NOTE: [Device context]
// While a DeviceContext is alive, on its thread, every aten factory op (an op without tensor
// arguments: empty, zeros, ones, full, arange, rand, randn, ...) called without a device makes
// its tensor on the context's device. A factory given a device keeps it; ops on tensors
// (empty_like, to, the random fills of an initialiser) follow their tensors, as in PyTorch.
// Only the calls made by the code in the scope are redirected, not the factories an op's
// implementation calls inside it (which PyTorch's Python-level context never sees either).
// Contexts nest; the innermost decides. Tensors made without the dispatcher (at::from_blob)
// are not affected.
//
// The redirection is a boxed fallback on libtorch's DeferredInit dispatch key, which the
// context adds to the thread's included keys: the key libtorch reserves for deferred module
// initialisation (torchdistX's deferred_init, which this replaces; the two cannot be loaded
// into one process together).
#pragma once

#include <c10/core/Device.h>

#include <optional>

namespace dtensor {
namespace nn {

class DeviceContext {
 public:
  explicit DeviceContext(c10::Device device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  // The innermost live context's device on this thread, if any.
  static std::optional<c10::Device> current();

 private:
  std::optional<c10::Device> saved_;
  bool saved_included_;
};

}  // namespace nn
}  // namespace dtensor
