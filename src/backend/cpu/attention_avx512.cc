// The attention tile kernel (attention_kernel.h) in 512-bit registers, for CPUs with AVX-512F
// (chosen at run time; this file alone is compiled with -mavx512f). Per key quad the scores of 4
// query rows at once (a decode step's GQA group of up to 4 query heads reads each key once), and
// P.V over up to 64 dims a pass. Results agree with the AVX2 kernel within f32 rounding (sums
// taken in another order), not to the bit.
#include <immintrin.h>

// GCC 12's 512-bit intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports once inlined (a known false positive of that header; as in tile8_vnni.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/attention_tile.h"
#include "backend/cpu/exp_poly.h"
#include "backend/cpu/gemm_avx512.h"

namespace squeezekv::cpu::attn {
namespace {

struct V {
  using Reg = __m512;
  static constexpr int kW = 16, kScoreRows = 4, kValueVecs = 4;  // 32 registers
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg load_i8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static Reg load_u4(const uint8_t* p, bool high) {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if (high) b = _mm_srli_epi16(b, 4);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(0x0F))));
  }
  static Reg set1_f16(const uint8_t* p) {  // the f16 at p in every lane
    uint16_t h;
    __builtin_memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(h)));
  }
  static void store(float* p, Reg x) { _mm512_storeu_ps(p, x); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  // exp(x) for x <= 0: simd::exp_nonpositive's reduction and polynomial (exp_poly.h) in 16 lanes
  static Reg exp_nonpositive(Reg x) {
    namespace e = exp_poly;
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(e::kFloor), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(e::kFloor));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(e::kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(e::kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(e::kLn2Lo), r);
    __m512 y = _mm512_set1_ps(e::kP[0]);
    for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(e::kP[i]));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i ei = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(ei));
  }
  static __m256 low(Reg a) { return _mm512_castps512_ps256(a); }
  static __m256 high(Reg a) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)); }
  static __m256 halves(Reg a) { return _mm256_add_ps(low(a), high(a)); }
  static float hsum(Reg x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(halves(x)), _mm256_extractf128_ps(halves(x), 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static float hmax(Reg x) {
    const __m256 h = _mm256_max_ps(low(x), high(x));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  static __m128 sum4(Reg a0, Reg a1, Reg a2, Reg a3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(halves(a0), halves(a1)), _mm256_hadd_ps(halves(a2), halves(a3)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  }
  static float scalar(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }
};

}  // namespace
#include "backend/cpu/attention_kernel.h"

TileFn avx512_tile(KvType k, KvType v) {
  if (!avx512::available()) return nullptr;
  return tile_for(k, v);
}

}  // namespace squeezekv::cpu::attn
