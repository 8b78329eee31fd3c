// A weight matrix as stored in the model file: `rows` output features, each a contiguous row of
// `cols` input values in `type` (block formats pack a row as cols / block_values blocks).
// Non-owning: the bytes live in a mapped file or a buffer owned by the model.
#pragma once
#include <cstddef>
#include <cstdint>

#include "squeezekv/dtype.h"

namespace squeezekv {

struct WeightMatrix {
  DType type = DType::F32;
  const uint8_t* data = nullptr;  // [rows][row_bytes]
  int64_t rows = 0;               // R: output features
  int64_t cols = 0;               // C: input features
  size_t row_bytes = 0;

  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  bool empty() const { return data == nullptr; }
};

}  // namespace squeezekv
