// Products on cuBLAS (gemm.h), recorded in the launcher as calls so that a repeated step's
// products replay inside its CUDA graph with its kernels.
#include "backend/cuda/gemm.h"

#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.h"

namespace squeezekv::cuda {
namespace {

// One product's arguments as recorded bytes (no padding: every byte is set).
struct GemmCall {
  cublasHandle_t blas;
  const void* w;  // [R][C] bf16 or f32
  const void* x;  // [T][C] bf16 (bf16 weights) or f32
  float* out;     // [T][R]
  int32_t R, T, C, bf16;
};
static_assert(sizeof(GemmCall) == 4 * 8 + 4 * 4, "GemmCall: no padding (recorded bytes)");

void run_gemm(const void* p, cudaStream_t) {  // the handle's stream is the launcher's
  const GemmCall& g = *static_cast<const GemmCall*>(p);
  const float one = 1.0f, zero = 0.0f;
  // column-major view: out (R x T) = W^T-as-stored (C x R, transposed) x x (C x T)
  if (g.bf16)
    check(cublasGemmEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, g.R, g.T, g.C, &one, g.w, CUDA_R_16BF, g.C, g.x, CUDA_R_16BF, g.C, &zero, g.out,
                       CUDA_R_32F, g.R, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "gemm bf16");
  else
    check(cublasSgemm(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, g.R, g.T, g.C, &one, static_cast<const float*>(g.w), g.C,
                      static_cast<const float*>(g.x), g.C, &zero, g.out, g.R),
          "gemm f32");
}

}  // namespace

void gemm(cublasHandle_t blas, Launcher& L, const MatmulPart* parts, int n, const float* x, int64_t T, __nv_bfloat16* xb, bool xb_ready) {
  const int C = static_cast<int>(parts[0].w->cols);
  bool converted = xb_ready;
  for (int i = 0; i < n; ++i) {
    const WeightMatrix& w = *parts[i].w;
    const bool bf16 = w.type == DType::BF16;
    if (bf16 && !converted) {
      launch_to_bf16(L, xb, x, T * C);
      converted = true;
    }
    GemmCall g;
    std::memset(&g, 0, sizeof g);
    g.blas = blas, g.w = w.data, g.x = bf16 ? static_cast<const void*>(xb) : x, g.out = parts[i].out;
    g.R = static_cast<int32_t>(w.rows), g.T = static_cast<int32_t>(T), g.C = C, g.bf16 = bf16 ? 1 : 0;
    L.call(run_gemm, g);
    if (parts[i].bias != nullptr) launch_add_bias(L, parts[i].out, parts[i].bias, T * g.R, g.R);
  }
}

}  // namespace squeezekv::cuda
