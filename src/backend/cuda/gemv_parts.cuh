// What the decode GEMV launches share (gemv.cu: bf16 and f32 weights; gemv_q.cu: packed
// weights): the parts of one launch, how a block's rows map onto them, and the block's end (its
// warps' sums added in order, bias, and the epilogue: RoPE or SwiGLU). Device code and the host
// helper that fills GemvParts; included by those two files only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/launcher.h"

namespace squeezekv::cuda::gemv_detail {

constexpr int kGemvBlockRows = 8;  // matrix rows a block serves
constexpr int kMaxParts = 4;

enum GemvEpilogue : int32_t { kEpiPlain = 0, kEpiRopeHalves = 1, kEpiRopeAdjacent = 2 };

// The products of one launch. Recorded as argument bytes, so it has no padding (value-initialise).
struct GemvParts {
  const void* w[kMaxParts];            // [rows][C] of WT
  float* out[kMaxParts];               // [T][rows]
  const float* bias[kMaxParts];        // [rows] or null
  const int32_t* pos;                  // [T] rope positions
  const float* inv_freq;               // [D/2]
  int32_t first_block[kMaxParts + 1];  // part p: blocks [first_block[p], first_block[p + 1])
  int32_t rows[kMaxParts];
  int32_t epi[kMaxParts];              // GemvEpilogue
  int32_t n, C, D;                     // parts, columns, head dim (rope)
  int32_t swiglu;                      // parts 0 (gate) and 1 (up), equal rows: out[0] = silu(gate) * up
  int32_t unused;
};
static_assert(sizeof(GemvParts) == 14 * 8 + 18 * 4, "GemvParts: no padding (a recorded kernel argument)");

// 16 bytes of weights, read once: not kept in L1 (which holds x)
__device__ inline uint4 load_stream(const void* p) {
  uint4 u;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  return u;
}
__device__ inline void load8(const __nv_bfloat16* w, float* f) {
  const uint4 u = load_stream(w);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 p = __bfloat1622float2(h[k]);
    f[2 * k] = p.x;
    f[2 * k + 1] = p.y;
  }
}
__device__ inline void load8(const float* w, float* f) {
  const uint4 a = load_stream(w), b = load_stream(w + 4);
  f[0] = __uint_as_float(a.x), f[1] = __uint_as_float(a.y), f[2] = __uint_as_float(a.z), f[3] = __uint_as_float(a.w);
  f[4] = __uint_as_float(b.x), f[5] = __uint_as_float(b.y), f[6] = __uint_as_float(b.z), f[7] = __uint_as_float(b.w);
}

template <class A, int N>
__device__ inline A pick(const A (&a)[N], int i) {  // a[i] without indexing parameter memory at run time
  A v = a[0];
#pragma unroll
  for (int j = 1; j < N; ++j) v = i == j ? a[j] : v;
  return v;
}

// A block's rows as two groups of kGemvBlockRows / 2 consecutive rows: group 0 starts at row
// first0 of part part0, group 1 at first1 of part1. Plain parts and adjacent rotation pairs
// (2d, 2d + 1): 8 rows in a row; rotation halves: 4 dims (d..d+3) of one head and their partners
// (d + D/2 ..); SwiGLU: 4 rows of the gate and the same 4 of the up. Block row i < 4 is row
// first0 + i of part0, row i >= 4 is first1 + i - 4 of part1.
struct GemvRows {
  int part0, part1, first0, first1;
  __device__ int row(int i) const { return (i < kGemvBlockRows / 2 ? first0 : first1) + i % (kGemvBlockRows / 2); }
  __device__ int part_of(int i) const { return i < kGemvBlockRows / 2 ? part0 : part1; }
};
__device__ inline GemvRows gemv_rows(const GemvParts& P, int p, int b) {
  constexpr int RB = kGemvBlockRows, HB = RB / 2;
  if (P.swiglu) return {0, 1, b * HB, b * HB};
  if (pick(P.epi, p) == kEpiRopeHalves) {
    const int per_head = P.D / RB, first = (b / per_head) * P.D + (b % per_head) * HB;
    return {p, p, first, first + P.D / 2};
  }
  return {p, p, b * RB, b * RB + HB};
}

// What a block does with a row group's sums fin[RB][T] (part p, rows g): the output rows,
// rotated (RoPE) or gated (SwiGLU) where the parts ask.
template <int T>
__device__ inline void gemv_epilogue(const GemvParts& P, int p, const GemvRows& g, const float* fin, int tid) {
  constexpr int RB = kGemvBlockRows, HB = RB / 2;
  const int epi = pick(P.epi, p);
  if (P.swiglu) {  // as k_silu_mul
    if (tid < HB * T) {
      const int i = tid / T, t = tid % T, R = P.rows[0], r = g.row(i);
      const float gv = fin[i * T + t], u = fin[(i + HB) * T + t];
      if (r < R) P.out[0][static_cast<size_t>(t) * R + r] = gv / (1.0f + expf(-gv)) * u;
    }
  } else if (epi != kEpiPlain) {  // as k_rope: pair (i0, i1) turns by pos * inv_freq[d]
    if (tid < HB * T) {
      const int k = tid / T, t = tid % T, R = pick(P.rows, p);
      const int i0 = epi == kEpiRopeHalves ? k : 2 * k, i1 = epi == kEpiRopeHalves ? k + HB : 2 * k + 1;
      const int r0 = g.row(i0), r1 = g.row(i1);
      const int d = epi == kEpiRopeHalves ? r0 % P.D : (r0 % P.D) / 2;
      const float a = static_cast<float>(P.pos[t]) * P.inv_freq[d];
      float sn, cs;
      sincosf(a, &sn, &cs);
      const float u = fin[i0 * T + t], v = fin[i1 * T + t];
      float* o = pick(P.out, p) + static_cast<size_t>(t) * R;
      o[r0] = u * cs - v * sn;
      o[r1] = v * cs + u * sn;
    }
  } else if (tid < RB * T) {
    const int i = tid / T, t = tid % T, R = pick(P.rows, p), r = g.row(i);
    if (r < R) pick(P.out, p)[static_cast<size_t>(t) * R + r] = fin[tid];
  }
}

