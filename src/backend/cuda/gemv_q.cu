// Packed-weight products (gemv_q.h): the Q8 activation rounding, the integer GEMV (dp4a over the
// groups of quant_groups.h) and the dequantization to bf16 for the tensor-core products.
#include "backend/cuda/gemv_q.h"

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_parts.cuh"
#include "backend/cuda/quant_groups.h"
#include "squeezekv/error.h"

namespace squeezekv::cuda {
namespace {
using namespace gemv_detail;

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

// The packed GEMV: gemv.cu's launch shape (gemv_parts.cuh: the parts of one launch dealt out
// in blocks of kGemvBlockRows rows, RoPE or SwiGLU in the block's epilogue), its threads taking
// the row's groups of 32 in turn: a thread loads its group's 8-bit activations once for the
// block's 8 rows, unpacks each row's group (quant_groups.h) and adds per half an integer dot
// (4 dp4a) scaled by both scales, plus the weights' offset times the activations' sum. Each
// output is summed in the same order whatever T and the other parts are.
// A block's warps: kQWarps, fewer where a row has fewer than 32 groups of 32 a warp. Measured on
// the H200 (8B shape, one sequence, 2026-12-02, run-d.sh): 1, 2 and 4 warps a block decode Q4_K_M
// at 168, 253 and 325 tok/s, Q8_0 at 165, 238 and 290, Q6_K at 129, 197 and 239. (At 168
// registers a thread, an SM holds one block of 8 warps but three of 4.)
constexpr int kQWarps = 4;

template <DType TY, int T>
__global__ void __launch_bounds__(kQWarps * 32) k_gemv_q(const int8_t* xq, const float4* xs, int64_t row_bytes, GemvParts P) {
  constexpr int RB = kGemvBlockRows;
  const int C = P.C, G = C / 32;
  const int64_t nb = C / (32 * PackedTraits<TY>::kGroups);
  const int p = gemv_part(P);
  pdl_launch_next();
  const GemvRows g = gemv_rows(P, p, blockIdx.x - pick(P.first_block, p));
  const uint8_t* wr[RB];
  gemv_row_starts(wr, P, g, row_bytes);
  pdl_wait();
  float acc[RB][T] = {};
  for (int gi = threadIdx.x; gi < G; gi += blockDim.x) {
    int4 xa[T], xb[T];
    float4 s[T];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const int4* xv = reinterpret_cast<const int4*>(xq + static_cast<int64_t>(t) * C + 32 * gi);
      xa[t] = xv[0], xb[t] = xv[1];
      s[t] = xs[static_cast<int64_t>(t) * G + gi];
    }
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      PackedGroup q;
      unpack_planar<TY>(wr[i], nb, gi, q);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        int lo = __dp4a(q.q[0], xa[t].x, 0);
        lo = __dp4a(q.q[1], xa[t].y, lo);
        lo = __dp4a(q.q[2], xa[t].z, lo);
        lo = __dp4a(q.q[3], xa[t].w, lo);
        int hi = __dp4a(q.q[4], xb[t].x, 0);
        hi = __dp4a(q.q[5], xb[t].y, hi);
        hi = __dp4a(q.q[6], xb[t].z, hi);
        hi = __dp4a(q.q[7], xb[t].w, hi);
        acc[i][t] += q.scale[0] * (s[t].x * static_cast<float>(lo)) + q.scale[1] * (s[t].x * static_cast<float>(hi)) +
                     q.min[0] * s[t].y + q.min[1] * s[t].z;
      }
    }
  }
  gemv_finish<T, kQWarps>(P, p, g, acc);
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

}  // namespace

void launch_quantize_q8(Launcher& L, int8_t* xq, float* xs, const float* x, int64_t T, int64_t C) {
  const int64_t blocks = T * C / 32;
  constexpr int kWarps = 8;
  L.launch(k_quantize_q8, blocks_for(blocks, kWarps), 32 * kWarps, 0, xq, reinterpret_cast<float4*>(xs), x, blocks);
}

bool launch_gemv_q(Launcher& L, const MatmulPart* parts, int n, const int8_t* xq, const float* xs, int T, bool swiglu) {
  if (T < 1 || T > kGemvQRows || !packed_type(parts[0].w->type)) return false;
  GemvParts P;
  if (!make_gemv_parts(P, parts, n, swiglu)) return false;
  const unsigned grid = static_cast<unsigned>(P.first_block[P.n]);
  const auto* s = reinterpret_cast<const float4*>(xs);
  const int64_t rb = static_cast<int64_t>(parts[0].w->row_bytes);
  // SQUEEZEKV_CUDA_QWARPS=1|2|4: every block that many warps, for measurements
  static const int forced = [] {
    const char* e = std::getenv("SQUEEZEKV_CUDA_QWARPS");
    const int w = e != nullptr ? std::atoi(e) : 0;
    return w == 1 || w == 2 || w == 4 ? w : 0;
  }();
  const int groups = P.C / 32;
  const unsigned threads = 32u * static_cast<unsigned>(forced > 0 ? forced : std::clamp(groups / 32, 1, kQWarps));
  dispatch_packed(parts[0].w->type, [&](auto ty) {
    constexpr DType TY = decltype(ty)::value;
    switch (T) {
      case 1: return L.launch(k_gemv_q<TY, 1>, grid, threads, 0, xq, s, rb, P);
      case 2: return L.launch(k_gemv_q<TY, 2>, grid, threads, 0, xq, s, rb, P);
      case 3: return L.launch(k_gemv_q<TY, 3>, grid, threads, 0, xq, s, rb, P);
      default: return L.launch(k_gemv_q<TY, 4>, grid, threads, 0, xq, s, rb, P);
    }
  });
  rope_left(L, parts, n, P, T);
  return true;
}

void launch_dequantize_bf16(Launcher& L, __nv_bfloat16* out, const WeightMatrix& w) {
  const int64_t groups = w.rows * (w.cols / 32);
  dispatch_packed(w.type, [&](auto ty) {
    constexpr DType TY = decltype(ty)::value;
    L.launch(k_dequantize_bf16<TY>, blocks_for(groups), kThreads, 0, out, w.data, static_cast<int64_t>(w.row_bytes), w.rows,
             static_cast<int>(w.cols));
  });
}

}  // namespace squeezekv::cuda
