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

// Block sizes (GGUF spec, ggml's docs/gguf.md), indexed by DType; constexpr, so kernels can size
// their loops at compile time.
inline constexpr DTypeInfo kDTypeInfo[kDTypeCount] = {
    {"F32", 1, 4},        {"F16", 1, 2},       {"BF16", 1, 2},
    {"Q8_0", 32, 34},     {"Q4_0", 32, 18},    {"Q4_1", 32, 20},    {"Q5_0", 32, 22},    {"Q5_1", 32, 24},
    {"Q2_K", 256, 84},    {"Q3_K", 256, 110},  {"Q4_K", 256, 144},  {"Q5_K", 256, 176},  {"Q6_K", 256, 210},
    {"IQ4_NL", 32, 18},   {"IQ4_XS", 256, 136},
};
constexpr const DTypeInfo& dtype_info(DType t) { return kDTypeInfo[static_cast<int>(t)]; }

// Bytes taken by `n` values of type `t`; `n` must be a multiple of the block size.
inline size_t dtype_bytes(DType t, int64_t n) {
  const DTypeInfo& i = dtype_info(t);
  return static_cast<size_t>(n / i.block_values) * static_cast<size_t>(i.block_bytes);
}

}  // namespace squeezekv
