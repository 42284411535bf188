// dtensor/checkpoint/crc32.cpp: CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib's
// crc32) of the checkpoint's checksum blocks (planner.h).
//
// Two implementations giving the same values:
//   - slicing-by-8 tables (any CPU; about 2 GB/s), also used for short inputs and tails;
//   - x86-64 with PCLMULQDQ (checked at run time with cpuid): the buffer is folded 64 bytes at
//     a time by carry-less multiplication (Intel, "Fast CRC Computation for Generic Polynomials
//     Using PCLMULQDQ Instruction", 2009), four 128-bit lanes in flight, then the 128-bit rest
//     and the tail go through the tables (about 15 GB/s here); with AVX-512 VPCLMULQDQ, the
//     same folds on four 512-bit registers, 256 bytes a step. Checksumming then costs less than
//     copying the bytes (issue 14's throughput figures).
#include "dtensor/checkpoint/crc32.h"

#include <array>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define DTENSOR_CRC32_PCLMUL 1
#endif

namespace dtensor {
namespace checkpoint {

namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}

const Tables& tables() {
  static const Tables t = make_tables();
  return t;
}

// The CRC register after `n` bytes from register `state` (no pre- or post-inversion).
uint32_t update_tables(uint32_t state, const unsigned char* p, size_t n) {
  const Tables& t = tables();
  while (n >= 8) {
    uint32_t lo = state ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
    uint32_t hi = uint32_t(p[4]) | uint32_t(p[5]) << 8 | uint32_t(p[6]) << 16 | uint32_t(p[7]) << 24;
    state = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) state = t[0][(state ^ *p++) & 0xFF] ^ (state >> 8);
  return state;
}

#ifdef DTENSOR_CRC32_PCLMUL

bool cpu_has_pclmul() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_PCLMUL) != 0 && (d & bit_SSE2) != 0;
}

// AVX-512F and VPCLMULQDQ, and the OS saving the zmm registers (XCR0: SSE, AVX, opmask, zmm).
bool cpu_has_vpclmul512() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xE6u) != 0xE6u) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & (1u << 16)) != 0 && (c & (1u << 10)) != 0;  // avx512f, vpclmulqdq
}

// The fold constants for a distance of D bits: low qword x^(D+32) mod P, high qword
// x^(D-32) mod P, both bit-reflected and shifted left by one (the reflected-domain form).
constexpr long long kFold128Lo = 0x1751997d0LL, kFold128Hi = 0x0ccaa009eLL;    // D = 128
constexpr long long kFold512Lo = 0x154442bd4LL, kFold512Hi = 0x1c6e41596LL;    // D = 512
constexpr long long kFold2048Lo = 0x11542778aLL, kFold2048Hi = 0x1322d1430LL;  // D = 2048

// Folds 128-bit lane `x` forward by the distance of the constants `k` and adds `data`.
__attribute__((target("pclmul,sse2"))) inline __m128i fold(__m128i x, __m128i k, __m128i data) {
  __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
  __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), data);
}

__attribute__((target("pclmul,sse2"))) inline __m128i load16(const unsigned char* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

// From four lanes holding (congruent to) the data before `p`, over the `n` bytes at `p`. The
// folds keep the processed prefix congruent (mod P, as a message) to the 16 bytes of the last
// lane, so the CRC of those 16 bytes from register 0, continued over the tail, is the CRC of
// the whole.
__attribute__((target("pclmul,sse2"))) uint32_t finish_lanes(__m128i x0, __m128i x1, __m128i x2, __m128i x3,
                                                             const unsigned char* p, size_t n) {
  const __m128i k4 = _mm_set_epi64x(kFold512Hi, kFold512Lo);
  const __m128i k1 = _mm_set_epi64x(kFold128Hi, kFold128Lo);
  while (n >= 64) {
    x0 = fold(x0, k4, load16(p));
    x1 = fold(x1, k4, load16(p + 16));
    x2 = fold(x2, k4, load16(p + 32));
    x3 = fold(x3, k4, load16(p + 48));
    p += 64;
    n -= 64;
  }
  x1 = fold(x0, k1, x1);
  x2 = fold(x1, k1, x2);
  x3 = fold(x2, k1, x3);
  while (n >= 16) {
    x3 = fold(x3, k1, load16(p));
    p += 16;
    n -= 16;
  }
  unsigned char rest[16];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(rest), x3);
  return update_tables(update_tables(0, rest, 16), p, n);
}