// The block's end: every warp's sums acc[RB][T] added in warp order (the same order whatever T
// and the parts are), bias added, then the epilogue. NW: the most warps a block has (blockDim.x
// / 32 of them take part).
template <int T, int NW>
__device__ inline void gemv_finish(const GemvParts& P, int p, const GemvRows& g, float (&acc)[kGemvBlockRows][T]) {
  const int nw = NW == 1 ? 1 : static_cast<int>(blockDim.x / 32);
  constexpr int RB = kGemvBlockRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float part[NW][RB * T];
  __shared__ float fin[RB * T];  // [row i][t]: the block's sums, bias added
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = warp_sum(acc[i][t]);
      if (lane == 0) part[warp][i * T + t] = s;
    }
  __syncthreads();
  const int tid = threadIdx.x;
  if (tid < RB * T) {
    const int i = tid / T, q = g.part_of(i), r = g.row(i);
    float s = 0.0f;
    for (int w = 0; w < nw; ++w) s += part[w][tid];
    const float* bias = pick(P.bias, q);
    fin[tid] = r < pick(P.rows, q) ? s + (bias != nullptr ? bias[r] : 0.0f) : 0.0f;
  }
  __syncthreads();
  gemv_epilogue<T>(P, p, g, fin, tid);
}

// wr[i] <- where block row i starts in its part's weights (stride: a row's elements of W), the
// last row of its group's part where the block runs past it (a short last block repeats it; its
// sums are dropped).
template <class W>
__device__ inline void gemv_row_starts(const W* (&wr)[kGemvBlockRows], const GemvParts& P, const GemvRows& g, int64_t stride) {
  constexpr int HB = kGemvBlockRows / 2;
  const W *base0 = static_cast<const W*>(pick(P.w, g.part0)), *base1 = static_cast<const W*>(pick(P.w, g.part1));
  const int last0 = pick(P.rows, g.part0) - 1, last1 = pick(P.rows, g.part1) - 1;
#pragma unroll
  for (int i = 0; i < kGemvBlockRows; ++i)
    wr[i] = i < HB ? base0 + static_cast<int64_t>(min(g.row(i), last0)) * stride : base1 + static_cast<int64_t>(min(g.row(i), last1)) * stride;
}

// The part a block serves (its index among the parts).
__device__ inline int gemv_part(const GemvParts& P) {
  int p = 0;
#pragma unroll
  for (int j = 1; j < kMaxParts; ++j) p += j < P.n && static_cast<int>(blockIdx.x) >= P.first_block[j] ? 1 : 0;
  return p;
}

// Whether k_gemv's epilogue rotates w's output: whole heads of a head dim that its blocks divide.
inline bool fusable(const RopeSpec& r, const WeightMatrix& w) {
  return r.D > 0 && r.D % kGemvBlockRows == 0 && w.rows % r.D == 0;
}

// P <- the parts of one launch (one weight type and width; swiglu: gate and up of equal rows),
// their RoPE taken by the epilogue where fusable. False where the parts do not share type and
// width or are too many.
inline bool make_gemv_parts(GemvParts& P, const MatmulPart* parts, int n, bool swiglu) {
  if (n < 1 || n > kMaxParts) return false;
  const WeightMatrix& w0 = *parts[0].w;
  P = GemvParts{};
  P.n = n, P.C = static_cast<int>(w0.cols), P.swiglu = swiglu ? 1 : 0;
  for (int i = 0; i < n; ++i) {
    const MatmulPart& m = parts[i];
    if (m.w->cols != w0.cols || m.w->type != w0.type) return false;
    if (swiglu && m.w->rows != w0.rows) return false;
    P.w[i] = m.w->data, P.out[i] = m.out, P.bias[i] = m.bias, P.rows[i] = static_cast<int>(m.w->rows);
    int blocks = (P.rows[i] + kGemvBlockRows - 1) / kGemvBlockRows;
    const RopeSpec* r = m.rope;
    const bool same_rope = r != nullptr && (P.D == 0 || (r->D == P.D && r->pos == P.pos && r->inv_freq == P.inv_freq));
    if (same_rope && fusable(*r, *m.w)) {  // one rotation per launch (q and k share the runner's)
      P.epi[i] = r->pairing == RopePairing::kHalves ? kEpiRopeHalves : kEpiRopeAdjacent;
      P.D = r->D, P.pos = r->pos, P.inv_freq = r->inv_freq;
    }
    if (swiglu) blocks = (P.rows[0] + kGemvBlockRows / 2 - 1) / (kGemvBlockRows / 2) * (i == 0 ? 1 : 0);
    P.first_block[i + 1] = P.first_block[i] + blocks;
  }
  return true;
}

// The rotations the epilogue could not take, after the launch.
inline void rope_left(Launcher& L, const MatmulPart* parts, int n, const GemvParts& P, int T) {
  for (int i = 0; i < n; ++i)
    if (const RopeSpec* r = parts[i].rope; r != nullptr && P.epi[i] == kEpiPlain)
      launch_rope(L, parts[i].out, r->pos, T, static_cast<int>(parts[i].w->rows / r->D), r->D, r->inv_freq,
                  r->pairing == RopePairing::kAdjacent);
}

}  // namespace squeezekv::cuda::gemv_detail
