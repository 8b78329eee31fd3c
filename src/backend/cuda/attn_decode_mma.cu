// Decode attention on the tensor cores (attn_decode_mma.h). A block is one warp: kv head g of one
// sequence, splits [split0, split0 + nsplit) of its keys one after another. The warp's 16 rows are
// the grp query heads of g (rows past grp are zeros and are never written); K and V stream
// through shared memory in tiles of 16 keys, a row format's stages deep (cp.async, the warp's own
// copies: no block barrier), and per tile S = Q K^T and O += P V run as mma.sync m16n8k16 (f16
// in, f32 accumulate: q rounded to f16 once, p to f16 for P V, as the prompt kernel k_attn_mma),
// with an online softmax per row in registers. At a split's end the warp writes the output and
// ml (one split in all) or the split's partials, and the kept scores for the mass (natural-log
// units, -inf where masked), exactly where k_attn_decode writes them. A CUDA-core block streams
// a split with 4 warps reducing each dot product by shuffles; here one warp's two instructions do
// 16 keys' scores, which left the CUDA-core kernel's batches at 25-40% of the copy bandwidth bound
// by their own instructions (docs/raw/2026-12-01-h200-batch-step/).
//
// The row formats are what differs, the keys' (F16Keys, Q8Keys) and the values' (F16Values,
// Q8Values, Q41Values) apart: how a tile is copied, and how the mma operands come from it (Q4_1
// values: Q41Values). Q8_0 rows (kv_q8.cuh) are copied as they are stored, half the bytes of
// f16, and each lane makes its own B operands from the int8 bytes: one PRMT turns two bytes into
// two exact f16 values (1024 + q + 128, 0x64 as the high byte), one HSUB2 and one HMUL2 make them
// q * d. For that a lane reads contiguous bytes: in S = Q K^T the head dims of a k-step are
// permuted (the same permutation on Q's columns, so the sum is the same); in O += P V an n tile's
// 8 columns are head dims 4 apart, and the output's columns are mapped back when it is stored.
#include "backend/cuda/attn_decode_mma.h"

#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <climits>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_q4.cuh"
#include "backend/cuda/kv_q8.cuh"
#include "backend/cuda/mma.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kMmaDecKeys = 16;  // keys a tile
// Blocks (one warp each) an SM holds at once: 8 x 26 KB of shared memory (head dim 128) and up to
// 255 registers a lane. Q8_0 rows at 12 warps of 4 stages (168 registers a lane, a few spilled)
// ran 10% slower alone on an H100 and no faster on an H200 (docs/raw/2026-12-07-h100-q8-decode-occupancy/).
constexpr int kMmaDecBlocksPerSm = 8;

// One 4-, 8- or 16-byte cp.async of which the first `src` bytes come from global memory and the
// rest are zeros (src 0: nothing is read).
template <int P>
__device__ __forceinline__ void cp_async_zfill(void* dst, const void* src, int bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (P == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(P), "r"(bytes) : "memory");
}

// One 4-, 8- or 16-byte cp.async, all of it from global memory.
template <int P>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (P == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(d), "l"(src), "n"(P) : "memory");
}

// f16 rows of one array (K or V): a tile is [16][D + 8] halves (padded so that an ldmatrix's 8
// rows fall on different banks); the operands come by ldmatrix.
template <int D>
struct F16Tile {
  static constexpr int LD = D + 8;  // row pitch in halves
  static constexpr int kTileBytes = kMmaDecKeys * LD * 2;
  // A lane copies the same 16-byte piece of rows rl, rl + RPP, ... of every tile, so its
  // addresses move by the tile's offset alone.
  static constexpr int CH = D / 8;  // 16-byte pieces of a row
  static constexpr int RPP = 32 / CH;
  static constexpr int PASSES = kMmaDecKeys / RPP;
  const __half* A;  // kv head g's rows [capacity][D]
  int lane, rl, piece;

  __device__ F16Tile(const void* a, int g, int capacity, int lane_)
      : A(static_cast<const __half*>(a) + static_cast<size_t>(g) * capacity * D), lane(lane_), rl(lane_ / CH), piece(lane_ % CH) {}

