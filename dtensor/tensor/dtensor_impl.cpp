// dtensor/tensor/dtensor_impl.cpp
#include "dtensor/tensor/dtensor_impl.h"

#include "dtensor/comm/work.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <typeinfo>

namespace dtensor {

namespace {
c10::DispatchKeySet keyset_for(c10::Device device) {
  const auto backend = device.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  return c10::DispatchKeySet({kDTensorKey, backend});
}
}  // namespace

DTensorImpl::DTensorImpl(at::Tensor local, DTensorSpec spec)
    : c10::TensorImpl(keyset_for(local.device()), local.dtype(), local.device()),
      local_(std::move(local)),
      spec_(std::move(spec)) {
  TORCH_INTERNAL_ASSERT(!local_.defined() || maybe_get_dtensor_impl(local_) == nullptr,
                        "a DTensor's local tensor cannot itself be a DTensor");
  set_storage_access_should_throw();
  refresh_global_metadata();
}

DTensorImpl::DTensorImpl(std::shared_ptr<comm::Work> work, std::shared_ptr<at::Tensor> result, c10::Device device,
                         DTensorSpec spec)
    : c10::TensorImpl(keyset_for(device), caffe2::TypeMeta::fromScalarType(spec.tensor_meta.dtype), device),
      pending_(std::move(work)),
      pending_result_(std::move(result)),
      spec_(std::move(spec)) {
  TORCH_INTERNAL_ASSERT(pending_ && pending_result_, "an async DTensor needs its work and result slot");
  pending_flag_.store(true, std::memory_order_release);
  set_storage_access_should_throw();
  refresh_global_metadata();
}

void DTensorImpl::resolve_pending() const {
  std::lock_guard<std::mutex> lk(pending_mu_);
  if (!pending_) return;  // another thread resolved it
  pending_->wait();       // rethrows the collective's error; the DTensor stays pending then
  local_ = *pending_result_;
  pending_.reset();
  pending_result_.reset();
  pending_flag_.store(false, std::memory_order_release);
}

c10::intrusive_ptr<DTensorImpl> DTensorImpl::fresh_copy() const {
  std::lock_guard<std::mutex> lk(pending_mu_);
  if (pending_) return c10::make_intrusive<DTensorImpl>(pending_, pending_result_, device(), spec_);
  return c10::make_intrusive<DTensorImpl>(local_, spec_);
}

void DTensorImpl::copy_pending_from(const DTensorImpl& other) {
  std::lock_guard<std::mutex> lk(other.pending_mu_);
  local_ = other.local_;
  pending_ = other.pending_;
  pending_result_ = other.pending_result_;
  pending_flag_.store(pending_ != nullptr, std::memory_order_release);
}

void DTensorImpl::refresh_global_metadata() {
  const auto& m = spec_.tensor_meta;
  TORCH_INTERNAL_ASSERT(m.shape.size() == m.stride.size(), "DTensorSpec with ", m.shape.size(),
                        " sizes and ", m.stride.size(), " strides");
  sizes_and_strides_.set_sizes(m.shape);
  for (size_t i = 0; i < m.stride.size(); ++i) sizes_and_strides_.stride_at_unchecked(i) = m.stride[i];
  storage_offset_ = m.storage_offset;
  data_type_ = caffe2::TypeMeta::fromScalarType(m.dtype);
  refresh_numel();
  refresh_contiguous();
}

void DTensorImpl::set_local_and_spec(at::Tensor local, DTensorSpec spec) {
  this->local();  // an in-place change of a pending DTensor waits first
  local_ = std::move(local);
  spec_ = std::move(spec);
  refresh_global_metadata();
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = fresh_copy();
  impl->detached_view_ = detached_view_;
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  impl->refresh_global_metadata();
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = fresh_copy();
  impl->detached_view_ = detached_view_;
  copy_tensor_metadata(this, impl.get(), std::move(version_counter), allow_tensor_metadata_change);
  impl->refresh_global_metadata();
  return impl;
}

void DTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<DTensorImpl*>(impl.get());
  TORCH_CHECK(other != nullptr,
              "cannot assign a plain tensor's data to a DTensor (e.g. param.set_data(plain)); "
              "distribute the tensor first");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  copy_pending_from(*other);
  spec_ = other->spec_;
  detached_view_ = other->detached_view_;
  refresh_global_metadata();
}

DTensorImpl* maybe_get_dtensor_impl(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has(kDTensorKey)) return nullptr;
  // NOTE: [Plain tensor with the DTensor key]
  // plain.set_data(dtensor) passes libtorch's compatibility check (both are dense CPU) and
  // copies the DTensor's key set into the plain TensorImpl, which then reaches the DTensor
  // fallback without being a DTensorImpl. torch::nn::Module::clone() does this to a module
  // with DTensor parameters. Refuse instead of reading a DTensorImpl that is not there.
  TORCH_CHECK(typeid(*t.unsafeGetTensorImpl()) == typeid(DTensorImpl),
              "a plain tensor of shape ", t.sizes(), " carries the DTensor dispatch key: it was given a DTensor's "
              "data with set_data() (torch::nn::Module::clone() of a module with DTensor parameters does this), "
              "which cannot work. Replace parameters with dtensor::nn::swap_parameter, and clone a module "
              "before parallelizing it, not after");
  return static_cast<DTensorImpl*>(t.unsafeGetTensorImpl());
}

DTensorImpl* unsafe_get_dtensor_impl(const at::Tensor& t) {
  auto* impl = maybe_get_dtensor_impl(t);
  TORCH_INTERNAL_ASSERT(impl != nullptr, "expected a DTensor");
  return impl;
}

// NOTE: [Saving a DTensor]
// libtorch's serialization (torch::save of a tensor or a module, jit pickling) reads a tensor's
// storage, which a DTensor does not have: TensorImpl raises "Cannot access storage of <this
// name>", so the name carries the way out. PyTorch pickles the DTensor subclass (local tensor +
// spec); C++ has no hook for that in libtorch's pickler.
const char* DTensorImpl::tensorimpl_type_name() const {
  return "DTensorImpl (a DTensor has no storage of its own, so libtorch's serialization (torch::save, "
         "pickle_save) cannot save it: save its local shard (dtensor::to_local) on every rank or the whole "
         "tensor (dtensor::full_tensor), or save a module with "
         "dtensor::checkpoint::save(dtensor::checkpoint::get_model_state_dict(module), dir), which keeps "
         "placements and reshards on load)";
}

at::Tensor make_dtensor(at::Tensor local, DTensorSpec spec) {
  return at::detail::make_tensor<DTensorImpl>(local.detach(), std::move(spec));
}

at::Tensor make_async_dtensor(std::shared_ptr<comm::Work> work, std::shared_ptr<at::Tensor> result,
                              c10::Device device, DTensorSpec spec) {
  return at::detail::make_tensor<DTensorImpl>(std::move(work), std::move(result), device, std::move(spec));
}

}  // namespace dtensor
