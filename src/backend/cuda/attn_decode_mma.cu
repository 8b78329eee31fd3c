// Decode attention on the tensor cores (attn_decode_mma.h). A block is one warp: kv head g of one
// sequence, splits [split0, split0 + nsplit) of its keys one after another. The warp's 16 rows are
// the grp query heads of g (rows past grp are zeros and are never written); K and V stream
// through shared memory in tiles of 16 keys, kMmaDecStages deep (cp.async, the warp's own
// copies: no block barrier), and per tile S = Q K^T and O += P V run as mma.sync m16n8k16 (f16
// in, f32 accumulate: q rounded to f16 once, p to f16 for P V, as the prompt kernel k_attn_mma),
// with an online softmax per row in registers. At a split's end the warp writes the output and
// ml (one split in all) or the split's partials, and the kept scores for the mass (natural-log
// units, -inf where masked), exactly where k_attn_decode writes them. A CUDA-core block streams
// a split with 4 warps reducing each dot product by shuffles; here one warp's two instructions do
// 16 keys' scores, which left the CUDA-core kernel's batches at 25-40% of the copy bandwidth bound
// by their own instructions (docs/raw/2026-12-01-h200-batch-step/).
#include "backend/cuda/attn_decode_mma.h"

#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <climits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/mma.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kMmaDecKeys = 16;    // keys a tile
constexpr int kMmaDecStages = 3;   // tiles in shared memory (two in flight while one is used)
constexpr int kMmaDecBlocksPerSm = 8;  // 8 x 26 KB of shared memory (head dim 128)

template <int D>
__host__ __device__ constexpr size_t mma_dec_smem_bytes() {
  return static_cast<size_t>(kMmaDecStages) * (2 * kMmaDecKeys * (D + 8) * sizeof(__half) + kMmaDecKeys * sizeof(int32_t));
}