  // rows j0 .. j0 + 15 into the tile dst; rows from `valid` on: zeros
  __device__ __forceinline__ void copy(unsigned char* dst, int j0, int valid) const {
    __half* t = reinterpret_cast<__half*>(dst) + rl * LD + piece * 8;
    const size_t go = (static_cast<size_t>(j0) + rl) * D + piece * 8;
    if (valid == kMmaDecKeys) {
#pragma unroll
      for (int p = 0; p < PASSES; ++p) __pipeline_memcpy_async(t + p * RPP * LD, A + go + p * RPP * D, 16);
    } else {
#pragma unroll
      for (int p = 0; p < PASSES; ++p) {
        const bool in = rl + p * RPP < valid;
        cp_async_zfill<16>(t + p * RPP * LD, in ? A + go + p * RPP * D : A, in ? 16 : 0);
      }
    }
  }
  // The step's new row x [D] of this array into slot (of [G][capacity] rows at a).
  __device__ __forceinline__ void write_row(void* a, const float* x, size_t slot) const {
    __half* r = static_cast<__half*>(a) + slot * D;
    for (int d = lane; d < D; d += 32) r[d] = __float2half_rn(x[d]);
  }
};

// Rows of one array in blocks with their scales (Q8_0, Q4_1): a tile is the 16 rows' bytes as
// stored, [16][RB], copied in the largest pieces (16, 8 or 4 bytes) the rows' alignment allows.
template <int RB>
struct PackedTile {
  static constexpr int kTileBytes = kMmaDecKeys * RB;  // a multiple of 16
  const unsigned char* A;                              // kv head g's rows [capacity][RB]
  int lane, piece;

  __device__ PackedTile(const void* a, int g, int capacity, int lane_)
      : A(static_cast<const unsigned char*>(a) + static_cast<size_t>(g) * capacity * RB), lane(lane_) {
    // a tile starts at a multiple of 16 rows (16 RB bytes, a multiple of 16) past A
    const unsigned at = static_cast<unsigned>(reinterpret_cast<uintptr_t>(A));
    piece = (at & 15) == 0 ? 16 : (at & 7) == 0 ? 8 : 4;
  }
  template <int P>
  __device__ __forceinline__ void copy_pieces(unsigned char* dst, int j0, int bytes) const {
    const unsigned char* src = A + static_cast<size_t>(j0) * RB;
    if (bytes == kTileBytes) {  // a whole tile (every tile but a split's last): no bounds, unrolled
      const unsigned char* s = src + lane * P;
      unsigned char* d = dst + lane * P;
#pragma unroll
      for (int k = 0; k < (kTileBytes + 32 * P - 1) / (32 * P); ++k)
        if ((k + 1) * 32 * P <= kTileBytes || lane * P + k * 32 * P < kTileBytes) cp_async<P>(d + k * 32 * P, s + k * 32 * P);
      return;
    }
    for (int o = lane * P; o < kTileBytes; o += 32 * P) {
      const int n = min(P, max(0, bytes - o));
      cp_async_zfill<P>(dst + o, n > 0 ? src + o : A, n);
    }
  }
  __device__ __forceinline__ void copy(unsigned char* dst, int j0, int valid) const {
    const int bytes = valid * RB;  // a multiple of 4
    if (piece == 16) copy_pieces<16>(dst, j0, bytes);
    else if (piece == 8) copy_pieces<8>(dst, j0, bytes);
    else copy_pieces<4>(dst, j0, bytes);
  }
};

// f16 keys: S = Q K^T from ldmatrix operands.
template <int D>
struct F16Keys : F16Tile<D> {
  using F16Tile<D>::F16Tile;
  using F16Tile<D>::lane;
  // The A operands of rows r0 = lane / 4 and r0 + 8 of q [16][D] (rows from grp on: zeros), times scale.
  __device__ __forceinline__ void load_q(uint32_t (&qa)[D / 16][4], const float* q, int grp, float scale) const {
    const int r0 = lane / 4, c0 = (lane % 4) * 2;
    auto qrow = [&](int r, int d) -> float2 {
      return r < grp ? *reinterpret_cast<const float2*>(q + static_cast<size_t>(r) * D + d) : make_float2(0.0f, 0.0f);
    };
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const float2 x0 = qrow(r0, ks * 16 + c0), x1 = qrow(r0 + 8, ks * 16 + c0), x2 = qrow(r0, ks * 16 + 8 + c0),
                   x3 = qrow(r0 + 8, ks * 16 + 8 + c0);
      qa[ks][0] = pack_half2(x0.x * scale, x0.y * scale);
      qa[ks][1] = pack_half2(x1.x * scale, x1.y * scale);
      qa[ks][2] = pack_half2(x2.x * scale, x2.y * scale);
      qa[ks][3] = pack_half2(x3.x * scale, x3.y * scale);
    }
  }
  // s[nt] = the 16 rows against keys nt * 8 .. nt * 8 + 7 of the K tile
  __device__ __forceinline__ void scores(float (&s)[2][4], const uint32_t (&qa)[D / 16][4], const unsigned char* kt) const {
    mma_scores<D>(s[0], qa, reinterpret_cast<const __half*>(kt), 0, lane);
    mma_scores<D>(s[1], qa, reinterpret_cast<const __half*>(kt), 1, lane);
  }
};

