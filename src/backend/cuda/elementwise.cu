// Element-wise kernels (elementwise.h), one thread an element (RoPE: one a rotation pair).
#include "backend/cuda/elementwise.h"

#include <algorithm>

#include "backend/cuda/common.cuh"

namespace squeezekv::cuda {
namespace {
// grid (T, n_heads), block D/2 threads (one rotation pair each)
__global__ void k_rope(float* x, const int32_t* pos, int n_heads, int D, const float* inv_freq, int adjacent) {
  pdl_enter();
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
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ void k_add(float* x, const float* y, int64_t n) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// out[T][R] += bias[R]
__global__ void k_add_bias(float* out, const float* bias, int64_t n, int R) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] += bias[i % R];
}

__global__ void k_to_bf16(__nv_bfloat16* out, const float* x, int64_t n) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(x[i]);
}

__global__ void k_to_f16(__half* out, const float* x, int64_t n) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

// grid (pairs of the joined row / kThreads, T): one thread a pair of columns (a rotation pair
// where the part is rotated). s is read where it lies (__grid_constant__): indexed by a thread's
// part, a plain by-value struct was copied to every thread's stack first (160 bytes a thread:
// 8.9 us for the 8B shape's q, k, v of 64 rows, H200 2026-12-03).
__global__ void k_split_rows(const __grid_constant__ SplitRows s, const float* joined) {
  pdl_enter();
  const int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;  // j: pair of the joined row
  if (2 * j >= s.begin[s.n]) return;
  int i = 0;
  while (2 * j >= s.begin[i + 1]) ++i;
  const int R = s.begin[i + 1] - s.begin[i], p = j - s.begin[i] / 2;
  int i0 = 2 * p, i1 = 2 * p + 1, k = 0;  // k: the rotation pair within its head
  if (s.rope[i]) {
    const int half = s.D / 2, h = p / half;
    k = p % half;
    i0 = h * s.D + (s.adjacent ? 2 * k : k);
    i1 = h * s.D + (s.adjacent ? 2 * k + 1 : k + half);
  }
  const float* src = joined + static_cast<size_t>(t) * s.begin[s.n] + s.begin[i];
  float a = src[i0], b = src[i1];
  if (s.bias[i] != nullptr) a += s.bias[i][i0], b += s.bias[i][i1];
  if (s.rope[i]) {
    const float ang = static_cast<float>(s.pos[t]) * s.inv_freq[k];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    const float ra = a * cs - b * sn, rb = b * cs + a * sn;
    a = ra, b = rb;
  }
  float* out = s.out[i] + static_cast<size_t>(t) * R;
  out[i0] = a;
  out[i1] = b;
}

// grid (F / kThreads, T)
__global__ void k_silu_mul_split(float* g, __nv_bfloat16* gb, const float* joined, int F) {
  pdl_enter();
  const int t = blockIdx.y, f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= F) return;
  const float* row = joined + static_cast<size_t>(t) * 2 * F;
  const float x = row[f];
  const float r = x / (1.0f + expf(-x)) * row[F + f];
  g[static_cast<size_t>(t) * F + f] = r;
  if (gb != nullptr) gb[static_cast<size_t>(t) * F + f] = __float2bfloat16(r);
}

// one block of kSumThreads: out[0] = sum (o - o_cut)^2, out[1] = sum o^2 over n, in double
constexpr int kSumThreads = 1024;
__global__ void __launch_bounds__(kSumThreads) k_error_energy(double* out, const float* o, const float* o_cut, int64_t n) {
  pdl_enter();
  double err = 0.0, energy = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kSumThreads) {
    const double x = o[i], d = x - o_cut[i];
    err += d * d;
    energy += x * x;
  }
  for (int off = 16; off > 0; off >>= 1) {
    err += __shfl_xor_sync(0xffffffffu, err, off);
    energy += __shfl_xor_sync(0xffffffffu, energy, off);
  }
  __shared__ double s_err[kSumThreads / 32], s_energy[kSumThreads / 32];
  if (threadIdx.x % 32 == 0) s_err[threadIdx.x / 32] = err, s_energy[threadIdx.x / 32] = energy;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kSumThreads / 32; ++w) err += s_err[w], energy += s_energy[w];
    out[0] = err;
    out[1] = energy;
  }
}

}  // namespace

void launch_split_rows(Launcher& L, const SplitRows& s, const float* joined, int64_t T) {
  L.launch(k_split_rows, dim3(blocks_for(s.begin[s.n] / 2), static_cast<unsigned>(T)), kThreads, 0, s, joined);
}
void launch_silu_mul_split(Launcher& L, float* g, __nv_bfloat16* gb, const float* joined, int64_t T, int F) {
  L.launch(k_silu_mul_split, dim3(blocks_for(F), static_cast<unsigned>(T)), kThreads, 0, g, gb, joined, F);
}

void launch_rope(Launcher& L, float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq, bool adjacent) {
  L.launch(k_rope, dim3(static_cast<unsigned>(T), n_heads), std::max(32, D / 2), 0, x, pos, n_heads, D, inv_freq, adjacent ? 1 : 0);
}
void launch_silu_mul(Launcher& L, float* g, const float* u, int64_t n) { L.launch(k_silu_mul, blocks_for(n), kThreads, 0, g, u, n); }
void launch_add(Launcher& L, float* x, const float* y, int64_t n) { L.launch(k_add, blocks_for(n), kThreads, 0, x, y, n); }
void launch_add_bias(Launcher& L, float* out, const float* bias, int64_t n, int R) {
  L.launch(k_add_bias, blocks_for(n), kThreads, 0, out, bias, n, R);
}
void launch_to_bf16(Launcher& L, __nv_bfloat16* out, const float* x, int64_t n) { L.launch(k_to_bf16, blocks_for(n), kThreads, 0, out, x, n); }
void launch_to_f16(Launcher& L, __half* out, const float* x, int64_t n) { L.launch(k_to_f16, blocks_for(n), kThreads, 0, out, x, n); }

void launch_error_energy(Launcher& L, double* out, const float* o, const float* o_cut, int64_t n) {
  L.launch(k_error_energy, 1, kSumThreads, 0, out, o, o_cut, n);
}

}  // namespace squeezekv::cuda
