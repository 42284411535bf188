// dtensor/checkpoint/crc32.h: the checksum of the checkpoint format (see crc32.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtensor {
namespace checkpoint {

// CRC-32 (IEEE 802.3, as zlib's crc32) of `n` bytes, continuing from `crc` (0 to start).
// Uses carry-less multiplication where the CPU has it (x86-64 PCLMULQDQ), tables otherwise.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);
// The same value, always from the tables (the reference the fast path is tested against).
uint32_t crc32_portable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace checkpoint
}  // namespace dtensor
