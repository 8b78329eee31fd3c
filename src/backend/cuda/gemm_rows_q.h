// Decode products of many activation rows (a decode batch of B sequences) over weights kept in
// their GGUF blocks (--device-weights native) on the tensor cores: each block of 64 rows reads its
// slice of the packed weights once, dequantizes it to f16 in shared memory and multiplies it with
// f16 activations (mma.sync m16n8k16, f32 sums). The weights' bytes cross the memory bus once per
// 64 rows at their packed size, where a dequantization to bf16 before cuBLAS wrote and read every
// weight again at 2 bytes.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

// The most rows the decode path gives launch_gemm_rows_q: one row tile, whose blocks read the
// weights once. Past it each tile reads them again, and dequantizing each matrix to bf16 for
// cuBLAS costs less (H200, 8B shape in Q4_K_M at context 512, 2026-12-03: 128 sequences 4,102
// tok/s here against 5,478 that way; 64: 3,763 against 3,304; 32: 2,293 against 1,830).
constexpr int kGemmRowsQMaxRows = 64;

// Whether launch_gemm_rows_q multiplies w: a packed type (quant_groups.h) whose rows are whole
// stages of 256 columns.
bool gemm_rows_q_serves(const WeightMatrix& w);

// out[B][R] = xh[B][C] @ W^T (+ bias[R]), W packed as upload_packed lays it out (planes, rows
// 16-byte aligned). Each output is summed in an order fixed by W's shape alone (the column slices
// of gemm_rows.h, added in slice order), so a row's outputs do not depend on B or on the other
// rows, bit for bit.
void launch_gemm_rows_q(Launcher& L, float* out, const __half* xh, const WeightMatrix& w, const float* bias, int B);

}  // namespace squeezekv::cuda
