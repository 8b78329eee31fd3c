// Integer dot products of every block format with 8-bit activations (quant_dot.h). The AVX2 path
// unpacks each group of 32 weights into one register of bytes: unsigned (0..63) with the format's
// constant offset moved into the per-half `min` term where the format has one (Q4_0's -8, Q6_K's
// -32, ...), so one maddubs takes them; signed (|q| <= 127) with the sign trick for Q8_0 and the
// IQ4 tables. Written from the layouts in core/quant.h; tested against ref::dot_q8.
#include "backend/cpu/quant_dot.h"

#include <cmath>

#include "backend/cpu/simd.h"
#include "backend/cpu/tile8.h"
#include "core/quant.h"
#include "squeezekv/error.h"

namespace squeezekv::cpu {

namespace ref {

void quantize_q8(Q8Block* out, const float* x, int64_t C) {
  for (int64_t b = 0; b < C / 32; ++b, x += 32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    int sum[2] = {0, 0};
    for (int i = 0; i < 32; ++i) {
      out[b].q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inv));
      sum[i / 16] += out[b].q[i];
    }
    out[b].d = d;
    out[b].s[0] = d * static_cast<float>(sum[0]);
    out[b].s[1] = d * static_cast<float>(sum[1]);
    out[b].st = d * static_cast<float>(sum[0] + sum[1]);
    out[b].qsum = sum[0] + sum[1];
  }
}

float dot_q8(DType t, const uint8_t* row, const Q8Block* x, int64_t C) {
  const DTypeInfo& info = dtype_info(t);
  const int groups = info.block_values / 32;
  double s = 0.0;
  QuantGroup g;
  for (int64_t b = 0; b < C / info.block_values; ++b) {
    for (int j = 0; j < groups; ++j, ++x) {
      unpack_group(t, row + b * info.block_bytes, j, g);
      for (int h = 0; h < 2; ++h) {
        int64_t isum = 0, xsum = 0;
        for (int i = 16 * h; i < 16 * h + 16; ++i) isum += int64_t{g.q[i]} * x->q[i], xsum += x->q[i];
        s += double(g.scale[h]) * x->d * double(isum) + double(g.min[h]) * x->d * double(xsum);
      }
    }
  }
  return static_cast<float>(s);
}

}  // namespace ref

bool has_q8_dot(DType t) { return dtype_info(t).block_values >= 32; }

#if SQUEEZEKV_AVX2
namespace {

using simd::hsum;

// One group of 32 weights for the integer product: the bytes, and per half w = sc * q + mn.
struct Group {
  __m256i q;
  float sc[2];
  float mn[2];
};

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of nibbles -> 32 bytes: low nibbles are values 0..15, high nibbles 16..31.
inline __m256i nibbles(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

// Bit i of `bits` -> byte i: 0x10 where set, 0 where clear (the 5th bit of Q5_0/Q5_1).
inline __m256i bit4_from_bits(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask), _mm256_set1_epi8(0x10));
}

// Bytes of v shifted right by s bits (bits from the neighbouring byte are masked off by `keep`).
inline __m256i shr_bytes(__m256i v, int s, int keep) {
  return _mm256_and_si256(_mm256_srli_epi16(v, s), _mm256_set1_epi8(static_cast<char>(keep)));
}

inline __m256i iq4_lookup(__m256i idx) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values));
  return _mm256_shuffle_epi8(_mm256_set_m128i(t, t), idx);
}

inline void same(Group& o, float sc, float mn) { o.sc[0] = o.sc[1] = sc, o.mn[0] = o.mn[1] = mn; }

// Unpacked group g of the block at blk; kSigned: q holds signed bytes, else unsigned ones.
template <DType T>
struct Unpack;