// f16 values: O += P V from transposing ldmatrix operands.
template <int D>
struct F16Values : F16Tile<D> {
  using F16Tile<D>::F16Tile;
  using F16Tile<D>::lane;
  using F16Tile<D>::LD;
  // o[nd] += P (A operands pa) times the V tile's columns nd * 8 .. nd * 8 + 7
  __device__ __forceinline__ void pv(float (&o)[D / 8][4], const uint32_t (&pa)[4], const unsigned char* vt) const {
    const __half* v = reinterpret_cast<const __half*>(vt);
    const int mi = lane / 8, rr = lane % 8;
#pragma unroll
    for (int nd = 0; nd < D / 8; nd += 2) {
      uint32_t b[4];  // b[0..1]: d tile nd, b[2..3]: nd + 1
      ldsm_x4_trans(b, v + (rr + (mi & 1) * 8) * LD + nd * 8 + (mi >> 1) * 8);
      mma_f16(o[nd], pa, b);
      mma_f16(o[nd + 1], pa, b + 2);
    }
  }
  // Row i (r0 + 8 i) of this lane's outputs, times f, into dst [D] (and ob [D] in bf16 unless null):
  // o[nd][2 i + e] is column nd * 8 + c0 + e.
  __device__ __forceinline__ void store(float* dst, __nv_bfloat16* ob, const float (&o)[D / 8][4], int i, float f) const {
    const int c0 = (lane % 4) * 2;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const float2 y = make_float2(o[nd][2 * i] * f, o[nd][2 * i + 1] * f);
      *reinterpret_cast<float2*>(dst + nd * 8 + c0) = y;
      if (ob != nullptr) *reinterpret_cast<__nv_bfloat162*>(ob + nd * 8 + c0) = __floats2bfloat162_rn(y.x, y.y);
    }
  }
};

// The 32-bit word at p, 2-byte aligned; at2: p lies 2 bytes past a 4-byte boundary (two aligned
// words and one PRMT).
__device__ __forceinline__ uint32_t lds_u32(const unsigned char* p, bool at2) {
  if (!at2) return *reinterpret_cast<const uint32_t*>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - 2);
  return __byte_perm(w[0], w[1], 0x5432);
}
// Bytes 0, 1 (sel 0x4140) or 2, 3 (0x4342) of x, each a Q8_0 value q XOR 0x80 (q + 128), as
// q * d in two f16: 0x64 above a byte is the f16 1024 + byte, exact, less 1152.
__device__ __forceinline__ uint32_t q8_half2(uint32_t x, unsigned sel, __half2 d) {
  const uint32_t e = __byte_perm(x, 0x64646464u, sel);
  const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&e), __float2half2_rn(1152.0f)), d);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Q8_0 keys (see the file's opening): each lane makes its B operands from the int8 bytes.
template <int D>
struct Q8Keys : PackedTile<D / kQ8Block * kQ8BlockBytes> {
  static constexpr int RB = D / kQ8Block * kQ8BlockBytes;  // bytes a row
  using PackedTile<RB>::PackedTile;
  using PackedTile<RB>::lane;
  // k-step 2b + h of block b is head dims 32 b + 8 i + 4 h + {0, 1, 2, 3} for lane i = lane % 4
  // (A's columns 2 i, 2 i + 1, 2 i + 8, 2 i + 9 in that order): rows r0, r0 + 8 read 8 floats each.
  __device__ __forceinline__ void load_q(uint32_t (&qa)[D / 16][4], const float* q, int grp, float scale) const {
    const int r0 = lane / 4, c = (lane % 4) * 8;
#pragma unroll
    for (int b = 0; b < D / 32; ++b)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = r0 + 8 * i;
        const float* x = q + static_cast<size_t>(r) * D + 32 * b + c;
        const float4 lo = r < grp ? *reinterpret_cast<const float4*>(x) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 hi = r < grp ? *reinterpret_cast<const float4*>(x + 4) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        qa[2 * b][i] = pack_half2(lo.x * scale, lo.y * scale);
        qa[2 * b][2 + i] = pack_half2(lo.z * scale, lo.w * scale);
        qa[2 * b + 1][i] = pack_half2(hi.x * scale, hi.y * scale);
        qa[2 * b + 1][2 + i] = pack_half2(hi.z * scale, hi.w * scale);
      }
  }
  // A lane's B operands of key nt * 8 + lane / 4: 8 bytes of each block at 2 + 8 i (2 bytes past a
  // 4-byte boundary in even blocks), its scale for all of them.
  __device__ __forceinline__ void scores(float (&s)[2][4], const uint32_t (&qa)[D / 16][4], const unsigned char* kt) const {
    const int i = lane % 4, j = lane / 4;
    float t[2][4];  // the odd k-steps' sums: two chains of dependent products a key tile, not one
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      t[nt][0] = t[nt][1] = t[nt][2] = t[nt][3] = 0.0f;
      const unsigned char* row = kt + (nt * 8 + j) * RB;
#pragma unroll
      for (int b = 0; b < D / 32; ++b) {
        const unsigned char* blk = row + b * kQ8BlockBytes;
        const __half2 d = __half2half2(*reinterpret_cast<const __half*>(blk));
        const bool at2 = b % 2 == 0;
        const uint32_t w0 = lds_u32(blk + 2 + 8 * i, at2) ^ 0x80808080u, w1 = lds_u32(blk + 6 + 8 * i, at2) ^ 0x80808080u;
        const uint32_t b0[2] = {q8_half2(w0, 0x4140, d), q8_half2(w0, 0x4342, d)};
        const uint32_t b1[2] = {q8_half2(w1, 0x4140, d), q8_half2(w1, 0x4342, d)};
        mma_f16(s[nt], qa[2 * b], b0);
        mma_f16(t[nt], qa[2 * b + 1], b1);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] += t[nt][e];
    }
  }
  // The step's new row x [D] quantized by the warp, block by block, as the CPU's kv_rows.cc does.
  __device__ __forceinline__ void write_row(void* a, const float* x, size_t slot) const {
    unsigned char* r = static_cast<unsigned char*>(a) + slot * RB;
#pragma unroll
    for (int b = 0; b < D / kQ8Block; ++b) q8_store_block(x[b * kQ8Block + lane], r + b * kQ8BlockBytes, lane);
  }
};

