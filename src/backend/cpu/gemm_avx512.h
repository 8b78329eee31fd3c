// The AVX-512 prefill matrix kernel (gemm_avx512.cc), called only where available() is true.
#pragma once
#include <cstdint>

namespace squeezekv::cpu::avx512 {

// True when this CPU runs AVX-512F, the kernel was built, and SQUEEZEKV_CPU allows it (cpu_features.h).
bool available();

// out[t * ldo + 0..32) = sum_c x[t * C + c] * panel[c * 32 + 0..32) for t in [0, T).
//   panel: 32 weight rows packed column-major [C][32].
void gemm_panel32(float* out, int64_t ldo, const float* x, int64_t T, int64_t C, const float* panel);

}  // namespace squeezekv::cpu::avx512
