// What every CUDA file of the backend shares: error checks, the programmatic-dependent-launch
// steps every kernel takes, warp and block reductions, and the block size of the plain kernels.
// Device helpers only; each kernel lives in the file of its job (norm.cu, gemv.cu, attn_*.cu, ...).
#pragma once
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "squeezekv/error.h"

namespace squeezekv::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cublas: ") + what + ": status " + std::to_string(int(s)));
}

constexpr int kThreads = 256;  // block size of the element-wise kernels
inline unsigned blocks_for(int64_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ---- programmatic dependent launch ----------------------------------------------------------
// With the Launcher's PDL on, a kernel may start while the one before it in the stream is still
// running. Every kernel first lets the next one launch (pdl_launch_next: its blocks are placed as
// SMs free up, so their start-up runs under this kernel's tail), then waits
// (pdl_wait) before it reads what earlier kernels wrote or writes anything: until the previous
// kernel has completed, and so, by induction, every earlier one. No deadlock: a kernel launches
// only once every block of the one before it is resident, and resident blocks wait only on earlier
// kernels. Without PDL both are no-ops.
__device__ inline void pdl_launch_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ inline void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ inline void pdl_enter() {
  pdl_launch_next();
  pdl_wait();
}

// ---- reductions ---------------------------------------------------------------------------

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ inline float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  v = l < nw ? red[l] : 0.0f;
  return warp_sum(v);
}

}  // namespace squeezekv::cuda
