// dtensor/utils/containers.cpp: argument packing and the recursive walk over IValue containers.
#include "dtensor/utils/containers.h"

#include <ATen/core/ivalue_inl.h>
#include <ATen/core/jit_type.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>


namespace dtensor {
namespace utils {

namespace {

// How far the walk goes: apply_to_tensors enters script objects (Python: dataclasses) and
// leaves dict keys alone; recursive_to does the opposite (Python maps over dict items).
struct WalkOptions {
  bool enter_objects = false;
  bool map_dict_keys = false;
};

c10::IValue walk(const c10::IValue& v, const TensorFn& fn, const WalkOptions& o) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isList()) {
    // Covers typed lists too (List[Tensor] is a GenericList with element type Tensor).
    c10::impl::GenericList in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (const c10::IValue& e : in) out.push_back(walk(e, fn, o));
    return out;
  }
  if (v.isTuple()) {
    const auto& tuple = v.toTupleRef();
    std::vector<c10::IValue> elems;
    elems.reserve(tuple.elements().size());
    for (const c10::IValue& e : tuple.elements()) elems.push_back(walk(e, fn, o));
    // A named tuple keeps its type (Python: type(x)(*res)).
    auto type = tuple.type();
    if (type && type->name()) return c10::ivalue::Tuple::createNamed(std::move(elems), type);
    return c10::ivalue::Tuple::create(std::move(elems));
  }
  if (v.isGenericDict()) {
    c10::impl::GenericDict in = v.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), in.valueType());
    out.reserve(in.size());
    for (const auto& entry : in)
      out.insert(o.map_dict_keys ? walk(entry.key(), fn, o) : entry.key(), walk(entry.value(), fn, o));
    return out;
  }
  if (v.isObject() && o.enter_objects) {
    // Python: dataclasses.replace(x), then every field transformed.
    const auto& obj = v.toObjectRef();
    c10::intrusive_ptr<c10::ivalue::Object> copy = obj.copy();
    for (size_t i = 0; i < obj.slots().size(); ++i) copy->setSlot(i, walk(obj.getSlot(i), fn, o));
    return copy;
  }
  return v;
}

void check_unique_keys(const Kwargs& kwargs, const char* op) {
  for (size_t i = 0; i < kwargs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      TORCH_CHECK(kwargs[i].first != kwargs[j].first, op, ": keyword '", kwargs[i].first, "' appears twice");
}

// One tensor to `target` (PyTorch: the tensor case of _recursive_to's to_map).
at::Tensor move_tensor(const at::Tensor& t, c10::Device target, bool side_stream) {
  const c10::Device src = t.device();
  if (src == target) return t;
  if (!side_stream || src.is_cpu() || !c10::impl::hasDeviceGuardImpl(target.type())) return t.to(target);
  // Copy on a stream of the target's pool; the current stream waits for the copy, and the
  // output's memory is recorded on the current stream so it is not reused before the work
  // queued there is done.
  c10::impl::VirtualGuardImpl impl(target.type());
  c10::Stream copy_stream = impl.getStreamFromGlobalPool(target);
  at::Tensor out;
  {
    c10::StreamGuard guard(copy_stream);
    out = t.to(target);
  }
  c10::Stream current = impl.getStream(target);
  c10::Event done(target.type());
  done.record(copy_stream);
  done.block(current);
  impl.recordDataPtrOnStream(out.storage().data_ptr(), current);
  return out;
}

TensorFn mover(c10::Device target, bool side_stream) {
  return [target, side_stream](const at::Tensor& t) { return move_tensor(t, target, side_stream); };
}

}  // namespace

std::pair<std::vector<c10::IValue>, std::vector<std::string>> pack_kwargs(const std::vector<c10::IValue>& args,
                                                                          const Kwargs& kwargs) {
  check_unique_keys(kwargs, "pack_kwargs");
  std::vector<c10::IValue> flat_args(args);
  std::vector<std::string> kwarg_keys;
  for (const auto& [key, value] : kwargs) {
    kwarg_keys.push_back(key);
    flat_args.push_back(value);
  }
  return {std::move(flat_args), std::move(kwarg_keys)};
}

