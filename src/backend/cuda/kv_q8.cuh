// Q8_0 KV rows on the device (core/kv_view.h's KvType::kQ8_0: blocks of 32 values along the head
// dim, each an f16 scale d and 32 int8 q, value q * d, 34 bytes): a warp quantizes a block exactly
// as core/kv_rows.cc's scalar definition does (the same f32 operations, so the bytes equal the
// CPU's for the same input), and a lane reads a quarter of a block (8 values) from shared or
// global memory at the 2-byte alignment the 34-byte blocks leave.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace squeezekv::cuda {

constexpr int kQ8Block = 32;       // values a block
constexpr int kQ8BlockBytes = 34;  // f16 scale + 32 int8

// The warp's 32 lanes quantize one block: lane i holds value i (x); blk: the block's 34 bytes.
// d = max|x| / 127 (stored as f16), q = round(x / d) through id = 1 / d, halves away from zero,
// as kv_rows.cc's quantize_q8_0 (std::lround).
__device__ inline void q8_store_block(float x, unsigned char* blk, int lane) {
  float amax = fabsf(x);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  blk[2 + lane] = static_cast<unsigned char>(static_cast<signed char>(static_cast<int>(roundf(x * id))));
  if (lane == 0) *reinterpret_cast<__half*>(blk) = __float2half_rn(d);
}

// Values [8 h, 8 h + 8) of the block at blk (2-byte aligned), h in [0, 4), as exact integers in f;
// returns the block's scale. Two 32-bit words from the 4-byte-aligned address below (three when
// the values start 2 bytes past one), funnel-shifted into place; each byte becomes a float through
// its exponent field (2^23 + (q + 128), less 2^23 + 128: one PRMT and one FADD a value).
__device__ inline float q8_load8(const unsigned char* blk, int h, float* f) {
  const float d = __half2float(*reinterpret_cast<const __half*>(blk));
  const uintptr_t at = reinterpret_cast<uintptr_t>(blk + 2 + 8 * h);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
  const unsigned sh = static_cast<unsigned>(at & 3) * 8;  // 0 or 16
  const uint32_t x0 = w[0], x1 = w[1], x2 = sh != 0 ? w[2] : 0u;
  const uint32_t word[2] = {__funnelshift_r(x0, x1, sh) ^ 0x80808080u, __funnelshift_r(x1, x2, sh) ^ 0x80808080u};
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) f[4 * k + e] = __int_as_float(__byte_perm(word[k], 0x4B000000u, 0x7540u | e)) - 8388736.0f;
  return d;
}

}  // namespace squeezekv::cuda
