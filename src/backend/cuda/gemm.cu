// Prompt-chunk products on cuBLAS (gemm.h).
#include "backend/cuda/gemm.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.h"

namespace squeezekv::cuda {

void gemm(cublasHandle_t blas, Launcher& L, const MatmulPart* parts, int n, const float* x, int64_t T, __nv_bfloat16* xb) {
  const float one = 1.0f, zero = 0.0f;
  const int C = static_cast<int>(parts[0].w->cols);
  bool converted = false;
  for (int i = 0; i < n; ++i) {
    const WeightMatrix& w = *parts[i].w;
    const int R = static_cast<int>(w.rows);
    // column-major view: out (R x T) = W^T-as-stored (C x R, transposed) x x (C x T)
    if (w.type == DType::BF16) {
      if (!converted) {
        launch_to_bf16(L, xb, x, T * C);
        converted = true;
      }
      L.flush();  // cuBLAS issues its own work on the stream
      check(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, R, static_cast<int>(T), C, &one, w.data, CUDA_R_16BF, C,
                         xb, CUDA_R_16BF, C, &zero, parts[i].out, CUDA_R_32F, R, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "gemm bf16");
    } else {
      L.flush();
      check(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, R, static_cast<int>(T), C, &one, reinterpret_cast<const float*>(w.data), C,
                        x, C, &zero, parts[i].out, R),
            "gemm f32");
    }
    if (parts[i].bias != nullptr) launch_add_bias(L, parts[i].out, parts[i].bias, T * R, R);
  }
}

}  // namespace squeezekv::cuda
