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
#include "backend/cuda/kv_q8.cuh"
#include "backend/cuda/mma.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kMmaDecKeys = 16;    // keys a tile
constexpr int kMmaDecStages = 3;   // tiles in shared memory (two in flight while one is used)
constexpr int kMmaDecBlocksPerSm = 8;  // 8 x 26 KB of shared memory (head dim 128)

// Bytes of a row of D values of type KT (f16 or Q8_0), and of a tile's rows as copied (Q8_0: the
// rows may start up to 12 bytes into their 16, kv_q8.cuh's 34-byte blocks being 4-byte aligned).
template <KvType KT, int D>
__host__ __device__ constexpr int mma_row_bytes() {
  return KT == KvType::kQ8_0 ? D / kQ8Block * kQ8BlockBytes : D * 2;
}
template <KvType KT, int D>
__host__ __device__ constexpr int mma_raw_tile_bytes() {
  return (kMmaDecKeys * mma_row_bytes<KT, D>() + 16 + 15) / 16 * 16;
}
// Shared memory of a block: f16 rows, kMmaDecStages tiles of K and V ([16][D + 8] halves each:
// ldmatrix's rows on distinct banks) and their positions; for Q8_0 the stages hold the tiles as
// copied ([16] rows of blocks) and one f16 tile of K and of V, converted from the stage in use.
template <KvType KT, int D>
__host__ __device__ constexpr size_t mma_dec_smem_bytes() {
  constexpr size_t f16_tile = kMmaDecKeys * (D + 8) * sizeof(__half), pos = kMmaDecKeys * sizeof(int32_t);
  if constexpr (KT == KvType::kQ8_0)
    return 2 * f16_tile + static_cast<size_t>(kMmaDecStages) * (2 * mma_raw_tile_bytes<KT, D>() + pos);
  else
    return static_cast<size_t>(kMmaDecStages) * (2 * f16_tile + pos);
}

// Q8_0 rows [0, rows) of a copied tile (rows of RB bytes from raw) as f16 into t [16][LD], the
// rest zeros: lane pairs of values (q as half exactly: 1024 + (q + 128) less 1152, then times the
// block's scale: one rounding, as launch_kv_dequantize's f16 rows).
template <int D>
__device__ __forceinline__ void q8_tile_to_f16(__half* t, const unsigned char* raw, int rows, int lane) {
  constexpr int LD = D + 8, RB = D / kQ8Block * kQ8BlockBytes, PAIRS = D / 2;
  const __half2 bias = __float2half2_rn(1152.0f);
  for (int e = lane; e < kMmaDecKeys * PAIRS; e += 32) {
    const int r = e / PAIRS, d = 2 * (e % PAIRS);
    __half2 x = __float2half2_rn(0.0f);
    if (r < rows) {
      const unsigned char* blk = raw + r * RB + (d / kQ8Block) * kQ8BlockBytes;
      const uint32_t q2 = *reinterpret_cast<const uint16_t*>(blk + 2 + d % kQ8Block) ^ 0x8080u;
      const uint32_t h = __byte_perm(q2, 0x6464u, 0x5140u);
      x = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&h), bias), __half2half2(*reinterpret_cast<const __half*>(blk)));
    }
    *reinterpret_cast<__half2*>(t + r * LD + d) = x;
  }
}

