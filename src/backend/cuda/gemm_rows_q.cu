// Batched decode products over packed weights (gemm_rows_q.h). gemm_rows.cu's shape with the
// weights read as stored: a block takes 64 activation rows (4 m16 groups of warps), OUT = 128
// weight rows (64 per n-part of 4 warps) and one of S slices of the columns, and streams through shared
// memory, in stages of 256 columns (quant_groups.h kStageCols: one K-quant superblock), the f16
// activation rows and each weight row's planes as stored (cp.async, the pieces StageSlots names).
// Each stage's weights are then dequantized once into an f16 tile (every thread a few groups of
// 32: unpack_planes, then two half2 operations a pair of values) that the warps read by ldmatrix.
// The S blocks of one row tile form a thread-block cluster that adds its partial sums in slice
// order (gemm_rows_store.cuh, as gemm_rows.cu's do).
// Letters: B rows, R weight rows, C columns, S column slices.
#include "backend/cuda/gemm_rows_q.h"

#include <cuda_pipeline.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_rows.h"
#include "backend/cuda/gemm_rows_store.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_groups.h"

namespace squeezekv::cuda {
namespace {

constexpr int kRows = kGemmRowsTile;  // activation rows a block
constexpr int kK = kStageCols;  // columns a stage
constexpr int kLd = kK + 8;     // pitch (halves) of the f16 tiles: an ldmatrix's 8 rows on different banks

template <DType TY, int OUT, int STAGES>
struct Shape {
  static constexpr int kWarps = OUT / 16;  // OUT / 64 n-parts of 4 warps (one m16 group each)
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRaw = StageTraits<TY>::kRowBytes;            // a weight row's stage as stored
  static constexpr size_t kActBytes = size_t(STAGES) * kRows * kLd * 2;  // [stage][64][kLd] f16
  static constexpr size_t kRawBytes = size_t(STAGES) * OUT * kRaw;       // [stage][OUT][kRaw]
  static constexpr size_t kSmem = kActBytes + kRawBytes + size_t(OUT) * kLd * 2;  // + the f16 tile [OUT][kLd]
};

// The 32 values of a group as f16 at dst (16-byte aligned): each byte q moved to 1152 + q by the
// exponent bits of 1024 (exact), less 1152, times the half's scale, plus its offset (one rounding).
template <bool kMin>
__device__ inline void store_f16(__half* dst, const PackedGroup& q) {
  const __half2 bias = __float2half2_rn(1152.0f);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const __half2 sc = __float2half2_rn(q.scale[h]), mn = __float2half2_rn(q.min[h]);
    uint32_t v[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = static_cast<uint32_t>(q.q[4 * h + k]) ^ 0x80808080u;  // q + 128 in each byte
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t bits = __byte_perm(u, 0x64646464u, e == 0 ? 0x4140 : 0x4342);  // bytes 2e, 2e + 1 under 0x64
        __half2 x = __hsub2(*reinterpret_cast<const __half2*>(&bits), bias);
        x = kMin ? __hfma2(x, sc, mn) : __hmul2(x, sc);
        v[2 * k + e] = *reinterpret_cast<const uint32_t*>(&x);
      }
    }
    uint4* d = reinterpret_cast<uint4*>(dst + 16 * h);
    d[0] = make_uint4(v[0], v[1], v[2], v[3]);
    d[1] = make_uint4(v[4], v[5], v[6], v[7]);
  }
}

