// Prototype: q8_0 keys' decode scores, f32 (the engine's way) vs transposed keys with VNNI and an
// int8 query. Not part of the product.
#include <immintrin.h>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

constexpr int D = 64, R = 3, RB = 68;  // q8_0 row bytes: [f16 d][32 q] x 2

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

// --- A: the engine's f32 way (score_tile<3> per quad, sum4) ---
static inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  auto halves = [](__m512 a) { return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1))); };
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(halves(a0), halves(a1)), _mm256_hadd_ps(halves(a2), halves(a3)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
static inline __m512 load_i8(const uint8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p))); }
static inline __m512 set1_f16(const uint8_t* p) { uint16_t h; memcpy(&h, p, 2); return _mm512_cvtph_ps(_mm256_set1_epi16((short)h)); }

void scores_f32(float* s, const float* q, const uint8_t* k, int N, float scale) {
  for (int c = 0; c < N / 4; ++c) {
    const uint8_t* kc = k + (size_t)4 * c * RB;
    __m512 a[R][4];
    for (int r = 0; r < R; ++r) for (int j = 0; j < 4; ++j) a[r][j] = _mm512_setzero_ps();
    for (int b = 0; b < 2; ++b) {
      __m512 sc[4];
      for (int j = 0; j < 4; ++j) sc[j] = set1_f16(kc + j * RB + b * 34);
      for (int h = 0; h < 2; ++h) {
        const int d = b * 32 + h * 16;
        __m512 kv[4];
        for (int j = 0; j < 4; ++j) kv[j] = _mm512_mul_ps(load_i8(kc + j * RB + b * 34 + 2 + h * 16), sc[j]);
        for (int r = 0; r < R; ++r) {
          const __m512 qr = _mm512_loadu_ps(q + r * D + d);
          for (int j = 0; j < 4; ++j) a[r][j] = _mm512_fmadd_ps(qr, kv[j], a[r][j]);
        }
      }
    }
    for (int r = 0; r < R; ++r) _mm_storeu_ps(s + (size_t)r * N + 4 * c, _mm_mul_ps(sum4(a[r][0], a[r][1], a[r][2], a[r][3]), _mm_set1_ps(scale)));
  }
}

// --- B: transposed keys, VNNI, int8 query ---
struct QInt { alignas(64) int32_t w[R][16]; float d[R][2]; int32_t qsum[R][2]; };
QInt quantize_q(const float* q) {
  QInt o;
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < 2; ++b) {
      float mx = 0; for (int i = 0; i < 32; ++i) mx = std::max(mx, std::fabs(q[r * D + b * 32 + i]));
      const float d = mx / 127.0f, inv = d > 0 ? 1.0f / d : 0.0f;
      int8_t qq[32]; int sum = 0;
      for (int i = 0; i < 32; ++i) { qq[i] = (int8_t)std::nearbyint(q[r * D + b * 32 + i] * inv); sum += qq[i]; }
      memcpy(&o.w[r][b * 8], qq, 32);
      o.d[r][b] = d; o.qsum[r][b] = sum;
    }
  return o;
}
// 16x16 dword transpose in place (x[i] lane j -> x[j] lane i)
static inline void transpose16(__m512i* x) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) { t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]); t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]); }
  for (int i = 0; i < 16; i += 4) {
    x[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]); x[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    x[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]); x[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // now within each 128-bit lane L of x[i]: 4x4 done; lanes across registers: blocks of 4 regs
  for (int i = 0; i < 4; ++i) {  // combine regs i, i+4, i+8, i+12 by 128-bit lanes
    const __m512i a = x[i], b = x[i + 4], c = x[i + 8], d = x[i + 12];
    const __m512i ab_lo = _mm512_shuffle_i32x4(a, b, 0x88), ab_hi = _mm512_shuffle_i32x4(a, b, 0xDD);
    const __m512i cd_lo = _mm512_shuffle_i32x4(c, d, 0x88), cd_hi = _mm512_shuffle_i32x4(c, d, 0xDD);
    x[i] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88); x[i + 8] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
    x[i + 4] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88); x[i + 12] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
  }
}
void scores_vnni(float* s, const QInt& qi, const uint8_t* k, int N, float scale) {
  const __m512i top = _mm512_set1_epi8((char)0x80);
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15), _mm512_set1_epi32(RB));
  for (int g = 0; g < N / 16; ++g) {
    const uint8_t* kg = k + (size_t)16 * g * RB;
    __m512i x[16];
    for (int i = 0; i < 16; ++i) {
      const uint8_t* row = kg + i * RB;
      x[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(row + 2))), _mm256_loadu_si256((const __m256i*)(row + 36)), 1);
    }
    transpose16(x);  // x[j]: dword j (dims 4j..4j+3) of the 16 keys
    for (int j = 0; j < 16; ++j) x[j] = _mm512_xor_si512(x[j], top);
    // the keys' scales: the dword at each row's start (d0) and at +34 (d1), low halves
    const __m512 d0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx, kg, 1)));
    const __m512 d1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx, kg + 34, 1)));
    for (int r = 0; r < R; ++r) {
      __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) a0 = _mm512_dpbusd_epi32(a0, x[j], _mm512_set1_epi32(qi.w[r][j]));
      for (int j = 8; j < 16; ++j) a1 = _mm512_dpbusd_epi32(a1, x[j], _mm512_set1_epi32(qi.w[r][j]));
      a0 = _mm512_sub_epi32(a0, _mm512_set1_epi32(128 * qi.qsum[r][0]));
      a1 = _mm512_sub_epi32(a1, _mm512_set1_epi32(128 * qi.qsum[r][1]));
      __m512 sc = _mm512_mul_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(d0, _mm512_set1_ps(qi.d[r][0] * scale)));
      sc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(d1, _mm512_set1_ps(qi.d[r][1] * scale)), sc);
      _mm512_storeu_ps(s + (size_t)r * N + 16 * g, sc);
    }
  }
}


