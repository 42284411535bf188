// dtensor/tensor/dtensor_impl.h
//
// DTensorImpl: the TensorImpl behind a DTensor (DESIGN.md D1, modelled on functorch's
// BatchedTensorImpl). It has no storage; it reports the GLOBAL sizes/strides/dtype of the
// distributed tensor, holds this rank's local shard (a plain tensor without autograd history)
// and the DTensorSpec, and carries kDTensorKey so that every aten op reaches the boxed
// fallback in dispatch.cpp.
//
//   at::Tensor dt = make_dtensor(local, spec);       // no autograd edge
//   DTensorImpl* impl = maybe_get_dtensor_impl(dt);  // nullptr for a plain tensor
#pragma once

#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/TensorImpl.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace dtensor {
namespace comm {
class Work;
}

// NOTE: [DTensor dispatch key]
// DTensors carry DispatchKey::Fake: it sits below Autograd/ADInplaceOrView and above
// BackendSelect and every composite kernel, so its fallback sees every op after autograd has
// recorded it. The key is marked for deletion upstream; keep it in this ONE constant and verify
// it on the libtorch of any new image before relying on it there.
constexpr c10::DispatchKey kDTensorKey = c10::DispatchKey::Fake;

class DTensorImpl : public c10::TensorImpl {
 public:
  DTensorImpl(at::Tensor local, DTensorSpec spec);
  // A DTensor whose local tensor is still being computed by `work` (an async redistribute):
  // `*result` holds it once the work has run. NOTE: [Async DTensors]
  DTensorImpl(std::shared_ptr<comm::Work> work, std::shared_ptr<at::Tensor> result, c10::Device device,
              DTensorSpec spec);

  // The local tensor; for an async DTensor this is the first use: it waits for the work
  // (rethrowing its error) before returning.
  const at::Tensor& local() const {
    if (C10_UNLIKELY(pending_flag_.load(std::memory_order_acquire))) resolve_pending();
    return local_;
  }
  // True while the local tensor of an async DTensor has not been waited for.
  bool is_pending() const { return pending_flag_.load(std::memory_order_acquire); }
  const DTensorSpec& spec() const { return spec_; }
  // Replaces local shard and spec in place (every handle of the DTensor sees it); used by
  // in-place ops that change the layout and by module surgery.
  void set_local_and_spec(at::Tensor local, DTensorSpec spec);

  // This DTensor came out of a view op whose input had to be redistributed (or is a view of
  // such a tensor): its local tensor views a redistributed copy, so it shares no memory with
  // the DTensor it is a view of, and in-place writes into it raise (NOTE: [In-place writes
  // through DTensor views] in dispatch.cpp).
  bool is_detached_view() const { return detached_view_; }
  void set_detached_view(bool detached) { detached_view_ = detached; }

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  // Names the type in libtorch errors; the text says how to save a DTensor, since libtorch's
  // serialization (torch::save, pickling) fails on its missing storage (dtensor_impl.cpp).
  const char* tensorimpl_type_name() const override;
  void refresh_global_metadata();
  void resolve_pending() const;
  void copy_pending_from(const DTensorImpl& other);
  c10::intrusive_ptr<DTensorImpl> fresh_copy() const;

  // NOTE: [Async DTensors]: local_ is undefined while pending_ is set; copies of the impl
  // (detach, views of autograd) share the pending work, and the first local() on any of them
  // waits. Dropping the last holder of an unused result waits in comm::Work's destructor.
  mutable at::Tensor local_;
  mutable std::shared_ptr<comm::Work> pending_;
  mutable std::shared_ptr<at::Tensor> pending_result_;
  mutable std::atomic<bool> pending_flag_{false};
  mutable std::mutex pending_mu_;
  DTensorSpec spec_;
  bool detached_view_ = false;
};

DTensorImpl* maybe_get_dtensor_impl(const at::Tensor& t);
DTensorImpl* unsafe_get_dtensor_impl(const at::Tensor& t);  // asserts it is one

// Wraps without autograd: the caller attaches history if needed.
at::Tensor make_dtensor(at::Tensor local, DTensorSpec spec);
// The same for a local tensor that `work` is still computing into `*result` (on `device`).
at::Tensor make_async_dtensor(std::shared_ptr<comm::Work> work, std::shared_ptr<at::Tensor> result,
                              c10::Device device, DTensorSpec spec);

}  // namespace dtensor
