#include "backend/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/quant.h"
#include "core/half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SQUEEZEKV_AVX2 1
#endif

namespace squeezekv::cpu {

void set_threads(int n) { omp_set_num_threads(std::max(1, n)); }
int threads() { return omp_get_max_threads(); }

namespace ref {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, w.row(r), row.data(), w.cols);
    for (int64_t t = 0; t < T; ++t) {
      double s = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(row[c]) * x[t * w.cols + c];
      out[t * w.rows + r] = static_cast<float>(s) + (bias ? bias[r] : 0.0f);
    }
  }
}

}  // namespace ref

#if SQUEEZEKV_AVX2
namespace {
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
}  // namespace
#endif

float dot(const float* a, const float* b, int64_t n) {
#if SQUEEZEKV_AVX2
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
#else
  return ref::dot(a, b, n);
#endif
}

namespace {

constexpr int64_t kRowBlock = 16;  // weight rows dequantized together, reused across all T

// Per-thread dequantization buffer, grown once and reused (no allocation in steady state).
float* row_buffer(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

#if SQUEEZEKV_AVX2
// 4 weight rows x 3 tokens of dot products at once: 12 accumulators, 7 loads per 12 FMAs, so the
// loop is bound by FMA throughput rather than loads. C must be a multiple of 8.
//   out[t * R + r] for r in [0, 4), t in [0, 3); w: 4 rows of C floats at stride C; x: 3 rows at stride C
inline void dot_4x3(float* out, int64_t R, const float* w, const float* x, int64_t C) {
  __m256 a[4][3];
  for (auto& row : a)
    for (auto& v : row) v = _mm256_setzero_ps();
  for (int64_t c = 0; c < C; c += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + C + c), x2 = _mm256_loadu_ps(x + 2 * C + c);
    for (int r = 0; r < 4; ++r) {
      const __m256 wr = _mm256_loadu_ps(w + r * C + c);
      a[r][0] = _mm256_fmadd_ps(wr, x0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(wr, x1, a[r][1]);
      a[r][2] = _mm256_fmadd_ps(wr, x2, a[r][2]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < 3; ++t) out[t * R + r] = hsum(a[r][t]);
}
#endif

#if SQUEEZEKV_AVX2
// Fused dequantize-and-dot for one stored row (decode: T = 1). Each block's values are formed
// exactly as dequantize_row forms them (d * q, then + m, no contraction) and accumulated in the
// same four lanes-of-8 as dot(), so the result is bit-identical to dequantize_row + dot.
inline __m256 q_to_ps(__m128i bytes8_as_epi32_src, bool is_signed) {
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes8_as_epi32_src) : _mm256_cvtepu8_epi32(bytes8_as_epi32_src));
}

float dot_stored(DType t, const uint8_t* row, const float* x, int64_t C) {
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const int64_t nb = C / 32;
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    __m256 w[4];
    if (t == DType::Q8_0) {
      const uint8_t* blk = row + b * 34;
      const __m256 d = _mm256_set1_ps(f16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8))));
      for (int k = 0; k < 4; ++k)
        w[k] = _mm256_mul_ps(d, q_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * k)), true));
    } else {  // Q4_0 / Q4_1: low nibbles are values 0..15, high nibbles 16..31
      const bool q41 = t == DType::Q4_1;
      const uint8_t* blk = row + b * (q41 ? 20 : 18);
      const __m256 d = _mm256_set1_ps(f16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8))));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q41 ? 4 : 2)));
      const __m128i mask = _mm_set1_epi8(0x0F);
      __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
      if (!q41) {  // q - 8
        lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
        hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
      }
      const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(d, q_to_ps(parts[k], !q41));
      if (q41) {
        const __m256 m = _mm256_set1_ps(f16_to_f32(static_cast<uint16_t>(blk[2] | (blk[3] << 8))));
        for (auto& wk : w) wk = _mm256_add_ps(wk, m);
      }
    }
    for (int k = 0; k < 4; ++k) s[k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + 8 * k), s[k]);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
}

bool has_fused_dot(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1; }
#endif

// out[t][r0 + i] for a block of nr rows already in f32 (rows at stride C).
void block_dots(float* out, int64_t R, int64_t r0, const float* rows, int64_t nr, const float* x, int64_t T, int64_t C) {
  int64_t t = 0;
#if SQUEEZEKV_AVX2
  if (C % 8 == 0 && nr % 4 == 0) {
    for (; t + 3 <= T; t += 3)
      for (int64_t i = 0; i < nr; i += 4) dot_4x3(out + t * R + r0 + i, R, rows + i * C, x + t * C, C);
  }
#endif
  for (; t < T; ++t) {
    const float* xt = x + t * C;
    float* ot = out + t * R + r0;
    for (int64_t i = 0; i < nr; ++i) ot[i] = dot(rows + i * C, xt, C);
  }
}

}  // namespace

void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias) {
  const int64_t R = w.rows, C = w.cols;
  const int64_t n_blocks = (R + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t r0 = b * kRowBlock;
    const int64_t nr = std::min(kRowBlock, R - r0);
    if (w.type == DType::F32) {
      block_dots(out, R, r0, reinterpret_cast<const float*>(w.row(r0)), nr, x, T, C);
#if SQUEEZEKV_AVX2
    } else if (T < 3 && has_fused_dot(w.type)) {  // decode: no dequantization buffer
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < nr; ++i) out[t * R + r0 + i] = dot_stored(w.type, w.row(r0 + i), x + t * C, C);
#endif
    } else {
      float* buf = row_buffer(static_cast<size_t>(kRowBlock * C));
      for (int64_t i = 0; i < nr; ++i) dequantize_row(w.type, w.row(r0 + i), buf + i * C, C);
      block_dots(out, R, r0, buf, nr, x, T, C);
    }
    if (bias != nullptr) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < nr; ++i) out[t * R + r0 + i] += bias[r0 + i];
    }
  }
}

void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * E;
    float* ot = out + t * E;
    float ss = 0.0f;
    for (int64_t i = 0; i < E; ++i) ss += xt[i] * xt[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(E) + eps);
    for (int64_t i = 0; i < E; ++i) ot[i] = w[i] * (xt[i] * inv);
  }
}

void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq,
          RopePairing pairing) {
  const int half = D / 2;
  thread_local std::vector<float> cs;
  cs.resize(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const float a = static_cast<float>(pos[t]) * inv_freq[i];
      cs[2 * i] = std::cos(a);
      cs[2 * i + 1] = std::sin(a);
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * D;
      for (int i = 0; i < half; ++i) {
        const int i0 = pairing == RopePairing::kHalves ? i : 2 * i;
        const int i1 = pairing == RopePairing::kHalves ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = b * c + a * s;
      }
    }
  }
}

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void f32_to_f16_row(uint16_t* dst, const float* src, int64_t n) {
  int64_t i = 0;
#if SQUEEZEKV_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

}  // namespace squeezekv::cpu
