// The 8-row tile products with AVX-512 VNNI (vpdpbusd on 256-bit registers, and for two tiles at
// once on 512-bit registers): each 4-byte group's products go straight into 32-bit lanes in one
// instruction. The integer sums are the same as the AVX2 kernel's (exact either way), so results
// are bit-identical on every machine. Compiled with -mavx512vnni -mavx512vl -mavx512bw; called
// only where cpu_features().avx512vnni.
#include <immintrin.h>

// GCC 12's 512-bit intrinsics start from _mm512_undefined_*(), a self-initialised variable that
// -Wmaybe-uninitialized (-Wuninitialized for the broadcasts) reports once inlined here (a known
// false positive of that header).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <array>
#include <cstring>

#include "backend/cpu/tile8.h"
#include "core/quant.h"

namespace squeezekv::cpu {
namespace {

struct Dpbusd {
  static constexpr bool kSums16 = false;
  static __m256i zero() { return _mm256_setzero_si256(); }
  static __m256i add(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_epi32(acc, w, x); }
  static __m256i finish(__m256i acc) { return acc; }
};

}  // namespace
#include "backend/cpu/tile8_kernel.h"
namespace {

// Two tiles in one pass of 512-bit registers: lanes 0-7 hold tile a's rows, lanes 8-15 tile b's.
// Every lane runs tile_q4's operations in tile_q4's order (exact integer sums per block, then the
// same two FMAs), so the results equal two tile_q4 calls to the bit; what is shared is the x
// broadcasts and the loop, per 16 rows instead of 8.
__attribute__((always_inline)) inline __m512i chunk_pair(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}
__attribute__((always_inline)) inline __m512 f16_pair(const uint8_t* a, const uint8_t* b) {
  const __m128i ha = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a)), hb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(ha), hb, 1));
}

// Weights ahead of use: a pass over 8 activation rows spends ~50 cycles on a block, and the loads
// of the weight tiles were the hot instructions (the hardware prefetcher does not keep ahead of
// two streams read at that pace); each block asks for the lines kPrefetchBlocks blocks ahead of
// every stream it reads (past a tile's end: the next tile, which the same thread reads next).
// 8 rows, Q4_1, SmolLM2-135M: 5.47 -> 4.45 ms a step (8 to 32 blocks ahead within noise).
constexpr int kPrefetchBlocks = 16;
__attribute__((always_inline)) inline void prefetch_ahead(const uint8_t* p, int block_bytes) {
  for (int off = 0; off < block_bytes + 32; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBlocks * block_bytes + off), _MM_HINT_T0);
}

// IQ4_NL's grid + 128: the unsigned bytes vpdpbusd multiplies (built once, not per call).
constexpr std::array<uint8_t, 16> kIq4Unsigned = [] {
  std::array<uint8_t, 16> a{};
  for (int i = 0; i < 16; ++i) a[i] = static_cast<uint8_t>(kIq4Values[i] + 128);
  return a;
}();

// Q5_0's / Q5_1's fifth bits of chunk c for both tiles (tile_q4's fifth_bits in 512 bits).
__attribute__((always_inline)) inline __m512i fifth_bits16(__m512i qh, int c) {
  const __m512i v = c < 4 ? _mm512_slli_epi16(qh, 4 - c) : _mm512_srli_epi16(qh, c - 4);
  return _mm512_and_si512(v, _mm512_set1_epi8(0x10));
}

// kind: Q4_0, Q4_1, Q5_0 / Q5_1 (nibble | fifth bit << 4), or IQ4_NL (each nibble looked up as its
// grid value + 128, an unsigned byte, so one dpbusd forms the sum of (w + 128) x that tile_iq4
// forms in two steps).
template <DType kType, int N>
void pair_q4(const uint8_t* ta, const uint8_t* tb, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr bool kIq4 = kType == DType::IQ4_NL, kQ5 = kType == DType::Q5_0 || kType == DType::Q5_1;
  constexpr bool kMin = kType == DType::Q4_1 || kType == DType::Q5_1;  // a stored min m after d
  constexpr int kQh = kMin ? 32 : 16, kQ = kQh + (kQ5 ? 32 : 0), kBlock = kQ + 128;
  constexpr float kMinOfD = kIq4 ? -128.0f : kQ5 ? -16.0f : -8.0f;  // the min term's factor of d (no stored min)
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i grid = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Unsigned.data())));
  __m512 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, ta += kBlock, tb += kBlock) {
    prefetch_ahead(ta, kBlock), prefetch_ahead(tb, kBlock);
    __m512i sum[N];
    for (int n = 0; n < N; ++n) sum[n] = _mm512_setzero_si512();
    [[maybe_unused]] const __m512i qh = kQ5 ? chunk_pair(ta + kQh, tb + kQh) : low;
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i q = chunk_pair(ta + kQ + 32 * k, tb + kQ + 32 * k);
      __m512i lo = _mm512_and_si512(q, low), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
      if constexpr (kIq4) lo = _mm512_shuffle_epi8(grid, lo), hi = _mm512_shuffle_epi8(grid, hi);
      if constexpr (kQ5) lo = _mm512_or_si512(lo, fifth_bits16(qh, k)), hi = _mm512_or_si512(hi, fifth_bits16(qh, k + 4));
      for (int n = 0; n < N; ++n) {
        const int8_t* xq = x[n * x_stride].q;
        int32_t f0, f1;
        std::memcpy(&f0, xq + 4 * k, 4);
        std::memcpy(&f1, xq + 4 * (k + 4), 4);
        sum[n] = _mm512_dpbusd_epi32(sum[n], lo, _mm512_set1_epi32(f0));
        sum[n] = _mm512_dpbusd_epi32(sum[n], hi, _mm512_set1_epi32(f1));
      }
    }
    const __m512 d = f16_pair(ta, tb);
    const __m512 mn = kMin ? f16_pair(ta + 16, tb + 16) : _mm512_mul_ps(_mm512_set1_ps(kMinOfD), d);
    for (int n = 0; n < N; ++n) {
      const Q8Block& xn = x[n * x_stride];
      acc[n] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xn.d)), _mm512_cvtepi32_ps(sum[n]), acc[n]);
      acc[n] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xn.st), acc[n]);
    }
  }
  for (int n = 0; n < N; ++n) _mm512_storeu_ps(out + n * out_stride, acc[n]);
}

