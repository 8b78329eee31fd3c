// A decode batch's products on cuBLASLt, each shape with the algorithm that ran it fastest: the
// batch's matrices are wide and its rows few (B of 8-256), where cuBLAS's default choice leaves
// most SMs idle on the narrow ones (k, v: 14% of the copy bandwidth at 64 rows). Each (R, C) and
// bucket of batch sizes (bucket(): 8 sizes wide up to 64, 32 up to 256) is timed once, at its
// first product, over the algorithms cuBLASLt's heuristic offers (split-K among them), with the
// weights out of L2 as in a real step; the fastest serves every B of the bucket that cuBLASLt
// accepts it for (the others are timed themselves): a server whose batch grows and shrinks by a
// sequence at a time times a few sizes, not every one (each timing is ~40 products and waits).
// A shape's algorithm is kept for the backend's life, so a run's products are the same bits step
// after step (not from one process to the next: the timing chooses).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

class LtProducts {
 public:
  // workspace: device memory the algorithms may use (recorded products share it: one stream);
  // algos: the heuristic's first candidates that are timed, runs: the timed runs of each (median)
  LtProducts(Launcher& L, void* workspace, size_t workspace_bytes, int algos, int runs);
  ~LtProducts();
  LtProducts(const LtProducts&) = delete;
  LtProducts& operator=(const LtProducts&) = delete;

  // out[B][R] = xb[B][C] @ W[R][C]^T, bf16 inputs, f32 sums and output, recorded in L. False
  // (nothing recorded) where cuBLASLt offers no algorithm for the shape.
  bool product(float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, int R, int B, int C);

  struct Plan;  // one shape's descriptors and chosen algorithm

  // The bucket of batch sizes B belongs to (its largest size).
  static int bucket(int B);

 private:
  Plan* plan(float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, int R, int B, int C);

  Launcher& L_;
  cublasLtHandle_t lt_ = nullptr;
  void* ws_;
  size_t ws_bytes_;
  int algos_, runs_;
  std::map<std::tuple<int, int, int>, std::unique_ptr<Plan>> plans_;       // (R, B, C)
  std::map<std::tuple<int, int, int>, cublasLtMatmulAlgo_t> chosen_;      // (R, bucket(B), C): the timed algorithm
  void* flush_ = nullptr;  // written between timed runs (past the L2), allocated at the first timing
};

}  // namespace squeezekv::cuda
