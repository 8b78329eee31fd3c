// Storage types of weights as they sit in a model file. Quantized types are block formats:
// `block_values` values packed into `block_bytes` bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace squeezekv {

enum class DType : uint8_t { F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K };

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
