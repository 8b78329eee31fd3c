// Decode products of stored weight rows with 8-bit activations (what llama.cpp does for its
// quantized types): the activations are rounded once per block of 32 to int8 with one f32 scale,
// and every block format's groups of 32 (core/quant.h) are multiplied with integer dot products,
// scaled once per half-group by both scales. Each product moves from the exact one by at most the
// activations' rounding: sum over blocks of sum|w| * max|x| / 254.
// Thread safety: pure functions.
#pragma once
#include <cstdint>

#include "squeezekv/dtype.h"

namespace squeezekv::cpu {

// 32 activations as int8: x[i] ~ d * q[i]; s[h] = d * (sum of q over half h) and st = d * (sum
// of all q), for the offsets (per half where the weights' offset differs by half, else st); qsum
// the sum of all q itself (for integer sums that add an offset times it).
struct Q8Block {
  float d = 0.0f;
  float s[2] = {0.0f, 0.0f};
  float st = 0.0f;
  int32_t qsum = 0;
  int8_t q[32];
};

// out[C / 32] <- x[C]: q = round-half-even(x / d), d = max|x| / 127 (C a multiple of 32).
void quantize_q8(Q8Block* out, const float* x, int64_t C);

// Whether dot_q8 takes weights of type t (every block type).
bool has_q8_dot(DType t);

// row (C values of type t) . x (C / 32 activation blocks).
float dot_q8(DType t, const uint8_t* row, const Q8Block* x, int64_t C);

// out[i * out_stride] = row . (x + i * x_stride) for n activation rows: the weights are unpacked
// once for all rows, and each result is bit-identical to dot_q8 of that row alone.
void dot_q8_rows(DType t, const uint8_t* row, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                 int64_t out_stride);

// dst[n] <- the n values of type t, for the prompt path's tiles: every block type through the same
// SIMD unpacking as the integer products (within one rounding of dequantize_row: sc * q + mn in
// one FMA); other types as dequantize_row.
void dequantize_row_fast(DType t, const uint8_t* row, float* dst, int64_t n);

namespace ref {
void quantize_q8(Q8Block* out, const float* x, int64_t C);
// Through unpack_group, in double: the same integers and scales, summed without rounding.
float dot_q8(DType t, const uint8_t* row, const Q8Block* x, int64_t C);
}  // namespace ref

}  // namespace squeezekv::cpu
