#include "core/kv_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "core/quant.h"

namespace squeezekv {
namespace {

constexpr int kBlock = 32;

void put_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(p, &h, 2);
}

void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0.0f;
  for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int i = 0; i < kBlock; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[i] * id)));
}

// A 4-bit code from its scaled value (0.5 already added): [0, 15], NaN as 0 (a float-to-int
// conversion of NaN, or of a value beyond int, is undefined; rows of a damaged model or cache can
// carry one).
int nibble(float v) { return v >= 0.0f ? (v < 15.0f ? static_cast<int>(v) : 15) : 0; }

void quantize_q4_0(const float* x, uint8_t* b) {
  float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
  for (int i = 0; i < kBlock; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  for (int i = 0; i < kBlock / 2; ++i) {
    b[2 + i] = static_cast<uint8_t>(nibble(x[i] * id + 8.5f) | (nibble(x[i + 16] * id + 8.5f) << 4));
  }
}

void quantize_q4_1(const float* x, uint8_t* b) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < kBlock; ++i) lo = std::fmin(lo, x[i]), hi = std::fmax(hi, x[i]);
  const float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  put_f16(b, d);
  put_f16(b + 2, lo);
  for (int i = 0; i < kBlock / 2; ++i) {
    b[4 + i] = static_cast<uint8_t>(nibble((x[i] - lo) * id + 0.5f) | (nibble((x[i + 16] - lo) * id + 0.5f) << 4));
  }
}

DType block_dtype(KvType t) {
  return t == KvType::kQ8_0 ? DType::Q8_0 : t == KvType::kQ4_0 ? DType::Q4_0 : DType::Q4_1;
}

}  // namespace

void kv_quantize_row(KvType t, const float* x, void* dst, int D) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  switch (t) {
    case KvType::kF16: f32_to_f16_row(static_cast<uint16_t*>(dst), x, D); return;
    case KvType::kF32: std::memcpy(dst, x, static_cast<size_t>(D) * sizeof(float)); return;
    case KvType::kQ8_0:
      for (int i = 0; i < D; i += kBlock) quantize_q8_0(x + i, b + i / kBlock * 34);
      return;
    case KvType::kQ4_0:
      for (int i = 0; i < D; i += kBlock) quantize_q4_0(x + i, b + i / kBlock * 18);
      return;
    case KvType::kQ4_1:
      for (int i = 0; i < D; i += kBlock) quantize_q4_1(x + i, b + i / kBlock * 20);
      return;
  }
}

void kv_dequantize_row(KvType t, const void* src, float* x, int D) {
  switch (t) {
    case KvType::kF16: f16_to_f32_row(x, static_cast<const uint16_t*>(src), D); return;
    case KvType::kF32: std::memcpy(x, src, static_cast<size_t>(D) * sizeof(float)); return;
    default: dequantize_row(block_dtype(t), static_cast<const uint8_t*>(src), x, D); return;
  }
}

float kv_row_value(KvType t, const void* row, int d) {
  const uint8_t* r = static_cast<const uint8_t*>(row);
  switch (t) {
    case KvType::kF16: return f16_to_f32(load_u16le(r + 2 * d));
    case KvType::kF32: {
      float v;
      std::memcpy(&v, r + 4 * d, 4);
      return v;
    }
    case KvType::kQ8_0: {
      const uint8_t* b = r + d / kBlock * 34;
      return load_f16(b) * static_cast<float>(static_cast<int8_t>(b[2 + d % kBlock]));
    }
    case KvType::kQ4_0: {
      const uint8_t* b = r + d / kBlock * 18;
      const int i = d % kBlock, q = (i < 16 ? b[2 + i] & 0x0F : b[2 + i - 16] >> 4) - 8;
      return load_f16(b) * static_cast<float>(q);
    }
    case KvType::kQ4_1: {
      const uint8_t* b = r + d / kBlock * 20;
      const int i = d % kBlock, q = i < 16 ? b[4 + i] & 0x0F : b[4 + i - 16] >> 4;
      return load_f16(b) * static_cast<float>(q) + load_f16(b + 2);
    }
  }
  return 0.0f;
}

bool kv_rows_finite(KvType t, const void* rows, size_t n, int D) {
  const uint8_t* p = static_cast<const uint8_t*>(rows);
  const size_t bytes = n * kv_row_bytes(t, D);
  // an f16 at byte offset i (little-endian) is not finite where its 5 exponent bits are all set
  auto half_bad = [p](size_t i) { return (p[i + 1] & 0x7C) == 0x7C; };
  bool bad = false;
  switch (t) {
    case KvType::kF16:
      for (size_t i = 0; i < bytes; i += 2) bad |= half_bad(i);
      return !bad;
    case KvType::kF32:  // exponent: bits 23-30, the high byte's low 7 bits and the next byte's top bit
      for (size_t i = 0; i < bytes; i += 4) bad |= (p[i + 3] & 0x7F) == 0x7F && (p[i + 2] & 0x80) != 0;
      return !bad;
    case KvType::kQ8_0:
      for (size_t i = 0; i < bytes; i += 34) bad |= half_bad(i);
      return !bad;
    case KvType::kQ4_0:
      for (size_t i = 0; i < bytes; i += 18) bad |= half_bad(i);
      return !bad;
    case KvType::kQ4_1:
      for (size_t i = 0; i < bytes; i += 20) bad |= half_bad(i) || half_bad(i + 2);
      return !bad;
  }
  return false;
}

void kv_rotate(float* x, int D) {
  const int B = D & -D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(B));
  constexpr uint64_t kSigns = 0x9E3779B97F4A7C15ull;  // dim i of a block flips where bit i % 64 is set
  for (int b0 = 0; b0 < D; b0 += B) {
    float* v = x + b0;
    for (int i = 0; i < B; ++i)
      if ((kSigns >> (i % 64)) & 1) v[i] = -v[i];
    for (int len = 1; len < B; len <<= 1)
      for (int i = 0; i < B; i += 2 * len)
        for (int j = i; j < i + len; ++j) {
          const float a = v[j], c = v[j + len];
          v[j] = a + c, v[j + len] = a - c;
        }
    for (int i = 0; i < B; ++i) v[i] *= scale;
  }
}

}  // namespace squeezekv
