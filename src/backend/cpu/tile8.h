// The CPU's int8 layout for Q4_0, Q4_1, Q8_0 and IQ4_NL matrices: 8 rows interleaved block by block,
// so that one register holds 4 columns of 8 rows and the decode kernels need no horizontal sums
// and no transposes (llama.cpp repacks its Q4_0 the same way for the same reason).
// A tile is rows [8t, 8t + 8); its blocks (32 columns each) follow one another; a block holds the
// 8 rows' f16 scales d[8], for Q4_1 their f16 mins m[8], then the quantized bytes as 32-bit chunks
// q[k][r] = bytes 4k..4k+3 of row r's block (Q4_0/Q4_1/IQ4_NL: the 16 bytes of nibbles, k < 4;
// Q8_0: the 32 signed bytes, k < 8).
// Products: every (weight row, activation row) pair is summed in one fixed order, the same in
// every kernel here whatever else shares the tile: per block the exact integer sum isum of the
// 32 products, acc = fma(d_w * d_x, isum, acc), then for Q4_0/Q4_1/IQ4_NL acc = fma(min_w, x_sum,
// acc) (Q4_0's min is -8 d_w; IQ4_NL's products are of its grid values + 128, so its min is
// -128 d_w), block after block; the result is acc. So a sequence's results do not depend on the
// batch it shares.
// Thread safety: pure functions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/quant_dot.h"
#include "core/weight.h"

namespace squeezekv::cpu {

// Whether w can be laid out as 8-row tiles (Q4_0/Q4_1/Q8_0/IQ4_NL rows, rows a multiple of 8).
bool can_tile8(const WeightMatrix& w);
// Bytes of one tile block (8 rows x 32 columns) and of the whole tiled matrix.
int tile8_block_bytes(DType t);
size_t tile8_bytes(const WeightMatrix& w);
// w (rows layout) -> dst (tile8_bytes(w)); returns the tiled matrix over dst.
WeightMatrix make_tile8(const WeightMatrix& w, uint8_t* dst);
// The start of tile t (rows [8t, 8t + 8)) of a tiled matrix.
inline const uint8_t* tile8_at(const WeightMatrix& w, int64_t t) {
  return w.data + static_cast<size_t>(t) * (w.cols / 32) * tile8_block_bytes(w.type);
}

// out[i * out_stride + r] = row r of the tile . (x + i * x_stride), r < 8, for n activation rows.
void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride);
// The same for two tiles, a's rows into out[.. + r] and b's into out[.. + 8 + r] (r < 8): equal to
// two dot_q8_tile8 calls to the bit (AVX-512 VNNI takes 8 or more rows of pairs in one 512-bit pass).
void dot_q8_tile8x2(DType t, const uint8_t* tile_a, const uint8_t* tile_b, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride);
// The tile's 8 rows into dst[8][C]: exact (as dequantize_row) or fast (as dequantize_row_fast).
void dequantize_tile8(DType t, const uint8_t* tile, int64_t C, float* dst, bool fast);

namespace vnni {
// The same products with AVX-512 VNNI (tile8_vnni.cc); dot_q8_tile8 calls it where
// cpu_features().avx512vnni (SQUEEZEKV_CPU=avx2 turns it off).
void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride);
void dot_q8_tile8x2(DType t, const uint8_t* tile_a, const uint8_t* tile_b, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride);
}  // namespace vnni

namespace ref {
// The same products in scalar code, with the same operations in the same order (bit-identical).
void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride);
}  // namespace ref

}  // namespace squeezekv::cpu
