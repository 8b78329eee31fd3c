// Scalar dequantization of every block format through unpack_group (core/quant.h).
#include "core/quant.h"

#include <algorithm>

#include "core/random.h"

namespace squeezekv {
namespace {

template <DType T>
void dequantize_blocks(const uint8_t* src, float* dst, int64_t n) {
  const DTypeInfo& info = dtype_info(T);
  const int groups = info.block_values / 32;
  QuantGroup g;
  for (int64_t b = 0; b < n / info.block_values; ++b, src += info.block_bytes) {
    for (int j = 0; j < groups; ++j, dst += 32) {
      unpack_group<T>(src, j, g);
      for (int i = 0; i < 32; ++i) {
        const float v = g.scale[i / 16] * static_cast<float>(g.q[i]);
        dst[i] = dtype_has_min(T) ? v + g.min[i / 16] : v;
      }
    }
  }
}

template <DType T>
void unpack_one(const uint8_t* blk, int g, QuantGroup& o) {
  unpack_group<T>(blk, g, o);
}

// One row per block type, indexed by DType (the plain float types have none).
using DequantizeFn = void (*)(const uint8_t*, float*, int64_t);
using UnpackFn = void (*)(const uint8_t*, int, QuantGroup&);
struct BlockFns {
  DequantizeFn dequantize = nullptr;
  UnpackFn unpack = nullptr;
};
template <DType T>
constexpr BlockFns fns() {
  return {&dequantize_blocks<T>, &unpack_one<T>};
}
constexpr BlockFns kBlockFns[kDTypeCount] = {
    {}, {}, {},
    fns<DType::Q8_0>(), fns<DType::Q4_0>(), fns<DType::Q4_1>(), fns<DType::Q5_0>(), fns<DType::Q5_1>(),
    fns<DType::Q2_K>(), fns<DType::Q3_K>(), fns<DType::Q4_K>(), fns<DType::Q5_K>(), fns<DType::Q6_K>(),
    fns<DType::IQ4_NL>(), fns<DType::IQ4_XS>(),
};

}  // namespace

void unpack_group(DType t, const uint8_t* blk, int g, QuantGroup& o) { kBlockFns[static_cast<int>(t)].unpack(blk, g, o); }

void dequantize_row(DType t, const uint8_t* src, float* dst, int64_t n) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:  // rows of 2-byte values start 2-byte aligned in every format we load
      return f16_to_f32_row(dst, reinterpret_cast<const uint16_t*>(src), n);
    case DType::BF16:
      return bf16_to_f32_row(dst, reinterpret_cast<const uint16_t*>(src), n);
    default:
      kBlockFns[static_cast<int>(t)].dequantize(src, dst, n);
  }
}

void random_blocks(DType t, uint8_t* dst, int64_t n_blocks, float a, uint64_t seed, uint64_t stream) {
  uint64_t s = stream_state(seed, stream);
  const DTypeInfo& info = dtype_info(t);
  const size_t bytes = static_cast<size_t>(n_blocks) * info.block_bytes;
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t r = splitmix64(s);
    std::memcpy(dst + i, &r, std::min<size_t>(8, bytes - i));
  }
  // each type's f16 fields (offset, value): its scale d so that scale x quant reaches about a, and
  // where it has one, the offset's scale
  struct Field {
    int offset;
    float value;
  };
  Field f[2] = {{-1, 0.0f}, {-1, 0.0f}};
  switch (t) {
    case DType::Q8_0: f[0] = {0, a / 127}; break;
    case DType::Q4_0: f[0] = {0, a / 8}; break;
    case DType::Q4_1: f[0] = {0, a / 8}, f[1] = {2, -a}; break;
    case DType::Q5_0: f[0] = {0, a / 16}; break;
    case DType::Q5_1: f[0] = {0, a / 16}, f[1] = {2, -a}; break;
    case DType::Q2_K: f[0] = {80, a / 45}, f[1] = {82, a / 15}; break;
    case DType::Q3_K: f[0] = {108, a / 128}; break;
    case DType::Q4_K: f[0] = {0, a / 945}, f[1] = {2, a / 63}; break;
    case DType::Q5_K: f[0] = {0, a / 1953}, f[1] = {2, a / 63}; break;
    case DType::Q6_K: f[0] = {208, a / 4096}; break;
    case DType::IQ4_NL: f[0] = {0, a / 127}; break;
    case DType::IQ4_XS: f[0] = {0, a / 4064}; break;
    default: return;  // plain float types have no blocks
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* blk = dst + static_cast<size_t>(b) * info.block_bytes;
    for (const Field& x : f) {
      if (x.offset < 0) continue;
      const uint16_t h = f32_to_f16(x.value);
      std::memcpy(blk + x.offset, &h, 2);
    }
    if (t == DType::Q8_0)
      for (int i = 2; i < 34; ++i)
        if (blk[i] == 0x80) blk[i] = 0x81;  // -128 -> -127: |q| <= 127 as QuantGroup promises
  }
}

}  // namespace squeezekv