// Register after `n` >= 64 bytes from register `state`: four 128-bit lanes, 64 bytes a step.
__attribute__((target("pclmul,sse2"))) uint32_t update_pclmul(uint32_t state, const unsigned char* p, size_t n) {
  __m128i x0 = _mm_xor_si128(load16(p), _mm_cvtsi32_si128(int(state)));
  return finish_lanes(x0, load16(p + 16), load16(p + 32), load16(p + 48), p + 64, n - 64);
}

#define DTENSOR_CRC32_AVX512 __attribute__((target("avx512f,vpclmulqdq,pclmul,sse2")))

DTENSOR_CRC32_AVX512 inline __m512i load64_(const unsigned char* q) {
  return _mm512_loadu_si512(reinterpret_cast<const void*>(q));
}

// fold() on each of the four lanes of a 512-bit register.
DTENSOR_CRC32_AVX512 inline __m512i fold512_(__m512i x, __m512i k, __m512i data) {
  __m512i lo = _mm512_clmulepi64_epi128(x, k, 0x00);
  __m512i hi = _mm512_clmulepi64_epi128(x, k, 0x11);
  return _mm512_ternarylogic_epi64(lo, hi, data, 0x96);  // lo ^ hi ^ data
}

// Register after `n` >= 256 bytes from register `state`: four 512-bit registers of four lanes
// each, 256 bytes a step; then the 64 bytes left in the last register go on as four lanes.
DTENSOR_CRC32_AVX512 uint32_t update_vpclmul512(uint32_t state, const unsigned char* p, size_t n) {
  const __m512i k16 = _mm512_broadcast_i32x4(_mm_set_epi64x(kFold2048Hi, kFold2048Lo));
  const __m512i k4 = _mm512_broadcast_i32x4(_mm_set_epi64x(kFold512Hi, kFold512Lo));
  __m512i z0 = _mm512_xor_si512(load64_(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128(int(state))));
  __m512i z1 = load64_(p + 64);
  __m512i z2 = load64_(p + 128);
  __m512i z3 = load64_(p + 192);
  p += 256;
  n -= 256;
  while (n >= 256) {
    z0 = fold512_(z0, k16, load64_(p));
    z1 = fold512_(z1, k16, load64_(p + 64));
    z2 = fold512_(z2, k16, load64_(p + 128));
    z3 = fold512_(z3, k16, load64_(p + 192));
    p += 256;
    n -= 256;
  }
  z1 = fold512_(z0, k4, z1);
  z2 = fold512_(z1, k4, z2);
  z3 = fold512_(z2, k4, z3);
  return finish_lanes(_mm512_extracti32x4_epi32(z3, 0), _mm512_extracti32x4_epi32(z3, 1),
                      _mm512_extracti32x4_epi32(z3, 2), _mm512_extracti32x4_epi32(z3, 3), p, n);
}

#endif

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t state = ~crc;
#ifdef DTENSOR_CRC32_PCLMUL
  static const bool pclmul = cpu_has_pclmul();
  static const bool vpclmul512 = pclmul && cpu_has_vpclmul512();
  if (vpclmul512 && n >= 256) return ~update_vpclmul512(state, p, n);
  if (pclmul && n >= 64) return ~update_pclmul(state, p, n);
#endif
  return ~update_tables(state, p, n);
}

uint32_t crc32_portable(const void* data, size_t n, uint32_t crc) {
  return ~update_tables(~crc, static_cast<const unsigned char*>(data), n);
}

}  // namespace checkpoint
}  // namespace dtensor