template <> struct Unpack<DType::Q8_0> {
  static constexpr bool kSigned = true;
  static void group(const uint8_t* b, int, Group& o) { o.q = load32(b + 2); same(o, load_f16(b), 0.0f); }
};
template <> struct Unpack<DType::Q4_0> {
  static constexpr bool kSigned = false;
  static void group(const uint8_t* b, int, Group& o) {
    const float d = load_f16(b);
    o.q = nibbles(b + 2);
    same(o, d, -8.0f * d);
  }
};
template <> struct Unpack<DType::Q4_1> {
  static constexpr bool kSigned = false;
  static void group(const uint8_t* b, int, Group& o) { o.q = nibbles(b + 4); same(o, load_f16(b), load_f16(b + 2)); }
};
template <> struct Unpack<DType::Q5_0> {
  static constexpr bool kSigned = false;
  static void group(const uint8_t* b, int, Group& o) {
    const float d = load_f16(b);
    o.q = _mm256_or_si256(nibbles(b + 6), bit4_from_bits(load_u32le(b + 2)));
    same(o, d, -16.0f * d);
  }
};
template <> struct Unpack<DType::Q5_1> {
  static constexpr bool kSigned = false;
  static void group(const uint8_t* b, int, Group& o) {
    o.q = _mm256_or_si256(nibbles(b + 8), bit4_from_bits(load_u32le(b + 4)));
    same(o, load_f16(b), load_f16(b + 2));
  }
};
// The K formats (256 values a block) decode the block's 16 half-group scales and offsets once
// (scales(): sc[i], mn[i] for half i of the block's 32-value groups), then each group's bytes
// (quants()); the scale bit-fields are what their per-group decoding cost before.
struct Scales {
  float sc[16], mn[16];
};
template <> struct Unpack<DType::Q2_K> {
  static constexpr bool kSigned = false;
  static __m256i quants(const uint8_t* b, int g) { return shr_bytes(load32(b + 16 + 32 * (g / 4)), 2 * (g % 4), 3); }
  static void scales(const uint8_t* b, Scales& s) {
    const float d = load_f16(b + 80), dmin = load_f16(b + 82);
    for (int i = 0; i < 16; ++i) {
      s.sc[i] = d * static_cast<float>(b[i] & 0x0F);
      s.mn[i] = -(dmin * static_cast<float>(b[i] >> 4));
    }
  }
};
template <> struct Unpack<DType::Q3_K> {  // q + 4 * hbit in 0..7, the -4 in mn
  static constexpr bool kSigned = false;
  static __m256i quants(const uint8_t* b, int g) {
    const __m256i lo = shr_bytes(load32(b + 32 + 32 * (g / 4)), 2 * (g % 4), 3);
    const __m256i hi = _mm256_slli_epi16(shr_bytes(load32(b), g, 1), 2);
    return _mm256_or_si256(lo, hi);
  }
  static void scales(const uint8_t* b, Scales& s) {
    const float d = load_f16(b + 108);
    for (int i = 0; i < 16; ++i) {
      s.sc[i] = d * static_cast<float>(q3k_scale(b + 96, i));
      s.mn[i] = -4.0f * s.sc[i];
    }
  }
};
template <DType T> struct UnpackK45 {
  static constexpr bool kSigned = false;
  static __m256i quants(const uint8_t* b, int g) {
    __m256i q = shr_bytes(load32(b + (T == DType::Q4_K ? 16 : 48) + 32 * (g / 2)), 4 * (g % 2), 0x0F);
    if constexpr (T == DType::Q5_K) q = _mm256_or_si256(q, _mm256_slli_epi16(shr_bytes(load32(b + 16), g, 1), 4));
    return q;
  }
  static void scales(const uint8_t* b, Scales& s) {
    const float d = load_f16(b), dmin = load_f16(b + 2);
    for (int g = 0; g < 8; ++g) {
      int sc, m;
      k4_scale_min(g, b + 4, &sc, &m);
      s.sc[2 * g] = s.sc[2 * g + 1] = d * static_cast<float>(sc);
      s.mn[2 * g] = s.mn[2 * g + 1] = -(dmin * static_cast<float>(m));
    }
  }
};
template <> struct Unpack<DType::Q4_K> : UnpackK45<DType::Q4_K> {};
template <> struct Unpack<DType::Q5_K> : UnpackK45<DType::Q5_K> {};
template <> struct Unpack<DType::Q6_K> {  // q + 32 in 0..63, the -32 in mn
  static constexpr bool kSigned = false;
  static __m256i quants(const uint8_t* b, int g) {
    const int n = g / 4, j = g % 4;
    const __m256i lo = shr_bytes(load32(b + 64 * n + 32 * (j % 2)), 4 * (j / 2), 0x0F);
    const __m256i hi = _mm256_slli_epi16(shr_bytes(load32(b + 128 + 32 * n), 2 * j, 3), 4);
    return _mm256_or_si256(lo, hi);
  }
  static void scales(const uint8_t* b, Scales& s) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_f16(b + 208);
    for (int i = 0; i < 16; ++i) {
      s.sc[i] = d * static_cast<float>(sc[i]);
      s.mn[i] = -32.0f * s.sc[i];
    }
  }
};
template <> struct Unpack<DType::IQ4_NL> {
  static constexpr bool kSigned = true;
  static void group(const uint8_t* b, int, Group& o) { o.q = iq4_lookup(nibbles(b + 2)); same(o, load_f16(b), 0.0f); }
};
template <> struct Unpack<DType::IQ4_XS> {
  static constexpr bool kSigned = true;
  static void group(const uint8_t* b, int g, Group& o) {
    o.q = iq4_lookup(nibbles(b + 8 + 16 * g));
    same(o, load_f16(b) * static_cast<float>(iq4xs_scale(b, g)), 0.0f);
  }
};

