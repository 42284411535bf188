// dtensor/utils/containers.h
//
// Arguments of a forward call as boxed values (c10::IValue), and functions that walk them:
// the C++ counterparts of torch.distributed.utils' _pack_kwargs, _unpack_kwargs,
// _apply_to_tensors, _cast_forward_inputs, _recursive_to and _to_kwargs (Python's leading
// underscore dropped).
//
//   using namespace dtensor::utils;
//   auto [flat, keys] = pack_kwargs({at::randn({4}), 3}, {{"mask", at::ones({4})}});
//   // flat = (x, 3, mask), keys = ("mask")
//   auto [args, kw] = unpack_kwargs(flat, keys);                      // back again
//   auto [a16, kw16] = cast_forward_inputs(at::kHalf, args, kw);      // float tensors -> half
//
// Containers are IValue lists, tuples (named tuples keep their type), dicts (values; insertion
// order kept), Kwargs (values) and, for apply_to_tensors, script objects (the counterpart of a dataclass: a
// shallow copy with every attribute transformed). Everything else (numbers, strings, None)
// passes through unchanged. Nothing here is collective.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtensor {
namespace utils {

// Keyword arguments in order (Python's **kwargs); names are unique.
using Kwargs = std::vector<std::pair<std::string, c10::IValue>>;

// {flat_args, kwarg_keys}: positional values first, then the keyword values in the order of
// kwarg_keys. A keyword given twice is an error. (PyTorch: _pack_kwargs.)
std::pair<std::vector<c10::IValue>, std::vector<std::string>> pack_kwargs(
    const std::vector<c10::IValue>& args, const Kwargs& kwargs = Kwargs());

// The inverse of pack_kwargs: {args, kwargs}, the last kwarg_keys.size() values being the
// keyword values. Throws "too many keys K vs. N" when there are more keys than values, and
// names a key given twice. (PyTorch: _unpack_kwargs.)
std::pair<std::vector<c10::IValue>, Kwargs> unpack_kwargs(const std::vector<c10::IValue>& flat_args,
                                                          const std::vector<std::string>& kwarg_keys);

using TensorFn = std::function<at::Tensor(const at::Tensor&)>;

// `fn` applied to every tensor in `container`, recursively (see the file comment); the
// containers are rebuilt, the input is not modified. A tensor is passed to `fn` itself.
// (PyTorch: _apply_to_tensors.)
c10::IValue apply_to_tensors(const TensorFn& fn, const c10::IValue& container);
std::vector<c10::IValue> apply_to_tensors(const TensorFn& fn, const std::vector<c10::IValue>& args);
Kwargs apply_to_tensors(const TensorFn& fn, const Kwargs& kwargs);

// Floating-point tensors of args and kwargs converted to `dtype` (others, and those already
// of `dtype`, unchanged); the conversion is differentiable, so requires_grad carries over.
// nullopt: returned as given. (PyTorch: _cast_forward_inputs.)
std::pair<std::vector<c10::IValue>, Kwargs> cast_forward_inputs(std::optional<at::ScalarType> dtype,
                                                                const std::vector<c10::IValue>& args,
                                                                const Kwargs& kwargs = Kwargs());

// Every tensor of `inputs` moved to `target_device` (tensors already there are kept as they
// are; script objects are not entered, as PyTorch does not enter dataclasses here). The
// result has PyTorch's shape: one entry per target device, so here always one.
// With `use_side_stream_for_tensor_copies`, copies from a non-CPU device run on a stream from
// the device's pool and the current stream waits for them (PyTorch: _recursive_to).
std::vector<c10::IValue> recursive_to(const c10::IValue& inputs, c10::Device target_device,
                                      bool use_side_stream_for_tensor_copies);

// recursive_to over positional and keyword arguments, padded so both lists have the same
// length (one entry per device: here one, or none when both are empty). (PyTorch: _to_kwargs.)
std::pair<std::vector<std::vector<c10::IValue>>, std::vector<Kwargs>> to_kwargs(
    const std::vector<c10::IValue>& inputs, const std::optional<Kwargs>& kwargs,
    c10::Device target_device, bool use_side_stream_for_tensor_copies);

}  // namespace utils
}  // namespace dtensor
