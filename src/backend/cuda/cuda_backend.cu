// The CUDA backend (backend.h): device memory, weights dequantized to bf16 on load (f32 in the
// exact test mode), cuBLAS for the products of prompt chunks, warp-per-row GEMV kernels for
// decode, and element-wise, RoPE, RMSNorm and attention kernels of our own. Attention is one block
// per (query row, head) with an online softmax over tiles of keys; the mass and entropy the
// policies need come from a second pass over the same keys, only when asked for.
// Letters: T rows, E hidden, H query heads, G kv heads, D head dim, R/C matrix rows/cols, N keys.
// Thread safety: one backend per sequence's thread; all work runs on the default stream in order.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/quant.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cublas: ") + what + ": status " + std::to_string(int(s)));
}
void check_launch(const char* what) { check(cudaGetLastError(), what); }

class DeviceBuffer final : public Buffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    bytes_ = bytes;
    check(cudaMalloc(&data_, std::max<size_t>(bytes, 16)), "cudaMalloc");
    check(cudaMemset(data_, 0, std::max<size_t>(bytes, 16)), "cudaMemset");
  }
  ~DeviceBuffer() override { cudaFree(data_); }
};

constexpr int kThreads = 256;

// ---- reductions ---------------------------------------------------------------------------

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  v = l < nw ? red[l] : 0.0f;
  return warp_sum(v);
}
__device__ float block_max(float v, float* red) {
  v = warp_max(v);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  v = l < nw ? red[l] : -INFINITY;
  return warp_max(v);
}

// ---- element-wise, norm, rope --------------------------------------------------------------