// A block's decoded scales where the format has scales() (the K formats); the others' group()
// reads the scale of its group itself.
template <DType T>
constexpr bool kBlockScales = requires(const uint8_t* b, Scales& s) { Unpack<T>::scales(b, s); };
template <DType T>
inline void block_scales(const uint8_t* b, Scales& s) {
  if constexpr (kBlockScales<T>) Unpack<T>::scales(b, s);
}
// Group g of the block at b (its scales in s where the format decodes them per block).
template <DType T>
inline void unpack(const uint8_t* b, int g, const Scales& s, Group& o) {
  if constexpr (kBlockScales<T>) {
    o.q = Unpack<T>::quants(b, g);
    o.sc[0] = s.sc[2 * g], o.sc[1] = s.sc[2 * g + 1], o.mn[0] = s.mn[2 * g], o.mn[1] = s.mn[2 * g + 1];
  } else {
    Unpack<T>::group(b, g, o);
  }
}

// Formats whose two halves of a group share one scale and one offset (Unpack sets them with same()).
template <DType T>
constexpr bool kUniform = !(T == DType::Q2_K || T == DType::Q3_K || T == DType::Q6_K);
// Formats with an offset term (a min, or a constant moved into it).
template <DType T>
constexpr bool kOffset = dtype_has_min(T) || T == DType::Q4_0 || T == DType::Q5_0 || T == DType::Q3_K || T == DType::Q6_K;

