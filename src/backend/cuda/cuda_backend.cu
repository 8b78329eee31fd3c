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
#include <climits>
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
// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  v = l < nw ? red[l] : 0.0f;
  return warp_sum(v);
}

// ---- element-wise, norm, rope --------------------------------------------------------------

__global__ void k_rmsnorm(float* out, const float* x, const float* w, int E, float eps) {
  __shared__ float red[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * E;
  float* o = out + static_cast<size_t>(blockIdx.x) * E;
  float ss = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < E; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(E) + eps);
  for (int i = threadIdx.x; i < E; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

// x[row] += y[row]; out[row] = rmsnorm(x[row]) (grid T)
__global__ void k_add_rmsnorm(float* out, float* x, const float* y, const float* w, int E, float eps) {
  __shared__ float red[32];
  float* xr = x + static_cast<size_t>(blockIdx.x) * E;
  const float* yr = y + static_cast<size_t>(blockIdx.x) * E;
  float* o = out + static_cast<size_t>(blockIdx.x) * E;
  float ss = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    const float v = xr[i] + yr[i];
    xr[i] = v;
    ss += v * v;
  }
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

// ---- decode products: T <= kGemvRows activation rows ------------------------------------------

constexpr int kGemvRows = 4;

__device__ inline void load8(const __nv_bfloat16* w, float* f) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(w));
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 p = __bfloat1622float2(h[k]);
    f[2 * k] = p.x;
    f[2 * k + 1] = p.y;
  }
}
__device__ inline void load8(const float* w, float* f) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(w)), b = __ldg(reinterpret_cast<const float4*>(w + 4));
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

// out[t][r] = x[t] . W[r] (+ bias[r]) for t < T; W [R][C] of WT (bf16 or f32); C % 8 == 0.
// A block serves kGemvRowsPerBlock rows with all its warps splitting the columns (so even a
// 4096-row matrix fills the device with warps): each lane streams 16 bytes of every row per step,
// two steps in flight, the x values it loads serving all rows; partial sums meet in shared memory.
constexpr int kGemvRowsPerBlock = 4;
constexpr int kGemvWarps = 8;

template <typename WT, int T>
__global__ void __launch_bounds__(kGemvWarps * 32) k_gemv(float* out, const float* x, const WT* W, const float* bias, int R, int C) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * kGemvRowsPerBlock;
  const WT* wr[kGemvRowsPerBlock];
#pragma unroll
  for (int i = 0; i < kGemvRowsPerBlock; ++i) wr[i] = W + static_cast<size_t>(min(r0 + i, R - 1)) * C;
  float acc[kGemvRowsPerBlock][T] = {};
#pragma unroll 2
  for (int c = threadIdx.x * 8; c < C; c += kGemvWarps * 32 * 8) {
    float xv[T][8];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<size_t>(t) * C + c;
      const float4 a = *reinterpret_cast<const float4*>(xt), b = *reinterpret_cast<const float4*>(xt + 4);
      xv[t][0] = a.x, xv[t][1] = a.y, xv[t][2] = a.z, xv[t][3] = a.w, xv[t][4] = b.x, xv[t][5] = b.y, xv[t][6] = b.z, xv[t][7] = b.w;
    }
#pragma unroll
    for (int i = 0; i < kGemvRowsPerBlock; ++i) {
      float w[8];
      load8(wr[i] + c, w);
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[i][t] += w[k] * xv[t][k];
    }
  }
  __shared__ float part[kGemvWarps][kGemvRowsPerBlock * T];
#pragma unroll
  for (int i = 0; i < kGemvRowsPerBlock; ++i)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = warp_sum(acc[i][t]);
      if (lane == 0) part[warp][i * T + t] = s;
    }
  __syncthreads();
  if (threadIdx.x < kGemvRowsPerBlock * T) {
    const int i = threadIdx.x / T, t = threadIdx.x % T;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) s += part[w][threadIdx.x];
    if (r0 + i < R) out[static_cast<size_t>(t) * R + r0 + i] = s + (bias != nullptr ? bias[r0 + i] : 0.0f);
  }
}

