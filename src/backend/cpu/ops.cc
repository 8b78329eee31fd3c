#include "backend/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <array>
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

// a . f16 row
inline float dot_f16(const float* a, const uint16_t* b, int64_t n) {
#if SQUEEZEKV_AVX2
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8)));
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, s1);
  }
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * f16_to_f32(b[i]);
  return s;
#else
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * f16_to_f32(b[i]);
  return s;
#endif
}

// acc[n] += p * row[n]
inline void axpy(float* acc, float p, const float* row, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += p * row[i];
}
inline void axpy_f16(float* acc, float p, const uint16_t* row, int64_t n) {
#if SQUEEZEKV_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 r = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, r, _mm256_loadu_ps(acc + i)));
  }
  for (; i < n; ++i) acc[i] += p * f16_to_f32(row[i]);
#else
  for (int64_t i = 0; i < n; ++i) acc[i] += p * f16_to_f32(row[i]);
#endif
}

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

int64_t attention_scratch_floats(int64_t T, int H, int N) {
  (void)T;
  // per head: a score row [N]; plus per-head mass rows [H][N]
  return static_cast<int64_t>(H) * N * 2;
}

void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
               AttentionProbe* probe, float* scratch) {
  const int G = kv.n_kv_heads, D = kv.head_dim, N = kv.count;
  const int group = H / G;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  float* const mass = probe != nullptr ? probe->mass : nullptr;
  const int64_t mass_from = probe != nullptr ? probe->mass_row_begin : 0;
  const bool entropy = probe != nullptr && probe->entropy;
  float* head_mass = scratch + static_cast<int64_t>(H) * N;  // [H][N]
  // per-head entropy sums, added in head order afterwards so the result does not depend on threads
  std::array<double, 1024> ent_sum{};
  std::array<int64_t, 1024> ent_rows{};
#pragma omp parallel for schedule(dynamic, 1)
  for (int h = 0; h < H; ++h) {
    const int g = h / group;
    const int32_t* pos = kv.pos + static_cast<int64_t>(g) * kv.capacity;
    const size_t base = static_cast<size_t>(g) * kv.capacity * D;
    float* p = scratch + static_cast<int64_t>(h) * N;
    float* hm = head_mass + static_cast<int64_t>(h) * N;
    if (mass != nullptr) std::fill(hm, hm + N, 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      const float* qt = q + (t * H + h) * D;
      float* ot = out + (t * H + h) * D;
      // slots are in no particular order: the causal mask is by position, and masked keys cost
      // a compare, not a dot product
      const int32_t qp = q_pos[t];
      const int n = N;
      int visible = 0;
      float mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        if (pos[j] > qp) {
          p[j] = -INFINITY;
          continue;
        }
        ++visible;
        const float s = kv.type == KvType::kF16
                            ? dot_f16(qt, static_cast<const uint16_t*>(kv.k) + base + static_cast<size_t>(j) * D, D)
                            : dot(qt, static_cast<const float*>(kv.k) + base + static_cast<size_t>(j) * D, D);
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      const float inv = 1.0f / sum;
      std::fill(ot, ot + D, 0.0f);
      for (int j = 0; j < n; ++j) {
        p[j] *= inv;
        if (kv.type == KvType::kF16)
          axpy_f16(ot, p[j], static_cast<const uint16_t*>(kv.v) + base + static_cast<size_t>(j) * D, D);
        else
          axpy(ot, p[j], static_cast<const float*>(kv.v) + base + static_cast<size_t>(j) * D, D);
      }
      if (mass != nullptr && t >= mass_from)
        for (int j = 0; j < n; ++j) hm[j] += p[j];
      if (entropy && visible >= 2) {
        double e = 0.0;
        for (int j = 0; j < n; ++j)
          if (p[j] > 0.0f) e -= static_cast<double>(p[j]) * std::log(static_cast<double>(p[j]));
        ent_sum[h] += e / std::log(static_cast<double>(visible));
        ++ent_rows[h];
      }
    }
  }
  if (entropy) {
    for (int h = 0; h < H; ++h) {
      probe->entropy_sum += ent_sum[h];
      probe->entropy_rows += ent_rows[h];
    }
  }
  if (mass != nullptr) {
    const float inv_group = 1.0f / static_cast<float>(group);
    for (int g = 0; g < G; ++g) {
      float* mg = mass + static_cast<int64_t>(g) * (probe->mass_stride > 0 ? probe->mass_stride : N);
      for (int j = 0; j < N; ++j) {
        float s = 0.0f;
        for (int k = 0; k < group; ++k) s += head_mass[static_cast<int64_t>(g * group + k) * N + j];
        mg[j] += s * inv_group;
      }
    }
  }
}

}  // namespace squeezekv::cpu