// row . x for N activation rows at once (x + n * x_stride blocks -> out[n * out_stride]): each
// weight group is unpacked once and multiplied with every row. Each row's sums are formed by the
// same operations in the same order for every N, so a row's result does not depend on N (a
// decode batch gives each sequence what it gets alone).
template <DType T, int N>
void dot_q8_n(const uint8_t* row, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr int kValues = dtype_info(T).block_values;
  const int bytes = dtype_info(T).block_bytes;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[N];
  float offset[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps(), offset[n] = 0.0f;
  Group w;
  Scales s;
  for (int64_t b = 0; b < C / kValues; ++b) {
    const uint8_t* blk = row + b * bytes;
    block_scales<T>(blk, s);
    for (int g = 0; g < kValues / 32; ++g, ++x) {
      unpack<T>(blk, g, s, w);
      __m256i wq = w.q;
      if constexpr (Unpack<T>::kSigned) wq = _mm256_sign_epi8(w.q, w.q);  // maddubs wants an unsigned operand: |w|
      const __m256 sc = kUniform<T> ? _mm256_set1_ps(w.sc[0]) : _mm256_set_m128(_mm_set1_ps(w.sc[1]), _mm_set1_ps(w.sc[0]));
#pragma GCC unroll 4
      for (int n = 0; n < N; ++n) {
        const Q8Block* xn = x + n * x_stride;
        __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xn->q));
        if constexpr (Unpack<T>::kSigned) q = _mm256_sign_epi8(q, w.q);  // x with w's sign
        const __m256i p16 = _mm256_maddubs_epi16(wq, q);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));  // lanes 0-3: half 0, 4-7: half 1
        acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_broadcast_ss(&xn->d)), p, acc[n]);
        if constexpr (kUniform<T> && kOffset<T>) offset[n] += w.mn[0] * xn->st;
        else if constexpr (kOffset<T>) offset[n] += w.mn[0] * xn->s[0] + w.mn[1] * xn->s[1];
      }
    }
  }
  for (int n = 0; n < N; ++n) out[n * out_stride] = hsum(acc[n]) + offset[n];
}

template <DType T>
float dot_q8_t(const uint8_t* row, const Q8Block* x, int64_t C) {
  float out;
  dot_q8_n<T, 1>(row, x, 0, C, &out, 0);
  return out;
}

// Up to 4 activation rows per call.
template <DType T>
void dot_q8_rows_t(const uint8_t* row, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out, int64_t out_stride) {
  for (; n >= 4; n -= 4, x += 4 * x_stride, out += 4 * out_stride) dot_q8_n<T, 4>(row, x, x_stride, C, out, out_stride);
  switch (n) {
    case 3: return dot_q8_n<T, 3>(row, x, x_stride, C, out, out_stride);
    case 2: return dot_q8_n<T, 2>(row, x, x_stride, C, out, out_stride);
    case 1: return dot_q8_n<T, 1>(row, x, x_stride, C, out, out_stride);
    default: return;
  }
}

// The prompt path's dequantization: the same unpacked groups, widened to f32 as sc * q + mn per
// half in one FMA (within one rounding of dequantize_row, which rounds the product and the sum).
template <DType T>
void dequantize_t(const uint8_t* row, float* dst, int64_t n) {
  constexpr int kValues = dtype_info(T).block_values;
  const int bytes = dtype_info(T).block_bytes;
  Group w;
  Scales s;
  for (int64_t b = 0; b < n / kValues; ++b) {
    const uint8_t* blk = row + b * bytes;
    block_scales<T>(blk, s);
    for (int g = 0; g < kValues / 32; ++g, dst += 32) {
      unpack<T>(blk, g, s, w);
      const __m128i half[2] = {_mm256_castsi256_si128(w.q), _mm256_extracti128_si256(w.q, 1)};
      for (int k = 0; k < 4; ++k) {
        const __m128i part = k % 2 == 0 ? half[k / 2] : _mm_srli_si128(half[k / 2], 8);
        const __m256i i32 = Unpack<T>::kSigned ? _mm256_cvtepi8_epi32(part) : _mm256_cvtepu8_epi32(part);
        _mm256_storeu_ps(dst + 8 * k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_set1_ps(w.sc[k / 2]),
                                                      _mm256_set1_ps(w.mn[k / 2])));
      }
    }
  }
}

