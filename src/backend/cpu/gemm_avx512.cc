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
  constexpr int kM = 12;  // 24 of the 32 registers accumulate
  int64_t t = 0;
  for (; t + kM <= T; t += kM) gemm_mx32<kM>(out + t * ldo, ldo, x + t * C, C, panel, C);
  switch (T - t) {
    case 11: gemm_mx32<11>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 10: gemm_mx32<10>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 9: gemm_mx32<9>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 8: gemm_mx32<8>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 7: gemm_mx32<7>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 6: gemm_mx32<6>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 5: gemm_mx32<5>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 4: gemm_mx32<4>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 3: gemm_mx32<3>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 2: gemm_mx32<2>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    case 1: gemm_mx32<1>(out + t * ldo, ldo, x + t * C, C, panel, C); break;
    default: break;
  }
}

}  // namespace squeezekv::cpu::avx512
