// The 8-row tile products with AVX-512 VNNI (vpdpbusd on 256-bit registers): each 4-byte group's
// products go straight into 32-bit lanes in one instruction. The integer sums are the same as the
// AVX2 kernel's (exact either way), so results are bit-identical on every machine. Compiled with
// -mavx512vnni -mavx512vl -mavx512bw; called only where cpu_features().avx512vnni.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/tile8.h"

namespace squeezekv::cpu {
namespace {

struct Dpbusd {
  static __m256i zero() { return _mm256_setzero_si256(); }
  static __m256i add(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_epi32(acc, w, x); }
  static __m256i finish(__m256i acc) { return acc; }
};

}  // namespace
#include "backend/cpu/tile8_kernel.h"

namespace vnni {

void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride) {
  tile8_products<Dpbusd, Dpbusd, 8>(t, tile, x, x_stride, n, C, out, out_stride);
}

}  // namespace vnni
}  // namespace squeezekv::cpu
