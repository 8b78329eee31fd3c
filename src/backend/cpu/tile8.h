// The CPU's int8 layout for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and IQ4_NL matrices: 8 rows interleaved block by block,
// so that one register holds 4 columns of 8 rows and the decode kernels need no horizontal sums
// and no transposes (llama.cpp repacks its Q4_0 the same way for the same reason).
// A tile is rows [8t, 8t + 8); its blocks (32 columns each) follow one another; a block holds the
// 8 rows' f16 scales d[8], for Q4_1/Q5_1 their f16 mins m[8], for Q5_0/Q5_1 their 32-bit high
// bits qh[8] (transposed: byte j, bit c = the fifth bit of chunk c's byte j; tile8.cc), then the
// quantized bytes as 32-bit chunks q[k][r] = bytes 4k..4k+3 of row r's block
// (Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL: the 16 bytes of nibbles, k < 4; Q8_0: the 32 signed bytes, k < 8).
// Products: every (weight row, activation row) pair is summed in one fixed order, the same in
// every kernel here whatever else shares the tile: per block the exact integer sum isum of the
// 32 products, acc = fma(d_w * d_x, isum, acc), then for every type but Q8_0 acc = fma(min_w,
// x_sum, acc) (Q4_0's min is -8 d_w, Q5_0's -16 d_w, Q4_1's and Q5_1's the stored m; the 5-bit
// types' values are nibble | fifth bit << 4; IQ4_NL's products are of its grid values + 128, so
// its min is -128 d_w), block after block; the result is acc. So a sequence's results do not
// depend on the batch it shares.
// Thread safety: pure functions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/quant_dot.h"
#include "core/weight.h"

namespace squeezekv::cpu {

// Whether w can be laid out as 8-row tiles (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL rows, rows a multiple of 8).
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

// Prompt chunks over block types stored as rows (the K formats, IQ4_XS: no 8-row
// tiles) take integer products too: 16 rows at a time are unpacked once per chunk into a group
// tile (a per-thread buffer; the file's rows stay as they are, so decode reads what it reads now).
// Per 32 columns a group tile holds q[k][16 rows][4]: bytes 4k..4k+3 of each row's unpacked group
// (quant_dot.h's unpacking: unsigned bytes with the format's constant offset moved into the
// offsets, or signed for Q8_0/IQ4), then per half of 16 values the rows' f32 scales sc[2][16] and
// offsets mn[2][16], so that value = sc * q + mn. Products per (weight row, activation row), in
// one fixed order in every kernel (256 or 512 bits, 8 or 16 rows a pass, any batch): per group the
// exact integer sums i0, i1 of each half's 16 products (one sum i of all 32 where the halves share
// their scale and offset), then acc = fma(sc0 * d_x, i0, acc), acc = fma(sc1 * d_x, i1, acc),
// acc = fma(mn0, s0_x, acc), acc = fma(mn1, s1_x, acc) (uniform: fma(sc0 * d_x, i, acc), then
// fma(mn0, st_x, acc)), group after group.
constexpr int kGroupRows = 16;
constexpr int kGroupBytes = 8 * kGroupRows * 4 + 2 * 2 * kGroupRows * 4;  // q, sc, mn of 32 columns
struct GroupKind {
  bool is_signed = false;  // q holds signed bytes (Q8_0, IQ4_NL, IQ4_XS)
  bool uniform = false;    // the halves share their scale and offset
};
// Whether prompt chunks over rows of type t can take group tiles (the build's SIMD unpacking).
bool has_group16(DType t);
// rows (n <= 16 rows of C values of type t, `stride` bytes apart) -> dst (C / 32 * kGroupBytes);
// rows n..15 are zero. Defined with the unpacking, in quant_dot.cc.
GroupKind make_group16(DType t, const uint8_t* rows, int64_t stride, int n, int64_t C, uint8_t* dst);
// out[i * out_stride + r] = row r of the group tile . (x + i * x_stride), r < rows (8 or 16), for
// n activation rows.
void dot_q8_group16(GroupKind kind, const uint8_t* g, int rows, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride);

namespace vnni {
// The same products with AVX-512 VNNI (tile8_vnni.cc); dot_q8_tile8 calls it where
// cpu_features().avx512vnni (SQUEEZEKV_CPU=avx2 turns it off).
void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride);
void dot_q8_tile8x2(DType t, const uint8_t* tile_a, const uint8_t* tile_b, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride);
void dot_q8_group16(GroupKind kind, const uint8_t* g, int rows, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride);
}  // namespace vnni

namespace ref {
// The same products in scalar code, with the same operations in the same order (bit-identical).
void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride);
void dot_q8_group16(GroupKind kind, const uint8_t* g, int rows, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride);
}  // namespace ref

}  // namespace squeezekv::cpu
