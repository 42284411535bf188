// dtensor/checkpoint/pickle_internal.h: checks a stored value's bytes (libtorch's
// torch::jit::pickle_save: a zip archive, the torch.save format, holding a pickle and its
// tensors' records) before libtorch's reader sees them. Internal: not part of the API.
//
// libtorch trusts the sizes inside: a record's size from the zip directory is allocated
// before it is read, and its unpickler reserves a string's length from the pickle (up to
// 2^64) and a memo of twice a memo id before checking that the bytes exist (libtorch 1.13:
// Unpickler::readBytes, LONG_BINPUT). A bad file could make it allocate without bound.
#pragma once

#include <cstddef>
#include <string>

namespace dtensor {
namespace checkpoint {
namespace detail {

// Throws a c10::Error, "<what>: <why>", unless every record of the archive is stored
// (uncompressed) inside it, and its pickle's length-prefixed arguments fit in the pickle and
// its memo ids count up from 0.
void check_pickled_value(const char* data, size_t size, const std::string& what);

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