template <KvType KT, int D, int GMAX>
__device__ __forceinline__ void decode_mma_warp(float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                                                const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w,
                                                int g, int split0, int nsplit, unsigned char* smem) {
  constexpr int LD = D + 8;  // row pitch in halves
  constexpr bool kQ8 = KT == KvType::kQ8_0;
  constexpr int F16_STAGES = kQ8 ? 1 : kMmaDecStages;   // f16 tiles: the stages, or the one converted
  constexpr int ROW = mma_row_bytes<KT, D>(), RAW = mma_raw_tile_bytes<KT, D>();
  __half* sk = reinterpret_cast<__half*>(smem);                                 // [F16_STAGES][16][LD]
  __half* sv = sk + F16_STAGES * kMmaDecKeys * LD;                               // [F16_STAGES][16][LD]
  unsigned char* sraw = reinterpret_cast<unsigned char*>(sv + F16_STAGES * kMmaDecKeys * LD);  // Q8_0: [stage][K, V][RAW]
  int32_t* sp = reinterpret_cast<int32_t*>(sraw + (kQ8 ? kMmaDecStages * 2 * RAW : 0));        // [stage][16]
  const int lane = threadIdx.x, grp = a.grp;
  const KeyRange kr = key_range(kv, a);
  if (split0 >= kr.splits) return;
  const int split_end = min(kr.splits, split0 + nsplit);
  const int per_split = (kr.chunk + kMmaDecKeys - 1) / kMmaDecKeys;
  const int last_keys = min(kr.N, split_end * kr.chunk) - (split_end - 1) * kr.chunk;
  const int n_tiles = (split_end - 1 - split0) * per_split + (last_keys + kMmaDecKeys - 1) / kMmaDecKeys;
  const unsigned char* Kb = static_cast<const unsigned char*>(kv.k) + static_cast<size_t>(g) * kv.capacity * ROW;
  const unsigned char* Vb = static_cast<const unsigned char*>(kv.v) + static_cast<size_t>(g) * kv.capacity * ROW;
  const __half* Kg = reinterpret_cast<const __half*>(Kb);
  const __half* Vg = reinterpret_cast<const __half*>(Vb);
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  if (w.k != nullptr && split_end == kr.splits) {  // the last split holds the new row: it goes in first
    const size_t slot = static_cast<size_t>(g) * kv.capacity + kr.N - 1;
    if constexpr (kQ8) {  // the warp quantizes block b of K, then of V
      unsigned char* K = static_cast<unsigned char*>(w.K) + slot * ROW;
      unsigned char* V = static_cast<unsigned char*>(w.V) + slot * ROW;
#pragma unroll
      for (int b = 0; b < D / kQ8Block; ++b) {
        q8_store_block(w.k[g * D + b * kQ8Block + lane], K + b * kQ8BlockBytes, lane);
        q8_store_block(w.v[g * D + b * kQ8Block + lane], V + b * kQ8BlockBytes, lane);
      }
    } else {
      __half* K = static_cast<__half*>(w.K);
      __half* V = static_cast<__half*>(w.V);
      for (int d = lane; d < D; d += 32) {
        K[slot * D + d] = __float2half_rn(w.k[g * D + d]);
        V[slot * D + d] = __float2half_rn(w.v[g * D + d]);
      }
    }
    if (lane == 0) w.P[slot] = w.pos[0], w.M[slot] = 0.0f;
    __threadfence_block();
    __syncwarp();  // the warp's copies below read the row
  }
  // tile u: split split0 + u / per_split, keys [j0, j0 + 16) of which those before the split's
  // end exist (the rest: zeros, position INT_MAX: masked)
  auto tile_at = [&](int u, int& j0, int& end) {
    const int s = split0 + u / per_split;
    end = min(kr.N, (s + 1) * kr.chunk);
    j0 = s * kr.chunk + (u % per_split) * kMmaDecKeys;
  };
  // Q8_0: where tile u's rows start in their raw stage (the offset of their first byte within its
  // 16, a multiple of 4: 16-byte copies meet 16-byte-aligned addresses on both sides)
  auto tile_skew = [&](int j0) -> int { return static_cast<int>(reinterpret_cast<uintptr_t>(Kb + static_cast<size_t>(j0) * ROW) & 15); };
  auto issue = [&](int u) {
    if (u < n_tiles) {
      int j0, end;
      tile_at(u, j0, end);
      const int st = u % kMmaDecStages;
      constexpr int CH = D / 8;  // 16-byte pieces of a row
      if constexpr (kQ8) {  // the rows before the split's end as they are (q8_tile_to_f16 zeros the rest)
        const int skew = tile_skew(j0), bytes = max(0, min(kMmaDecKeys, end - j0)) * ROW;
        const int head = min(bytes, (16 - skew) & 15), mid = (bytes - head) & ~15, tail = bytes - head - mid;
        unsigned char* dk = sraw + st * 2 * RAW + skew;
        unsigned char* dv = dk + RAW;
        const unsigned char* k0 = Kb + static_cast<size_t>(j0) * ROW;
        const unsigned char* v0 = Vb + static_cast<size_t>(j0) * ROW;
        for (int c = lane; c < (head + tail) / 4; c += 32) {
          const int o = c < head / 4 ? 4 * c : head + mid + 4 * (c - head / 4);
          __pipeline_memcpy_async(dk + o, k0 + o, 4);
          __pipeline_memcpy_async(dv + o, v0 + o, 4);
        }
        for (int c = lane; c < mid / 16; c += 32) {
          __pipeline_memcpy_async(dk + head + c * 16, k0 + head + c * 16, 16);
          __pipeline_memcpy_async(dv + head + c * 16, v0 + head + c * 16, 16);
        }
      } else {
        for (int c = lane; c < kMmaDecKeys * CH; c += 32) {
          const int r = c / CH, piece = c % CH, j = j0 + r;
          const int src = j < end ? j : 0, zfill = j < end ? 0 : 16;
          __pipeline_memcpy_async(sk + (st * kMmaDecKeys + r) * LD + piece * 8, Kg + static_cast<size_t>(src) * D + piece * 8, 16,
                                  zfill);
          __pipeline_memcpy_async(sv + (st * kMmaDecKeys + r) * LD + piece * 8, Vg + static_cast<size_t>(src) * D + piece * 8, 16,
                                  zfill);
        }
      }
      if (lane < kMmaDecKeys) {
        if (j0 + lane < end) __pipeline_memcpy_async(sp + st * kMmaDecKeys + lane, Pg + j0 + lane, 4);
        else sp[st * kMmaDecKeys + lane] = INT_MAX;
      }
    }
    __pipeline_commit();  // an empty group past the last tile keeps the counting uniform
  };
  for (int t = 0; t < kMmaDecStages - 1; ++t) issue(t);
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
  const int qp = q_pos[0];
  float o[D / 8][4], m[2], l[2];
  for (int u = 0; u < n_tiles; ++u) {
    if (u % per_split == 0) {  // a split begins: its own softmax
      m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    }
    issue(u + kMmaDecStages - 1);
    __pipeline_wait_prior(kMmaDecStages - 1);  // this lane's copies of tile u have landed
    __syncwarp();                               // and every lane's
    const int st = u % kMmaDecStages;
    int j0, end;
    tile_at(u, j0, end);
    const __half* kt = sk + (kQ8 ? 0 : st) * kMmaDecKeys * LD;
    const __half* vt = sv + (kQ8 ? 0 : st) * kMmaDecKeys * LD;
    if constexpr (kQ8) {  // the stage's rows as f16 into the one f16 tile (read by the last tile's mma before the syncwarp below)
      const unsigned char* raw = sraw + st * 2 * RAW + tile_skew(j0);
      const int rows = min(kMmaDecKeys, end - j0);
      q8_tile_to_f16<D>(sk, raw, rows, lane);
      q8_tile_to_f16<D>(sv, raw + RAW, rows, lane);
      __syncwarp();
    }
    const int32_t* pt = sp + st * kMmaDecKeys;
    float s[2][4];
    mma_scores<D>(s[0], qa, kt, 0, lane);
    mma_scores<D>(s[1], qa, kt, 1, lane);
    // mask (and keep the scores for the mass), then the online softmax of rows r0 and r0 + 8
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + 8 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = nt * 8 + c0 + e;
          float& x = s[nt][2 * i + e];
          x = pt[jj] <= qp ? x : -INFINITY;
          if (scores != nullptr && r < grp && j0 + jj < end) scores[(static_cast<size_t>(g) * GMAX + r) * kv.capacity + j0 + jj] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[i], mx), ref = mn == -INFINITY ? 0.0f : mn;
      const float alpha = __expf(m[i] - ref);  // m = -inf: 0
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * i + e];
          x = __expf(x - ref);  // masked: 0
          sum += x;
        }
      l[i] = l[i] * alpha + sum;
      m[i] = mn;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) o[nd][2 * i] *= alpha, o[nd][2 * i + 1] *= alpha;
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
    if (u + 1 < n_tiles && (u + 1) % per_split != 0) continue;
    // the split ends: its output (one split in all) or partials, rows below grp
    const int split = split0 + u / per_split;
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
        for (int nd = 0; nd < D / 8; ++nd)
          *reinterpret_cast<float2*>(out + h * D + nd * 8 + c0) = make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
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