// Q8_0 values: n tile 4 u + t, column n is head dim 32 u + 4 n + t.
template <int D>
struct Q8Values : Q8Keys<D> {  // (the copy and the row write are the keys')
  static constexpr int RB = Q8Keys<D>::RB;
  using Q8Keys<D>::Q8Keys;
  using Q8Keys<D>::lane;
  // Lane (i = lane % 4, n = lane / 4) reads 4 bytes at 2 + 4 n of block u from rows 2 i, 2 i + 1
  // (k 2 i, 2 i + 1: b[0]) and 2 i + 8, 2 i + 9 (b[1]), and makes the B operands of the block's 4
  // n tiles from them.
  __device__ __forceinline__ void pv(float (&o)[D / 8][4], const uint32_t (&pa)[4], const unsigned char* vt) const {
    const int i = lane % 4, n = lane / 4;
    const unsigned char* ra = vt + 2 * i * RB;  // rows 2 i, + 1, + 8, + 9
#pragma unroll
    for (int u = 0; u < D / 32; ++u) {
      const int at = u * kQ8BlockBytes;
      const bool at2 = u % 2 == 0;
      auto scale = [&](int r) { return *reinterpret_cast<const __half*>(ra + r * RB + at); };
      auto word = [&](int r) { return lds_u32(ra + r * RB + at + 2 + 4 * n, at2) ^ 0x80808080u; };
      const __half2 d01 = __halves2half2(scale(0), scale(1)), d89 = __halves2half2(scale(8), scale(9));
      const uint32_t wa = word(0), wb = word(1), wc = word(8), wd = word(9);
      const uint32_t x01 = __byte_perm(wa, wb, 0x5140), y01 = __byte_perm(wa, wb, 0x7362);  // bytes 0, 1 and 2, 3 of both rows
      const uint32_t x89 = __byte_perm(wc, wd, 0x5140), y89 = __byte_perm(wc, wd, 0x7362);
      const uint32_t b0[2] = {q8_half2(x01, 0x4140, d01), q8_half2(x89, 0x4140, d89)};
      const uint32_t b1[2] = {q8_half2(x01, 0x4342, d01), q8_half2(x89, 0x4342, d89)};
      const uint32_t b2[2] = {q8_half2(y01, 0x4140, d01), q8_half2(y89, 0x4140, d89)};
      const uint32_t b3[2] = {q8_half2(y01, 0x4342, d01), q8_half2(y89, 0x4342, d89)};
      mma_f16(o[4 * u], pa, b0);
      mma_f16(o[4 * u + 1], pa, b1);
      mma_f16(o[4 * u + 2], pa, b2);
      mma_f16(o[4 * u + 3], pa, b3);
    }
  }
  // As F16Values::store; o[4 u + t][2 i + e] is column 32 u + 8 (lane % 4) + 4 e + t.
  __device__ __forceinline__ void store(float* dst, __nv_bfloat16* ob, const float (&o)[D / 8][4], int i, float f) const {
    const int c = (lane % 4) * 8;
#pragma unroll
    for (int u = 0; u < D / 32; ++u)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        store4(dst, ob, 32 * u + c + 4 * e, o[4 * u][2 * i + e] * f, o[4 * u + 1][2 * i + e] * f, o[4 * u + 2][2 * i + e] * f,
               o[4 * u + 3][2 * i + e] * f);
  }
  // Head dims d .. d + 3 (a multiple of 4) of the output row dst (and ob unless null).
  __device__ static __forceinline__ void store4(float* dst, __nv_bfloat16* ob, int d, float a, float b, float c, float e) {
    *reinterpret_cast<float4*>(dst + d) = make_float4(a, b, c, e);
    if (ob != nullptr) {
      const __nv_bfloat162 p0 = __floats2bfloat162_rn(a, b), p1 = __floats2bfloat162_rn(c, e);
      uint2 pk;
      pk.x = *reinterpret_cast<const uint32_t*>(&p0), pk.y = *reinterpret_cast<const uint32_t*>(&p1);
      *reinterpret_cast<uint2*>(ob + d) = pk;
    }
  }
};

