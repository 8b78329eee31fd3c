// KV row kernels (kv_rows.h).
#include "backend/cuda/kv_rows.h"

#include <cuda_fp16.h>

#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_q4.cuh"
#include "backend/cuda/kv_q8.cuh"

namespace squeezekv::cuda {
namespace {

// Bytes of a row of D values of type T.
template <KvType T>
__device__ constexpr size_t row_bytes(int D) {
  if constexpr (T == KvType::kF16) return static_cast<size_t>(D) * 2;
  else if constexpr (T == KvType::kF32) return static_cast<size_t>(D) * 4;
  else if constexpr (T == KvType::kQ8_0) return static_cast<size_t>(D / kQ8Block) * kQ8BlockBytes;
  else return static_cast<size_t>(D / kQ41Block) * kQ41BlockBytes;
}
// Value d of a row of type T (x): the block types' 32 values are a warp's 32 lanes, which
// quantize their block together (kv_q8.cuh, kv_q4.cuh).
template <KvType T>
__device__ inline void put_value(unsigned char* row, int d, float x) {
  if constexpr (T == KvType::kF16) reinterpret_cast<__half*>(row)[d] = __float2half_rn(x);
  else if constexpr (T == KvType::kF32) reinterpret_cast<float*>(row)[d] = x;
  else if constexpr (T == KvType::kQ8_0) q8_store_block(x, row + (d / kQ8Block) * kQ8BlockBytes, d % kQ8Block);
  else q4_1_store_block(x, row + (d / kQ41Block) * kQ41BlockBytes, d % kQ41Block);
}

// grid (T, G), block D (<= 1024; a multiple of 32 for the block types): thread d writes value d
// of the K row (type KT) and the V row (VT); the first slot is at, or *count_dev - T when
// count_dev is set
template <KvType KT, KvType VT>
__global__ void k_kv_write(unsigned char* K, unsigned char* V, int32_t* P, float* M, int G, int D, int cap, int at,
                           const int32_t* count_dev, const float* k, const float* v, const int32_t* rows_pos) {
  pdl_enter();
  const int r = blockIdx.x, g = blockIdx.y, d = threadIdx.x;
  if (count_dev != nullptr) at = *count_dev - static_cast<int>(gridDim.x);
  const size_t slot = static_cast<size_t>(g) * cap + at + r;
  const size_t src = (static_cast<size_t>(r) * G + g) * D + d;
  put_value<KT>(K + slot * row_bytes<KT>(D), d, k[src]);
  put_value<VT>(V + slot * row_bytes<VT>(D), d, v[src]);
  if (d == 0) P[slot] = rows_pos[r], M[slot] = 0.0f;
}

// Rows [0, N) of every head of one array of type T as f16 or f32 values OT (N = *count_dev, or
// count): grid (ceil(cap / 8), G), block (32, 8): warp y takes row blockIdx.x * 8 + y, each lane
// value pairs.
__device__ inline void put_pair(__half* row, int i, float2 x) { reinterpret_cast<__half2*>(row)[i] = __floats2half2_rn(x.x, x.y); }
__device__ inline void put_pair(float* row, int i, float2 x) { reinterpret_cast<float2*>(row)[i] = x; }
template <KvType T>
__device__ inline float2 get_pair(const unsigned char* row, int i) {
  if constexpr (T == KvType::kF16) return __half22float2(reinterpret_cast<const __half2*>(row)[i]);
  else if constexpr (T == KvType::kF32) return reinterpret_cast<const float2*>(row)[i];
  else if constexpr (T == KvType::kQ8_0) {
    const int b = 2 * i / kQ8Block, e = 2 * i % kQ8Block;
    const unsigned char* blk = row + b * kQ8BlockBytes;
    const float d = __half2float(*reinterpret_cast<const __half*>(blk));
    return make_float2(static_cast<signed char>(blk[2 + e]) * d, static_cast<signed char>(blk[3 + e]) * d);
  } else {
    return q4_1_load2(row + (2 * i / kQ41Block) * kQ41BlockBytes, i % (kQ41Block / 2));
  }
}
template <KvType T, typename OT>
__global__ void k_kv_dequantize(OT* out, const unsigned char* rows, int D, int cap, int count, const int32_t* count_dev) {
  pdl_enter();
  const int N = count_dev != nullptr ? *count_dev : count;
  const int j = blockIdx.x * blockDim.y + threadIdx.y, g = blockIdx.y;
  if (j >= N) return;
  const size_t slot = static_cast<size_t>(g) * cap + j;
  for (int i = threadIdx.x; i < D / 2; i += 32) put_pair(out + slot * D, i, get_pair<T>(rows + slot * row_bytes<T>(D), i));
}

// grid n, block 128: row from[i] -> to[i] in K, V (k_words, v_words 32-bit words a row), pos, mass
__global__ void k_kv_move(uint32_t* K, uint32_t* V, int32_t* P, float* M, size_t k_words, size_t v_words, const int* from,
                          const int* to) {
  pdl_enter();
  const size_t f = from[blockIdx.x], t = to[blockIdx.x];
  for (size_t w = threadIdx.x; w < k_words; w += blockDim.x) K[t * k_words + w] = K[f * k_words + w];
  for (size_t w = threadIdx.x; w < v_words; w += blockDim.x) V[t * v_words + w] = V[f * v_words + w];
  if (threadIdx.x == 0) P[t] = P[f], M[t] = M[f];
}

// Which of two rows goes first as one integer: less mass first, between equal masses the newer
// position; ~0 for none. (Float bits ordered as integers: negative values flipped whole, the rest
// with the sign bit set; positions ordered as signed, then reversed.)
__device__ inline unsigned long long evict_key(float m, int32_t p) {
  uint32_t b = __float_as_uint(m);
  b = (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
  return (static_cast<unsigned long long>(b) << 32) | ~(static_cast<uint32_t>(p) ^ 0x80000000u);
}

// grid (G, entries), block kEvictThreads: per entry (a layer of a sequence) and head the least-mass
// slot among positions [keep_below, keep_from) (ties: the newer position goes), then row count - 1
// into its hole (cpu_backend.cc's loop, in parallel). table [entries]: uploaded before the launch.
constexpr int kEvictThreads = 256;
__global__ void __launch_bounds__(kEvictThreads) k_kv_evict_one(const EvictOne* __restrict__ table) {
  pdl_enter();
  const EvictOne& e = table[blockIdx.y];
  uint32_t *K = e.K, *V = e.V;
  int32_t* P = e.P;
  float* M = e.M;
  const size_t k_words = e.k_words, v_words = e.v_words;
  const int count = e.count;
  const int32_t keep_below = e.keep_below, keep_from = e.newest != nullptr ? *e.newest - e.n_recent + 1 : e.keep_from;
  const size_t base = static_cast<size_t>(blockIdx.x) * e.cap;
  const int32_t* pos = P + base;
  const float* m = M + base;
  // each thread's least key over its rows (loads independent of each other), then the warp's
  // through shuffles, then the block's through shared memory
  unsigned long long best = ~0ull;
  int at = -1;
  if (e.scores == nullptr) {
#pragma unroll 4
    for (int j = threadIdx.x; j < count; j += kEvictThreads) {
      const int32_t p = pos[j];
      const unsigned long long k = p < keep_below || p >= keep_from ? ~0ull : evict_key(m[j], p);
      if (k < best) best = k, at = j;
    }
  } else {  // the step's mass first, with k_attn_mass's operations (the same values), then the key
    const GroupSoftmax<8> sm(e.ml, blockIdx.x, e.grp);
    const float* sc = e.scores + static_cast<size_t>(blockIdx.x) * e.gmax * e.cap;
    for (int j = threadIdx.x; j < count; j += kEvictThreads) {
      float* dst = M + base + j;
      const float mj = sm.add_mass(*dst, sc, e.cap, j, e.mass_max);
      *dst = mj;
      const int32_t p = pos[j];
      const unsigned long long k = p < keep_below || p >= keep_from ? ~0ull : evict_key(mj, p);
      if (k < best) best = k, at = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long k = __shfl_xor_sync(0xffffffffu, best, o);
    const int j = __shfl_xor_sync(0xffffffffu, at, o);
    if (k < best) best = k, at = j;
  }
  __shared__ unsigned long long s_key[kEvictThreads / 32];
  __shared__ int s_at[kEvictThreads / 32];
  __shared__ int s_victim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) s_key[warp] = best, s_at[warp] = at;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kEvictThreads / 32; ++w)
      if (s_key[w] < best) best = s_key[w], at = s_at[w];
    s_victim = best == ~0ull ? -1 : at;
  }
  __syncthreads();
  const int victim = s_victim, last = count - 1;
  if (victim < 0 || victim == last) return;
  for (size_t w = threadIdx.x; w < k_words; w += kEvictThreads) K[(base + victim) * k_words + w] = K[(base + last) * k_words + w];
  for (size_t w = threadIdx.x; w < v_words; w += kEvictThreads) V[(base + victim) * v_words + w] = V[(base + last) * v_words + w];
  if (threadIdx.x == 0) P[base + victim] = P[base + last], M[base + victim] = M[base + last];
}

// A head's rank among the block's threads whose flag is set (those before it), and how many are
// set in all. Every thread of the block calls it; warp_set: shared [32].
__device__ inline int block_rank(bool flag, int* warp_set, int& total) {
  const unsigned set = __ballot_sync(0xffffffffu, flag);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_set[warp] = __popc(set);
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
    const int n = warp_set[w];
    before += w < warp ? n : 0;
    all += n;
  }
  __syncthreads();
  total = all;
  return before + __popc(set & ((1u << lane) - 1u));
}