constexpr int kMinPairRows = 8;

// Q8_0 pairs: the bytes w + 128 (w with its top bit flipped: unsigned for vpdpbusd) times x, less
// 128 times the activations' integer sum, is tile_q8's integer sum of w x exactly, and the floats
// are tile_q8's.
template <int N>
void pair_q8(const uint8_t* ta, const uint8_t* tb, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr int kBlock = 272, kQ = 16;
  const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, ta += kBlock, tb += kBlock) {
    prefetch_ahead(ta, kBlock), prefetch_ahead(tb, kBlock);
    __m512i sum[N];
    for (int n = 0; n < N; ++n) sum[n] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m512i wu = _mm512_xor_si512(chunk_pair(ta + kQ + 32 * c, tb + kQ + 32 * c), top);
      for (int n = 0; n < N; ++n) {
        int32_t f;
        std::memcpy(&f, x[n * x_stride].q + 4 * c, 4);
        sum[n] = _mm512_dpbusd_epi32(sum[n], wu, _mm512_set1_epi32(f));
      }
    }
    const __m512 d = f16_pair(ta, tb);
    for (int n = 0; n < N; ++n) {
      const __m512i isum = _mm512_sub_epi32(sum[n], _mm512_set1_epi32(128 * x[n * x_stride].qsum));
      acc[n] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x[n * x_stride].d)), _mm512_cvtepi32_ps(isum), acc[n]);
    }
  }
  for (int n = 0; n < N; ++n) _mm512_storeu_ps(out + n * out_stride, acc[n]);
}

// n activation rows over two tiles, in groups of 8, 4, then 1 (a row's sums do not depend on its group)
template <DType kType>
void pairs(const uint8_t* ta, const uint8_t* tb, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
           int64_t out_stride) {
  int i = 0;
  auto one = [&]<int N>(int at) {
    if constexpr (kType == DType::Q8_0) pair_q8<N>(ta, tb, x + at * x_stride, x_stride, C, out + at * out_stride, out_stride);
    else pair_q4<kType, N>(ta, tb, x + at * x_stride, x_stride, C, out + at * out_stride, out_stride);
  };
  for (; i + 8 <= n; i += 8) one.template operator()<8>(i);
  for (; i + 4 <= n; i += 4) one.template operator()<4>(i);
  for (; i < n; ++i) one.template operator()<1>(i);
}

