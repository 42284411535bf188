// dtensor/utils/storage.cpp: storage free/alloc.
#include "dtensor/utils/storage.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Backtrace.h>
#include <c10/util/Exception.h>

#include <iostream>
#include <sstream>

namespace dtensor {
namespace utils {

namespace {

c10::StorageImpl* storage_of(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.defined(), op, ": the tensor is undefined");
  TORCH_CHECK(t.has_storage(), op, ": the tensor has no storage (a DTensor or another wrapper tensor? pass its ",
              "local tensor)");
  return t.storage().unsafeGetStorageImpl();
}

// Storage size in elements of the tensor's dtype (Python: tensor._typed_storage()._size()).
int64_t storage_numel(const at::Tensor& t, c10::StorageImpl* s) {
  return static_cast<int64_t>(s->nbytes() / t.dtype().itemsize());
}

// Replaces the storage's memory by a fresh allocation of `nbytes` from the storage's own
// allocator. Only called to grow from or shrink to 0 bytes, so there is nothing to copy.
void resize_storage_bytes(c10::StorageImpl* s, size_t nbytes, const char* op) {
  TORCH_CHECK(s->resizable() && s->allocator() != nullptr, op,
              ": the tensor's storage is not resizable (memory not owned by PyTorch, e.g. from_blob)");
  TORCH_INTERNAL_ASSERT(s->nbytes() == 0 || nbytes == 0);
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace

void p_assert(bool cond, const std::string& message, bool raise_assertion_error) {
  if (cond) return;
  std::cerr << message << "\n" << c10::get_backtrace(/*frames_to_skip=*/1) << std::flush;
  if (raise_assertion_error) TORCH_CHECK(false, message);
}

void alloc_storage(const at::Tensor& tensor, c10::IntArrayRef size) {
  at::NoGradGuard no_grad;
  c10::StorageImpl* s = storage_of(tensor, "alloc_storage");
  const int64_t wanted = c10::multiply_integers(size);
  const int64_t have = storage_numel(tensor, s);
  if (have == wanted) return;  // already allocated
  p_assert(have == 0, "Tensor storage should have been resized to be 0 but got " + std::to_string(have));
  resize_storage_bytes(s, static_cast<size_t>(wanted) * tensor.dtype().itemsize(), "alloc_storage");
}

bool free_storage(const at::Tensor& tensor) {
  at::NoGradGuard no_grad;
  c10::StorageImpl* s = storage_of(tensor, "free_storage");
  const int64_t have = storage_numel(tensor, s);
  if (have == 0) return false;  // already freed
  std::ostringstream msg;
  msg << "Freeing a tensor's storage is unsafe when it is not the sole occupant\n"
      << "storage offset: " << tensor.storage_offset() << "\n"
      << "storage size: " << have << "\n"
      << "tensor shape: " << tensor.sizes();
  p_assert(tensor.storage_offset() == 0, msg.str());
  resize_storage_bytes(s, 0, "free_storage");
  return true;
}

bool data_ptr_allocated(const at::Tensor& tensor) {
  return tensor.defined() && tensor.has_storage() && tensor.storage().data() != nullptr;
}

}  // namespace utils
}  // namespace dtensor
