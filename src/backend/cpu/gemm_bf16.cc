// The matrix kernels for BF16 weights on CPUs with AVX-512 BF16 (chosen at run time; this file
// alone is compiled with -mavx512f -mavx512bf16): activations rounded once to bf16, pairs of
// products summed into f32 by vdpbf16ps, twice the multiply-adds of an f32 FMA per instruction;
// prompt chunks over packed panels of 32 rows, decode rows over the rows as stored.
// Raw pointers and intrinsics only, as gemm_avx512.cc (no inline library code instantiated here).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_avx512.h"
#include "backend/cpu/prefetch.h"

namespace squeezekv::cpu::avx512bf16 {
#include "backend/cpu/row_groups.h"
namespace {

// M tokens x 32 outputs: per pair of columns two panel loads and M broadcasts feed 2M vdpbf16ps.
//   out[m * ldo + 0..32) = sum_p x[m * ldx + p] . panel[p][0..32)   (each a pair of bf16)
template <int M>
inline void gemm_mx32(float* out, int64_t ldo, const uint32_t* x, int64_t ldx, const uint32_t* panel, int64_t P) {
  __m512 acc[M][2];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; ++p) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + p * 32), w1 = (__m512bh)_mm512_loadu_si512(panel + p * 32 + 16);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * ldx + p]));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, b);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, b);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) {
    _mm512_storeu_ps(out + m * ldo, acc[m][0]);
    _mm512_storeu_ps(out + m * ldo + 16, acc[m][1]);
  }
}

// 16 rows of 16 entries (r[i] = row i) into 16 columns: r[j] <- entry j of rows 0..15. 32-bit
// interleaves within 128-bit lanes, then 64-bit, then two rounds of 128-bit lane picks. (GCC 12
// warns of the intrinsics' own undefined-vector placeholders here: a false positive.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {  // u[i + c] holds column c + 4 l of rows i..i+3 in lane l
    u[i + 0] = _mm512_unpacklo_epi64(t[i], t[i + 2]), u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]), u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88), r[c + 8] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[c + 4] = _mm512_shuffle_i32x4(v1, v3, 0x88), r[c + 12] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}
#pragma GCC diagnostic pop

}  // namespace

bool available() { return cpu_features().avx512bf16; }

void pack_pairs32(uint32_t* panel, const uint32_t* rows, int64_t stride, int64_t P) {
  int64_t p = 0;
  for (; p + 16 <= P; p += 16)
    for (int half = 0; half < 2; ++half) {
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows + (half * 16 + i) * stride + p);
      transpose16(r);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(panel + (p + j) * 32 + half * 16, r[j]);
    }
  for (; p < P; ++p)
    for (int i = 0; i < 32; ++i) panel[p * 32 + i] = rows[i * stride + p];
}

void to_bf16_pairs(uint32_t* out, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i / 2, (__m512i)h);
  }
  if (i < n) {  // the tail through a zero-padded copy (n is even)
    alignas(64) float tail[32] = {};
    for (int64_t j = i; j < n; ++j) tail[j - i] = x[j];
    alignas(64) uint32_t packed[16];
    _mm512_store_si512(packed, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(tail + 16), _mm512_load_ps(tail)));
    for (int64_t j = 0; j < (n - i) / 2; ++j) out[i / 2 + j] = packed[j];
  }
}

void gemm_panel32(float* out, int64_t ldo, const uint32_t* x, int64_t T, int64_t P, const uint32_t* panel) {
  // 12 rows a group: 24 of the 32 registers accumulate
  for_row_groups<12>(T, [&]<int M>(int64_t t) { gemm_mx32<M>(out + t * ldo, ldo, x + t * P, P, panel, P); });
}

// One row at a time, as the weights lie: per 64 columns four row loads, four activation loads and
// four vdpbf16ps into four accumulators (four chains hide the instruction's latency). Row i +
// `ahead` asked for (software prefetch) before row i where the caller says: 4 KB ahead on Intel
// CPUs (the GPU machine's Xeon read BF16 rows 20-25% faster so), none elsewhere (on the AMD EPYC,
// family 26, with a fifth of the f32 dot's instructions the hardware prefetchers keep ahead of
// the row stream alone: asking 3.4-4 KB ahead cost 5-15% at one thread on 2026-12-07, four rows
// interleaved a half; cpu_features.cc). P's last entries (P % 16) by a masked load.
void dot_rows(float* out, int64_t ldo, const uint32_t* x, int64_t T, int64_t P, const uint32_t* rows, int64_t stride, int64_t nr,
              int64_t ahead) {
  const __mmask16 last = static_cast<__mmask16>((1u << (P % 16)) - 1);
  const int64_t body = P / 16 * 16;
  for (int64_t t = 0; t < T; ++t) {
    const uint32_t* xt = x + t * P;
    for (int64_t i = 0; i < nr; ++i) {
      const uint32_t* w = rows + i * stride;
      if (ahead > 0 && t == 0 && i + ahead < nr) prefetch_row(w + ahead * stride, static_cast<size_t>(P) * 4);
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      int64_t p = 0;
      for (; p + 64 <= body; p += 64) {
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + p), (__m512bh)_mm512_loadu_si512(xt + p));
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + p + 16), (__m512bh)_mm512_loadu_si512(xt + p + 16));
        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w + p + 32), (__m512bh)_mm512_loadu_si512(xt + p + 32));
        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w + p + 48), (__m512bh)_mm512_loadu_si512(xt + p + 48));
      }
      for (; p < body; p += 16) a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + p), (__m512bh)_mm512_loadu_si512(xt + p));
      if (last != 0)
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_maskz_loadu_epi32(last, w + p), (__m512bh)_mm512_maskz_loadu_epi32(last, xt + p));
      out[t * ldo + i] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
  }
}

}  // namespace squeezekv::cpu::avx512bf16
