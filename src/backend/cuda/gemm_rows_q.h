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

// Whether launch_gemm_rows_q multiplies w: a packed type (quant_groups.h) whose rows are whole
// stages of 256 columns.
bool gemm_rows_q_serves(const WeightMatrix& w);

// out[B][R] = xh[B][C] @ W^T (+ bias[R]), W packed as upload_packed lays it out (planes, rows
// 16-byte aligned). Each output is summed in an order fixed by W's shape alone (the column slices
// of gemm_rows.h, added in slice order), so a row's outputs do not depend on B or on the other
// rows, bit for bit.
void launch_gemm_rows_q(Launcher& L, float* out, const __half* xh, const WeightMatrix& w, const float* bias, int B);

}  // namespace squeezekv::cuda