template <typename WT>
void launch_gemv(float* out, const float* x, const WT* W, const float* bias, int R, int C, int T) {
  const unsigned grid = static_cast<unsigned>((R + kGemvRowsPerBlock - 1) / kGemvRowsPerBlock);
  switch (T) {
    case 1: k_gemv<WT, 1><<<grid, kGemvWarps * 32>>>(out, x, W, bias, R, C); break;
    case 2: k_gemv<WT, 2><<<grid, kGemvWarps * 32>>>(out, x, W, bias, R, C); break;
    case 3: k_gemv<WT, 3><<<grid, kGemvWarps * 32>>>(out, x, W, bias, R, C); break;
    default: k_gemv<WT, 4><<<grid, kGemvWarps * 32>>>(out, x, W, bias, R, C); break;
  }
}

// ---- attention --------------------------------------------------------------------------------
// One block serves one kv head g and a tile of query tokens: its rows are (token, query head of g)
// pairs, so the heads that share g read each K/V tile once (from shared memory). Keys go in
// tiles of 32, one per lane; each warp keeps an online softmax for its rows (up to 4). Long key
// ranges split over blocks (flash-decoding: partial max, sum and output per split, merged after);
// the split depends on sizes only. The policies' mass and the entropy come from a second kernel
// over the same scores with the final max and sum (only when asked for).

constexpr int kAttnWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kAttnRows = kAttnWarps * kRowsPerWarp;  // rows per block
constexpr int kKeyTile = 32;
constexpr int kMaxHeadDim = 256;

struct AttnShape {
  int T, H, G, grp, D, N, cap, qt;  // qt: query tokens per block
  int splits, chunk;                // key range split: chunk keys (a multiple of 32) per split
  float scale;
};

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

// The block's shared memory: q rows [rows][D], K tile [32][D + 1] (padded: lanes read different
// banks), V tile [32][D], the tile's positions [32].
struct AttnSmem {
  float *q, *k, *v;
  int* pos;
};
__device__ inline AttnSmem carve(float* smem, int D) {
  AttnSmem s;
  s.q = smem;
  s.k = s.q + kAttnRows * D;
  s.v = s.k + kKeyTile * (D + 1);
  s.pos = reinterpret_cast<int*>(s.v + kKeyTile * D);
  return s;
}

size_t attn_smem_bytes(int D) {
  return sizeof(float) * (static_cast<size_t>(kAttnRows) * D + kKeyTile * (D + 1) + kKeyTile * D) + kKeyTile * sizeof(int);
}

// Loads the block's query rows (scaled) into qs; returns nothing. Row r = (token t0 + r / grp, head g*grp + r % grp).
__device__ inline void load_q(float* qs, const float* q, const AttnShape& a, int g, int t0) {
  const int live = min(a.qt, a.T - t0) * a.grp * a.D;  // rows past it are never read
#pragma unroll 4
  for (int i = threadIdx.x; i < live; i += blockDim.x) {
    const int r = i / a.D, d = i % a.D, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    qs[i] = (r < a.qt * a.grp && t < a.T) ? q[(static_cast<size_t>(t) * a.H + h) * a.D + d] * a.scale : 0.0f;
  }
}

template <typename KT>
__device__ inline void load_tile(float* ks, float* vs, int* ps, const KvView& kv, int g, int start, int end, int D) {
  const KT* K = static_cast<const KT*>(kv.k) + (static_cast<size_t>(g) * kv.capacity + start) * D;
  const KT* V = static_cast<const KT*>(kv.v) + (static_cast<size_t>(g) * kv.capacity + start) * D;
  const int n = min(kKeyTile, end - start);
#pragma unroll 4
  for (int i = threadIdx.x; i < kKeyTile * D; i += blockDim.x) {
    const int j = i / D, d = i % D;
    ks[j * (D + 1) + d] = j < n ? to_f<KT>(K[i]) : 0.0f;
    vs[i] = j < n ? to_f<KT>(V[i]) : 0.0f;
  }
  if (threadIdx.x < kKeyTile) ps[threadIdx.x] = threadIdx.x < n ? kv.pos[static_cast<size_t>(g) * kv.capacity + start + threadIdx.x] : INT_MAX;
}

