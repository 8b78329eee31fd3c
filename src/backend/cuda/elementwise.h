// Element-wise kernels of the forward pass: RoPE, SwiGLU's gate, residual adds, bias, bf16 conversion.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

// x[T][n_heads][D] rotated in place at positions pos[T]; adjacent: pairs (2i, 2i+1), else (i, i + D/2)
void launch_rope(Launcher& L, float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq, bool adjacent);
// g[n] = silu(g) * u
void launch_silu_mul(Launcher& L, float* g, const float* u, int64_t n);
// x[n] += y
void launch_add(Launcher& L, float* x, const float* y, int64_t n);
// out[n / R][R] += bias[R]
void launch_add_bias(Launcher& L, float* out, const float* bias, int64_t n, int R);
// out[n] = bf16(x)
void launch_to_bf16(Launcher& L, __nv_bfloat16* out, const float* x, int64_t n);

}  // namespace squeezekv::cuda
