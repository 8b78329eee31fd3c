// Dequantization of one row of a stored weight into f32 (block layouts: ggml's docs/gguf.md and its
// reference dequantize_row_* routines). Scalar code the compiler vectorises; exact by construction.
#pragma once
#include <cstdint>

#include "squeezekv/dtype.h"

namespace squeezekv::cpu {

// dst[n] <- src (n values of type t; n a multiple of t's block size).
void dequantize_row(DType t, const uint8_t* src, float* dst, int64_t n);

}  // namespace squeezekv::cpu
