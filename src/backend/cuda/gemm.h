// Products on cuBLAS: prompt chunks, and a decode batch's rows past the GEMV's few.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

// out[T][R] = x[T][C] @ W^T (+ bias) for every part by cuBLAS on blas (whose stream is L's): the
// parts share x, converted once into xb [T][C] (bf16 scratch; only touched where a part has bf16
// weights, f32 weights multiply x as it is). xb_ready: xb holds x in bf16 already.
void gemm(cublasHandle_t blas, Launcher& L, const MatmulPart* parts, int n, const float* x, int64_t T, __nv_bfloat16* xb,
          bool xb_ready = false);

}  // namespace squeezekv::cuda