// grid G, block kTopThreads: head blockIdx.x's n_evict least keys (evict_key: less mass first,
// between equal masses the newer position) among the rows whose position lies in
// [keep_below, keep_from). A radix select finds the n_evict-th least key, eight bits at a time
// from the top (a shared histogram of the rows that share the digits found so far); the rows at
// or below it go. Then either dead_pos gets the held positions with kDeadPosition at those rows,
// or the rows move as KvStorage::evict moves them: the evicted rows below count - n_evict (holes,
// lowest first) and the kept rows at or above it (donors, highest first), each list ranked by
// block-wide counts into scratch [G][2][n_evict], and donor i moved into hole i, a warp a row.
constexpr int kTopThreads = 1024;
__global__ void __launch_bounds__(kTopThreads)
    k_kv_evict_top(uint32_t* K, uint32_t* V, int32_t* P, float* M, int k_words, int v_words, int cap, int count, int n_evict,
                   int32_t keep_below, int32_t keep_from, int32_t* dead_pos, int* scratch) {
  pdl_enter();
  const size_t base = static_cast<size_t>(blockIdx.x) * cap;
  const int32_t* pos = P + base;
  const float* m = M + base;
  __shared__ unsigned hist[256];
  __shared__ unsigned long long s_prefix;
  __shared__ unsigned s_k;
  __shared__ int warp_set[32];
  unsigned long long prefix = 0, mask = 0;
  unsigned k = static_cast<unsigned>(n_evict);  // the k-th least key among those matching prefix
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < count; j += blockDim.x) {
      const int32_t p = pos[j];
      if (p < keep_below || p >= keep_from) continue;
      const unsigned long long key = evict_key(m[j], p);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // the digit: the first bin where the running count reaches k
      const int lane = threadIdx.x;
      unsigned own = 0;
      for (int i = 0; i < 8; ++i) own += hist[lane * 8 + i];
      unsigned incl = own;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
      }
      const unsigned reach = __ballot_sync(0xffffffffu, incl >= k);
      if (lane == __ffs(reach) - 1) {
        unsigned c = incl - own;
        int d = lane * 8;
        while (c + hist[d] < k) c += hist[d++];
        s_prefix = prefix | (static_cast<unsigned long long>(d) << shift);
        s_k = k - c;
      }
    }
    __syncthreads();
    prefix = s_prefix;
    k = s_k;
    mask |= 255ull << shift;
  }
  const unsigned long long last = prefix;  // the n_evict-th least key: every key up to it goes
  auto evicted = [&](int j) {
    const int32_t p = pos[j];
    return p >= keep_below && p < keep_from && evict_key(m[j], p) <= last;
  };
  if (dead_pos != nullptr) {
    for (int j = threadIdx.x; j < count; j += blockDim.x) dead_pos[base + j] = evicted(j) ? kDeadPosition : pos[j];
    return;
  }
  const int new_count = count - n_evict;
  int* holes = scratch + static_cast<size_t>(blockIdx.x) * 2 * n_evict;
  int* donors = holes + n_evict;
  int n_holes = 0, n_donors = 0;
  for (int j0 = 0; j0 < count; j0 += blockDim.x) {  // every thread takes each round (block_rank)
    const int j = j0 + threadIdx.x;
    const bool ev = j < count && evicted(j);
    int total = 0;
    const int h = block_rank(j < new_count && ev, warp_set, total);
    if (j < new_count && ev) holes[n_holes + h] = j;
    n_holes += total;
    const int d = block_rank(j >= new_count && j < count && !ev, warp_set, total);
    if (j >= new_count && j < count && !ev) donors[n_donors + d] = j;
    n_donors += total;
  }
  __syncthreads();  // the lists, written to global memory by this block, read by it
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < n_holes; i += blockDim.x / 32) {
    const size_t to = base + holes[i], from = base + donors[n_donors - 1 - i];
    for (int w = lane; w < k_words; w += 32) K[to * k_words + w] = K[from * k_words + w];
    for (int w = lane; w < v_words; w += 32) V[to * v_words + w] = V[from * v_words + w];
    if (lane == 0) P[to] = P[from], M[to] = M[from];
  }
}

