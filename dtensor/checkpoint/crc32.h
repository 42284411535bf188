// dtensor/checkpoint/crc32.h: the checksum of the checkpoint format.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dtensor {
namespace checkpoint {

// CRC-32 (IEEE 802.3, as zlib's crc32) of `n` bytes, continuing from `crc` (0 to start).
// Computed by ISA-L (Debian's libisal-dev) when the build found it, else by libdeflate
// (libdeflate-dev); both fold with carry-less multiplication chosen at run time.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

}  // namespace checkpoint
}  // namespace dtensor