template <int D, int GMAX>
__device__ __forceinline__ void decode_mma_warp(float* out, __nv_bfloat16* ob, float* ml, float* part_acc, float* part_ml, float* scores,
                                                const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w,
                                                int g, int split0, int nsplit, unsigned char* smem) {
  constexpr int LD = D + 8;  // row pitch in halves
  __half* sk = reinterpret_cast<__half*>(smem);                                 // [stage][16][LD]
  __half* sv = sk + kMmaDecStages * kMmaDecKeys * LD;                            // [stage][16][LD]
  int32_t* sp = reinterpret_cast<int32_t*>(sv + kMmaDecStages * kMmaDecKeys * LD);  // [stage][16]
  const int lane = threadIdx.x, grp = a.grp;
  const KeyRange kr = key_range(kv, a);
  if (split0 >= kr.splits) return;
  const int split_end = min(kr.splits, split0 + nsplit);
  const __half* Kg = static_cast<const __half*>(kv.k) + static_cast<size_t>(g) * kv.capacity * D;
  const __half* Vg = static_cast<const __half*>(kv.v) + static_cast<size_t>(g) * kv.capacity * D;
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  if (w.k != nullptr && split_end == kr.splits) {  // the last split holds the new row: it goes in first
    const size_t slot = static_cast<size_t>(g) * kv.capacity + kr.N - 1;
    __half* K = static_cast<__half*>(w.K);
    __half* V = static_cast<__half*>(w.V);
    for (int d = lane; d < D; d += 32) {
      K[slot * D + d] = __float2half_rn(w.k[g * D + d]);
      V[slot * D + d] = __float2half_rn(w.v[g * D + d]);
    }
    if (lane == 0) w.P[slot] = w.pos[0], w.M[slot] = 0.0f;
    __threadfence_block();
    __syncwarp();  // the warp's copies below read the row
  }
  // Tiles run split by split, 16 keys each, the last of a split cut at its end (the rest: zeros,
  // position INT_MAX: masked). The issue and the use of tiles each keep their split and tile by
  // counting (no division a tile). A lane copies the same 16-byte piece of rows rl, rl + RPP, ...
  // of every tile, so its addresses move by the tile's offset alone.
  constexpr int CH = D / 8;                     // 16-byte pieces of a row
  constexpr int RPP = 32 / CH;                  // rows a pass of the warp's copies
  constexpr int PASSES = kMmaDecKeys / RPP;
  const int piece = lane % CH, rl = lane / CH;
  const __half* kl = Kg + rl * D + piece * 8;
  const __half* vl = Vg + rl * D + piece * 8;
  const int sl = rl * LD + piece * 8;
  int is = split0, it = 0, ist = 0;  // the next tile to issue: split, tile in it, stage
  auto issue = [&]() {
    if (is < split_end) {
      const int j0 = is * kr.chunk + it * kMmaDecKeys, end = min(kr.N, (is + 1) * kr.chunk);
      __half* dk = sk + ist * kMmaDecKeys * LD + sl;
      __half* dv = sv + ist * kMmaDecKeys * LD + sl;
      const size_t go = static_cast<size_t>(j0) * D;
      if (j0 + kMmaDecKeys <= end) {
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
          __pipeline_memcpy_async(dk + p * RPP * LD, kl + go + p * RPP * D, 16);
          __pipeline_memcpy_async(dv + p * RPP * LD, vl + go + p * RPP * D, 16);
        }
      } else {
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
          const bool in = j0 + rl + p * RPP < end;
          __pipeline_memcpy_async(dk + p * RPP * LD, in ? kl + go + p * RPP * D : Kg, 16, in ? 0 : 16);
          __pipeline_memcpy_async(dv + p * RPP * LD, in ? vl + go + p * RPP * D : Vg, 16, in ? 0 : 16);
        }
      }
      if (lane < kMmaDecKeys) {
        if (j0 + lane < end) __pipeline_memcpy_async(sp + ist * kMmaDecKeys + lane, Pg + j0 + lane, 4);
        else sp[ist * kMmaDecKeys + lane] = INT_MAX;
      }
      if (j0 + kMmaDecKeys >= end) ++is, it = 0;
      else ++it;
      ist = ist + 1 == kMmaDecStages ? 0 : ist + 1;
    }
    __pipeline_commit();  // an empty group past the last tile keeps the counting uniform
  };
  for (int t = 0; t < kMmaDecStages - 1; ++t) issue();
  // the A operands: rows r0 = lane / 4 and r0 + 8 (heads g * grp + r; zero past grp), scaled q as f16
  const int r0 = lane / 4, c0 = (lane % 4) * 2;
  uint32_t qa[D / 16][4];
  {
    auto qrow = [&](int r, int d) -> float2 {
      return r < grp ? *reinterpret_cast<const float2*>(q + static_cast<size_t>(g * grp + r) * D + d) : make_float2(0.0f, 0.0f);
    };
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const float2 x0 = qrow(r0, ks * 16 + c0), x1 = qrow(r0 + 8, ks * 16 + c0), x2 = qrow(r0, ks * 16 + 8 + c0),
                   x3 = qrow(r0 + 8, ks * 16 + 8 + c0);
      qa[ks][0] = pack_half2(x0.x * a.scale, x0.y * a.scale);
      qa[ks][1] = pack_half2(x1.x * a.scale, x1.y * a.scale);
      qa[ks][2] = pack_half2(x2.x * a.scale, x2.y * a.scale);
      qa[ks][3] = pack_half2(x3.x * a.scale, x3.y * a.scale);
    }
  }
  // this lane's rows of the kept scores (null: no mass, or a row past grp)
  float* srow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    srow[i] = scores != nullptr && r0 + 8 * i < grp ? scores + (static_cast<size_t>(g) * GMAX + r0 + 8 * i) * kv.capacity : nullptr;
  const int qp = q_pos[0];
  float o[D / 8][4], m[2], l[2];
  int cs = split0, ct = 0, cst = 0;  // the tile in use: split, tile in it, stage
  while (cs < split_end) {
    if (ct == 0) {  // a split begins: its own softmax
      m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    }
    issue();
    __pipeline_wait_prior(kMmaDecStages - 1);  // this lane's copies of the tile in use have landed
    __syncwarp();                               // and every lane's
    const int j0 = cs * kr.chunk + ct * kMmaDecKeys, end = min(kr.N, (cs + 1) * kr.chunk);
    const __half* kt = sk + cst * kMmaDecKeys * LD;
    const __half* vt = sv + cst * kMmaDecKeys * LD;
    const int32_t* pt = sp + cst * kMmaDecKeys;
    float s[2][4];
    mma_scores<D>(s[0], qa, kt, 0, lane);
    mma_scores<D>(s[1], qa, kt, 1, lane);
    // mask (and keep the scores for the mass), then the online softmax of rows r0 and r0 + 8
    int kp[2][2];  // positions of this lane's keys nt * 8 + c0 + e
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) kp[nt][0] = pt[nt * 8 + c0], kp[nt][1] = pt[nt * 8 + c0 + 1];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = nt * 8 + c0 + e;
          float& x = s[nt][2 * i + e];
          x = kp[nt][e] <= qp ? x : -INFINITY;
          if (srow[i] != nullptr && j0 + jj < end) srow[i][j0 + jj] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // Rescale only when the row's maximum grew (the four lanes of a row agree): otherwise the
      // factor is exp(0) = 1 and the products would not change a bit. After the first tiles a
      // row's maximum rarely grows, and the D / 4 products a lane are most of a tile's softmax.
      if (mx > m[i]) {
        const float alpha = __expf(m[i] - mx);  // m = -inf: 0
        l[i] *= alpha;
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) o[nd][2 * i] *= alpha, o[nd][2 * i + 1] *= alpha;
        m[i] = mx;
      }
      const float ref = m[i] == -INFINITY ? 0.0f : m[i];
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * i + e];
          x = __expf(x - ref);  // masked: 0
          sum += x;
        }
      l[i] += sum;
    }
    // O += P V (P from the S accumulators: their layout is the A operand's)
    uint32_t pa[4];
    pa[0] = pack_half2(s[0][0], s[0][1]);
    pa[1] = pack_half2(s[0][2], s[0][3]);
    pa[2] = pack_half2(s[1][0], s[1][1]);
    pa[3] = pack_half2(s[1][2], s[1][3]);