template <KvType KT, int D, int GMAX>
__global__ void __launch_bounds__(32, kMmaDecBlocksPerSm) k_attn_decode_mma(float* out, float* ml, float* part_acc, float* part_ml,
                                                                          float* scores, const float* q, const int32_t* q_pos, KvView kv,
                                                                          AttnShape a, KvRowWrite w) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  decode_mma_warp<KT, D, GMAX>(out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w, blockIdx.x, blockIdx.y, 1, dsm);
}

template <KvType KT, int D, int GMAX>
__global__ void __launch_bounds__(32, kMmaDecBlocksPerSm) k_attn_decode_mma_batch(DecodeBatch b, DecodeRows r, AttnShape a,
                                                                                int per_block) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  const BatchBlock k = batch_block(b, r, a);
  decode_mma_warp<KT, D, GMAX>(k.out, k.ml, k.part_acc, k.part_ml, k.scores, k.q, k.q_pos, k.kv, k.a, k.w, blockIdx.x, blockIdx.y * per_block,
                           per_block, dsm);
}

template <class F>
void set_smem(F* fn, size_t bytes) {
  check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), "decode attention smem");
}

template <KvType KT, int D, int GMAX>
void launch_one(Launcher& L, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  constexpr size_t smem = mma_dec_smem_bytes<KT, D>();
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) set_smem(k_attn_decode_mma<KT, D, GMAX>, smem), attribute_set = true;
  L.launch(k_attn_decode_mma<KT, D, GMAX>, grid, 32, smem, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
}

