// dtensor/utils/storage.h
//
// Freeing and re-allocating the storage behind a tensor while the tensor object (and every
// handle to it: module parameters, optimizer state) stays alive, as FSDP does with its flat
// parameters between uses. Counterparts of torch.distributed.utils' _free_storage,
// _alloc_storage, _data_ptr_allocated and _p_assert.
//
//   at::Tensor flat = at::empty({1024});
//   dtensor::utils::free_storage(flat);             // storage now 0 bytes; flat keeps its shape
//   dtensor::utils::alloc_storage(flat, {1024});    // 4 KiB again (contents undefined)
//
// Nothing here is collective.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <string>

namespace dtensor {
namespace utils {

// Python's assert for places where an exception could be swallowed (autograd hooks): when
// `cond` is false, prints `message` and the C++ stack to stderr, then throws c10::Error with
// `message` if `raise_assertion_error`. (PyTorch: _p_assert.)
void p_assert(bool cond, const std::string& message, bool raise_assertion_error = true);

// Gives `tensor`'s storage room for numel(size) elements of its dtype. Nothing to do when it
// already has exactly that many; otherwise the storage must have been freed (0 elements),
// else p_assert fails with "Tensor storage should have been resized to be 0 but got N".
// (PyTorch: _alloc_storage.)
void alloc_storage(const at::Tensor& tensor, c10::IntArrayRef size);

// Resizes `tensor`'s storage to 0 bytes. Returns false when it already was. Freeing is refused
// (p_assert) when the tensor does not start its storage (storage_offset != 0): it is then not
// the storage's sole occupant. (PyTorch: _free_storage.)
bool free_storage(const at::Tensor& tensor);

// True when the tensor's storage has memory. (PyTorch: _data_ptr_allocated.)
bool data_ptr_allocated(const at::Tensor& tensor);

}  // namespace utils
}  // namespace dtensor
