// The weight block formats of GGUF (ggml's docs/gguf.md and gguf-py's quants.py describe the same
// layouts) written once, as scalar code: every block is a run of groups of 32 values, and each
// group is 32 small integers q with a scale and an offset per half of 16, so that
//   value[i] = scale[i / 16] * q[i] + min[i / 16]            (min is 0 for the types without one)
// with the same operations in the same order as the reference dequantizers (bit-exact). Kernels of
// every backend (CPU SIMD dots, GPU) are tested against `unpack_group` and `dequantize_row`.
// Thread safety: pure functions.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "squeezekv/dtype.h"

namespace squeezekv {

// One group of 32 values of a block, as integers and per-half affine factors.
struct QuantGroup {
  int8_t q[32];     // the integer quants, already offset (e.g. Q4_0's q - 8): |q| <= 127
  float scale[2];   // values 0..15 and 16..31
  float min[2];     // additive term per half (0 for types without one)
};

// The 16 values an IQ4_NL / IQ4_XS nibble indexes (the format's fixed non-linear grid).
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                         1,    13,   25,  38,  53,  69,  89,  113};

inline uint16_t load_u16le(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32le(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float load_f16(const uint8_t* p) { return f16_to_f32(load_u16le(p)); }

// Q4_K / Q5_K: sub-block j's 6-bit scale and min, packed into 12 bytes.
inline void k4_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K: scale k (of 16) is 6 bits: the low 4 in byte k (k < 8) or the high nibble of byte k - 8,
// the high 2 in byte 8 + k % 4 at bit 2 * (k / 4); stored with +32.
inline int q3k_scale(const uint8_t* s, int k) {
  const int lo = k < 8 ? (s[k] & 0x0F) : (s[k - 8] >> 4);
  const int hi = (s[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
  return (lo | (hi << 4)) - 32;
}

// IQ4_XS: sub-block j's 6-bit scale (4 low bits in scales_l, 2 high in scales_h), stored with +32.
inline int iq4xs_scale(const uint8_t* blk, int j) {
  const int lo = (blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
  const int hi = (load_u16le(blk + 2) >> (2 * j)) & 3;
  return (lo | (hi << 4)) - 32;
}

// Group g (values 32g .. 32g + 31) of the block at `blk` of type t. Layouts, byte offsets first:
//   Q8_0   (32, 34 B):  d f16 | q int8[32]                                   w = d q
//   Q4_0   (32, 18 B):  d | nibbles[16] (low: values 0..15, high: 16..31)     w = d (q - 8)
//   Q4_1   (32, 20 B):  d | m | nibbles[16]                                   w = d q + m
//   Q5_0   (32, 22 B):  d | qh u32 (bit i: 5th bit of value i) | nibbles[16]  w = d (q - 16)
//   Q5_1   (32, 24 B):  d | m | qh u32 | nibbles[16]                          w = d q + m
//   Q2_K   (256, 84 B): scales[16] (low nibble scale, high min) | qs[64] | d | dmin
//                       value 128n + 32j + l = (qs[32n + l] >> 2j) & 3;  w = d sc q - dmin m (per 16)
//   Q3_K   (256, 110 B): hmask[32] | qs[64] | scales[12] | d; 2 low bits as Q2_K, high bit of value
//                       32i + l in hmask[l] bit i, clear means -4;       w = d (sc - 32) q (per 16)
//   Q4_K   (256, 144 B): d | dmin | scales[12] | qs[128]; value 64c + 32h + l is nibble h of
//                       qs[32c + l];                                     w = d sc q - dmin m (per 32)
//   Q5_K   (256, 176 B): d | dmin | scales[12] | qh[32] | qs[128]; Q4_K's nibbles + bit i of qh[l]
//                       for value 32i + l as bit 4
//   Q6_K   (256, 210 B): ql[128] | qh[64] | scales int8[16] | d; value 128n + 32j + l: nibble
//                       (j / 2) of ql[64n + 32(j % 2) + l] | bits 2j.. of qh[32n + l] << 4, - 32;
//                       w = d sc q (per 16)
//   IQ4_NL (32, 18 B):  d | nibbles[16]                                   w = d kIq4Values[q]
//   IQ4_XS (256, 136 B): d | scales_h u16 | scales_l[4] | nibbles[128] (16 per group, as IQ4_NL)
//                                                                         w = d (ls - 32) kIq4Values[q]
// Plain float types have no groups.
template <DType T>
inline void unpack_group(const uint8_t* blk, int g, QuantGroup& o) {
  auto nibbles = [&o](const uint8_t* qs, int offset) {  // 16 bytes -> values 0..15 low, 16..31 high
    for (int l = 0; l < 16; ++l) {
      o.q[l] = static_cast<int8_t>((qs[l] & 0x0F) - offset);
      o.q[l + 16] = static_cast<int8_t>((qs[l] >> 4) - offset);
    }
  };
  auto same = [&o](float s, float m) { o.scale[0] = o.scale[1] = s, o.min[0] = o.min[1] = m; };
  if constexpr (T == DType::Q8_0) {
    std::memcpy(o.q, blk + 2, 32);
    same(load_f16(blk), 0.0f);
  } else if constexpr (T == DType::Q4_0) {
    nibbles(blk + 2, 8);
    same(load_f16(blk), 0.0f);
  } else if constexpr (T == DType::Q4_1) {
    nibbles(blk + 4, 0);
    same(load_f16(blk), load_f16(blk + 2));
  } else if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
    const int off = T == DType::Q5_1 ? 2 : 0;
    const uint32_t qh = load_u32le(blk + 2 + off);
    const uint8_t* qs = blk + 6 + off;
    const int sub = T == DType::Q5_0 ? 16 : 0;
    for (int l = 0; l < 16; ++l) {
      o.q[l] = static_cast<int8_t>(((qs[l] & 0x0F) | (((qh >> l) & 1) << 4)) - sub);
      o.q[l + 16] = static_cast<int8_t>(((qs[l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - sub);
    }
    same(load_f16(blk), T == DType::Q5_1 ? load_f16(blk + 2) : 0.0f);
  } else if constexpr (T == DType::Q2_K || T == DType::Q3_K) {
    const int n = g / 4, j = g % 4;
    const uint8_t* qs = blk + (T == DType::Q2_K ? 16 : 32) + 32 * n;
    for (int l = 0; l < 32; ++l) o.q[l] = static_cast<int8_t>((qs[l] >> (2 * j)) & 3);
    if constexpr (T == DType::Q2_K) {
      const float d = load_f16(blk + 80), dmin = load_f16(blk + 82);
      for (int h = 0; h < 2; ++h) {
        const uint8_t s = blk[2 * g + h];
        o.scale[h] = d * static_cast<float>(s & 0x0F);
        o.min[h] = -(dmin * static_cast<float>(s >> 4));
      }
    } else {
      const uint8_t* hmask = blk;
      for (int l = 0; l < 32; ++l)
        if (((hmask[l] >> g) & 1) == 0) o.q[l] = static_cast<int8_t>(o.q[l] - 4);
      const float d = load_f16(blk + 108);
      for (int h = 0; h < 2; ++h) o.scale[h] = d * static_cast<float>(q3k_scale(blk + 96, 2 * g + h));
      o.min[0] = o.min[1] = 0.0f;
    }
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    const uint8_t* qs = blk + (T == DType::Q4_K ? 16 : 48) + 32 * (g / 2);
    const int shift = 4 * (g % 2);
    for (int l = 0; l < 32; ++l) o.q[l] = static_cast<int8_t>((qs[l] >> shift) & 0x0F);
    if constexpr (T == DType::Q5_K) {
      const uint8_t* qh = blk + 16;
      for (int l = 0; l < 32; ++l) o.q[l] = static_cast<int8_t>(o.q[l] | (((qh[l] >> g) & 1) << 4));
    }
    int sc, m;
    k4_scale_min(g, blk + 4, &sc, &m);
    same(load_f16(blk) * static_cast<float>(sc), -(load_f16(blk + 2) * static_cast<float>(m)));
  } else if constexpr (T == DType::Q6_K) {
    const int n = g / 4, j = g % 4;
    const uint8_t* ql = blk + 64 * n + 32 * (j % 2);
    const uint8_t* qh = blk + 128 + 32 * n;
    const int shift = 4 * (j / 2);
    for (int l = 0; l < 32; ++l)
      o.q[l] = static_cast<int8_t>((((ql[l] >> shift) & 0x0F) | (((qh[l] >> (2 * j)) & 3) << 4)) - 32);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = load_f16(blk + 208);
    for (int h = 0; h < 2; ++h) o.scale[h] = d * static_cast<float>(sc[2 * g + h]);
    o.min[0] = o.min[1] = 0.0f;
  } else if constexpr (T == DType::IQ4_NL || T == DType::IQ4_XS) {
    const uint8_t* qs = T == DType::IQ4_NL ? blk + 2 : blk + 8 + 16 * g;
    for (int l = 0; l < 16; ++l) {
      o.q[l] = kIq4Values[qs[l] & 0x0F];
      o.q[l + 16] = kIq4Values[qs[l] >> 4];
    }
    const float d = load_f16(blk);
    same(T == DType::IQ4_NL ? d : d * static_cast<float>(iq4xs_scale(blk, g)), 0.0f);
  } else {
    static_assert(T == DType::Q8_0, "unpack_group: not a block type");
  }
}

// Whether type t's values carry an additive term (QuantGroup::min not always 0).
constexpr bool dtype_has_min(DType t) {
  return t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q2_K || t == DType::Q4_K || t == DType::Q5_K;
}

// Any block type, dispatched at run time (for tests and slow paths).
void unpack_group(DType t, const uint8_t* blk, int g, QuantGroup& o);

// dst[n] <- src (n values of type t; n a multiple of t's block size).
void dequantize_row(DType t, const uint8_t* src, float* dst, int64_t n);

// n_blocks random blocks of block type t at dst whose values stay within about [-a, a]: random
// quants and packed sub-scales, the f16 scale fields set so that the largest products reach a
// (and Q8_0 quants above -128). The same bytes for the same (seed, stream) on every machine: for
// dummy weights of a real shape (model/dummy.cc) and kernel tests, never as a quantizer.
void random_blocks(DType t, uint8_t* dst, int64_t n_blocks, float a, uint64_t seed, uint64_t stream);

}  // namespace squeezekv
