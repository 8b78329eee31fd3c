// K and V rows as stored (core/kv_view.h's KvType) to and from f32: the one scalar definition of
// every row format, which the backends' kernels are tested against. The block types quantize as
// GGUF's reference quantizers of the same layouts do (Q8_0: scale max|x| / 127, q = round(x /
// scale); Q4_0: scale = the value of largest magnitude / -8, q = x / scale + 8 rounded and
// clamped to 15; Q4_1: scale (max - min) / 15, q = (x - min) / scale rounded, clamped to 15) and
// dequantize through core/quant.h's dequantize_row. Thread safety: pure functions.
#pragma once
#include <cstdint>

#include "core/kv_view.h"

namespace squeezekv {

// dst: one row of kv_row_bytes(t, D); x [D]. D % 32 == 0 for the block types.
void kv_quantize_row(KvType t, const float* x, void* dst, int D);
// x [D] from one stored row.
void kv_dequantize_row(KvType t, const void* src, float* x, int D);
// Value d of one stored row (the attention reference's per-element read).
float kv_row_value(KvType t, const void* row, int d);
// Whether every value of n stored rows (one after another, kv_row_bytes(t, D) each) is finite, as
// dequantizing them and std::isfinite would say, read from the bits alone: f16 and f32 exponents,
// and the block types' f16 scales (a block's values d * q, d * (q - 8), d * q + m are finite
// exactly where its d and m are). For a saved cache's rows, tens of MB, before they are used.
bool kv_rows_finite(KvType t, const void* rows, size_t n, int D);
// x [D] <- R x in place, R orthonormal: a randomized Walsh-Hadamard transform (fixed signs, then
// the Hadamard butterflies, scaled by 1/sqrt(B)) on each block of B dims, B the largest power of
// two dividing D. Keys of a kv_rotates_keys type are stored as R k and met by R q, so q.k is
// unchanged while a channel of large values spreads over its block before the block is
// quantized (QuaRot's idea, Ashkboos et al. 2024, applied per row so that eviction still moves
// self-contained rows).
void kv_rotate(float* x, int D);

}  // namespace squeezekv