// grid (G, ceil(T / qt), splits). Writes, per row (t, h) and split, the partial max, sum and
// output; with one split the output is final (out) and so are max and sum (ml).
template <typename KT>
__global__ void k_attn(float* out, float* part_acc, float* ml, const float* q, const int32_t* q_pos, KvView kv, AttnShape a) {
  extern __shared__ float smem[];
  const int D = a.D, g = blockIdx.x, t0 = blockIdx.y * a.qt, split = blockIdx.z;
  const AttnSmem sm = carve(smem, D);
  float *qs = sm.q, *ks = sm.k, *vs = sm.v;
  int* ps = sm.pos;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_q(qs, q, a, g, t0);
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxHeadDim / 32];
  int qp[kRowsPerWarp];
  bool live[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp;
    live[i] = r < a.qt * a.grp && t < a.T;
    qp[i] = live[i] ? q_pos[t] : -1;
    m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int dd = 0; dd < kMaxHeadDim / 32; ++dd) acc[i][dd] = 0.0f;
  }
  const int begin = split * a.chunk, end = min(a.N, begin + a.chunk);
  for (int start = begin; start < end; start += kKeyTile) {
    __syncthreads();
    load_tile<KT>(ks, vs, ps, kv, g, start, end, D);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (!live[i]) continue;  // uniform across the warp
      const float* qr = qs + (warp + kAttnWarps * i) * D;
      const float* kr = ks + lane * (D + 1);
      float sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qr[d] * kr[d];
      const bool vis = ps[lane] <= qp[i];
      sc = vis ? sc : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(sc));
      if (mn == -INFINITY) continue;
      const float p = vis ? __expf(sc - mn) : 0.0f;
      const float alpha = m[i] > -INFINITY ? __expf(m[i] - mn) : 0.0f;
      l[i] = l[i] * alpha + warp_sum(p);
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd) acc[i][dd] *= alpha;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* vr = vs + j * D + lane;
#pragma unroll
        for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
          if (dd * 32 + lane < D) acc[i][dd] += pj * vr[dd * 32];
      }
      m[i] = mn;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (!live[i]) continue;
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    const size_t row = static_cast<size_t>(t) * a.H + h;
    if (a.splits == 1) {
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
        if (dd * 32 + lane < D) out[row * D + dd * 32 + lane] = acc[i][dd] * inv;
      if (lane == 0) ml[2 * row] = m[i], ml[2 * row + 1] = l[i];
    } else {
      const size_t prow = static_cast<size_t>(split) * a.T * a.H + row;
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
        if (dd * 32 + lane < D) part_acc[prow * D + dd * 32 + lane] = acc[i][dd];
      if (lane == 0) ml[2 * prow] = m[i], ml[2 * prow + 1] = l[i];
    }
  }
}

// grid T*H, block 32 x (D/32 lanes of output): merges the splits of one row; ml_out [T*H][2].
__global__ void k_attn_merge(float* out, float* ml_out, const float* part_acc, const float* part_ml, int rows, int splits, int D) {
  const int row = blockIdx.x;
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, part_ml[2 * (static_cast<size_t>(s) * rows + row)]);
  float L = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float ms = part_ml[2 * (static_cast<size_t>(s) * rows + row)];
    if (ms > -INFINITY) L += part_ml[2 * (static_cast<size_t>(s) * rows + row) + 1] * __expf(ms - M);
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = part_ml[2 * (static_cast<size_t>(s) * rows + row)];
      if (ms > -INFINITY) o += part_acc[(static_cast<size_t>(s) * rows + row) * D + d] * __expf(ms - M);
    }
    out[static_cast<size_t>(row) * D + d] = o * inv;
  }
  if (threadIdx.x == 0) ml_out[2 * row] = M, ml_out[2 * row + 1] = L;
}