// grid (ceil(B / 64), ceil(R / OUT), S), clusters of (1, 1, S), Shape::kThreads threads, shared
// memory Shape::kSmem. C % (S * kK) == 0.
template <DType TY, int OUT, int S, int STAGES>
__global__ void __cluster_dims__(1, 1, S) __launch_bounds__(OUT / 16 * 32)
    k_gemm_rows_q(float* out, const __half* xh, const uint8_t* W, int64_t row_bytes, const float* bias, int B, int R, int C) {
  using Sh = Shape<TY, OUT, STAGES>;
  constexpr PlaneSpec kP = PackedTraits<TY>::kPlanes;
  constexpr StageSlots kS = StageTraits<TY>::kSlots;
  pdl_enter();
  extern __shared__ __align__(16) unsigned char gsm[];
  __half* sx = reinterpret_cast<__half*>(gsm);
  uint8_t* sraw = gsm + Sh::kActBytes;
  __half* sw = reinterpret_cast<__half*>(sraw + Sh::kRawBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int mg = warp % 4, np = warp / 4;  // this warp's m16 group and n-part
  const int tb = blockIdx.x * kRows, t0 = tb + mg * 16, r0 = blockIdx.y * OUT;
  const int n_stages = C / kK / S, s0 = blockIdx.z * n_stages;  // this block's slice of the columns
  const int64_t nb = C / (32 * PackedTraits<TY>::kGroups);        // blocks a row
  const int rows = min(kRows, B - tb);                            // live activation rows of the block
  auto issue = [&](int chunk) {
    if (chunk < n_stages) {
      const int st = chunk % STAGES;
      const int64_t s = s0 + chunk;
      __half* dx = sx + st * kRows * kLd;
      constexpr int kPieces = kK / 8;  // 16-byte pieces of an activation row's stage
      for (int c = tid; c < kRows * kPieces; c += Sh::kThreads) {
        const int r = c / kPieces, piece = c % kPieces;
        const bool in = r < rows;  // rows past B: zeros
        __pipeline_memcpy_async(dx + r * kLd + piece * 8, xh + static_cast<size_t>(tb + (in ? r : 0)) * C + s * kK + piece * 8, 16,
                                in ? 0 : 16);
      }
      uint8_t* dr = sraw + st * OUT * Sh::kRaw;
#pragma unroll
      for (int p = 0; p < kP.n; ++p) {
        const int64_t start = stage_start(nb, kP.prefix[p], kS.bytes[p], s), ws = start & ~int64_t{15};
        const int pieces = static_cast<int>((start - ws + kS.bytes[p] + 15) / 16);
        for (int c = tid; c < OUT * pieces; c += Sh::kThreads) {
          const int r = c / pieces, piece = c % pieces;
          const int row = min(r0 + r, R - 1);  // past R: the last row again (its outputs are not written)
          __pipeline_memcpy_async(dr + r * Sh::kRaw + kS.off[p] + 16 * piece, W + row * row_bytes + ws + 16 * piece, 16);
        }
      }
    }
    __pipeline_commit();  // an empty group past the last stage keeps the counting uniform
  };
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  const bool live = t0 < B;
  float acc[8][4] = {};
  for (int chunk = 0; chunk < n_stages; ++chunk) {
    issue(chunk + STAGES - 1);
    __pipeline_wait_prior(STAGES - 1);
    __syncthreads();
    const int st = chunk % STAGES;
    {  // the stage's weights as f16 rows
      const int64_t s = s0 + chunk;
      int mis[4];  // each plane's first stage element within its first piece
#pragma unroll
      for (int p = 0; p < 4; ++p) mis[p] = static_cast<int>(stage_start(nb, kP.prefix[p], kS.bytes[p], s) & 15);
      const uint8_t* base = sraw + st * OUT * Sh::kRaw;
      for (int gi = tid; gi < OUT * (kK / 32); gi += Sh::kThreads) {
        const int n = gi / (kK / 32), j = gi % (kK / 32);
        const uint8_t* rb = base + n * Sh::kRaw;
        PackedGroup q;
        unpack_planes<TY>(rb + kS.off[0] + mis[0], rb + kS.off[1] + mis[1], rb + kS.off[2] + mis[2], rb + kS.off[3] + mis[3], j, q);
        store_f16<PackedTraits<TY>::kHasMin>(sw + n * kLd + 32 * j, q);
      }
    }
    __syncthreads();
    if (live) {
      const __half* xt = sx + st * kRows * kLd + mg * 16 * kLd;
      const __half* wt = sw + np * 64 * kLd;
#pragma unroll
      for (int kk = 0; kk < kK / 16; kk += 2) {  // two k16 steps per ldmatrix x4 of W
        uint32_t a[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int mi = lane / 8, rr = lane % 8;
          ldsm_x4(a[h], xt + (rr + (mi & 1) * 8) * kLd + (kk + h) * 16 + (mi >> 1) * 8);
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          uint32_t b[4];  // b[0..1]: k-step kk, b[2..3]: kk + 1
          ldsm_x4(b, wt + (nt * 8 + lane % 8) * kLd + kk * 16 + (lane / 8) * 8);
          mma_f16(acc[nt], a[0], b);
          mma_f16(acc[nt], a[1], b + 2);
        }
      }
    }
    __syncthreads();  // the stage and the tile are refilled next
  }
  store_rows<8, OUT, S, Sh::kThreads>(acc, out, bias, B, R, tb, r0, mg * 16, np * 64, live, gsm);
}

template <DType TY, int OUT, int S>
void launch_shape(Launcher& L, float* out, const __half* xh, const WeightMatrix& w, const float* bias, int B) {
  constexpr int kStages = 2;  // what fits beside the tile: 205 KB (Q8_0) of an SM's 227
  using Sh = Shape<TY, OUT, kStages>;
  static_assert(sizeof(float) * kRows * OUT <= Sh::kSmem, "the partials fit the stages' memory");
  static_assert(Sh::kSmem <= 227 * 1024, "one block fits an SM's shared memory");
  auto* kernel = k_gemm_rows_q<TY, OUT, S, kStages>;
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Sh::kSmem)), "gemm rows q smem");
    attribute_set = true;
  }
  const int R = static_cast<int>(w.rows), C = static_cast<int>(w.cols);
  const dim3 grid(static_cast<unsigned>((B + kRows - 1) / kRows), static_cast<unsigned>((R + OUT - 1) / OUT), S);
  L.launch(kernel, grid, Sh::kThreads, Sh::kSmem, out, xh, static_cast<const uint8_t*>(w.data), static_cast<int64_t>(w.row_bytes), bias, B,
           R, C);
}

// 128 weight rows a block (8 warps): measured on the H200 (8B shape in Q4_K_M at context 512,
// 2026-12-03, docs/raw/2026-12-03-h200-packed-batches) against 64 (4 warps, three stages) at 32, 64
// and 128 sequences: 2,292, 3,760 and 4,082 tok/s against 1,658, 3,007 and 3,347.
constexpr int kOut = 128;

}  // namespace

bool gemm_rows_q_serves(const WeightMatrix& w) { return packed_type(w.type) && w.cols % kK == 0; }

void launch_gemm_rows_q(Launcher& L, float* out, const __half* xh, const WeightMatrix& w, const float* bias, int B) {
  // the columns in slices until a row tile's blocks fill the device: from the shape alone
  const int tiles = static_cast<int>((w.rows + kOut - 1) / kOut), stages = static_cast<int>(w.cols / kK);
  const int S = gemm_rows_slices_of(tiles, stages);
  dispatch_packed(w.type, [&](auto ty) {
    constexpr DType TY = decltype(ty)::value;
    switch (S) {
      case 8: return launch_shape<TY, kOut, 8>(L, out, xh, w, bias, B);
      case 4: return launch_shape<TY, kOut, 4>(L, out, xh, w, bias, B);
      case 2: return launch_shape<TY, kOut, 2>(L, out, xh, w, bias, B);
      default: return launch_shape<TY, kOut, 1>(L, out, xh, w, bias, B);
    }
  });
}

}  // namespace squeezekv::cuda