// Q4_1 values (kv_q4.cuh: a block's f16 scale d and minimum m, then byte j holding value j in its
// low nibble and value j + 16 in its high one). n tile 4 u + t, column n is head dim
// 32 u + 2 n + (t & 1) + 16 (t >> 1): lane (i = lane % 4, n = lane / 4) reads the 2 bytes at
// 4 + 2 n of block u from rows 2 i, 2 i + 1, 2 i + 8, 2 i + 9, and makes the B operands of the
// block's 4 n tiles from their nibbles: 0x64 above a nibble is the f16 1024 + q, exact, and one
// HFMA2 gives (q - 0) d + m, rounded once, from (1024 + q - 1024).
template <int D>
struct Q41Values : PackedTile<D / kQ41Block * kQ41BlockBytes> {
  static constexpr int RB = D / kQ41Block * kQ41BlockBytes;
  using PackedTile<RB>::PackedTile;
  using PackedTile<RB>::lane;
  // Nibble bytes 0 and 2 (sel 0x4240) or 1 and 3 (0x4341) of x (low nibbles: x & 0x0F0F0F0F,
  // high ones shifted down), the two rows' (d, m) in dd and mm: q * d + m in two f16.
  __device__ static __forceinline__ uint32_t q4_half2(uint32_t x, unsigned sel, __half2 dd, __half2 mm) {
    const uint32_t e = __byte_perm(x, 0x64646464u, sel);
    const __half2 h = __hfma2(__hsub2(*reinterpret_cast<const __half2*>(&e), __float2half2_rn(1024.0f)), dd, mm);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ __forceinline__ void pv(float (&o)[D / 8][4], const uint32_t (&pa)[4], const unsigned char* vt) const {
    const int i = lane % 4, n = lane / 4;
    const unsigned char* ra = vt + 2 * i * RB;  // rows 2 i, + 1, + 8, + 9
#pragma unroll
    for (int u = 0; u < D / 32; ++u) {
      const int at = u * kQ41BlockBytes;  // 4-byte aligned
      auto dm = [&](int r) { return *reinterpret_cast<const __half2*>(ra + r * RB + at); };  // (d, m)
      auto bytes = [&](int r) { return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(ra + r * RB + at + 4 + 2 * n)); };
      const __half2 dm0 = dm(0), dm1 = dm(1), dm8 = dm(8), dm9 = dm(9);
      const __half2 d01 = __lows2half2(dm0, dm1), m01 = __highs2half2(dm0, dm1);
      const __half2 d89 = __lows2half2(dm8, dm9), m89 = __highs2half2(dm8, dm9);
      const uint32_t x01 = bytes(0) | (bytes(1) << 16), x89 = bytes(8) | (bytes(9) << 16);  // [a0 a1 b0 b1]
      const uint32_t lo01 = x01 & 0x0F0F0F0Fu, hi01 = (x01 >> 4) & 0x0F0F0F0Fu;
      const uint32_t lo89 = x89 & 0x0F0F0F0Fu, hi89 = (x89 >> 4) & 0x0F0F0F0Fu;
      const uint32_t b0[2] = {q4_half2(lo01, 0x4240, d01, m01), q4_half2(lo89, 0x4240, d89, m89)};  // dims 2 n
      const uint32_t b1[2] = {q4_half2(lo01, 0x4341, d01, m01), q4_half2(lo89, 0x4341, d89, m89)};  // 2 n + 1
      const uint32_t b2[2] = {q4_half2(hi01, 0x4240, d01, m01), q4_half2(hi89, 0x4240, d89, m89)};  // 16 + 2 n
      const uint32_t b3[2] = {q4_half2(hi01, 0x4341, d01, m01), q4_half2(hi89, 0x4341, d89, m89)};  // 17 + 2 n
      mma_f16(o[4 * u], pa, b0);
      mma_f16(o[4 * u + 1], pa, b1);
      mma_f16(o[4 * u + 2], pa, b2);
      mma_f16(o[4 * u + 3], pa, b3);
    }
  }
  // As F16Values::store; o[4 u + t][2 i + e] is column n = 2 (lane % 4) + e of n tile 4 u + t:
  // head dims 32 u + 4 c + 2 e + {0, 1} (t = 0, 1) and 16 more (t = 2, 3), c = lane % 4.
  __device__ __forceinline__ void store(float* dst, __nv_bfloat16* ob, const float (&o)[D / 8][4], int i, float f) const {
    const int c = lane % 4;
#pragma unroll
    for (int u = 0; u < D / 32; ++u)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        Q8Values<D>::store4(dst, ob, 32 * u + 16 * h + 4 * c, o[4 * u + 2 * h][2 * i] * f, o[4 * u + 2 * h + 1][2 * i] * f,
                            o[4 * u + 2 * h][2 * i + 1] * f, o[4 * u + 2 * h + 1][2 * i + 1] * f);
  }
  // The step's new row x [D] quantized by the warp, block by block, as the CPU's kv_rows.cc does.
  __device__ __forceinline__ void write_row(void* a, const float* x, size_t slot) const {
    unsigned char* r = static_cast<unsigned char*>(a) + slot * RB;
#pragma unroll
    for (int b = 0; b < D / kQ41Block; ++b) q4_1_store_block(x[b * kQ41Block + lane], r + b * kQ41BlockBytes, lane);
  }
};