template <KvType KT, KvType VT>
void launch_write(Launcher& L, const void* tag, const KvArrays& a, int at, const float* k, const float* v, const int32_t* rows_pos, int T) {
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(a.G));
  L.launch_tagged(tag, k_kv_write<KT, VT>, grid, a.D, 0, static_cast<unsigned char*>(a.k), static_cast<unsigned char*>(a.v), a.pos, a.mass,
                  a.G, a.D, a.capacity, at, a.count_dev, k, v, rows_pos);
}

}  // namespace

void launch_kv_evict_top(Launcher& L, const KvArrays& a, int count, int n_evict, int32_t keep_below, int32_t keep_from,
                         int32_t* dead_pos, int* scratch) {
  L.launch(k_kv_evict_top, static_cast<unsigned>(a.G), kTopThreads, 0, static_cast<uint32_t*>(a.k), static_cast<uint32_t*>(a.v),
           a.pos, a.mass, static_cast<int>(a.row_bytes() / 4), static_cast<int>(a.v_row_bytes() / 4), a.capacity, count, n_evict,
           keep_below, keep_from, dead_pos, scratch);
}

void launch_kv_write(Launcher& L, const void* tag, const KvArrays& a, int at, const float* k, const float* v, const int32_t* rows_pos,
                     int T) {
  constexpr KvType f16 = KvType::kF16, f32 = KvType::kF32, q8 = KvType::kQ8_0, q41 = KvType::kQ4_1;
  if (a.type == q8 && a.v_type == q41) launch_write<q8, q41>(L, tag, a, at, k, v, rows_pos, T);
  else if (a.type == f16 && a.v_type == q41) launch_write<f16, q41>(L, tag, a, at, k, v, rows_pos, T);
  else if (a.type == q8) launch_write<q8, q8>(L, tag, a, at, k, v, rows_pos, T);
  else if (a.type == f16) launch_write<f16, f16>(L, tag, a, at, k, v, rows_pos, T);
  else launch_write<f32, f32>(L, tag, a, at, k, v, rows_pos, T);
}