template <KvType KT, int D, int GMAX>
void launch_batch(Launcher& L, int most, int seqs, int sms, const DecodeBatch& b, const DecodeRows& r, const AttnShape& a) {
  constexpr size_t smem = mma_dec_smem_bytes<KT, D>();
  static bool attribute_set = false;
  if (!attribute_set) set_smem(k_attn_decode_mma_batch<KT, D, GMAX>, smem), attribute_set = true;
  const int per_block = splits_per_block(most, a.G, seqs, kMmaDecBlocksPerSm * sms);
  const dim3 grid(a.G, (most + per_block - 1) / per_block, seqs);
  L.launch(k_attn_decode_mma_batch<KT, D, GMAX>, grid, 32, smem, b, r, a, per_block);
}

}  // namespace

bool decode_mma_serves(const KvView& kv, int grp) {
  const bool type = kv.type == KvType::kF16 && kv.v_type == kv.type;
  return type && (kv.head_dim == 64 || kv.head_dim == 128) && grp >= 1 && grp <= 8;
}

void launch_attn_decode_mma(Launcher& L, int gmax, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                            const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  const bool q8 = kv.type == KvType::kQ8_0, d64 = a.D == 64, g4 = gmax == 4;
#define SQUEEZEKV_ONE(T, D, G) launch_one<T, D, G>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w)
  if (q8) {
    if (d64) g4 ? SQUEEZEKV_ONE(KvType::kQ8_0, 64, 4) : SQUEEZEKV_ONE(KvType::kQ8_0, 64, 8);
    else g4 ? SQUEEZEKV_ONE(KvType::kQ8_0, 128, 4) : SQUEEZEKV_ONE(KvType::kQ8_0, 128, 8);
  } else {
    if (d64) g4 ? SQUEEZEKV_ONE(KvType::kF16, 64, 4) : SQUEEZEKV_ONE(KvType::kF16, 64, 8);
    else g4 ? SQUEEZEKV_ONE(KvType::kF16, 128, 4) : SQUEEZEKV_ONE(KvType::kF16, 128, 8);
  }
#undef SQUEEZEKV_ONE
  if (!a.direct) launch_attn_merge(L, out, ml, part_acc, part_ml, a.H, kv, a);
}

void launch_attn_decode_mma_batch(Launcher& L, KvType type, int gmax, int most, int seqs, int sms, const DecodeBatch& b,
                                  const DecodeRows& r, const AttnShape& a) {
  const bool q8 = type == KvType::kQ8_0, d64 = a.D == 64, g4 = gmax == 4;
#define SQUEEZEKV_BATCH(T, D, G) launch_batch<T, D, G>(L, most, seqs, sms, b, r, a)
  if (q8) {
    if (d64) g4 ? SQUEEZEKV_BATCH(KvType::kQ8_0, 64, 4) : SQUEEZEKV_BATCH(KvType::kQ8_0, 64, 8);
    else g4 ? SQUEEZEKV_BATCH(KvType::kQ8_0, 128, 4) : SQUEEZEKV_BATCH(KvType::kQ8_0, 128, 8);
  } else {
    if (d64) g4 ? SQUEEZEKV_BATCH(KvType::kF16, 64, 4) : SQUEEZEKV_BATCH(KvType::kF16, 64, 8);
    else g4 ? SQUEEZEKV_BATCH(KvType::kF16, 128, 4) : SQUEEZEKV_BATCH(KvType::kF16, 128, 8);
  }
#undef SQUEEZEKV_BATCH
}

}  // namespace squeezekv::cuda
