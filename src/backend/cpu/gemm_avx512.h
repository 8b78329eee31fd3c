// The AVX-512 prefill matrix kernels (gemm_avx512.cc; BF16 weights: gemm_bf16.cc), called only
// where their available() is true.
#pragma once
#include <cstdint>

namespace squeezekv::cpu::avx512 {

// True when this CPU runs AVX-512F, the kernel was built, and SQUEEZEKV_CPU allows it (cpu_features.h).
bool available();

// out[t * ldo + 0..32) = sum_c x[t * C + c] * panel[c * 32 + 0..32) for t in [0, T).
//   panel: 32 weight rows packed column-major [C][32].
void gemm_panel32(float* out, int64_t ldo, const float* x, int64_t T, int64_t C, const float* panel);

}  // namespace squeezekv::cpu::avx512

namespace squeezekv::cpu::avx512bf16 {

// True when this CPU runs AVX-512 BF16, the kernel was built, and SQUEEZEKV_CPU allows it.
bool available();

// out[n / 2] <- x[n] (n even) as pairs of bf16 (rounded to nearest even), element 2i in the low half.
void to_bf16_pairs(uint32_t* out, const float* x, int64_t n);

// out[t * ldo + 0..32) = sum_p x[t * P + p] . panel[p * 32 + 0..32) for t in [0, T): each term a
// pair of bf16 products (vdpbf16ps), P = columns / 2.
//   panel: 32 BF16 weight rows as column pairs [P][32] (row r's columns 2p, 2p + 1 in entry r).
void gemm_panel32(float* out, int64_t ldo, const uint32_t* x, int64_t T, int64_t P, const uint32_t* panel);

}  // namespace squeezekv::cpu::avx512bf16
