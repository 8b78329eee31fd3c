// Decode products of many activation rows (a decode batch of B sequences) on the tensor cores:
// the weights read once per 64 rows, each output's sum formed the same way whatever B is.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

constexpr int kGemmRowsK = 64;  // the columns must be a multiple of this

// out[B][R] = xb[B][C] @ W[R][C]^T (+ bias[R]) with bf16 x and W and f32 sums (mma.sync
// m16n8k16). Each output (t, r) is summed by one warp over k in 16-column steps in order, so a
// row's outputs do not depend on B or on the other rows (bit for bit). C % kGemmRowsK == 0.
void launch_gemm_rows(Launcher& L, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C);

}  // namespace squeezekv::cuda
