// A decode batch's products on cuBLASLt with each shape's fastest algorithm (gemm_lt.h).
#include "backend/cuda/gemm_lt.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/common.cuh"

namespace squeezekv::cuda {

struct LtProducts::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

namespace {

constexpr size_t kL2Flush = size_t{128} << 20;  // written before each timed run: past the L2

// One recorded product (no padding: every byte is set).
struct LtCall {
  cublasLtHandle_t lt;
  const LtProducts::Plan* plan;
  const void* w;  // [R][C] bf16
  const void* x;  // [B][C] bf16
  float* out;     // [B][R]
  void* ws;
  uint64_t ws_bytes;
};
static_assert(sizeof(LtCall) == 7 * 8, "LtCall: no padding (recorded bytes)");

LtCall make_call(cublasLtHandle_t lt, const LtProducts::Plan* plan, const void* w, const void* x, float* out, void* ws,
                 uint64_t ws_bytes) {
  LtCall g;
  std::memset(&g, 0, sizeof g);
  g.lt = lt, g.plan = plan, g.w = w, g.x = x, g.out = out, g.ws = ws, g.ws_bytes = ws_bytes;
  return g;
}
// The product with one algorithm (the chosen one, or a candidate being timed).
cublasStatus_t lt_matmul(const LtCall& g, const cublasLtMatmulAlgo_t& algo, cudaStream_t st) {
  const float one = 1.0f, zero = 0.0f;
  return cublasLtMatmul(g.lt, g.plan->op, &one, g.w, g.plan->a, g.x, g.plan->b, &zero, g.out, g.plan->c, g.out, g.plan->c, &algo, g.ws,
                        g.ws_bytes, st);
}
void run_recorded(const void* p, cudaStream_t st) {
  const LtCall& g = *static_cast<const LtCall*>(p);
  check(lt_matmul(g, g.plan->algo, st), "cublasLtMatmul");
}

}  // namespace

LtProducts::LtProducts(Launcher& L, void* workspace, size_t workspace_bytes, int algos, int runs)
    : L_(L), ws_(workspace), ws_bytes_(workspace_bytes), algos_(std::max(1, algos)), runs_(std::max(1, runs)) {
  check(cublasLtCreate(&lt_), "cublasLtCreate");
}

LtProducts::~LtProducts() {
  plans_.clear();
  if (flush_ != nullptr) cudaFree(flush_);
  if (lt_) cublasLtDestroy(lt_);
}

bool LtProducts::product(float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, int R, int B, int C) {
  Plan* p = plan(out, xb, W, R, B, C);
  if (p == nullptr) return false;
  L_.call(run_recorded, make_call(lt_, p, W, xb, out, ws_, ws_bytes_));
  return true;
}

int LtProducts::bucket(int B) {
  if (B <= 8) return 8;
  if (B <= 64) return (B + 7) / 8 * 8;
  if (B <= 256) return (B + 31) / 32 * 32;
  return (B + 127) / 128 * 128;
}

LtProducts::Plan* LtProducts::plan(float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, int R, int B, int C) {
  auto& slot = plans_[{R, B, C}];
  if (slot) return slot->ok ? slot.get() : nullptr;
  slot = std::make_unique<Plan>();
  Plan& p = *slot;
  // column-major view: out (R x B, ld R) = W^T-as-stored (C x R, transposed) x x (C x B)
  check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "cublasLt transa");
  check(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "cublasLt transb");
  check(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, C, R, C), "cublasLt layout");
  check(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, C, B, C), "cublasLt layout");
  check(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, R, B, R), "cublasLt layout");
  // a batch size whose bucket has a timed algorithm takes it where cuBLASLt says it serves this B
  const auto chosen = chosen_.find({R, bucket(B), C});
  if (chosen != chosen_.end()) {
    cublasLtMatmulHeuristicResult_t r{};
    if (cublasLtMatmulAlgoCheck(lt_, p.op, p.a, p.b, p.c, p.c, &chosen->second, &r) == CUBLAS_STATUS_SUCCESS &&
        r.workspaceSize <= ws_bytes_) {
      p.algo = chosen->second, p.ok = true;
      return &p;
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLt preference");
  const uint64_t ws = ws_bytes_;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "cublasLt preference");
  std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<size_t>(algos_));
  int n_found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, algos_, found.data(), &n_found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || n_found == 0) return nullptr;
  // time each candidate on the real operands, in stream order after what is recorded (its
  // output is written again by the recorded product), each run after 128 MB written elsewhere
  L_.flush();
  const cudaStream_t st = L_.stream();
  // kept for the next shape: a server meets a new batch size often, and cudaFree waits for the
  // whole device; without room for it the runs are timed with the L2 as it is
  if (flush_ == nullptr && cudaMalloc(&flush_, kL2Flush) != cudaSuccess) flush_ = nullptr, (void)cudaGetLastError();
  void* flush = flush_;
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  const LtCall g = make_call(lt_, &p, W, xb, out, ws_, ws_bytes_);
  float best = 0.0f;
  for (int i = 0; i < n_found; ++i) {
    if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
    std::vector<float> ms;
    bool fails = false;
    for (int r = 0; r <= runs_ && !fails; ++r) {  // run 0 warms up
      if (flush != nullptr) check(cudaMemsetAsync(flush, r, kL2Flush, st), "memset (product timing)");
      check(cudaEventRecord(e0, st), "event");
      fails = lt_matmul(g, found[i].algo, st) != CUBLAS_STATUS_SUCCESS;
      check(cudaEventRecord(e1, st), "event");
      check(cudaEventSynchronize(e1), "event");
      float t = 0.0f;
      check(cudaEventElapsedTime(&t, e0, e1), "event");
      if (r > 0) ms.push_back(t);
    }
    if (fails) continue;
    std::sort(ms.begin(), ms.end());
    if (!p.ok || ms[ms.size() / 2] < best) p.algo = found[i].algo, best = ms[ms.size() / 2], p.ok = true;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  if (p.ok) chosen_.emplace(std::make_tuple(R, bucket(B), C), p.algo);
  return p.ok ? &p : nullptr;
}

}  // namespace squeezekv::cuda