__global__ void k_rmsnorm(float* out, const float* x, const float* w, int E, float eps) {
  __shared__ float red[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * E;
  float* o = out + static_cast<size_t>(blockIdx.x) * E;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < E; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(E) + eps);
  for (int i = threadIdx.x; i < E; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

// grid (T, n_heads), block D/2 threads (one rotation pair each)
__global__ void k_rope(float* x, const int32_t* pos, int n_heads, int D, const float* inv_freq, int adjacent) {
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = D / 2;
  if (i >= half) return;
  float* v = x + (static_cast<size_t>(t) * n_heads + h) * D;
  const float a = static_cast<float>(pos[t]) * inv_freq[i];
  float s, c;
  sincosf(a, &s, &c);
  const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
  const float p = v[i0], q = v[i1];
  v[i0] = p * c - q * s;
  v[i1] = q * c + p * s;
}

__global__ void k_silu_mul(float* g, const float* u, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ void k_add(float* x, const float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// out[T][R] += bias[R]
__global__ void k_add_bias(float* out, const float* bias, int64_t n, int R) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] += bias[i % R];
}

__global__ void k_to_bf16(__nv_bfloat16* out, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(x[i]);
}

// ---- decode products: one warp per weight row, T <= kGemvRows activation rows ---------------

constexpr int kGemvRows = 4;

__device__ inline void load8(const __nv_bfloat16* w, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(w);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
  for (int k = 0; k < 4; ++k) {
    const float2 p = __bfloat1622float2(h[k]);
    f[2 * k] = p.x;
    f[2 * k + 1] = p.y;
  }
}
__device__ inline void load8(const float* w, float* f) {
  const float4 a = *reinterpret_cast<const float4*>(w), b = *reinterpret_cast<const float4*>(w + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// out[t][r] = x[t] . W[r] (+ bias[r]) for t < T; W [R][C] of WT (bf16 or f32); C % 8 == 0.
template <typename WT>
__global__ void k_gemv(float* out, const float* x, const WT* W, const float* bias, int R, int C, int T) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= R) return;
  const WT* wr = W + static_cast<size_t>(warp) * C;
  float acc[kGemvRows] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int c = lane * 8; c < C; c += 32 * 8) {
    float w[8];
    load8(wr + c, w);
#pragma unroll
    for (int t = 0; t < kGemvRows; ++t) {
      if (t < T) {
        const float* xt = x + static_cast<size_t>(t) * C + c;
        const float4 a = *reinterpret_cast<const float4*>(xt), b = *reinterpret_cast<const float4*>(xt + 4);
        acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kGemvRows; ++t) {
    if (t < T) {
      const float s = warp_sum(acc[t]);
      if (lane == 0) out[static_cast<size_t>(t) * R + warp] = s + (bias != nullptr ? bias[warp] : 0.0f);
    }
  }
}

// ---- attention --------------------------------------------------------------------------------

constexpr int kAttnThreads = 128;  // keys per tile
constexpr int kMaxHeadDim = 256;

template <typename KT>
__device__ inline float to_f(KT v);
template <>
__device__ inline float to_f<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ inline float to_f<float>(float v) {
  return v;
}

// grid (H, T), block kAttnThreads. One (query row, head) per block: online softmax over tiles
// of keys, each thread scoring one key of a tile, threads d < D accumulating output dimension d
// (and d + blockDim). With mass or entropy wanted, a second pass recomputes the same scores and
// adds p / (H/G) into mass[g][j] (rows t >= mass_row_begin) and writes H(p)/log(n) per row.
template <typename KT>
__global__ void k_attention(float* out, const float* q, const int32_t* q_pos, int H, KvView kv, float scale,
                            float* mass, int64_t mass_stride, int64_t mass_row_begin, float* entropy) {
  const int h = blockIdx.x, t = blockIdx.y, G = kv.n_kv_heads, D = kv.head_dim, N = kv.count;
  const int g = h / (H / G);
  __shared__ float qs[kMaxHeadDim];
  __shared__ float ps[kAttnThreads];
  __shared__ float red[32];
  const float* qr = q + (static_cast<size_t>(t) * H + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = qr[d];
  const KT* K = static_cast<const KT*>(kv.k) + static_cast<size_t>(g) * kv.capacity * D;
  const KT* V = static_cast<const KT*>(kv.v) + static_cast<size_t>(g) * kv.capacity * D;
  const int32_t* pos = kv.pos + static_cast<size_t>(g) * kv.capacity;
  const int32_t qp = q_pos[t];
  __syncthreads();
  auto score = [&](int j) -> float {
    if (j >= N || pos[j] > qp) return -INFINITY;
    const KT* kr = K + static_cast<size_t>(j) * D;
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s += qs[d] * to_f<KT>(kr[d]);
    return s * scale;
  };
  float m = -INFINITY, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
  int visible = 0;
  const int d0 = threadIdx.x, d1 = threadIdx.x + blockDim.x;
  for (int start = 0; start < N; start += blockDim.x) {
    const float s = score(start + threadIdx.x);
    visible += s > -INFINITY;
    const float mn = fmaxf(m, block_max(s, red));
    if (mn == -INFINITY) continue;  // nothing visible yet (uniform across the block)
    const float p = s > -INFINITY ? expf(s - mn) : 0.0f;
    const float alpha = m > -INFINITY ? expf(m - mn) : 0.0f;
    const float tile = block_sum(p, red);
    ps[threadIdx.x] = p;
    __syncthreads();
    l = l * alpha + tile;
    const int n = min(static_cast<int>(blockDim.x), N - start);
    if (d0 < D) {
      float a = 0.0f;
      for (int jj = 0; jj < n; ++jj) a += ps[jj] * to_f<KT>(V[static_cast<size_t>(start + jj) * D + d0]);
      acc0 = acc0 * alpha + a;
    }
    if (d1 < D) {
      float a = 0.0f;
      for (int jj = 0; jj < n; ++jj) a += ps[jj] * to_f<KT>(V[static_cast<size_t>(start + jj) * D + d1]);
      acc1 = acc1 * alpha + a;
    }
    m = mn;
    __syncthreads();
  }
  float* o = out + (static_cast<size_t>(t) * H + h) * D;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (d0 < D) o[d0] = acc0 * inv;
  if (d1 < D) o[d1] = acc1 * inv;
  const bool want_mass = mass != nullptr && t >= mass_row_begin;
  if (!want_mass && entropy == nullptr) return;
  // second pass: the normalised probabilities of the same scores
  const float group = static_cast<float>(H / G);
  float ent = 0.0f;
  for (int start = 0; start < N; start += blockDim.x) {
    const int j = start + threadIdx.x;
    const float s = score(j);
    if (s == -INFINITY) continue;
    const float p = expf(s - m) * inv;
    if (want_mass) atomicAdd(mass + static_cast<size_t>(g) * mass_stride + j, p / group);
    if (p > 0.0f) ent -= p * logf(p);
  }
  if (entropy != nullptr) {
    ent = block_sum(ent, red);
    const float n_vis = block_sum(static_cast<float>(visible), red);
    if (threadIdx.x == 0) entropy[static_cast<size_t>(t) * H + h] = n_vis >= 2.0f ? ent / logf(n_vis) : -1.0f;
  }
}

// ---- KV rows ----------------------------------------------------------------------------------

// grid (T, G), block D (<= 1024)
template <typename KT>
__global__ void k_kv_write(KT* K, KT* V, int32_t* P, float* M, int G, int D, int cap, int at, const float* k,
                           const float* v, const int32_t* rows_pos) {
  const int r = blockIdx.x, g = blockIdx.y, d = threadIdx.x;
  const size_t slot = static_cast<size_t>(g) * cap + at + r;
  const size_t src = (static_cast<size_t>(r) * G + g) * D + d;
  if (d < D) {
    if constexpr (sizeof(KT) == 2) {
      K[slot * D + d] = __float2half_rn(k[src]);
      V[slot * D + d] = __float2half_rn(v[src]);
    } else {
      K[slot * D + d] = k[src];
      V[slot * D + d] = v[src];
    }
  }
  if (d == 0) P[slot] = rows_pos[r], M[slot] = 0.0f;
}

// grid n, block 128: row from[i] -> to[i] in K, V (row_words 32-bit words each), pos, mass
__global__ void k_kv_move(uint32_t* K, uint32_t* V, int32_t* P, float* M, size_t row_words, const int* from,
                          const int* to) {
  const size_t f = from[blockIdx.x], t = to[blockIdx.x];
  for (size_t w = threadIdx.x; w < row_words; w += blockDim.x) {
    K[t * row_words + w] = K[f * row_words + w];
    V[t * row_words + w] = V[f * row_words + w];
  }
  if (threadIdx.x == 0) P[t] = P[f], M[t] = M[f];
}

unsigned blocks_for(int64_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ---- the backend ------------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& o) : opt_(o) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
      throw Error("--device cuda: no CUDA device is visible (cudaGetDeviceCount found none)");
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp p;
    check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    name_ = p.name;
    check(cublasCreate(&blas_), "cublasCreate");
    // the exact test mode must not round through TF32
    check(cublasSetMathMode(blas_, opt_.f32_weights ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  ~CudaBackend() override { cublasDestroy(blas_); }

  Device kind() const override { return Device::kCuda; }
  std::string describe() const override {
    return "cuda, " + name_ + ", " + (opt_.f32_weights ? "f32" : "bf16") + " weights";
  }
  bool host_visible() const override { return false; }

  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<DeviceBuffer>(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "upload");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "download");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "copy");
  }

  WeightMatrix prepare_weight(const WeightMatrix& w, WeightUse use, std::unique_ptr<Buffer>& keep) override {
    // vectors stay f32; matrices become bf16 (f32 in the exact mode), dequantized row by row
    const bool f32 = use == WeightUse::kVector || opt_.f32_weights;
    const size_t eb = f32 ? 4 : 2, row = static_cast<size_t>(w.cols) * eb;
    keep = alloc(row * static_cast<size_t>(w.rows));
    if (!f32 && w.type == DType::BF16) {  // stored as used: one copy
      upload(keep->data(), w.data, row * static_cast<size_t>(w.rows));
      WeightMatrix d = w;
      d.data = keep->as<uint8_t>();
      return d;
    }
    constexpr int64_t kRowsPerCopy = 256;
    std::vector<float> f(static_cast<size_t>(w.cols * kRowsPerCopy));
    std::vector<uint16_t> b(f32 ? 0 : f.size());
    for (int64_t r0 = 0; r0 < w.rows; r0 += kRowsPerCopy) {
      const int64_t n = std::min(kRowsPerCopy, w.rows - r0);
      for (int64_t i = 0; i < n; ++i) dequantize_row(w.type, w.row(r0 + i), f.data() + i * w.cols, w.cols);
      const void* src = f.data();
      if (!f32) {
        for (size_t i = 0; i < static_cast<size_t>(n * w.cols); ++i) b[i] = f32_to_bf16(f[i]);
        src = b.data();
      }
      upload(keep->as<uint8_t>() + static_cast<size_t>(r0) * row, src, static_cast<size_t>(n) * row);
    }
    WeightMatrix d = w;
    d.type = f32 ? DType::F32 : DType::BF16;
    d.data = keep->as<uint8_t>();
    d.row_bytes = row;
    return d;
  }

  void embed(float* x, const WeightMatrix& table, const int32_t* tokens, int T) override {
    // the table stays in host memory (rows picked by host ids); T rows travel per step
    host_rows_.resize(static_cast<size_t>(T) * table.cols);
    for (int t = 0; t < T; ++t) dequantize_row(table.type, table.row(tokens[t]), host_rows_.data() + static_cast<size_t>(t) * table.cols, table.cols);
    upload(x, host_rows_.data(), host_rows_.size() * sizeof(float));
  }

  void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations) override {
    const int R = static_cast<int>(w.rows), C = static_cast<int>(w.cols);
    if (T <= kGemvRows && C % 8 == 0) {
      const unsigned grid = blocks_for(static_cast<int64_t>(R) * 32);
      if (w.type == DType::BF16)
        k_gemv<<<grid, kThreads>>>(out, x, reinterpret_cast<const __nv_bfloat16*>(w.data), bias, R, C, static_cast<int>(T));
      else
        k_gemv<<<grid, kThreads>>>(out, x, reinterpret_cast<const float*>(w.data), bias, R, C, static_cast<int>(T));
      check_launch("gemv");
      return;
    }
    // column-major view: out (R x T) = W^T-as-stored (C x R, transposed) x x (C x T)
    const float one = 1.0f, zero = 0.0f;
    if (w.type == DType::BF16) {
      const size_t need = static_cast<size_t>(T) * C * 2;
      if (!xb_ || xb_->bytes() < need) xb_ = alloc(need);
      k_to_bf16<<<blocks_for(T * C), kThreads>>>(xb_->as<__nv_bfloat16>(), x, T * C);
      check_launch("to_bf16");
      check(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, R, static_cast<int>(T), C, &one, w.data, CUDA_R_16BF, C,
                         xb_->data(), CUDA_R_16BF, C, &zero, out, CUDA_R_32F, R, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "gemm bf16");
    } else {
      check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, R, static_cast<int>(T), C, &one,
                        reinterpret_cast<const float*>(w.data), C, x, C, &zero, out, R),
            "gemm f32");
    }
    if (bias != nullptr) {
      k_add_bias<<<blocks_for(T * R), kThreads>>>(out, bias, T * R, R);
      check_launch("add_bias");
    }
  }

  void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps) override {
    k_rmsnorm<<<static_cast<unsigned>(T), kThreads>>>(out, x, w, static_cast<int>(E), eps);
    check_launch("rmsnorm");
  }
  void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq, RopePairing pairing) override {
    k_rope<<<dim3(static_cast<unsigned>(T), n_heads), std::max(32, D / 2)>>>(x, pos, n_heads, D, inv_freq,
                                                                            pairing == RopePairing::kAdjacent);
    check_launch("rope");
  }
  void silu_mul(float* gate, const float* up, int64_t n) override {
    k_silu_mul<<<blocks_for(n), kThreads>>>(gate, up, n);
    check_launch("silu_mul");
  }
  void add(float* x, const float* y, int64_t n) override {
    k_add<<<blocks_for(n), kThreads>>>(x, y, n);
    check_launch("add");
  }

  void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                 AttentionProbe* probe) override {
    if (kv.head_dim > kMaxHeadDim) throw Error("cuda attention: head dim " + std::to_string(kv.head_dim) + " above 256");
    float* mass = probe != nullptr ? probe->mass : nullptr;
    const int64_t stride = probe != nullptr && probe->mass_stride > 0 ? probe->mass_stride : kv.count;
    const int64_t row_begin = probe != nullptr ? probe->mass_row_begin : 0;
    float* ent = nullptr;
    if (probe != nullptr && probe->entropy) {
      const size_t need = static_cast<size_t>(T) * H * sizeof(float);
      if (!ent_ || ent_->bytes() < need) ent_ = alloc(need);
      ent = ent_->as<float>();
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
    const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>(T));
    if (kv.type == KvType::kF16)
      k_attention<__half><<<grid, kAttnThreads>>>(out, q, q_pos, H, kv, scale, mass, stride, row_begin, ent);
    else
      k_attention<float><<<grid, kAttnThreads>>>(out, q, q_pos, H, kv, scale, mass, stride, row_begin, ent);
    check_launch("attention");
    if (ent != nullptr) {  // the one step that reports a squeeze metric
      std::vector<float> e(static_cast<size_t>(T) * H);
      download(e.data(), ent, e.size() * sizeof(float));
      for (float v : e)
        if (v >= 0.0f) probe->entropy_sum += v, ++probe->entropy_rows;
    }
  }

  double copy_bandwidth() override {
    if (bandwidth_ > 0) return bandwidth_;
    const size_t bytes = size_t{1} << 30;  // 1 GiB each way, well past the L2
    auto a = alloc(bytes), b = alloc(bytes);
    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    std::vector<float> ms;
    for (int i = 0; i < 6; ++i) {
      check(cudaEventRecord(e0), "event");
      check(cudaMemcpy(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice), "copy");
      check(cudaEventRecord(e1), "event");
      check(cudaEventSynchronize(e1), "event");
      float t = 0;
      check(cudaEventElapsedTime(&t, e0, e1), "event");
      if (i > 0) ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    bandwidth_ = 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);  // read + written
    return bandwidth_;
  }

  void kv_write(const KvArrays& a, int at, const float* k, const float* v, const int32_t* rows_pos, int T) override {
    if (a.D > 1024) throw Error("cuda kv_write: head dim above 1024");
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(a.G));
    if (a.type == KvType::kF16)
      k_kv_write<<<grid, a.D>>>(static_cast<__half*>(a.k), static_cast<__half*>(a.v), a.pos, a.mass, a.G, a.D, a.capacity, at,
                                k, v, rows_pos);
    else
      k_kv_write<<<grid, a.D>>>(static_cast<float*>(a.k), static_cast<float*>(a.v), a.pos, a.mass, a.G, a.D, a.capacity, at,
                                k, v, rows_pos);
    check_launch("kv_write");
  }
  void kv_move(const KvArrays& a, const int* from, const int* to, int n) override {
    if (n == 0) return;
    const size_t need = 2 * static_cast<size_t>(n) * sizeof(int);
    if (!moves_ || moves_->bytes() < need) moves_ = alloc(std::max<size_t>(need, 4096));
    upload(moves_->data(), from, n * sizeof(int));
    upload(moves_->as<int>() + n, to, n * sizeof(int));
    k_kv_move<<<static_cast<unsigned>(n), 128>>>(static_cast<uint32_t*>(a.k), static_cast<uint32_t*>(a.v), a.pos, a.mass,
                                                  a.row_bytes() / 4, moves_->as<int>(), moves_->as<int>() + n);
    check_launch("kv_move");
  }

 private:
  static uint16_t f32_to_bf16(float f) {  // round to nearest even (finite inputs)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }

  CudaOptions opt_;
  std::string name_;
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<Buffer> xb_, ent_, moves_;  // scratch: bf16 activations, entropies, compaction moves
  std::vector<float> host_rows_;              // embedding rows on their way up
  double bandwidth_ = 0.0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) { return std::make_unique<CudaBackend>(options); }

}  // namespace squeezekv