// Group tiles (tile8.h): each row's groups through the same unpacking as the decode products,
// the bytes scattered as 4-byte chunks beside the other rows'; the block scales decoded once per
// row and block.
template <DType T>
GroupKind make_group16_t(const uint8_t* rows, int64_t stride, int n, int64_t C, uint8_t* dst) {
  constexpr int kValues = dtype_info(T).block_values;
  const int bytes = dtype_info(T).block_bytes;
  std::memset(dst, 0, static_cast<size_t>(C / 32) * kGroupBytes);
  Group w;
  Scales s;
  alignas(32) uint32_t chunks[8];
  for (int r = 0; r < n; ++r) {
    const uint8_t* row = rows + r * stride;
    uint8_t* g8 = dst;
    for (int64_t b = 0; b < C / kValues; ++b) {
      const uint8_t* blk = row + b * bytes;
      block_scales<T>(blk, s);
      for (int g = 0; g < kValues / 32; ++g, g8 += kGroupBytes) {
        unpack<T>(blk, g, s, w);
        _mm256_store_si256(reinterpret_cast<__m256i*>(chunks), w.q);
        uint32_t* q = reinterpret_cast<uint32_t*>(g8);
        for (int k = 0; k < 8; ++k) q[k * kGroupRows + r] = chunks[k];
        float* sc = reinterpret_cast<float*>(g8 + 8 * kGroupRows * 4);
        float* mn = sc + 2 * kGroupRows;
        sc[r] = w.sc[0], sc[kGroupRows + r] = w.sc[1];
        mn[r] = w.mn[0], mn[kGroupRows + r] = w.mn[1];
      }
    }
  }
  return {Unpack<T>::kSigned, kUniform<T>};
}

using GroupFn = GroupKind (*)(const uint8_t*, int64_t, int, int64_t, uint8_t*);
constexpr GroupFn kGroup16[kDTypeCount] = {
    nullptr, nullptr, nullptr,
    make_group16_t<DType::Q8_0>, make_group16_t<DType::Q4_0>, make_group16_t<DType::Q4_1>, make_group16_t<DType::Q5_0>,
    make_group16_t<DType::Q5_1>, make_group16_t<DType::Q2_K>, make_group16_t<DType::Q3_K>, make_group16_t<DType::Q4_K>,
    make_group16_t<DType::Q5_K>, make_group16_t<DType::Q6_K>, make_group16_t<DType::IQ4_NL>, make_group16_t<DType::IQ4_XS>,
};

using DotFn = float (*)(const uint8_t*, const Q8Block*, int64_t);
constexpr DotFn kDots[kDTypeCount] = {
    nullptr, nullptr, nullptr,
    dot_q8_t<DType::Q8_0>, dot_q8_t<DType::Q4_0>, dot_q8_t<DType::Q4_1>, dot_q8_t<DType::Q5_0>, dot_q8_t<DType::Q5_1>,
    dot_q8_t<DType::Q2_K>, dot_q8_t<DType::Q3_K>, dot_q8_t<DType::Q4_K>, dot_q8_t<DType::Q5_K>, dot_q8_t<DType::Q6_K>,
    dot_q8_t<DType::IQ4_NL>, dot_q8_t<DType::IQ4_XS>,
};

using DotRowsFn = void (*)(const uint8_t*, const Q8Block*, int64_t, int, int64_t, float*, int64_t);
constexpr DotRowsFn kDotRows[kDTypeCount] = {
    nullptr, nullptr, nullptr,
    dot_q8_rows_t<DType::Q8_0>, dot_q8_rows_t<DType::Q4_0>, dot_q8_rows_t<DType::Q4_1>, dot_q8_rows_t<DType::Q5_0>,
    dot_q8_rows_t<DType::Q5_1>, dot_q8_rows_t<DType::Q2_K>, dot_q8_rows_t<DType::Q3_K>, dot_q8_rows_t<DType::Q4_K>,
    dot_q8_rows_t<DType::Q5_K>, dot_q8_rows_t<DType::Q6_K>, dot_q8_rows_t<DType::IQ4_NL>, dot_q8_rows_t<DType::IQ4_XS>,
};