template <KvType T, int D>
using MmaKeys = std::conditional_t<T == KvType::kQ8_0, Q8Keys<D>, F16Keys<D>>;
template <KvType T, int D>
using MmaValues = std::conditional_t<T == KvType::kQ8_0, Q8Values<D>, std::conditional_t<T == KvType::kQ4_1, Q41Values<D>, F16Values<D>>>;

// A K and V pair's tiles, and how many stages of them a warp keeps: about as many bytes as three
// stages of f16 rows (two tiles in flight while one is used), so that 8 blocks fit an SM: f16 3,
// Q8_0 6, f16 keys with Q4_1 values 4, Q8_0 keys with Q4_1 values 7.
template <KvType KT, KvType VT, int D>
struct MmaRows {
  using K = MmaKeys<KT, D>;
  using V = MmaValues<VT, D>;
  static constexpr size_t kStageBytes = K::kTileBytes + V::kTileBytes + kMmaDecKeys * sizeof(int32_t);
  static constexpr int kStages = KT == KvType::kF16 ? (VT == KvType::kF16 ? 3 : 4) : (VT == KvType::kQ8_0 ? 6 : 7);
  static_assert(kStages * kStageBytes <= 26624, "8 blocks an SM");
};

// A stage: the K tile, the V tile, the 16 keys' positions.
template <KvType KT, KvType VT, int D>
__host__ __device__ constexpr size_t mma_dec_smem_bytes() {
  using R = MmaRows<KT, VT, D>;
  return static_cast<size_t>(R::kStages) * R::kStageBytes;
}