// The policies' outputs from the final max and sum: mass[g][j] += p / grp over rows with
// t >= mass_row_begin (summed within the warp first; mass_max: mass = max(mass, p), through the
// bits of non-negative floats, which order as integers), and per row the entropy sum -p log p and
// the visible key count (atomically over splits) into ent[row][2].
template <typename KT>
__global__ void k_attn_probe(float* mass, int64_t mass_stride, int64_t mass_row_begin, bool mass_max, float* ent, const float* ml,
                             const float* q, const int32_t* q_pos, KvView kv, AttnShape a) {
  extern __shared__ float smem[];
  const int D = a.D, g = blockIdx.x, t0 = blockIdx.y * a.qt, split = blockIdx.z;
  const AttnSmem sm = carve(smem, D);
  float *qs = sm.q, *ks = sm.k, *vs = sm.v;
  int* ps = sm.pos;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_q(qs, q, a, g, t0);
  float m[kRowsPerWarp], inv[kRowsPerWarp], h_sum[kRowsPerWarp], n_vis[kRowsPerWarp];
  int qp[kRowsPerWarp];
  bool live[kRowsPerWarp], to_mass[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    live[i] = r < a.qt * a.grp && t < a.T;
    const size_t row = static_cast<size_t>(live[i] ? t : 0) * a.H + h;
    qp[i] = live[i] ? q_pos[t] : -1;
    m[i] = live[i] ? ml[2 * row] : 0.0f;
    inv[i] = live[i] && ml[2 * row + 1] > 0.0f ? 1.0f / ml[2 * row + 1] : 0.0f;
    to_mass[i] = live[i] && mass != nullptr && t >= mass_row_begin;
    h_sum[i] = 0.0f, n_vis[i] = 0.0f;
  }
  const int begin = split * a.chunk, end = min(a.N, begin + a.chunk);
  for (int start = begin; start < end; start += kKeyTile) {
    __syncthreads();
    load_tile<KT>(ks, vs, ps, kv, g, start, end, D);
    __syncthreads();
    float msum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (!live[i]) continue;
      const float* qr = qs + (warp + kAttnWarps * i) * D;
      const float* kr = ks + lane * (D + 1);
      float sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qr[d] * kr[d];
      if (ps[lane] > qp[i]) continue;
      const float p = __expf(sc - m[i]) * inv[i];
      if (to_mass[i]) msum = mass_max ? fmaxf(msum, p) : msum + p;
      if (p > 0.0f) h_sum[i] -= p * __logf(p);
      n_vis[i] += 1.0f;
    }
    if (mass != nullptr && msum > 0.0f && start + lane < end) {
      float* dst = mass + static_cast<size_t>(g) * mass_stride + start + lane;
      if (mass_max) atomicMax(reinterpret_cast<int*>(dst), __float_as_int(msum));
      else atomicAdd(dst, msum / static_cast<float>(a.grp));
    }
  }
  if (ent == nullptr) return;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (!live[i]) continue;
    const float hs = warp_sum(h_sum[i]), nv = warp_sum(n_vis[i]);
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    if (lane == 0) {
      atomicAdd(ent + 2 * (static_cast<size_t>(t) * a.H + h), hs);
      atomicAdd(ent + 2 * (static_cast<size_t>(t) * a.H + h) + 1, nv);
    }
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

