#include "backend/cpu/quant.h"

#include <cstring>

#include "core/half.h"

namespace squeezekv::cpu {
namespace {

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Q8_0: f16 d, 32 x int8.  x = d * q
void deq_q8_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 34, dst += 32) {
    const float d = f16_to_f32(load_u16(src));
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 32; ++j) dst[j] = d * static_cast<float>(q[j]);
  }
}

// Q4_0: f16 d, 16 bytes; low nibble of byte j is value j, high nibble value j+16.  x = d * (q - 8)
void deq_q4_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 18, dst += 32) {
    const float d = f16_to_f32(load_u16(src));
    const uint8_t* q = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>((q[j] & 0x0F) - 8);
      dst[j + 16] = d * static_cast<float>((q[j] >> 4) - 8);
    }
  }
}

// Q4_1: f16 d, f16 m, 16 bytes.  x = d * q + m
void deq_q4_1(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 20, dst += 32) {
    const float d = f16_to_f32(load_u16(src));
    const float m = f16_to_f32(load_u16(src + 2));
    const uint8_t* q = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * static_cast<float>(q[j] & 0x0F) + m;
      dst[j + 16] = d * static_cast<float>(q[j] >> 4) + m;
    }
  }
}

// Q4_K: super-block of 256: f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins, 128 bytes
// of nibbles. Eight sub-blocks of 32; sub-block j: x = d*sc_j*q - dmin*m_j.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void deq_q4_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 144) {
    const float d = f16_to_f32(load_u16(src));
    const float dmin = f16_to_f32(load_u16(src + 2));
    const uint8_t* scales = src + 4;
    const uint8_t* q = src + 16;
    for (int is = 0; is < 8; is += 2, q += 32, dst += 64) {
      uint8_t sc, m;
      scale_min_k4(is, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) dst[l] = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) dst[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// Q6_K: super-block of 256: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, f16 d.
void deq_q6_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 210) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = f16_to_f32(load_u16(src + 208));
    for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * sc[is] * static_cast<float>(q1);
        dst[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        dst[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        dst[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

}  // namespace

void dequantize_row(DType t, const uint8_t* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case DType::Q8_0:
      return deq_q8_0(src, dst, n / 32);
    case DType::Q4_0:
      return deq_q4_0(src, dst, n / 32);
    case DType::Q4_1:
      return deq_q4_1(src, dst, n / 32);
    case DType::Q4_K:
      return deq_q4_k(src, dst, n / 256);
    case DType::Q6_K:
      return deq_q6_k(src, dst, n / 256);
  }
}

}  // namespace squeezekv::cpu