using DequantizeFn = void (*)(const uint8_t*, float*, int64_t);
constexpr DequantizeFn kDequantize[kDTypeCount] = {
    nullptr, nullptr, nullptr,
    dequantize_t<DType::Q8_0>, dequantize_t<DType::Q4_0>, dequantize_t<DType::Q4_1>, dequantize_t<DType::Q5_0>,
    dequantize_t<DType::Q5_1>, dequantize_t<DType::Q2_K>, dequantize_t<DType::Q3_K>, dequantize_t<DType::Q4_K>,
    dequantize_t<DType::Q5_K>, dequantize_t<DType::Q6_K>, dequantize_t<DType::IQ4_NL>, dequantize_t<DType::IQ4_XS>,
};

}  // namespace

void dequantize_row_fast(DType t, const uint8_t* row, float* dst, int64_t n) {
  if (has_q8_dot(t)) return kDequantize[static_cast<int>(t)](row, dst, n);
  dequantize_row(t, row, dst, n);
}

void quantize_q8(Q8Block* out, const float* x, int64_t C) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < C / 32; ++b, x += 32) {
    __m256 v[4], mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + 8 * k);
      mx = _mm256_max_ps(mx, _mm256_and_ps(v[k], abs_mask));
    }
    const float d = simd::hmax(mx) / 127.0f;
    const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    __m256i i32[4];
    for (int k = 0; k < 4; ++k)
      i32[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // pack 32 x i32 -> 32 x i8 in order (packs interleave 128-bit lanes; the permute restores it)
    const __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]), i16b = _mm256_packs_epi32(i32[2], i32[3]);
    const __m256i i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16a, i16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q), i8);
    // sums of each half: bytes 0..15 are the low 128-bit lane
    const __m256i sum32 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), i8), _mm256_set1_epi16(1));
    __m128i lo = _mm256_castsi256_si128(sum32), hi = _mm256_extracti128_si256(sum32, 1);
    lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0x4e));
    lo = _mm_add_epi32(lo, _mm_shuffle_epi32(lo, 0xb1));
    hi = _mm_add_epi32(hi, _mm_shuffle_epi32(hi, 0x4e));
    hi = _mm_add_epi32(hi, _mm_shuffle_epi32(hi, 0xb1));
    out[b].d = d;
    out[b].s[0] = d * static_cast<float>(_mm_cvtsi128_si32(lo));
    out[b].s[1] = d * static_cast<float>(_mm_cvtsi128_si32(hi));
    out[b].st = d * static_cast<float>(_mm_cvtsi128_si32(lo) + _mm_cvtsi128_si32(hi));
    out[b].qsum = _mm_cvtsi128_si32(lo) + _mm_cvtsi128_si32(hi);
  }
}

bool has_group16(DType t) { return has_q8_dot(t); }

GroupKind make_group16(DType t, const uint8_t* rows, int64_t stride, int n, int64_t C, uint8_t* dst) {
  return kGroup16[static_cast<int>(t)](rows, stride, n, C, dst);
}

float dot_q8(DType t, const uint8_t* row, const Q8Block* x, int64_t C) { return kDots[static_cast<int>(t)](row, x, C); }

void dot_q8_rows(DType t, const uint8_t* row, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                 int64_t out_stride) {
  kDotRows[static_cast<int>(t)](row, x, x_stride, n, C, out, out_stride);
}

#else

bool has_group16(DType) { return false; }
GroupKind make_group16(DType, const uint8_t*, int64_t, int, int64_t, uint8_t*) { throw Error("make_group16: needs the AVX2 build"); }

void dequantize_row_fast(DType t, const uint8_t* row, float* dst, int64_t n) { dequantize_row(t, row, dst, n); }
void quantize_q8(Q8Block* out, const float* x, int64_t C) { ref::quantize_q8(out, x, C); }
float dot_q8(DType t, const uint8_t* row, const Q8Block* x, int64_t C) { return ref::dot_q8(t, row, x, C); }
void dot_q8_rows(DType t, const uint8_t* row, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                 int64_t out_stride) {
  for (int i = 0; i < n; ++i) out[i * out_stride] = ref::dot_q8(t, row, x + i * x_stride, C);
}

#endif

}  // namespace squeezekv::cpu
