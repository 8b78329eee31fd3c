// Decode products of many activation rows (a decode batch of B sequences) on the tensor cores:
// the weights read once per 64 rows, each output's sum formed the same way whatever B is.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

constexpr int kGemmRowsK = 64;  // the columns must be a multiple of this

// Blocks a row group's tiles and slices should reach (an H200's 132 SMs, two blocks each).
constexpr int kGemmRowsBlocks = 264;
// The column slices of an R x C matrix for gemm_rows (1, 2, 4 or 8): its shape's alone, never the batch's.
int gemm_rows_slices(int R, int C);
// The slices of a matrix of `tiles` weight-row tiles and `chunks` column stages (gemm_rows_q.h's
// too): doubled while the blocks stay under kGemmRowsBlocks and the stages split evenly.
int gemm_rows_slices_of(int tiles, int chunks);

// out[B][R] = xb[B][C] @ W[R][C]^T (+ bias[R]) with bf16 x and W and f32 sums (mma.sync
// m16n8k16). Each output (t, r) is summed by one warp per column slice over k in 16-column steps
// in order, and the slices' sums are added in slice order, so a row's outputs do not depend on B
// or on the other rows (bit for bit). C % kGemmRowsK == 0. step: the most columns a warp's weight
// loads run ahead, 64 or 128 (the sums are the same bits either way).
void launch_gemm_rows(Launcher& L, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C,
                      int step);

}  // namespace squeezekv::cuda
