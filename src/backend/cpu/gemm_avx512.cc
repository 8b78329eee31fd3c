// The prefill matrix kernel in 512-bit registers, for CPUs that have AVX-512F (chosen at run time;
// this file alone is compiled with -mavx512f). It uses raw pointers and intrinsics only: an inline
// library function instantiated here could be picked by the linker for the whole program and run
// AVX-512 code on a CPU without it.
// Same arithmetic as the AVX2 6x16 kernel in ops.cc: each output accumulates x[c] * w[c] in
// column order, one FMA per term.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/gemm_avx512.h"

#include "backend/cpu/cpu_features.h"

namespace squeezekv::cpu::avx512 {
#include "backend/cpu/row_groups.h"
namespace {

// M tokens x 32 outputs: per column two panel loads and M broadcasts feed 2M FMAs.
//   out[m * ldo + 0..32) = sum_c x[m * ldx + c] * panel[c][0..32)
template <int M>
inline void gemm_mx32(float* out, int64_t ldo, const float* x, int64_t ldx, const float* panel, int64_t C) {
  __m512 acc[M][2];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < C; ++c) {
    const __m512 w0 = _mm512_loadu_ps(panel + c * 32), w1 = _mm512_loadu_ps(panel + c * 32 + 16);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * ldx + c]);
      acc[m][0] = _mm512_fmadd_ps(b, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(b, w1, acc[m][1]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
    _mm512_storeu_ps(out + m * ldo, acc[m][0]);
    _mm512_storeu_ps(out + m * ldo + 16, acc[m][1]);
  }
}

}  // namespace

bool available() { return cpu_features().avx512f; }

void gemm_panel32(float* out, int64_t ldo, const float* x, int64_t T, int64_t C, const float* panel) {
  // 12 rows a group: 24 of the 32 registers accumulate
  for_row_groups<12>(T, [&]<int M>(int64_t t) { gemm_mx32<M>(out + t * ldo, ldo, x + t * C, C, panel, C); });
}

}  // namespace squeezekv::cpu::avx512
