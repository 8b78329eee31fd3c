// The prefill matrix kernel in 512-bit registers, and the F16 decode rows', for CPUs that have
// AVX-512F (chosen at run time; this file alone is compiled with -mavx512f). It uses raw pointers and intrinsics only: an inline
// library function instantiated here could be picked by the linker for the whole program and run
// AVX-512 code on a CPU without it.
// Same arithmetic as the AVX2 6x16 kernel in ops.cc: each output accumulates x[c] * w[c] in
// column order, one FMA per term.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/gemm_avx512.h"
#include "backend/cpu/prefetch.h"

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

// One F16 row at a time, as stored: per 64 columns four conversions (vcvtph2ps, exact) and four
// FMAs into four accumulators, 16 lanes each, then the columns past the last 16 one by one; row
// i + `ahead` asked for before row i where the caller says (as avx512bf16::dot_rows).
void dot_rows_f16(float* out, int64_t ldo, const float* x, int64_t T, int64_t C, const uint16_t* rows, int64_t stride, int64_t nr,
                  int64_t ahead) {
  const int64_t body = C / 16 * 16;
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C;
    for (int64_t i = 0; i < nr; ++i) {
      const uint16_t* w = rows + i * stride;
      if (ahead > 0 && t == 0 && i + ahead < nr) prefetch_row(w + ahead * stride, static_cast<size_t>(C) * 2);
      auto wide = [w](int64_t c) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c))); };
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      int64_t c = 0;
      for (; c + 64 <= body; c += 64) {
        a0 = _mm512_fmadd_ps(wide(c), _mm512_loadu_ps(xt + c), a0);
        a1 = _mm512_fmadd_ps(wide(c + 16), _mm512_loadu_ps(xt + c + 16), a1);
        a2 = _mm512_fmadd_ps(wide(c + 32), _mm512_loadu_ps(xt + c + 32), a2);
        a3 = _mm512_fmadd_ps(wide(c + 48), _mm512_loadu_ps(xt + c + 48), a3);
      }
      for (; c < body; c += 16) a0 = _mm512_fmadd_ps(wide(c), _mm512_loadu_ps(xt + c), a0);
      float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
      for (; c < C; ++c) s += _cvtsh_ss(w[c]) * xt[c];
      out[t * ldo + i] = s;
    }
  }
}

}  // namespace squeezekv::cpu::avx512
