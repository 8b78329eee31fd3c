// The tensor-core instructions the kernels share (attn_mma.cu, attn_decode_mma.cu, gemm_rows.cu): fragments loaded
// from shared memory by ldmatrix, and mma.sync m16n8k16 with f32 accumulators. Fragment layouts
// are the PTX ISA's for m16n8k16 (A row-major 16x16, B column-major 16x8, C 16x8).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace squeezekv::cuda {

// Four 8x8 matrices of 16-bit values from shared memory (p: this lane's row address).
__device__ inline void ldsm_x4(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// The same, each matrix transposed.
__device__ inline void ldsm_x4_trans(uint32_t* r, const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// c[4] += a[4] (16x16 f16, row) * b[2] (16x8 f16, col)
__device__ inline void mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// c[4] += a[4] (16x16 bf16, row) * b[2] (16x8 bf16, col)
__device__ inline void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two f32 values as one register of two f16 (lo in the low half): an A operand's pair.
__device__ inline uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// s[4] = 16 query rows (A operands qa, one per 16 of the D columns) against keys nt * 8 ..
// nt * 8 + 7 of the key tile kt [keys][D + 8] (f16 rows, padded so that an ldmatrix's 8 rows
// fall on different banks).
template <int D>
__device__ inline void mma_scores(float* s, const uint32_t (&qa)[D / 16][4], const __half* kt, int nt, int lane) {
  constexpr int LD = D + 8;
  s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ks += 2) {
    uint32_t b[4];  // b[0..1]: k-step ks, b[2..3]: ks + 1
    ldsm_x4(b, kt + (nt * 8 + lane % 8) * LD + ks * 16 + (lane / 8) * 8);
    mma_f16(s, qa[ks], b);
    mma_f16(s, qa[ks + 1], b + 2);
  }
}

}  // namespace squeezekv::cuda
