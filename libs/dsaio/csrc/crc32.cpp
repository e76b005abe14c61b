// CRC-32 with zlib's polynomial (reflected 0xEDB88320): the checksum in checkpoint files.
//
// zlib's crc32 runs at about 4 GB/s on this project's machines, as slow as the disk, so a save
// spent a core on it. Folding 64 bytes at a time with carry-less multiplication (PCLMULQDQ) is
// several times faster. The method and constants are Intel's "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ" (bit-reflected domain), as used by zlib-ng, Chromium and Linux.
// CPUs without PCLMULQDQ, and the bytes that do not fill a 16-byte block, use a byte table.
#include "engine.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dsaio {
namespace {

struct Table {
  uint32_t t[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
  }
};

// `crc` is the running register (already inverted), as in all the functions below.
uint32_t bytewise(uint32_t crc, const unsigned char* p, uint64_t n) {
  static const Table table;
  while (n--) crc = table.t[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
#define DSAIO_PCLMUL __attribute__((target("pclmul,sse4.1")))

DSAIO_PCLMUL inline __m128i load(const unsigned char* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}

// Carries 128 bits of remainder forward (multiplied by x^distance mod P) onto the next 128 bits.
DSAIO_PCLMUL inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

// Needs n >= 64 and n a multiple of 16.
DSAIO_PCLMUL uint32_t folded(uint32_t crc, const unsigned char* p, uint64_t n) {
  alignas(16) static const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};  // fold by 4 x 128 bits
  alignas(16) static const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};  // fold by 128 bits
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};  // 128 -> 64 bits
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};  // P(x), Barrett mu
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
  p += 64;
  n -= 64;
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  for (; n >= 64; p += 64, n -= 64) {  // four independent streams hide the multiply latency
    x1 = fold(x1, k, load(p));
    x2 = fold(x2, k, load(p + 16));
    x3 = fold(x3, k, load(p + 32));
    x4 = fold(x4, k, load(p + 48));
  }
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = fold(x1, k, x2);
  x1 = fold(x1, k, x3);
  x1 = fold(x1, k, x4);
  for (; n >= 16; p += 16, n -= 16) x1 = fold(x1, k, load(p));
  // 128 -> 64 bits.
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x2 = _mm_clmulepi64_si128(x1, k, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x2 = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x00), x2);
  // Barrett reduction to 32 bits.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), k, 0x10);
  x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), k, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x1, x2), 1));
}

bool have_pclmul() {
  static const bool ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return ok;
}
#endif

}  // namespace

uint32_t crc32(uint32_t crc, const char* data, uint64_t n) {
  auto p = reinterpret_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (n >= 64 && have_pclmul()) {
    uint64_t m = n & ~uint64_t{15};
    c = folded(c, p, m);
    p += m;
    n -= m;
  }
#endif
  return ~bytewise(c, p, n);
}

}  // namespace dsaio
