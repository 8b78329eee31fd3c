// Scalar dequantization of every block format through unpack_group (core/quant.h).
#include "core/quant.h"

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

}  // namespace squeezekv