template <KvType KT, KvType VT, int D, int GMAX>
__device__ __forceinline__ void decode_mma_warp(float* out, __nv_bfloat16* ob, float* ml, float* part_acc, float* part_ml, float* scores,
                                                const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w,
                                                int g, int split0, int nsplit, unsigned char* smem) {
  using R = MmaRows<KT, VT, D>;
  constexpr int kStages = R::kStages;
  constexpr size_t kStageBytes = R::kStageBytes;
  constexpr int KTB = R::K::kTileBytes, VTB = R::V::kTileBytes;  // a stage: K tile, V tile, positions
  const int lane = threadIdx.x, grp = a.grp;
  const KeyRange kr = key_range(kv, a);
  if (split0 >= kr.splits) return;
  const int split_end = min(kr.splits, split0 + nsplit);
  const typename R::K keys(kv.k, g, kv.capacity, lane);
  const typename R::V values(kv.v, g, kv.capacity, lane);
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  if (w.k != nullptr && split_end == kr.splits) {  // the last split holds the new row: it goes in first
    const size_t slot = static_cast<size_t>(g) * kv.capacity + kr.N - 1;
    keys.write_row(w.K, w.k + g * D, slot);
    values.write_row(w.V, w.v + g * D, slot);
    if (lane == 0) w.P[slot] = w.pos[0], w.M[slot] = 0.0f;
    __threadfence_block();
    __syncwarp();  // the warp's copies below read the row
  }
  // Tiles run split by split, 16 keys each, the last of a split cut at its end (the rest: zeros,
  // position INT_MAX: masked). The issue and the use of tiles each keep their split and tile by
  // counting (no division a tile).
  int is = split0, it = 0, ist = 0;  // the next tile to issue: split, tile in it, stage
  auto issue = [&]() {
    if (is < split_end) {
      const int j0 = is * kr.chunk + it * kMmaDecKeys, end = min(kr.N, (is + 1) * kr.chunk);
      unsigned char* st = smem + ist * kStageBytes;
      keys.copy(st, j0, min(kMmaDecKeys, end - j0));
      values.copy(st + KTB, j0, min(kMmaDecKeys, end - j0));
      int32_t* sp = reinterpret_cast<int32_t*>(st + KTB + VTB);
      if (lane < kMmaDecKeys) {
        if (j0 + lane < end) __pipeline_memcpy_async(sp + lane, Pg + j0 + lane, 4);
        else sp[lane] = INT_MAX;
      }
      if (j0 + kMmaDecKeys >= end) ++is, it = 0;
      else ++it;
      ist = ist + 1 == kStages ? 0 : ist + 1;
    }
    __pipeline_commit();  // an empty group past the last tile keeps the counting uniform
  };
  for (int t = 0; t < kStages - 1; ++t) issue();
  // the A operands: rows r0 = lane / 4 and r0 + 8 (heads g * grp + r; zero past grp), scaled q as f16
  const int r0 = lane / 4, c0 = (lane % 4) * 2;
  uint32_t qa[D / 16][4];
  keys.load_q(qa, q + static_cast<size_t>(g) * grp * D, grp, a.scale);
  // this lane's rows of the kept scores (null: no mass, or a row past grp)
  float* srow[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    srow[i] = scores != nullptr && r0 + 8 * i < grp ? scores + (static_cast<size_t>(g) * GMAX + r0 + 8 * i) * kv.capacity : nullptr;
  const int qp = q_pos[0];
  // Each split its own softmax. The accumulators start at zero here; a later split's are zeroed by
  // its first rescale (its m starts at -inf, so alpha is 0), which costs nothing more, where
  // zeroing them at every split's start made the compiler select each of the D / 2 at every tile.
  float o[D / 8][4], m[2], l[2];
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
  int cs = split0, ct = 0, cst = 0;  // the tile in use: split, tile in it, stage
  while (cs < split_end) {
    if (ct == 0) m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;  // a split begins
    issue();
    __pipeline_wait_prior(kStages - 1);  // this lane's copies of the tile in use have landed
    __syncwarp();                        // and every lane's
    const int j0 = cs * kr.chunk + ct * kMmaDecKeys, end = min(kr.N, (cs + 1) * kr.chunk);
    const unsigned char* st = smem + cst * kStageBytes;
    const int32_t* pt = reinterpret_cast<const int32_t*>(st + KTB + VTB);
    float s[2][4];
    keys.scores(s, qa, st);
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
    values.pv(o, pa, st + KTB);
    __syncwarp();  // the stage is refilled by a later issue()
    cst = cst + 1 == kStages ? 0 : cst + 1;
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
        values.store(out + h * D, ob != nullptr ? ob + h * D : nullptr, o, i, L > 0.0f ? 1.0f / L : 0.0f);
        if (c0 == 0) ml[2 * h] = m[i], ml[2 * h + 1] = L;
      } else {
        const size_t prow = static_cast<size_t>(split) * a.H + h;
        values.store(part_acc + prow * D, nullptr, o, i, L > 0.0f ? 1.0f : 0.0f);  // L 0: no key, o not rescaled
        if (c0 == 0) part_ml[2 * prow] = m[i], part_ml[2 * prow + 1] = L;
      }
    }
  }
}

template <KvType KT, KvType VT, int D, int GMAX>
__global__ void __launch_bounds__(32, kMmaDecBlocksPerSm) k_attn_decode_mma(float* out, float* ml, float* part_acc, float* part_ml,
                                                                          float* scores, const float* q, const int32_t* q_pos, KvView kv,
                                                                          AttnShape a, KvRowWrite w) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  decode_mma_warp<KT, VT, D, GMAX>(out, nullptr, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w, blockIdx.x, blockIdx.y, 1, dsm);
}

