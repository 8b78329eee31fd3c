// Storage types of weights as they sit in a model file. Quantized types are block formats:
// `block_values` values packed into `block_bytes` bytes (layouts: src/core/quant.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace squeezekv {

enum class DType : uint8_t {
  F32, F16, BF16,                          // plain floats
  Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,            // blocks of 32, one scale (and min)
  Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,            // super-blocks of 256 with 16 or 32-value sub-scales
  IQ4_NL, IQ4_XS,                          // 4-bit indices into a fixed non-linear table
};
inline constexpr int kDTypeCount = 15;

struct DTypeInfo {
  std::string_view name;
  int block_values;  // values per block (1 for plain float types)
  int block_bytes;   // bytes per block
};

const DTypeInfo& dtype_info(DType t);

// Bytes taken by `n` values of type `t`; `n` must be a multiple of the block size.
inline size_t dtype_bytes(DType t, int64_t n) {
  const DTypeInfo& i = dtype_info(t);
  return static_cast<size_t>(n / i.block_values) * static_cast<size_t>(i.block_bytes);
}

}  // namespace squeezekv
