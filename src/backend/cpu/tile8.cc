// 8-row tiles of Q4_0 / Q4_1 / Q8_0 (tile8.h): repacking, the int8 decode products, dequantization.
#include "backend/cpu/tile8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/simd.h"
#include "core/quant.h"

namespace squeezekv::cpu {

namespace {

// Offsets inside one row's stored block: scale d, min m (Q4_1), quantized bytes and their count.
struct RowBlock {
  int bytes, q_at, q_bytes;
  bool has_m;
};
constexpr RowBlock row_block(DType t) {
  return t == DType::Q4_0 ? RowBlock{18, 2, 16, false} : t == DType::Q4_1 ? RowBlock{20, 4, 16, true} : RowBlock{34, 2, 32, false};
}
// Offsets inside one tile block: d[8] at 0, m[8] at 16 (Q4_1), then the chunks q[k][8].
constexpr int tile_q_at(DType t) { return t == DType::Q4_1 ? 32 : 16; }

// Row r of block b of a tile -> the block as the file stores it (18, 20 or 34 bytes).
void untile_block(DType t, const uint8_t* blk, int r, uint8_t* out) {
  const RowBlock rb = row_block(t);
  std::memcpy(out, blk + 2 * r, 2);
  if (rb.has_m) std::memcpy(out + 2, blk + 16 + 2 * r, 2);
  const uint8_t* q = blk + tile_q_at(t);
  for (int k = 0; k < rb.q_bytes / 4; ++k) std::memcpy(out + rb.q_at + 4 * k, q + (k * 8 + r) * 4, 4);
}

}  // namespace

bool can_tile8(const WeightMatrix& w) {
  return (w.type == DType::Q4_0 || w.type == DType::Q4_1 || w.type == DType::Q8_0) && w.layout == WeightLayout::kRows &&
         w.rows % 8 == 0 && w.cols % 32 == 0 && w.rows > 0;
}

int tile8_block_bytes(DType t) { return tile_q_at(t) + 8 * row_block(t).q_bytes; }

size_t tile8_bytes(const WeightMatrix& w) {
  return static_cast<size_t>(w.rows / 8) * static_cast<size_t>(w.cols / 32) * tile8_block_bytes(w.type);
}

WeightMatrix make_tile8(const WeightMatrix& w, uint8_t* dst) {
  const RowBlock rb = row_block(w.type);
  const int tb = tile8_block_bytes(w.type), qa = tile_q_at(w.type);
  const int64_t nb = w.cols / 32;
  // one thread on purpose: an OpenMP team started here (the loading thread) would stay alive
  // beside the team of the thread that runs the steps (a server's engine thread), and libgomp
  // stops spinning between parallel regions once it manages more threads than there are cores
  for (int64_t t = 0; t < w.rows / 8; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = dst + (t * nb + b) * tb;
      for (int r = 0; r < 8; ++r) {
        const uint8_t* src = w.row(8 * t + r) + b * rb.bytes;
        std::memcpy(blk + 2 * r, src, 2);
        if (rb.has_m) std::memcpy(blk + 16 + 2 * r, src + 2, 2);
        for (int k = 0; k < rb.q_bytes / 4; ++k) std::memcpy(blk + qa + (k * 8 + r) * 4, src + rb.q_at + 4 * k, 4);
      }
    }
  }
  WeightMatrix out = w;
  out.data = dst;
  out.layout = WeightLayout::kTiles8;
  return out;
}

void dequantize_tile8(DType t, const uint8_t* tile, int64_t C, float* dst, bool fast) {
  const RowBlock rb = row_block(t);
  const int tb = tile8_block_bytes(t);
  const int64_t nb = C / 32;
  thread_local std::vector<uint8_t> row;  // one row as stored, grown once
  row.resize(static_cast<size_t>(nb * rb.bytes));
  for (int r = 0; r < 8; ++r) {
    for (int64_t b = 0; b < nb; ++b) untile_block(t, tile + b * tb, r, row.data() + b * rb.bytes);
    if (fast) dequantize_row_fast(t, row.data(), dst + r * C, C);
    else dequantize_row(t, row.data(), dst + r * C, C);
  }
}

