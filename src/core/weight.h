// A weight matrix as stored in the model file: `rows` output features, each a contiguous row of
// `cols` input values in `type` (block formats pack a row as cols / block_values blocks), or as a
// backend laid it out for its kernels (layout).
// Non-owning: the bytes live in a mapped file or a buffer owned by the model or the backend.
#pragma once
#include <cstddef>
#include <cstdint>

#include "squeezekv/dtype.h"

namespace squeezekv {

enum class WeightLayout : uint8_t {
  kRows,    // row after row (as stored in files)
  kTiles8,  // the CPU's int8 decode layout: 8 rows interleaved block by block (backend/cpu/tile8.h);
            // row() is not defined
};

struct WeightMatrix {
  DType type = DType::F32;
  const uint8_t* data = nullptr;  // [rows][row_bytes]
  int64_t rows = 0;               // R: output features
  int64_t cols = 0;               // C: input features
  size_t row_bytes = 0;            // bytes of one row's values (kTiles8: the same total, rows * row_bytes)
  WeightLayout layout = WeightLayout::kRows;
  bool file_backed = false;  // the bytes are in a read-only file mapping: a backend that keeps its own
                             // copy may drop their pages from memory (they come back from the file)

  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
  bool empty() const { return data == nullptr; }
};

}  // namespace squeezekv
