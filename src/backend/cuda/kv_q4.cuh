// Q4_1 KV rows on the device (core/kv_view.h's KvType::kQ4_1: blocks of 32 values along the head
// dim, each an f16 scale d and minimum m, then 16 bytes, byte j holding value j's code in its low
// nibble and value j + 16's in its high one; value q * d + m, 20 bytes): a warp quantizes a block
// exactly as core/kv_rows.cc's scalar definition does (the same f32 operations, none contracted
// into an FMA, so the bytes equal the CPU's for the same input).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace squeezekv::cuda {

constexpr int kQ41Block = 32;       // values a block
constexpr int kQ41BlockBytes = 20;  // f16 d, f16 m, 16 bytes of codes

// The warp's 32 lanes quantize one block: lane i holds value i (x); blk: the block's 20 bytes
// (4-byte aligned). lo, hi: the block's least and largest value (NaN ignored, as std::fmin);
// d = (hi - lo) / 15, code = (x - lo) / d + 0.5 truncated to [0, 15] (NaN: 0), m = lo.
__device__ inline void q4_1_store_block(float x, unsigned char* blk, int lane) {
  float lo = x, hi = x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  const float d = __fdiv_rn(__fsub_rn(hi, lo), 15.0f), id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  const float v = __fadd_rn(__fmul_rn(__fsub_rn(x, lo), id), 0.5f);
  const int q = v >= 0.0f ? (v < 15.0f ? static_cast<int>(v) : 15) : 0;
  const int q_hi = __shfl_down_sync(0xffffffffu, q, 16);  // lane j < 16: value j + 16's code
  if (lane < 16) blk[4 + lane] = static_cast<unsigned char>(q | (q_hi << 4));
  if (lane == 0) {
    reinterpret_cast<__half*>(blk)[0] = __float2half_rn(d);
    reinterpret_cast<__half*>(blk)[1] = __float2half_rn(lo);
  }
}

// Values 2 e and 2 e + 1 of the block at blk (e in [0, 16)) as floats, q * d + m in f32 (as
// core's dequantize_row).
__device__ inline float2 q4_1_load2(const unsigned char* blk, int e) {
  const float d = __half2float(reinterpret_cast<const __half*>(blk)[0]), m = __half2float(reinterpret_cast<const __half*>(blk)[1]);
  const int j = 2 * e;
  const unsigned b0 = blk[4 + j % 16], b1 = blk[4 + (j + 1) % 16];
  const int q0 = j < 16 ? b0 & 15 : b0 >> 4, q1 = j < 16 ? b1 & 15 : b1 >> 4;
  return make_float2(__fadd_rn(__fmul_rn(static_cast<float>(q0), d), m), __fadd_rn(__fmul_rn(static_cast<float>(q1), d), m));
}

}  // namespace squeezekv::cuda