#pragma unroll
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t b[4];  // b[0..1]: d tile nd, b[2..3]: nd + 1
      const int mi = lane / 8, rr = lane % 8;
      ldsm_x4_trans(b, vt + (rr + (mi & 1) * 8) * LD + nd * 8 + (mi >> 1) * 8);
      mma_f16(o[nd], pa, b);
      mma_f16(o[nd + 1], pa, b + 2);
    }
    __syncwarp();  // the stage is refilled by a later issue()
    cst = cst + 1 == kMmaDecStages ? 0 : cst + 1;
    if (j0 + kMmaDecKeys < end) {
      ++ct;
      continue;
    }
    // the split ends: its output (one split in all) or partials, rows below grp
    const int split = cs;
    ++cs, ct = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float L = l[i];
      L += __shfl_xor_sync(0xffffffffu, L, 1);
      L += __shfl_xor_sync(0xffffffffu, L, 2);
      const int r = r0 + 8 * i;
      if (r >= grp) continue;
      const size_t h = static_cast<size_t>(g) * grp + r;  // rows: T * H with T = 1
      if (kr.splits == 1) {
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
          const float2 y = make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
          *reinterpret_cast<float2*>(out + h * D + nd * 8 + c0) = y;
          if (ob != nullptr) *reinterpret_cast<__nv_bfloat162*>(ob + h * D + nd * 8 + c0) = __floats2bfloat162_rn(y.x, y.y);
        }
        if (c0 == 0) ml[2 * h] = m[i], ml[2 * h + 1] = L;
      } else {
        const size_t prow = static_cast<size_t>(split) * a.H + h;
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd)
          *reinterpret_cast<float2*>(part_acc + prow * D + nd * 8 + c0) = make_float2(o[nd][2 * i], o[nd][2 * i + 1]);
        if (c0 == 0) part_ml[2 * prow] = m[i], part_ml[2 * prow + 1] = L;
      }
    }
  }
}