std::pair<std::vector<c10::IValue>, Kwargs> unpack_kwargs(const std::vector<c10::IValue>& flat_args,
                                                          const std::vector<std::string>& kwarg_keys) {
  TORCH_CHECK(kwarg_keys.size() <= flat_args.size(), "unpack_kwargs: too many keys ", kwarg_keys.size(), " vs. ",
              flat_args.size(), " (kwarg_keys must name the last values of flat_args, as pack_kwargs returns them)");
  const size_t num_positional = flat_args.size() - kwarg_keys.size();
  std::vector<c10::IValue> args(flat_args.begin(), flat_args.begin() + num_positional);
  Kwargs kwargs;
  for (size_t i = 0; i < kwarg_keys.size(); ++i) kwargs.emplace_back(kwarg_keys[i], flat_args[num_positional + i]);
  check_unique_keys(kwargs, "unpack_kwargs");
  return {std::move(args), std::move(kwargs)};
}

c10::IValue apply_to_tensors(const TensorFn& fn, const c10::IValue& container) {
  WalkOptions o;
  o.enter_objects = true;
  return walk(container, fn, o);
}

std::vector<c10::IValue> apply_to_tensors(const TensorFn& fn, const std::vector<c10::IValue>& args) {
  std::vector<c10::IValue> out;
  out.reserve(args.size());
  for (const auto& a : args) out.push_back(apply_to_tensors(fn, a));
  return out;
}

Kwargs apply_to_tensors(const TensorFn& fn, const Kwargs& kwargs) {
  Kwargs out;
  out.reserve(kwargs.size());
  for (const auto& [key, value] : kwargs) out.emplace_back(key, apply_to_tensors(fn, value));
  return out;
}

std::pair<std::vector<c10::IValue>, Kwargs> cast_forward_inputs(std::optional<at::ScalarType> dtype,
                                                                const std::vector<c10::IValue>& args,
                                                                const Kwargs& kwargs) {
  if (!dtype) return {args, kwargs};
  const at::ScalarType to = *dtype;
  TensorFn cast = [to](const at::Tensor& x) {
    if (!at::isFloatingType(x.scalar_type()) || x.scalar_type() == to) return x;
    return x.to(to);
  };
  return {apply_to_tensors(cast, args), apply_to_tensors(cast, kwargs)};
}

std::vector<c10::IValue> recursive_to(const c10::IValue& inputs, c10::Device target_device,
                                      bool use_side_stream_for_tensor_copies) {
  WalkOptions o;
  o.map_dict_keys = true;
  return {walk(inputs, mover(target_device, use_side_stream_for_tensor_copies), o)};
}

std::pair<std::vector<std::vector<c10::IValue>>, std::vector<Kwargs>> to_kwargs(
    const std::vector<c10::IValue>& inputs, const std::optional<Kwargs>& kwargs, c10::Device target_device,
    bool use_side_stream_for_tensor_copies) {
  std::vector<std::vector<c10::IValue>> moved_inputs;
  std::vector<Kwargs> moved_kwargs;
  if (!inputs.empty()) {
    for (const c10::IValue& per_device :
         recursive_to(c10::ivalue::Tuple::create(inputs), target_device, use_side_stream_for_tensor_copies)) {
      const auto& elems = per_device.toTupleRef().elements();
      moved_inputs.emplace_back(elems.begin(), elems.end());
    }
  }
  if (kwargs && !kwargs->empty()) {
    // Python maps over the dict's items (keys are strings: only values change).
    check_unique_keys(*kwargs, "to_kwargs");
    Kwargs moved;
    WalkOptions o;
    o.map_dict_keys = true;
    for (const auto& [key, value] : *kwargs)
      moved.emplace_back(key, walk(value, mover(target_device, use_side_stream_for_tensor_copies), o));
    moved_kwargs.push_back(std::move(moved));
  }
  while (moved_inputs.size() < moved_kwargs.size()) moved_inputs.emplace_back();
  while (moved_kwargs.size() < moved_inputs.size()) moved_kwargs.emplace_back();
  return {std::move(moved_inputs), std::move(moved_kwargs)};
}

}  // namespace utils
}  // namespace dtensor
