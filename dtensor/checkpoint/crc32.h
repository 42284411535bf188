// dtensor/checkpoint/crc32.h: the checksum of the checkpoint format.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtensor {
namespace checkpoint {

// CRC-32 (IEEE 802.3, as zlib's crc32) of `n` bytes, continuing from `crc` (0 to start).
// Computed by libdeflate (Debian's libdeflate-dev), whose x86-64 code folds with carry-less
// multiplication chosen at run time (PCLMULQDQ; AVX-512 VPCLMULQDQ from libdeflate 1.20).
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

}  // namespace checkpoint
}  // namespace dtensor
