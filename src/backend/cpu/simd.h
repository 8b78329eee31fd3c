// Small AVX2 helpers shared by the CPU kernels (horizontal reductions, a vector exp). Defines
// SQUEEZEKV_AVX2 when the build targets AVX2 + FMA + F16C.
#pragma once

#include "backend/cpu/exp_poly.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SQUEEZEKV_AVX2 1
#endif

namespace squeezekv::cpu::simd {
#if SQUEEZEKV_AVX2
// exp(x) for x <= 0, ~1 ulp (Cody-Waite range reduction, degree-6 polynomial on [-ln2/2, ln2/2]);
// x below -87 (and -inf, a masked key) gives exactly 0.
inline __m256 exp_nonpositive(__m256 x) {
  namespace e = exp_poly;
  const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(e::kFloor), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(e::kFloor));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(e::kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(e::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(e::kLn2Lo), r);
  __m256 y = _mm256_set1_ps(e::kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(e::kP[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i ei = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero_below, _mm256_mul_ps(y, _mm256_castsi256_ps(ei)));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#endif
}  // namespace squeezekv::cpu::simd
