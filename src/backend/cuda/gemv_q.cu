// Packed-weight products (gemv_q.h): the Q8 activation rounding, the integer GEMV (dp4a over the
// groups of quant_groups.h) and the dequantization to bf16 for the tensor-core products.
#include "backend/cuda/gemv_q.h"

#include "backend/cuda/common.cuh"
#include "backend/cuda/quant_groups.h"
#include "squeezekv/error.h"

namespace squeezekv::cuda {
namespace {

// One warp a block of 32 values (lane i: value i). xs as launch_quantize_q8 says.
__global__ void k_quantize_q8(int8_t* xq, float4* xs, const float* x, int64_t n_blocks) {
  pdl_enter();
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= n_blocks) return;
  const float v = x[b * 32 + lane];
  const float d = warp_max(fabsf(v)) / 127.0f;
  const float inv = d > 0.0f ? __frcp_rn(d) : 0.0f;  // 1 / d rounded as the CPU's division
  const int q = static_cast<int>(rintf(__fmul_rn(v, inv)));
  xq[b * 32 + lane] = static_cast<int8_t>(q);
  int s = q;  // sums of each half (lanes 0..15, 16..31)
  for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int s_hi = __shfl_sync(0xffffffffu, s, 16);
  if (lane == 0) xs[b] = make_float4(d, d * static_cast<float>(s), d * static_cast<float>(s_hi), 0.0f);
}

constexpr int kGemvWarps = 4;  // weight rows a block

// grid R / kGemvWarps, block 32 * kGemvWarps: warp w takes row blockIdx.x * kGemvWarps + w, its
// lanes the row's groups of 32 in turn; per group and half an integer dot (4 dp4a) scaled by the
// weights' and the activations' scales, plus the weights' offset times the activations' sum.
template <DType TY, int NT>
__global__ void __launch_bounds__(32 * kGemvWarps) k_gemv_q(float* out, const uint8_t* w, int64_t row_bytes, const int8_t* xq,
                                                            const float4* xs, const float* bias, int R, int C) {
  pdl_enter();
  const int r = blockIdx.x * kGemvWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= R) return;
  const uint8_t* row = w + r * row_bytes;
  const int G = C / 32;
  const int64_t nb = C / (32 * PackedTraits<TY>::kGroups);
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
#pragma unroll 2
  for (int g = lane; g < G; g += 32) {
    PackedGroup p;
    unpack_planar<TY>(row, nb, g, p);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int4* xv = reinterpret_cast<const int4*>(xq + static_cast<int64_t>(t) * C + 32 * g);
      const int4 a = xv[0], b = xv[1];
      const float4 s = xs[static_cast<int64_t>(t) * G + g];
      int lo = __dp4a(p.q[0], a.x, 0);
      lo = __dp4a(p.q[1], a.y, lo);
      lo = __dp4a(p.q[2], a.z, lo);
      lo = __dp4a(p.q[3], a.w, lo);
      int hi = __dp4a(p.q[4], b.x, 0);
      hi = __dp4a(p.q[5], b.y, hi);
      hi = __dp4a(p.q[6], b.z, hi);
      hi = __dp4a(p.q[7], b.w, hi);
      acc[t] += p.scale[0] * (s.x * static_cast<float>(lo)) + p.scale[1] * (s.x * static_cast<float>(hi)) + p.min[0] * s.y +
                p.min[1] * s.z;
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) out[static_cast<int64_t>(t) * R + r] = bias != nullptr ? v + bias[r] : v;
  }
}