// grid G, block 256: per head the least-mass slot among positions [keep_below, keep_from) (ties:
// the newer position goes), then row count - 1 into its hole (cpu_backend.cc's loop, in parallel).
__global__ void k_kv_evict_one(uint32_t* K, uint32_t* V, int32_t* P, float* M, size_t row_words, int cap, int count,
                               int32_t keep_below, int32_t keep_from) {
  const size_t base = static_cast<size_t>(blockIdx.x) * cap;
  const int32_t* pos = P + base;
  const float* m = M + base;
  int worst = -1;
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    if (pos[j] < keep_below || pos[j] >= keep_from) continue;
    if (worst < 0 || m[j] < m[worst] || (m[j] == m[worst] && pos[j] > pos[worst])) worst = j;
  }
  __shared__ int cand[256];
  cand[threadIdx.x] = worst;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const int a = cand[threadIdx.x], b = cand[threadIdx.x + s];
      if (b >= 0 && (a < 0 || m[b] < m[a] || (m[b] == m[a] && pos[b] > pos[a]))) cand[threadIdx.x] = b;
    }
    __syncthreads();
  }
  const int victim = cand[0], last = count - 1;
  if (victim < 0 || victim == last) return;
  for (size_t w = threadIdx.x; w < row_words; w += blockDim.x) {
    K[(base + victim) * row_words + w] = K[(base + last) * row_words + w];
    V[(base + victim) * row_words + w] = V[(base + last) * row_words + w];
  }
  __syncthreads();  // every thread read m/pos of the victim above before they change
  if (threadIdx.x == 0) P[base + victim] = P[base + last], M[base + victim] = M[base + last];
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
    sms_ = p.multiProcessorCount;
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

  // A decode batch: up to kGemvRows rows per GEMV launch, each row's sums formed exactly as in a
  // one-row launch (its own accumulators, the same order), the weights read once per launch.
  void matmul_rows(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations act) override {
    const int R = static_cast<int>(w.rows), C = static_cast<int>(w.cols);
    if (C % 8 != 0) return Backend::matmul_rows(out, x, w, T, bias, act);
    for (int64_t t0 = 0; t0 < T; t0 += kGemvRows) {
      const int n = static_cast<int>(std::min<int64_t>(kGemvRows, T - t0));
      float* o = out + t0 * R;
      const float* xt = x + t0 * C;
      if (w.type == DType::BF16) launch_gemv(o, xt, reinterpret_cast<const __nv_bfloat16*>(w.data), bias, R, C, n);
      else launch_gemv(o, xt, reinterpret_cast<const float*>(w.data), bias, R, C, n);
      check_launch("gemv rows");
    }
  }

  void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations) override {
    const int R = static_cast<int>(w.rows), C = static_cast<int>(w.cols);
    if (T <= kGemvRows && C % 8 == 0) {
      if (w.type == DType::BF16)
        launch_gemv(out, x, reinterpret_cast<const __nv_bfloat16*>(w.data), bias, R, C, static_cast<int>(T));
      else
        launch_gemv(out, x, reinterpret_cast<const float*>(w.data), bias, R, C, static_cast<int>(T));
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
    k_rmsnorm<<<static_cast<unsigned>(T), 1024>>>(out, x, w, static_cast<int>(E), eps);  // one row: latency-bound
    check_launch("rmsnorm");
  }
  void add_rmsnorm(float* out, float* x, const float* y, const float* w, int64_t T, int64_t E, float eps) override {
    k_add_rmsnorm<<<static_cast<unsigned>(T), 1024>>>(out, x, y, w, static_cast<int>(E), eps);
    check_launch("add_rmsnorm");
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
    AttnShape a;
    a.T = static_cast<int>(T), a.H = H, a.G = kv.n_kv_heads, a.grp = H / kv.n_kv_heads, a.D = kv.head_dim, a.N = kv.count;
    a.cap = kv.capacity;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
    if (a.D > kMaxHeadDim) throw Error("cuda attention: head dim " + std::to_string(a.D) + " above 256");
    if (a.grp > kAttnRows) throw Error("cuda attention: more than 32 query heads per kv head");
    a.qt = std::max(1, std::min(a.T, kAttnRows / a.grp));
    const int qtiles = (a.T + a.qt - 1) / a.qt;
    // split long key ranges when the blocks alone would not fill the device (sizes only)
    const int blocks = a.G * qtiles;
    a.splits = 1;
    if (blocks < 2 * sms_) a.splits = std::max(1, std::min({(2 * sms_) / blocks, (a.N + 255) / 256, 64}));
    a.chunk = ((a.N + a.splits - 1) / a.splits + kKeyTile - 1) / kKeyTile * kKeyTile;
    a.splits = a.N > 0 ? (a.N + a.chunk - 1) / a.chunk : 1;
    const size_t rows = static_cast<size_t>(a.T) * H;
    grow(ml_, rows * 2 * sizeof(float));
    if (a.splits > 1) {
      grow(part_acc_, a.splits * rows * a.D * sizeof(float));
      grow(part_ml_, a.splits * rows * 2 * sizeof(float));
    }
    const size_t smem = attn_smem_bytes(a.D);
    const dim3 grid(a.G, qtiles, a.splits);
    const bool f16 = kv.type == KvType::kF16;
    if (smem > 48 * 1024 && smem_set_ < smem) {
      check(cudaFuncSetAttribute(k_attn<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      check(cudaFuncSetAttribute(k_attn<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      check(cudaFuncSetAttribute(k_attn_probe<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      check(cudaFuncSetAttribute(k_attn_probe<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      smem_set_ = smem;
    }
    float* part_ml = a.splits > 1 ? part_ml_->as<float>() : ml_->as<float>();
    float* part_acc = a.splits > 1 ? part_acc_->as<float>() : nullptr;
    if (f16)
      k_attn<__half><<<grid, kAttnWarps * 32, smem>>>(out, part_acc, part_ml, q, q_pos, kv, a);
    else
      k_attn<float><<<grid, kAttnWarps * 32, smem>>>(out, part_acc, part_ml, q, q_pos, kv, a);
    check_launch("attention");
    if (a.splits > 1) {
      k_attn_merge<<<static_cast<unsigned>(rows), 32>>>(out, ml_->as<float>(), part_acc, part_ml, static_cast<int>(rows),
                                                       a.splits, a.D);
      check_launch("attention merge");
    }
    float* mass = probe != nullptr ? probe->mass : nullptr;
    const bool ent = probe != nullptr && probe->entropy;
    if (mass == nullptr && !ent) return;  // no second pass unless a policy needs it
    const int64_t stride = probe->mass_stride > 0 ? probe->mass_stride : kv.count;
    float* e = nullptr;
    if (ent) {
      grow(ent_, rows * 2 * sizeof(float));
      check(cudaMemset(ent_->data(), 0, rows * 2 * sizeof(float)), "memset");
      e = ent_->as<float>();
    }
    if (f16)
      k_attn_probe<__half><<<grid, kAttnWarps * 32, smem>>>(mass, stride, probe->mass_row_begin, probe->reduce == MassReduce::kMax, e, ml_->as<float>(), q, q_pos, kv, a);
    else
      k_attn_probe<float><<<grid, kAttnWarps * 32, smem>>>(mass, stride, probe->mass_row_begin, probe->reduce == MassReduce::kMax, e, ml_->as<float>(), q, q_pos, kv, a);
    check_launch("attention probe");
    if (ent) {  // the one step that reports a squeeze metric
      std::vector<float> h(rows * 2);
      download(h.data(), e, h.size() * sizeof(float));
      for (size_t r = 0; r < rows; ++r)
        if (h[2 * r + 1] >= 2.0f) probe->entropy_sum += h[2 * r] / std::log(h[2 * r + 1]), ++probe->entropy_rows;
    }
  }

  void kv_evict_one(const KvArrays& a, int count, int32_t keep_below, int32_t keep_from) override {
    k_kv_evict_one<<<static_cast<unsigned>(a.G), 256>>>(static_cast<uint32_t*>(a.k), static_cast<uint32_t*>(a.v), a.pos, a.mass,
                                                          a.row_bytes() / 4, a.capacity, count, keep_below, keep_from);
    check_launch("kv_evict_one");
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
  void grow(std::unique_ptr<Buffer>& b, size_t bytes) {
    if (!b || b->bytes() < bytes) b = alloc(bytes);
  }
  int sms_ = 1;
  size_t smem_set_ = 0;
  // scratch: bf16 activations, entropies, compaction moves, attention max/sum and split partials
  std::unique_ptr<Buffer> xb_, ent_, moves_, ml_, part_acc_, part_ml_;
  std::vector<float> host_rows_;              // embedding rows on their way up
  double bandwidth_ = 0.0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) { return std::make_unique<CudaBackend>(options); }

}  // namespace squeezekv