void launch_kv_dequantize(Launcher& L, KvType from, KvType to, void* out, const void* rows, const KvView& kv) {
  const dim3 grid(static_cast<unsigned>((kv.capacity + 7) / 8), static_cast<unsigned>(kv.n_kv_heads));
  const auto* R = static_cast<const unsigned char*>(rows);
  auto go = [&](auto tag) {
    constexpr KvType T = decltype(tag)::value;
    if (to == KvType::kF32)
      L.launch(k_kv_dequantize<T, float>, grid, dim3(32, 8), 0, static_cast<float*>(out), R, kv.head_dim, kv.capacity, kv.count,
               kv.count_dev);
    else
      L.launch(k_kv_dequantize<T, __half>, grid, dim3(32, 8), 0, static_cast<__half*>(out), R, kv.head_dim, kv.capacity, kv.count,
               kv.count_dev);
  };
  switch (from) {
    case KvType::kF16: go(std::integral_constant<KvType, KvType::kF16>{}); break;
    case KvType::kF32: go(std::integral_constant<KvType, KvType::kF32>{}); break;
    case KvType::kQ8_0: go(std::integral_constant<KvType, KvType::kQ8_0>{}); break;
    case KvType::kQ4_1: go(std::integral_constant<KvType, KvType::kQ4_1>{}); break;
    default: throw Error("cuda attention: no conversion of these KV rows");
  }
}

void launch_kv_move(Launcher& L, const KvArrays& a, const int* from, const int* to, int n) {
  L.launch(k_kv_move, static_cast<unsigned>(n), 128, 0, static_cast<uint32_t*>(a.k), static_cast<uint32_t*>(a.v), a.pos, a.mass,
           a.row_bytes() / 4, a.v_row_bytes() / 4, from, to);
}

void launch_kv_evict(Launcher& L, const void* tag, const EvictOne* table, int n, int G) {
  L.launch_tagged(tag, k_kv_evict_one, dim3(static_cast<unsigned>(G), static_cast<unsigned>(n)), kEvictThreads, 0, table);
}

}  // namespace squeezekv::cuda
