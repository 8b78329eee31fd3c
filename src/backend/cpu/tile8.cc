// 8-row tiles of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL (tile8.h): repacking, int8 products,
// dequantization.
#include "backend/cpu/tile8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/simd.h"
#include "core/quant.h"

namespace squeezekv::cpu {

namespace {

// Offsets inside one row's stored block: scale d at 0, then (Q4_1, Q5_1) the f16 min m, then
// (Q5_0, Q5_1) the 32 high bits qh, then the quantized bytes and their count.
struct RowBlock {
  int bytes, m_bytes, qh_bytes, q_at, q_bytes;
};
constexpr RowBlock row_block(DType t) {
  return t == DType::Q4_0 || t == DType::IQ4_NL ? RowBlock{18, 0, 0, 2, 16}
         : t == DType::Q4_1                     ? RowBlock{20, 2, 0, 4, 16}
         : t == DType::Q5_0                     ? RowBlock{22, 0, 4, 6, 16}
         : t == DType::Q5_1                     ? RowBlock{24, 2, 4, 8, 16}
                                                : RowBlock{34, 0, 0, 2, 32};
}
// Offsets inside one tile block: d[8] at 0, then m[8], then qh[8] (where the type has them), then
// the chunks q[k][8].
constexpr int tile_m_at() { return 16; }
constexpr int tile_qh_at(DType t) { return 16 + 8 * row_block(t).m_bytes; }
constexpr int tile_q_at(DType t) { return tile_qh_at(t) + 8 * row_block(t).qh_bytes; }

// Q5_0's and Q5_1's high bits in a tile: qh (bit v: value v's fifth bit) transposed so that byte
// j, bit c holds bit 4c + j, the fifth bit of chunk c's byte j (chunks c < 4: low nibbles of bytes
// 4c..; c >= 4: high nibbles of bytes 4(c - 4)..). A kernel then takes chunk c's fifth bits into
// bit 4 of each byte with one 16-bit shift (by 4 - c or c - 4) and one mask.
uint32_t transpose_qh(uint32_t qh) {
  uint32_t t = 0;
  for (int v = 0; v < 32; ++v) t |= ((qh >> v) & 1u) << (8 * (v % 4) + v / 4);
  return t;
}
uint32_t untranspose_qh(uint32_t t) {
  uint32_t qh = 0;
  for (int v = 0; v < 32; ++v) qh |= ((t >> (8 * (v % 4) + v / 4)) & 1u) << v;
  return qh;
}

// Row r of block b of a tile -> the block as the file stores it (18, 20, 22, 24 or 34 bytes).
void untile_block(DType t, const uint8_t* blk, int r, uint8_t* out) {
  const RowBlock rb = row_block(t);
  std::memcpy(out, blk + 2 * r, 2);
  std::memcpy(out + 2, blk + tile_m_at() + 2 * r, rb.m_bytes);
  if (rb.qh_bytes > 0) {
    const uint32_t qh = untranspose_qh(load_u32le(blk + tile_qh_at(t) + 4 * r));
    for (int i = 0; i < 4; ++i) out[2 + rb.m_bytes + i] = static_cast<uint8_t>(qh >> (8 * i));
  }
  const uint8_t* q = blk + tile_q_at(t);
  for (int k = 0; k < rb.q_bytes / 4; ++k) std::memcpy(out + rb.q_at + 4 * k, q + (k * 8 + r) * 4, 4);
}

}  // namespace

bool can_tile8(const WeightMatrix& w) {
  return (w.type == DType::Q4_0 || w.type == DType::Q4_1 || w.type == DType::Q5_0 || w.type == DType::Q5_1 ||
          w.type == DType::Q8_0 || w.type == DType::IQ4_NL) &&
         w.layout == WeightLayout::kRows &&
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
        std::memcpy(blk + tile_m_at() + 2 * r, src + 2, rb.m_bytes);
        if (rb.qh_bytes > 0) {
          const uint32_t t = transpose_qh(load_u32le(src + 2 + rb.m_bytes));
          for (int i = 0; i < 4; ++i) blk[tile_qh_at(w.type) + 4 * r + i] = static_cast<uint8_t>(t >> (8 * i));
        }
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
            if (t == DType::IQ4_NL) w = kIq4Values[w] + 128;  // the grid value, offset to be unsigned
            if (row_block(t).qh_bytes > 0)  // the fifth bit, from the transposed qh
              w |= static_cast<int>((blk[tile_qh_at(t) + 4 * r + v % 4] >> (v / 4)) & 1) << 4;
          }
          isum += w * xi[b].q[v];
        }
        acc = std::fma(d * xi[b].d, static_cast<float>(isum), acc);
        if (t == DType::Q4_0) acc = std::fma(-8.0f * d, xi[b].st, acc);
        if (t == DType::Q5_0) acc = std::fma(-16.0f * d, xi[b].st, acc);
        if (t == DType::IQ4_NL) acc = std::fma(-128.0f * d, xi[b].st, acc);
        if (t == DType::Q4_1 || t == DType::Q5_1) acc = std::fma(f16_to_f32(load_u16le(blk + tile_m_at() + 2 * r)), xi[b].st, acc);
      }
      out[i * out_stride + r] = acc;
    }
  }
}