// Group tiles, all 16 rows in one pass of 512-bit registers: every lane runs group_n's operations
// in group_n's order on the same exact integers (signed bytes sharing one scale: w + 128 times x,
// less 128 times the activations' sum, as pair_q8; signed bytes per half: |w| and x negated where
// w < 0), so the results equal the 256-bit kernel's to the bit.
template <bool kSigned, bool kUniform, int N>
void group16_n(const uint8_t* g, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr bool kOffset = kSigned && kUniform;  // w + 128 and one correction a block
  const __m512i zero = _mm512_setzero_si512(), top = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, g += kGroupBytes) {
    prefetch_ahead(g, kGroupBytes);
    __m512i s0[N], s1[N];
    for (int n = 0; n < N; ++n) s0[n] = s1[n] = zero;
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i w = _mm512_loadu_si512(g + k * 4 * kGroupRows);
      const __m512i wu = kOffset ? _mm512_xor_si512(w, top) : kSigned ? _mm512_abs_epi8(w) : w;
      const __mmask64 neg = kSigned && !kOffset ? _mm512_movepi8_mask(w) : 0;
      for (int n = 0; n < N; ++n) {
        int32_t f;
        std::memcpy(&f, x[n * x_stride].q + 4 * k, 4);
        __m512i xc = _mm512_set1_epi32(f);
        if constexpr (kSigned && !kOffset) xc = _mm512_mask_sub_epi8(xc, neg, zero, xc);
        if (kUniform || k < 4) s0[n] = _mm512_dpbusd_epi32(s0[n], wu, xc);
        else s1[n] = _mm512_dpbusd_epi32(s1[n], wu, xc);
      }
    }
    if constexpr (kOffset)
      for (int n = 0; n < N; ++n) s0[n] = _mm512_sub_epi32(s0[n], _mm512_set1_epi32(128 * x[n * x_stride].qsum));
    const float* sc = reinterpret_cast<const float*>(g + 8 * 4 * kGroupRows);
    const __m512 sc0 = _mm512_loadu_ps(sc), sc1 = _mm512_loadu_ps(sc + kGroupRows);
    const __m512 mn0 = _mm512_loadu_ps(sc + 2 * kGroupRows), mn1 = _mm512_loadu_ps(sc + 3 * kGroupRows);
    for (int n = 0; n < N; ++n) {
      const Q8Block& xn = x[n * x_stride];
      const __m512 dx = _mm512_set1_ps(xn.d);
      acc[n] = _mm512_fmadd_ps(_mm512_mul_ps(sc0, dx), _mm512_cvtepi32_ps(s0[n]), acc[n]);
      if constexpr (kUniform) {
        acc[n] = _mm512_fmadd_ps(mn0, _mm512_set1_ps(xn.st), acc[n]);
      } else {
        acc[n] = _mm512_fmadd_ps(_mm512_mul_ps(sc1, dx), _mm512_cvtepi32_ps(s1[n]), acc[n]);
        acc[n] = _mm512_fmadd_ps(mn0, _mm512_set1_ps(xn.s[0]), acc[n]);
        acc[n] = _mm512_fmadd_ps(mn1, _mm512_set1_ps(xn.s[1]), acc[n]);
      }
    }
  }
  for (int n = 0; n < N; ++n) _mm512_storeu_ps(out + n * out_stride, acc[n]);
}

template <bool kSigned, bool kUniform>
void group16_rows(const uint8_t* g, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out, int64_t out_stride) {
  int i = 0;
  auto one = [&]<int N>(int at) { group16_n<kSigned, kUniform, N>(g, x + at * x_stride, x_stride, C, out + at * out_stride, out_stride); };
  for (; i + 8 <= n; i += 8) one.template operator()<8>(i);
  for (; i + 4 <= n; i += 4) one.template operator()<4>(i);
  for (; i < n; ++i) one.template operator()<1>(i);
}

}  // namespace

namespace vnni {

void dot_q8_tile8x2(DType t, const uint8_t* tile_a, const uint8_t* tile_b, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride) {
  // a few rows (decode) are faster through the 256-bit kernel one tile at a time (seen on an AMD
  // EPYC: one row 20% slower in pairs); prompt chunks and batches of 8+ rows go in pairs
  if (n >= kMinPairRows) {
    switch (t) {
      case DType::Q4_0: return pairs<DType::Q4_0>(tile_a, tile_b, x, x_stride, n, C, out, out_stride);
      case DType::Q4_1: return pairs<DType::Q4_1>(tile_a, tile_b, x, x_stride, n, C, out, out_stride);
      case DType::Q5_0: return pairs<DType::Q5_0>(tile_a, tile_b, x, x_stride, n, C, out, out_stride);
      case DType::Q5_1: return pairs<DType::Q5_1>(tile_a, tile_b, x, x_stride, n, C, out, out_stride);
      case DType::IQ4_NL: return pairs<DType::IQ4_NL>(tile_a, tile_b, x, x_stride, n, C, out, out_stride);
      case DType::Q8_0: return pairs<DType::Q8_0>(tile_a, tile_b, x, x_stride, n, C, out, out_stride);
      default: break;
    }
  }
  tile8_products<Dpbusd, Dpbusd, 8>(t, tile_a, x, x_stride, n, C, out, out_stride);
  tile8_products<Dpbusd, Dpbusd, 8>(t, tile_b, x, x_stride, n, C, out + 8, out_stride);
}

void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride) {
  tile8_products<Dpbusd, Dpbusd, 8>(t, tile, x, x_stride, n, C, out, out_stride);
}

void dot_q8_group16(GroupKind kind, const uint8_t* g, int rows, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride) {
  if (rows == kGroupRows && n >= kMinPairRows) {
    if (kind.is_signed && kind.uniform) return group16_rows<true, true>(g, x, x_stride, n, C, out, out_stride);
    if (kind.is_signed) return group16_rows<true, false>(g, x, x_stride, n, C, out, out_stride);
    if (kind.uniform) return group16_rows<false, true>(g, x, x_stride, n, C, out, out_stride);
    return group16_rows<false, false>(g, x, x_stride, n, C, out, out_stride);
  }
  for (int half = 0; half < rows / 8; ++half) group8_products<Dpbusd, 8>(kind, g, half, x, x_stride, n, C, out + 8 * half, out_stride);
}

}  // namespace vnni
}  // namespace squeezekv::cpu