namespace ref {

void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride) {
  const int tb = tile8_block_bytes(t), qa = tile_q_at(t);
  const int64_t nb = C / 32;
  for (int i = 0; i < n; ++i) {
    const Q8Block* xi = x + i * x_stride;
    for (int r = 0; r < 8; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = tile + b * tb;
        const float d = f16_to_f32(load_u16le(blk + 2 * r));
        int32_t isum = 0;
        for (int v = 0; v < 32; ++v) {
          int w;
          if (t == DType::Q8_0) {
            w = static_cast<int8_t>(blk[qa + ((v / 4) * 8 + r) * 4 + v % 4]);
          } else {  // value v < 16: low nibble of byte v; v >= 16: high nibble of byte v - 16
            const int byte = v % 16;
            const uint8_t q = blk[qa + ((byte / 4) * 8 + r) * 4 + byte % 4];
            w = v < 16 ? (q & 0x0F) : (q >> 4);
          }
          isum += w * xi[b].q[v];
        }
        acc = std::fma(d * xi[b].d, static_cast<float>(isum), acc);
        if (t == DType::Q4_0) acc = std::fma(-8.0f * d, xi[b].st, acc);
        if (t == DType::Q4_1) acc = std::fma(f16_to_f32(load_u16le(blk + 16 + 2 * r)), xi[b].st, acc);
      }
      out[i * out_stride + r] = acc;
    }
  }
}

}  // namespace ref

#if SQUEEZEKV_AVX2
namespace {

__attribute__((always_inline)) inline __m256i chunk_of(const int8_t* q, int c) {
  int32_t four;
  std::memcpy(&four, q + 4 * c, 4);
  return _mm256_set1_epi32(four);
}
__attribute__((always_inline)) inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
__attribute__((always_inline)) inline __m256i load_chunk(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Q4_0 / Q4_1, N activation rows. Chunk c < 4: low nibbles of q[c]; c >= 4: high nibbles of q[c - 4].
template <bool kQ41, int N>
void tile_q4(const uint8_t* tile, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr int kBlock = kQ41 ? 160 : 144, kQ = kQ41 ? 32 : 16;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, tile += kBlock) {
    __m256i sum16[N];  // every int16 lane sums at most 8 chunks x 2 x 15 x 127 = 30480: no overflow
    for (int n = 0; n < N; ++n) sum16[n] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i q = load_chunk(tile + kQ + 32 * k);
      const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      for (int n = 0; n < N; ++n) {
        const int8_t* xq = x[n * x_stride].q;
        sum16[n] = _mm256_add_epi16(sum16[n], _mm256_maddubs_epi16(lo, chunk_of(xq, k)));
        sum16[n] = _mm256_add_epi16(sum16[n], _mm256_maddubs_epi16(hi, chunk_of(xq, k + 4)));
      }
    }
    const __m256 d = f16x8(tile);
    const __m256 mn = kQ41 ? f16x8(tile + 16) : _mm256_mul_ps(_mm256_set1_ps(-8.0f), d);
    for (int n = 0; n < N; ++n) {
      const Q8Block& xn = x[n * x_stride];
      const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sum16[n], ones));
      acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xn.d)), isum, acc[n]);
      acc[n] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xn.st), acc[n]);
    }
  }
  for (int n = 0; n < N; ++n) _mm256_storeu_ps(out + n * out_stride, acc[n]);
}

// Q8_0, N activation rows: maddubs takes |w| and x with w's sign; int32 sums per chunk.
template <int N>
void tile_q8(const uint8_t* tile, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr int kBlock = 272, kQ = 16;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, tile += kBlock) {
    __m256i sum32[N];
    for (int n = 0; n < N; ++n) sum32[n] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i w = load_chunk(tile + kQ + 32 * c);
      const __m256i wabs = _mm256_sign_epi8(w, w);
      for (int n = 0; n < N; ++n) {
        const __m256i xs = _mm256_sign_epi8(chunk_of(x[n * x_stride].q, c), w);
        sum32[n] = _mm256_add_epi32(sum32[n], _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, xs), ones));
      }
    }
    const __m256 d = f16x8(tile);
    for (int n = 0; n < N; ++n)
      acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x[n * x_stride].d)), _mm256_cvtepi32_ps(sum32[n]), acc[n]);
  }
  for (int n = 0; n < N; ++n) _mm256_storeu_ps(out + n * out_stride, acc[n]);
}

template <int N>
void tile_n(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  if (t == DType::Q4_0) tile_q4<false, N>(tile, x, x_stride, C, out, out_stride);
  else if (t == DType::Q4_1) tile_q4<true, N>(tile, x, x_stride, C, out, out_stride);
  else tile_q8<N>(tile, x, x_stride, C, out, out_stride);
}

}  // namespace

void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride) {
  int i = 0;
  for (; i + 4 <= n; i += 4) tile_n<4>(t, tile, x + i * x_stride, x_stride, C, out + i * out_stride, out_stride);
  switch (n - i) {
    case 3: return tile_n<3>(t, tile, x + i * x_stride, x_stride, C, out + i * out_stride, out_stride);
    case 2: return tile_n<2>(t, tile, x + i * x_stride, x_stride, C, out + i * out_stride, out_stride);
    case 1: return tile_n<1>(t, tile, x + i * x_stride, x_stride, C, out + i * out_stride, out_stride);
    default: return;
  }
}

#else

void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride) {
  ref::dot_q8_tile8(t, tile, x, x_stride, n, C, out, out_stride);
}

#endif

}  // namespace squeezekv::cpu
