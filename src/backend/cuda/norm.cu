// RMSNorm kernels (norm.h). Letters: T rows, E row width.
#include "backend/cuda/norm.h"

#include <algorithm>

#include "backend/cuda/common.cuh"

namespace squeezekv::cuda {
namespace {

__global__ void k_rmsnorm(float* out, __nv_bfloat16* outb, const float* x, const float* w, int E, float eps) {
  pdl_enter();
  __shared__ float red[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * E;
  float* o = out + static_cast<size_t>(blockIdx.x) * E;
  float ss = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < E; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(E) + eps);
  __nv_bfloat16* ob = outb != nullptr ? outb + static_cast<size_t>(blockIdx.x) * E : nullptr;
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    const float r = w[i] * (xr[i] * inv);
    o[i] = r;
    if (ob != nullptr) ob[i] = __float2bfloat16(r);
  }
}

// x[row] += y[row]; out[row] = rmsnorm(x[row]) (grid T)
__global__ void k_add_rmsnorm(float* out, __nv_bfloat16* outb, float* x, const float* y, const float* w, int E, float eps) {
  pdl_enter();
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
  __nv_bfloat16* ob = outb != nullptr ? outb + static_cast<size_t>(blockIdx.x) * E : nullptr;
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    const float r = w[i] * (xr[i] * inv);
    o[i] = r;
    if (ob != nullptr) ob[i] = __float2bfloat16(r);
  }
}

// The same two ops for rows of E % 4 == 0 floats that fit a block's registers (NV float4 a
// thread): one pass over memory instead of two, the norm weights loaded before the PDL wait (they
// do not depend on the kernels before). y null: rmsnorm alone (x is not written). grid T.
constexpr int kNormThreads = 1024, kNormMaxVec = 4;
template <int NV>
__global__ void __launch_bounds__(kNormThreads) k_add_rmsnorm4(float* out, __nv_bfloat16* outb, float* x, const float* y, const float* w, int E,
                                                                float eps) {
  pdl_launch_next();
  __shared__ float red[32];
  const int n4 = E / 4;
  float4 wv[NV], v[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n4) wv[k] = reinterpret_cast<const float4*>(w)[i];
  }
  pdl_wait();
  float4* xr = reinterpret_cast<float4*>(x + static_cast<size_t>(blockIdx.x) * E);
  const float4* yr = y != nullptr ? reinterpret_cast<const float4*>(y + static_cast<size_t>(blockIdx.x) * E) : nullptr;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n4) continue;
    v[k] = xr[i];
    if (yr != nullptr) {
      const float4 b = yr[i];
      v[k].x += b.x, v[k].y += b.y, v[k].z += b.z, v[k].w += b.w;
      xr[i] = v[k];
    }
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(E) + eps);
  float4* o = reinterpret_cast<float4*>(out + static_cast<size_t>(blockIdx.x) * E);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n4) continue;
    const float4 r = make_float4(wv[k].x * (v[k].x * inv), wv[k].y * (v[k].y * inv), wv[k].z * (v[k].z * inv), wv[k].w * (v[k].w * inv));
    o[i] = r;
    if (outb != nullptr) {  // the same row in bf16, as k_to_bf16 rounds it, for the products that read it next
      __nv_bfloat162* ob = reinterpret_cast<__nv_bfloat162*>(outb + static_cast<size_t>(blockIdx.x) * E) + 2 * i;
      ob[0] = __nv_bfloat162(__float2bfloat16(r.x), __float2bfloat16(r.y));
      ob[1] = __nv_bfloat162(__float2bfloat16(r.z), __float2bfloat16(r.w));
    }
  }
}

// k_add_rmsnorm4 where rows are whole float4s (aligned) and fit kNormMaxVec a thread
bool norm_in_registers(Launcher& L, float* out, __nv_bfloat16* outb, float* x, const float* y, const float* w, int64_t T, int64_t E,
                       float eps) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (E % 4 != 0 || E / 4 > kNormThreads * kNormMaxVec || !aligned(out) || !aligned(x) || !aligned(w) ||
      (y != nullptr && !aligned(y)) || (outb != nullptr && reinterpret_cast<uintptr_t>(outb) % 8 != 0))
    return false;
  const int n4 = static_cast<int>(E / 4), nv = (n4 + kNormThreads - 1) / kNormThreads;
  const int threads = std::max(32, ((n4 + nv - 1) / nv + 31) / 32 * 32);
  const unsigned grid = static_cast<unsigned>(T);
  const int e = static_cast<int>(E);
  switch (nv) {
    case 1: L.launch(k_add_rmsnorm4<1>, grid, threads, 0, out, outb, x, y, w, e, eps); break;
    case 2: L.launch(k_add_rmsnorm4<2>, grid, threads, 0, out, outb, x, y, w, e, eps); break;
    case 3: L.launch(k_add_rmsnorm4<3>, grid, threads, 0, out, outb, x, y, w, e, eps); break;
    default: L.launch(k_add_rmsnorm4<4>, grid, threads, 0, out, outb, x, y, w, e, eps); break;
  }
  return true;
}

}  // namespace

void launch_rmsnorm(Launcher& L, float* out, __nv_bfloat16* out_bf16, float* x, const float* y, const float* w, int64_t T, int64_t E,
                    float eps) {
  if (norm_in_registers(L, out, out_bf16, x, y, w, T, E, eps)) return;
  // one row a block of 1024 threads: a row is latency-bound
  if (y == nullptr)
    L.launch(k_rmsnorm, static_cast<unsigned>(T), 1024, 0, out, out_bf16, static_cast<const float*>(x), w, static_cast<int>(E), eps);
  else L.launch(k_add_rmsnorm, static_cast<unsigned>(T), 1024, 0, out, out_bf16, x, y, w, static_cast<int>(E), eps);
}

}  // namespace squeezekv::cuda