void dot_q8_group16(GroupKind kind, const uint8_t* g, int rows, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride) {
  for (int i = 0; i < n; ++i) {
    const Q8Block* xi = x + i * x_stride;
    for (int r = 0; r < rows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < C / 32; ++b) {
        const uint8_t* gb = g + b * kGroupBytes;
        const float* sc = reinterpret_cast<const float*>(gb + 8 * 4 * kGroupRows);
        int32_t isum[2] = {0, 0};
        for (int v = 0; v < 32; ++v) {
          const uint8_t byte = gb[((v / 4) * kGroupRows + r) * 4 + v % 4];
          const int w = kind.is_signed ? static_cast<int8_t>(byte) : byte;
          isum[kind.uniform ? 0 : v / 16] += w * xi[b].q[v];
        }
        const float dx = xi[b].d;
        acc = std::fma(sc[r] * dx, static_cast<float>(isum[0]), acc);
        if (kind.uniform) {
          acc = std::fma(sc[2 * kGroupRows + r], xi[b].st, acc);
        } else {
          acc = std::fma(sc[kGroupRows + r] * dx, static_cast<float>(isum[1]), acc);
          acc = std::fma(sc[2 * kGroupRows + r], xi[b].s[0], acc);
          acc = std::fma(sc[3 * kGroupRows + r], xi[b].s[1], acc);
        }
      }
      out[i * out_stride + r] = acc;
    }
  }
}

}  // namespace ref

#if SQUEEZEKV_AVX2
namespace {

// AVX2 integer dots: Q4 products summed in int16 lanes (8 chunks x 2 x 15 x 127 = 30480 fits),
// widened once per block (Q5 values: once per 4 chunks, tile_q4); Q8_0 products widened per chunk
// (2 x 127 x 127 per lane leaves no room).
struct MaddubsQ4 {
  static constexpr bool kSums16 = true;
  static __m256i zero() { return _mm256_setzero_si256(); }
  static __m256i add(__m256i acc, __m256i w, __m256i x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)); }
  static __m256i finish(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
};
struct MaddubsQ8 {
  static constexpr bool kSums16 = false;
  static __m256i zero() { return _mm256_setzero_si256(); }
  static __m256i add(__m256i acc, __m256i w, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
  static __m256i finish(__m256i acc) { return acc; }
};

}  // namespace
#include "backend/cpu/tile8_kernel.h"

void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride) {
#if SQUEEZEKV_VNNI_KERNEL
  if (cpu_features().avx512vnni) return vnni::dot_q8_tile8(t, tile, x, x_stride, n, C, out, out_stride);
#endif
  tile8_products<MaddubsQ4, MaddubsQ8>(t, tile, x, x_stride, n, C, out, out_stride);
}

void dot_q8_tile8x2(DType t, const uint8_t* tile_a, const uint8_t* tile_b, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride) {
#if SQUEEZEKV_VNNI_KERNEL
  if (cpu_features().avx512vnni) return vnni::dot_q8_tile8x2(t, tile_a, tile_b, x, x_stride, n, C, out, out_stride);
#endif
  dot_q8_tile8(t, tile_a, x, x_stride, n, C, out, out_stride);
  dot_q8_tile8(t, tile_b, x, x_stride, n, C, out + 8, out_stride);
}

void dot_q8_group16(GroupKind kind, const uint8_t* g, int rows, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride) {
#if SQUEEZEKV_VNNI_KERNEL
  if (cpu_features().avx512vnni) return vnni::dot_q8_group16(kind, g, rows, x, x_stride, n, C, out, out_stride);
#endif
  for (int half = 0; half < rows / 8; ++half)
    group8_products<MaddubsQ8, 4>(kind, g, half, x, x_stride, n, C, out + 8 * half, out_stride);
}

#else

void dot_q8_tile8(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                  int64_t out_stride) {
  ref::dot_q8_tile8(t, tile, x, x_stride, n, C, out, out_stride);
}

void dot_q8_tile8x2(DType t, const uint8_t* tile_a, const uint8_t* tile_b, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride) {
  ref::dot_q8_tile8(t, tile_a, x, x_stride, n, C, out, out_stride);
  ref::dot_q8_tile8(t, tile_b, x, x_stride, n, C, out + 8, out_stride);
}

void dot_q8_group16(GroupKind kind, const uint8_t* g, int rows, const Q8Block* x, int64_t x_stride, int n, int64_t C,
                    float* out, int64_t out_stride) {
  ref::dot_q8_group16(kind, g, rows, x, x_stride, n, C, out, out_stride);
}

#endif

}  // namespace squeezekv::cpu