// One thread a group of 32 values: 32 bf16 written as four 16-byte stores. (Four threads a
// group, each storing 8 values so that a warp's stores are contiguous, each unpacking the whole
// group, measured slower on the H200: pp512 of the 8B shape in Q4_K_M 14.3-15.0k tok/s against
// 16.5-17.2k, 2026-12-02.)
template <DType TY>
__global__ void k_dequantize_bf16(__nv_bfloat16* out, const uint8_t* w, int64_t row_bytes, int64_t R, int C) {
  pdl_enter();
  const int G = C / 32;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= R * G) return;
  const int64_t r = i / G;
  const int g = static_cast<int>(i % G);
  PackedGroup p;
  unpack_planar<TY>(w + r * row_bytes, C / (32 * PackedTraits<TY>::kGroups), g, p);
  const int8_t* q = reinterpret_cast<const int8_t*>(p.q);
  uint4* dst = reinterpret_cast<uint4*>(out + r * C + 32 * g);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    __nv_bfloat16 v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int idx = 8 * k + e, h = idx / 16;
      float x = p.scale[h] * static_cast<float>(q[idx]);
      if constexpr (PackedTraits<TY>::kHasMin) x = x + p.min[h];
      v[e] = __float2bfloat16(x);
    }
    dst[k] = *reinterpret_cast<const uint4*>(v);
  }
}

template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
#define SQK_TYPE(X) \
  case DType::X: return f(std::integral_constant<DType, DType::X>{});
    SQK_TYPE(Q8_0) SQK_TYPE(Q4_0) SQK_TYPE(Q4_1) SQK_TYPE(Q5_0) SQK_TYPE(Q5_1) SQK_TYPE(Q2_K) SQK_TYPE(Q3_K)
    SQK_TYPE(Q4_K) SQK_TYPE(Q5_K) SQK_TYPE(Q6_K) SQK_TYPE(IQ4_NL) SQK_TYPE(IQ4_XS)
#undef SQK_TYPE
    default: throw Error(std::string("cuda: no packed product for weights of type ") + std::string(dtype_info(t).name));
  }
}

}  // namespace

void launch_quantize_q8(Launcher& L, int8_t* xq, float* xs, const float* x, int64_t T, int64_t C) {
  const int64_t blocks = T * C / 32;
  constexpr int kWarps = 8;
  L.launch(k_quantize_q8, blocks_for(blocks, kWarps), 32 * kWarps, 0, xq, reinterpret_cast<float4*>(xs), x, blocks);
}

void launch_gemv_q(Launcher& L, float* out, const int8_t* xq, const float* xs, const WeightMatrix& w, const float* bias, int T) {
  const unsigned grid = blocks_for(w.rows, kGemvWarps);
  const auto* s = reinterpret_cast<const float4*>(xs);
  const int R = static_cast<int>(w.rows), C = static_cast<int>(w.cols);
  const int64_t rb = static_cast<int64_t>(w.row_bytes);
  dispatch(w.type, [&](auto ty) {
    constexpr DType TY = decltype(ty)::value;
    switch (T) {
      case 1: return L.launch(k_gemv_q<TY, 1>, grid, 32 * kGemvWarps, 0, out, w.data, rb, xq, s, bias, R, C);
      case 2: return L.launch(k_gemv_q<TY, 2>, grid, 32 * kGemvWarps, 0, out, w.data, rb, xq, s, bias, R, C);
      case 3: return L.launch(k_gemv_q<TY, 3>, grid, 32 * kGemvWarps, 0, out, w.data, rb, xq, s, bias, R, C);
      case 4: return L.launch(k_gemv_q<TY, 4>, grid, 32 * kGemvWarps, 0, out, w.data, rb, xq, s, bias, R, C);
      default: throw Error("cuda: launch_gemv_q serves 1 to 4 rows, not " + std::to_string(T));
    }
  });
}

void launch_dequantize_bf16(Launcher& L, __nv_bfloat16* out, const WeightMatrix& w) {
  const int64_t groups = w.rows * (w.cols / 32);
  dispatch(w.type, [&](auto ty) {
    constexpr DType TY = decltype(ty)::value;
    L.launch(k_dequantize_bf16<TY>, blocks_for(groups), kThreads, 0, out, w.data, static_cast<int64_t>(w.row_bytes), w.rows,
             static_cast<int>(w.cols));
  });
}

}  // namespace squeezekv::cuda