// --- C: transposed keys, f32 query (each byte lane sign-extended and converted, q broadcast) ---
void scores_tf32(float* s, const float* q, const uint8_t* k, int N, float scale) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15), _mm512_set1_epi32(RB));
  for (int g = 0; g < N / 16; ++g) {
    const uint8_t* kg = k + (size_t)16 * g * RB;
    __m512i x[16];
    for (int i = 0; i < 16; ++i) {
      const uint8_t* row = kg + i * RB;
      x[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(row + 2))), _mm256_loadu_si256((const __m256i*)(row + 36)), 1);
    }
    transpose16(x);
    const __m512 d0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx, kg, 1)));
    const __m512 d1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx, kg + 34, 1)));
    __m512 a[R][2];
    for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int j = 0; j < 16; ++j) {
      const __m512 v0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x[j], 24), 24));
      const __m512 v1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x[j], 16), 24));
      const __m512 v2 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x[j], 8), 24));
      const __m512 v3 = _mm512_cvtepi32_ps(_mm512_srai_epi32(x[j], 24));
      const int b = j / 8;
      for (int r = 0; r < R; ++r) {
        const float* qr = q + r * D + 4 * j;
        a[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(qr[0]), v0, a[r][b]);
        a[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(qr[1]), v1, a[r][b]);
        a[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(qr[2]), v2, a[r][b]);
        a[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(qr[3]), v3, a[r][b]);
      }
    }
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(s + (size_t)r * N + 16 * g, _mm512_mul_ps(_mm512_fmadd_ps(a[r][1], d1, _mm512_mul_ps(a[r][0], d0)), _mm512_set1_ps(scale)));
  }
}

int main() {
  const int N = 8192, G = 3, reps = 2000;
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  std::vector<uint8_t> k((size_t)G * N * RB);
  for (size_t i = 0; i < k.size(); i += 34) {
    const uint16_t h = _cvtss_sh(0.01f + 0.02f * (rng() % 100) / 100.0f, 0); memcpy(&k[i], &h, 2);
    for (int j = 0; j < 32; ++j) k[i + 2 + j] = (uint8_t)(int8_t)((int)(rng() % 255) - 127);
  }
  std::vector<float> q(G * R * D); for (auto& v : q) v = nd(rng);
  std::vector<float> sa((size_t)G * R * N), sb((size_t)G * R * N);
  const float scale = 0.125f;
  std::vector<QInt> qi(G);
  for (int g = 0; g < G; ++g) qi[g] = quantize_q(q.data() + g * R * D);
  // accuracy
  for (int g = 0; g < G; ++g) { scores_f32(sa.data() + (size_t)g * R * N, q.data() + g * R * D, k.data() + (size_t)g * N * RB, N, scale);
                                scores_vnni(sb.data() + (size_t)g * R * N, qi[g], k.data() + (size_t)g * N * RB, N, scale); }
  std::vector<float> sc((size_t)G * R * N);
  for (int g = 0; g < G; ++g) scores_tf32(sc.data() + (size_t)g * R * N, q.data() + g * R * D, k.data() + (size_t)g * N * RB, N, scale);
  { double w = 0; for (size_t i = 0; i < sa.size(); ++i) w = std::max(w, (double)std::fabs(sa[i] - sc[i])); printf("max |f32 - transposed f32| %.3g\n", w); }
  double worst = 0, mag = 0; for (size_t i = 0; i < sa.size(); ++i) worst = std::max(worst, (double)std::fabs(sa[i] - sb[i])), mag = std::max(mag, (double)std::fabs(sa[i]));
  printf("max |f32 - vnni| %.4g of max |score| %.4g\n", worst, mag);
  for (int round = 0; round < 3; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) for (int g = 0; g < G; ++g) scores_f32(sa.data() + (size_t)g * R * N, q.data() + g * R * D, k.data() + (size_t)g * N * RB, N, scale);
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) for (int g = 0; g < G; ++g) { qi[g] = quantize_q(q.data() + g * R * D); scores_vnni(sb.data() + (size_t)g * R * N, qi[g], k.data() + (size_t)g * N * RB, N, scale); }
    auto t2 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) for (int g = 0; g < G; ++g) scores_tf32(sc.data() + (size_t)g * R * N, q.data() + g * R * D, k.data() + (size_t)g * N * RB, N, scale);
    auto t3 = std::chrono::steady_clock::now();
    printf("per layer (3 kv heads x 8192 keys x 3 rows), 1 thread: f32 %.1f us, vnni %.1f us, transposed f32 %.1f us\n",
           std::chrono::duration<double, std::micro>(t1 - t0).count() / reps, std::chrono::duration<double, std::micro>(t2 - t1).count() / reps,
           std::chrono::duration<double, std::micro>(t3 - t2).count() / reps);
  }
}