template <KvType KT, KvType VT, int D, int GMAX>
__global__ void __launch_bounds__(32, kMmaDecBlocksPerSm) k_attn_decode_mma_batch(DecodeBatch b, DecodeRows r, AttnShape a,
                                                                                int per_block) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  const BatchBlock k = batch_block(b, r, a);
  decode_mma_warp<KT, VT, D, GMAX>(k.out, k.out_bf16, k.ml, k.part_acc, k.part_ml, k.scores, k.q, k.q_pos, k.kv, k.a, k.w, blockIdx.x,
                              blockIdx.y * per_block, per_block, dsm);
}

template <class F>
void set_smem(F* fn, size_t bytes) {
  check(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), "decode attention smem");
}

template <KvType KT, KvType VT, int D, int GMAX>
void launch_one(Launcher& L, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) set_smem(k_attn_decode_mma<KT, VT, D, GMAX>, mma_dec_smem_bytes<KT, VT, D>()), attribute_set = true;
  L.launch(k_attn_decode_mma<KT, VT, D, GMAX>, grid, 32, mma_dec_smem_bytes<KT, VT, D>(), out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
}

template <KvType KT, KvType VT, int D, int GMAX>
void launch_batch(Launcher& L, int most, int seqs, int sms, const DecodeBatch& b, const DecodeRows& r, const AttnShape& a) {
  static bool attribute_set = false;
  if (!attribute_set) set_smem(k_attn_decode_mma_batch<KT, VT, D, GMAX>, mma_dec_smem_bytes<KT, VT, D>()), attribute_set = true;
  const int per_block = splits_per_block(most, a.G, seqs, kMmaDecBlocksPerSm * sms);
  const dim3 grid(a.G, (most + per_block - 1) / per_block, seqs);
  L.launch(k_attn_decode_mma_batch<KT, VT, D, GMAX>, grid, 32, mma_dec_smem_bytes<KT, VT, D>(), b, r, a, per_block);
}

// The instantiation for a K and V type pair, head dim and group bound: f(tag) with its KT, VT, D, GMAX.
template <KvType KT, KvType VT, int D, int GMAX>
struct Shape {
  static constexpr KvType kK = KT, kV = VT;
  static constexpr int kD = D, kGmax = GMAX;
};
template <KvType KT, KvType VT, class F>
void by_shape(int D, int gmax, F&& f) {
  if (D == 64 && gmax == 4) f(Shape<KT, VT, 64, 4>{});
  else if (D == 64) f(Shape<KT, VT, 64, 8>{});
  else if (gmax == 4) f(Shape<KT, VT, 128, 4>{});
  else f(Shape<KT, VT, 128, 8>{});
}
// The pairs served (decode_mma_serves): f16, Q8_0, and Q4_1 values beside f16 or Q8_0 keys.
template <class F>
void by_shape(KvType k, KvType v, int D, int gmax, F&& f) {
  if (k == KvType::kQ8_0) {
    if (v == KvType::kQ4_1) by_shape<KvType::kQ8_0, KvType::kQ4_1>(D, gmax, f);
    else by_shape<KvType::kQ8_0, KvType::kQ8_0>(D, gmax, f);
  } else {
    if (v == KvType::kQ4_1) by_shape<KvType::kF16, KvType::kQ4_1>(D, gmax, f);
    else by_shape<KvType::kF16, KvType::kF16>(D, gmax, f);
  }
}

}  // namespace

bool decode_mma_pair(KvType k, KvType v) {
  return (k == KvType::kF16 || k == KvType::kQ8_0) && (v == k || v == KvType::kQ4_1);
}

bool decode_mma_serves(const KvView& kv, int grp) {
  return decode_mma_pair(kv.type, kv.v_type) && (kv.head_dim == 64 || kv.head_dim == 128) && grp >= 1 && grp <= 8;
}

int decode_mma_blocks_per_sm() { return kMmaDecBlocksPerSm; }

void launch_attn_decode_mma(Launcher& L, int gmax, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                            const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  by_shape(kv.type, kv.v_type, a.D, gmax, [&](auto s) {
    using S = decltype(s);
    launch_one<S::kK, S::kV, S::kD, S::kGmax>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
  });
  if (!a.direct) launch_attn_merge(L, out, ml, part_acc, part_ml, a.H, kv, a);
}

void launch_attn_decode_mma_batch(Launcher& L, KvType k_type, KvType v_type, int gmax, int most, int seqs, int sms, const DecodeBatch& b,
                                  const DecodeRows& r, const AttnShape& a) {
  by_shape(k_type, v_type, a.D, gmax, [&](auto s) {
    using S = decltype(s);
    launch_batch<S::kK, S::kV, S::kD, S::kGmax>(L, most, seqs, sms, b, r, a);
  });
}

}  // namespace squeezekv::cuda
