// dtensor/checkpoint/crc32.cpp: the checkpoint format's CRC-32, by ISA-L (when built with it)
// or libdeflate.
//
// ISA-L first: on this project's reference machine (AMD EPYC with AVX-512 VPCLMULQDQ, Debian 12)
// 64 MiB in 1 MiB blocks take 1.0 ms with ISA-L 2.30 when the data was just read (in the cache;
// 1.8 ms from memory), 4.0 ms with libdeflate 1.14 and 9.3 ms with zlib 1.2.13, and every byte
// a checkpoint writes and reads is checksummed (README, "Distributed checkpoint": on load it was
// as much CPU time as the read itself). ISA-L picks its AVX-512 / AVX2 / SSE code at run time.
// Debian 13's libdeflate (1.23) has a VPCLMULQDQ path too, Debian 12's does not. Both compute
// zlib's CRC-32 (crc32_gzip_refl continues from a previous value like zlib's crc32).
#include "dtensor/checkpoint/crc32.h"

#ifdef DTENSOR_WITH_ISAL
#include <isa-l/crc.h>
#else
#include <libdeflate.h>
#endif

namespace dtensor {
namespace checkpoint {

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
#ifdef DTENSOR_WITH_ISAL
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), n);
#else
  return libdeflate_crc32(crc, data, n);
#endif
}

}  // namespace checkpoint
}  // namespace dtensor