template <int D, int GMAX>
__global__ void __launch_bounds__(32, kMmaDecBlocksPerSm) k_attn_decode_mma(float* out, float* ml, float* part_acc, float* part_ml,
                                                                          float* scores, const float* q, const int32_t* q_pos, KvView kv,
                                                                          AttnShape a, KvRowWrite w) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  decode_mma_warp<D, GMAX>(out, nullptr, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w, blockIdx.x, blockIdx.y, 1, dsm);
}

template <int D, int GMAX>
__global__ void __launch_bounds__(32, kMmaDecBlocksPerSm) k_attn_decode_mma_batch(DecodeBatch b, DecodeRows r, AttnShape a,
                                                                                int per_block) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  const BatchBlock k = batch_block(b, r, a);
  decode_mma_warp<D, GMAX>(k.out, k.out_bf16, k.ml, k.part_acc, k.part_ml, k.scores, k.q, k.q_pos, k.kv, k.a, k.w, blockIdx.x,
                           blockIdx.y * per_block, per_block, dsm);
}

template <class F>
void set_smem(F* fn, size_t bytes) {
  check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), "decode attention smem");
}

template <int D, int GMAX>
void launch_one(Launcher& L, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) set_smem(k_attn_decode_mma<D, GMAX>, mma_dec_smem_bytes<D>()), attribute_set = true;
  L.launch(k_attn_decode_mma<D, GMAX>, grid, 32, mma_dec_smem_bytes<D>(), out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
}

template <int D, int GMAX>
void launch_batch(Launcher& L, int most, int seqs, int sms, const DecodeBatch& b, const DecodeRows& r, const AttnShape& a) {
  static bool attribute_set = false;
  if (!attribute_set) set_smem(k_attn_decode_mma_batch<D, GMAX>, mma_dec_smem_bytes<D>()), attribute_set = true;
  const int per_block = splits_per_block(most, a.G, seqs, kMmaDecBlocksPerSm * sms);
  const dim3 grid(a.G, (most + per_block - 1) / per_block, seqs);
  L.launch(k_attn_decode_mma_batch<D, GMAX>, grid, 32, mma_dec_smem_bytes<D>(), b, r, a, per_block);
}

}  // namespace

bool decode_mma_serves(const KvView& kv, int grp) {
  return kv.type == KvType::kF16 && kv.v_type == KvType::kF16 && (kv.head_dim == 64 || kv.head_dim == 128) && grp >= 1 && grp <= 8;
}

void launch_attn_decode_mma(Launcher& L, int gmax, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                            const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  const bool d64 = a.D == 64;
  if (d64 && gmax == 4) launch_one<64, 4>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
  else if (d64) launch_one<64, 8>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
  else if (gmax == 4) launch_one<128, 4>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
  else launch_one<128, 8>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
  if (!a.direct) launch_attn_merge(L, out, ml, part_acc, part_ml, a.H, kv, a);
}

void launch_attn_decode_mma_batch(Launcher& L, int gmax, int most, int seqs, int sms, const DecodeBatch& b, const DecodeRows& r,
                                  const AttnShape& a) {
  if (a.D == 64 && gmax == 4) launch_batch<64, 4>(L, most, seqs, sms, b, r, a);
  else if (a.D == 64) launch_batch<64, 8>(L, most, seqs, sms, b, r, a);
  else if (gmax == 4) launch_batch<128, 4>(L, most, seqs, sms, b, r, a);
  else launch_batch<128, 8>(L, most, seqs, sms, b, r, a);
}

}  // namespace squeezekv::cuda
