#include "backend/cpu/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/prefetch.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/tile8.h"
#include "core/quant.h"
#include "core/half.h"
#if SQUEEZEKV_AVX512_KERNEL || SQUEEZEKV_BF16_KERNEL
#include "backend/cpu/gemm_avx512.h"
#endif

#include "backend/cpu/simd.h"

namespace squeezekv::cpu {

namespace ref {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    dequantize_row(w.type, w.row(r), row.data(), w.cols);
    for (int64_t t = 0; t < T; ++t) {
      double s = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(row[c]) * x[t * w.cols + c];
      out[t * w.rows + r] = static_cast<float>(s) + (bias ? bias[r] : 0.0f);
    }
  }
}

}  // namespace ref

#if SQUEEZEKV_AVX2
using simd::hsum;
#endif

#if SQUEEZEKV_AVX2
// dot()'s summation: four accumulators of 8 lanes over blocks of 32, then lanes of 8, then the
// last n % 8 values one by one. load8(i) gives the 8 weights from i as floats, tail(out, i, k)
// the k < 8 weights from i; any row format whose widening is exact sums bit-identically to dot().
template <class Load8, class Tail>
inline float dot_lanes(const Load8& load8, const Tail& tail, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(load8(i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(load8(i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(load8(i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load8(i), _mm256_loadu_ps(b + i), s0);
  float a[8];
  tail(a, i, n - i);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (int64_t j = 0; i + j < n; ++j) s += a[j] * b[i + j];
  return s;
}
#endif

float dot(const float* a, const float* b, int64_t n) {
#if SQUEEZEKV_AVX2
  return dot_lanes([a](int64_t i) { return _mm256_loadu_ps(a + i); },
                   [a](float* out, int64_t i, int64_t k) { std::copy(a + i, a + i + k, out); }, b, n);
#else
  return ref::dot(a, b, n);
#endif
}

#include "backend/cpu/row_groups.h"

namespace {

constexpr int64_t kRowBlock = 16;  // weight rows dequantized together, reused across all T
// Row-wise steps of a prompt chunk (activation rounding, RMSNorm, RoPE) run on every thread from
// this many rows (each row as alone: results do not depend on the threads); decode rows and
// small batches stay on the calling thread, where a parallel region costs more than it saves.
// (A parallel region that its `if` turns off still costs about a microsecond in libgomp, which a
// decode step pays ~200 times: the serial case is a plain loop.)
constexpr int64_t kParallelRows = 16;
template <class F>
void for_rows(int64_t n, bool parallel, F&& f) {
  if (parallel) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) f(i);
  } else {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
}

// Rows of w ahead of the one being summed that a decode kernel asks for, to ask about `bytes`
// ahead (at least one row; 0 bytes: none). The fused f32 dot asks 4 KB ahead; the 16-bit
// decode-row kernels cpu_features().half_rows_ahead bytes (4 KB on Intel CPUs, none elsewhere).
int64_t rows_ahead(const WeightMatrix& w, int64_t bytes) {
  return bytes == 0 ? 0 : std::max<int64_t>(1, bytes / static_cast<int64_t>(w.row_bytes));
}

// Per-thread dequantization buffer, grown once and reused (no allocation in steady state).
float* row_buffer(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

#if SQUEEZEKV_AVX2
// 4 weight rows x 3 tokens of dot products at once: 12 accumulators, 7 loads per 12 FMAs, so the
// loop is bound by FMA throughput rather than loads. C must be a multiple of 8.
//   out[t * R + r] for r in [0, 4), t in [0, 3); w: 4 rows of C floats at stride C; x: 3 rows at stride C
inline void dot_4x3(float* out, int64_t R, const float* w, const float* x, int64_t C) {
  __m256 a[4][3];
  for (auto& row : a)
    for (auto& v : row) v = _mm256_setzero_ps();
  for (int64_t c = 0; c < C; c += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + C + c), x2 = _mm256_loadu_ps(x + 2 * C + c);
    for (int r = 0; r < 4; ++r) {
      const __m256 wr = _mm256_loadu_ps(w + r * C + c);
      a[r][0] = _mm256_fmadd_ps(wr, x0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(wr, x1, a[r][1]);
      a[r][2] = _mm256_fmadd_ps(wr, x2, a[r][2]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < 3; ++t) out[t * R + r] = hsum(a[r][t]);
}
#endif

#if SQUEEZEKV_AVX2
// Fused dequantize-and-dot for one stored row (decode: T = 1). Each block's values are formed
// exactly as dequantize_row forms them (d * q, then + m, no contraction) and accumulated in the
// same four lanes-of-8 as dot(), so the result is bit-identical to dequantize_row + dot.
inline __m256 q_to_ps(__m128i bytes8_as_epi32_src, bool is_signed) {
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(bytes8_as_epi32_src) : _mm256_cvtepu8_epi32(bytes8_as_epi32_src));
}

// F16 / BF16 rows: converted 8 at a time (exactly) and summed by dot()'s own loop, so the result
// is bit-identical to dequantize_row + dot.
inline __m256 load8_half(DType t, const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return t == DType::F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

float dot_half(DType t, const uint16_t* w, const float* x, int64_t n) {
  return dot_lanes([t, w](int64_t i) { return load8_half(t, w + i); },
                   [t, w](float* out, int64_t i, int64_t k) {
                     if (t == DType::F16) f16_to_f32_row(out, w + i, k);
                     else bf16_to_f32_row(out, w + i, k);
                   },
                   x, n);
}

float dot_stored(DType t, const uint8_t* row, const float* x, int64_t C) {
  if (t == DType::F16 || t == DType::BF16) return dot_half(t, reinterpret_cast<const uint16_t*>(row), x, C);
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const int64_t nb = C / 32;
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    __m256 w[4];
    if (t == DType::Q8_0) {
      const uint8_t* blk = row + b * 34;
      const __m256 d = _mm256_set1_ps(f16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8))));
      for (int k = 0; k < 4; ++k)
        w[k] = _mm256_mul_ps(d, q_to_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * k)), true));
    } else {  // Q4_0 / Q4_1: low nibbles are values 0..15, high nibbles 16..31
      const bool q41 = t == DType::Q4_1;
      const uint8_t* blk = row + b * (q41 ? 20 : 18);
      const __m256 d = _mm256_set1_ps(f16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8))));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q41 ? 4 : 2)));
      const __m128i mask = _mm_set1_epi8(0x0F);
      __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
      if (!q41) {  // q - 8
        lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
        hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
      }
      const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(d, q_to_ps(parts[k], !q41));
      if (q41) {
        const __m256 m = _mm256_set1_ps(f16_to_f32(static_cast<uint16_t>(blk[2] | (blk[3] << 8))));
        for (auto& wk : w) wk = _mm256_add_ps(wk, m);
      }
    }
    for (int k = 0; k < 4; ++k) s[k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(x + 8 * k), s[k]);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
}

bool has_fused_dot(DType t) {
  return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_1 || t == DType::F16 || t == DType::BF16;
}

#endif

#if SQUEEZEKV_AVX2
// M tokens x 16 outputs with the weights packed column-major (panel[c][16]): per column, two
// panel loads and M broadcasts feed 2M FMAs, and the 16 sums land contiguous in out, with no
// horizontal additions. M = 6 uses 12 of the 16 vector registers for accumulators.
//   out[m * ldo + 0..16) = sum_c x[m * ldx + c] * panel[c][0..16)
template <int M>
inline void gemm_mx16(float* out, int64_t ldo, const float* x, int64_t ldx, const float* panel, int64_t C) {
  __m256 acc[M][2];
  // full unrolling over m keeps the accumulators in registers (GCC otherwise keeps them in memory)
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t c = 0; c < C; ++c) {
    const __m256 w0 = _mm256_loadu_ps(panel + c * 16), w1 = _mm256_loadu_ps(panel + c * 16 + 8);
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m256 b = _mm256_broadcast_ss(x + m * ldx + c);
      acc[m][0] = _mm256_fmadd_ps(b, w0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(b, w1, acc[m][1]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
    _mm256_storeu_ps(out + m * ldo, acc[m][0]);
    _mm256_storeu_ps(out + m * ldo + 8, acc[m][1]);
  }
}

// The block's rows [width][C] packed column-major into a per-thread panel [C][width] (grown once).
const float* pack_panel(const float* rows, int64_t width, int64_t C) {
  thread_local std::vector<float> panel_buf;
  if (panel_buf.size() < static_cast<size_t>(width * C)) panel_buf.resize(static_cast<size_t>(width * C));
  float* panel = panel_buf.data();
  for (int64_t c = 0; c < C; ++c)
    for (int64_t i = 0; i < width; ++i) panel[c * width + i] = rows[i * C + c];
  return panel;
}

// out[t][r0 + 0..16) for a block of exactly 16 rows in f32 (rows at stride C), every token.
void block_gemm16(float* out, int64_t R, int64_t r0, const float* rows, const float* x, int64_t T, int64_t C) {
  const float* panel = pack_panel(rows, 16, C);
  for_row_groups<6>(T, [&]<int M>(int64_t t) { gemm_mx16<M>(out + t * R + r0, R, x + t * C, C, panel, C); });
}
#endif

// Prefill blocks (T >= 6) of kWideBlock rows go to the AVX-512 kernel on CPUs that have it.
constexpr int64_t kWideBlock = 32;
bool wide_blocks(int64_t T) {
#if SQUEEZEKV_AVX512_KERNEL
  static const bool avx512 = avx512::available();
  return avx512 && T >= 6;
#else
  (void)T;
  return false;
#endif
}

// out[t][r0 + i] for a block of nr rows already in f32 (rows at stride C).
void block_dots(float* out, int64_t R, int64_t r0, const float* rows, int64_t nr, const float* x, int64_t T, int64_t C) {
  int64_t t = 0;
#if SQUEEZEKV_AVX512_KERNEL
  if (nr == kWideBlock && wide_blocks(T)) return avx512::gemm_panel32(out + r0, R, x, T, C, pack_panel(rows, kWideBlock, C));
#endif
#if SQUEEZEKV_AVX2
  if (nr == 16 && T >= 6) return block_gemm16(out, R, r0, rows, x, T, C);
  if (C % 8 == 0 && nr % 4 == 0) {
    for (; t + 3 <= T; t += 3)
      for (int64_t i = 0; i < nr; i += 4) dot_4x3(out + t * R + r0 + i, R, rows + i * C, x + t * C, C);
  }
#endif
  for (; t < T; ++t) {
    const float* xt = x + t * C;
    float* ot = out + t * R + r0;
    for (int64_t i = 0; i < nr; ++i) ot[i] = dot(rows + i * C, xt, C);
  }
}

}  // namespace

namespace {

// How one matrix of a matmul_parts call is multiplied (decided once per call).
struct PartPlan {
  bool int8 = false, tiled = false, fused = false, grouped = false, bf16 = false, bf16_rows = false, f16_rows = false;
  int64_t block = kRowBlock, n_blocks = 0;
};

// out[t][r0 + 0..32) for kWideBlock BF16 rows: the rows packed as column pairs, times the
// activations' bf16 pairs xb [T][C / 2] (PartPlan::bf16 is set only where the kernel runs); on
// CPUs with AMX tiles every row through them (tdpbf16ps), elsewhere through vdpbf16ps.
void bf16_block(float* out, int64_t R, int64_t r0, const WeightMatrix& w, const uint32_t* xb, int64_t T) {
#if SQUEEZEKV_BF16_KERNEL
  thread_local std::vector<uint32_t> panel_buf;  // grown once
  const int64_t P = w.cols / 2;
  panel_buf.resize(static_cast<size_t>(P) * kWideBlock);
  uint32_t* panel = panel_buf.data();
  avx512bf16::pack_pairs32(panel, reinterpret_cast<const uint32_t*>(w.row(r0)), static_cast<int64_t>(w.row_bytes / 4), P);
#if SQUEEZEKV_AMX_KERNEL
  if (amx::available() && amx::gemm_bf16_panel32(out + r0, R, xb, T, P, panel)) return;
#endif
  avx512bf16::gemm_panel32(out + r0, R, xb, T, P, panel);
#else
  (void)out, (void)R, (void)r0, (void)w, (void)xb, (void)T;
#endif
}

// Rows [r0, r0 + nr) of one part for every one of the T input rows.
void part_block(const MatmulPart& p, const PartPlan& plan, const float* x, const Q8Block* xq, const uint32_t* xb, int64_t T,
                bool decode, int64_t r0, int64_t nr) {
  const WeightMatrix& w = *p.w;
  float* out = p.out;
  const int64_t R = w.rows, C = w.cols;
  if (plan.bf16 && nr == kWideBlock) {  // BF16 rows as column pairs, products with bf16 activations
    bf16_block(out, R, r0, w, xb, T);
  } else if (plan.bf16_rows) {  // decode rows over BF16 rows as stored, bf16 activations
#if SQUEEZEKV_BF16_KERNEL
    avx512bf16::dot_rows(out + r0, R, xb, T, C / 2, reinterpret_cast<const uint32_t*>(w.row(r0)), static_cast<int64_t>(w.row_bytes / 4), nr,
                         rows_ahead(w, cpu_features().half_rows_ahead));
#endif
  } else if (plan.f16_rows) {  // decode rows over F16 rows as stored, 16 lanes
#if SQUEEZEKV_AVX512_KERNEL
    avx512::dot_rows_f16(out + r0, R, x, T, C, reinterpret_cast<const uint16_t*>(w.row(r0)), static_cast<int64_t>(w.row_bytes / 2), nr,
                         rows_ahead(w, cpu_features().half_rows_ahead));
#endif
  } else if (plan.grouped) {  // 16 rows unpacked once into a group tile, then every one of the T rows
    thread_local std::vector<uint8_t> group_buf;  // grown once
    group_buf.resize(static_cast<size_t>(C / 32) * kGroupBytes);
    for (int64_t i = 0; i < nr; i += kGroupRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kGroupRows, nr - i));
      const GroupKind kind = make_group16(w.type, w.row(r0 + i), w.row_bytes, rows, C, group_buf.data());
      dot_q8_group16(kind, group_buf.data(), rows, xq, C / 32, static_cast<int>(T), C, out + r0 + i, R);
    }
  } else if (plan.int8 && plan.tiled) {  // 8-row tiles (two at a time where they come in pairs): each block read once for all T rows
    int64_t i = 0;
    for (; i + 16 <= nr; i += 16)
      dot_q8_tile8x2(w.type, tile8_at(w, (r0 + i) / 8), tile8_at(w, (r0 + i) / 8 + 1), xq, C / 32, static_cast<int>(T), C,
                     out + r0 + i, R);
    for (; i < nr; i += 8)
      dot_q8_tile8(w.type, tile8_at(w, (r0 + i) / 8), xq, C / 32, static_cast<int>(T), C, out + r0 + i, R);
  } else if (plan.int8) {  // each weight row unpacked once for all T rows
    for (int64_t i = 0; i < nr; ++i)
      dot_q8_rows(w.type, w.row(r0 + i), xq, C / 32, static_cast<int>(T), C, out + r0 + i, R);
  } else if (plan.tiled) {  // f32 activations or a prompt chunk over 8-row tiles: dequantized first
    float* buf = row_buffer(static_cast<size_t>(plan.block * C));
    for (int64_t i = 0; i < nr; i += 8) dequantize_tile8(w.type, tile8_at(w, (r0 + i) / 8), C, buf + i * C, !decode);
    if (decode) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < nr; ++i) out[t * R + r0 + i] = dot(buf + i * C, x + t * C, C);
    } else {
      block_dots(out, R, r0, buf, nr, x, T, C);
    }
  } else if (plan.fused) {
#if SQUEEZEKV_AVX2
    // the rows ~4 KB ahead asked for while this one is summed (decode reads the weights once,
    // row after row; the hardware prefetcher alone left one core reading BF16 rows at ~8 GB/s, as
    // it did the 8-row tiles: tile8_kernel.h; the K formats' rows, whose unpacking bounds them,
    // gained nothing)
    const int64_t ahead = rows_ahead(w, 4096);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < nr; ++i) {
        if (t == 0 && i + ahead < nr) prefetch_row(w.row(r0 + i + ahead), w.row_bytes);
        out[t * R + r0 + i] = dot_stored(w.type, w.row(r0 + i), x + t * C, C);
      }
#endif
  } else {
    const float* rows_f32 = reinterpret_cast<const float*>(w.row(r0));
    if (w.type != DType::F32) {
      float* buf = row_buffer(static_cast<size_t>(plan.block * C));
      // prompt chunks take the SIMD dequantization (within a rounding); decode rows stay exact
      for (int64_t i = 0; i < nr; ++i) {
        if (!decode) dequantize_row_fast(w.type, w.row(r0 + i), buf + i * C, C);
        else dequantize_row(w.type, w.row(r0 + i), buf + i * C, C);
      }
      rows_f32 = buf;
    }
    if (decode) {  // dot() per row: what a one-row product does
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < nr; ++i) out[t * R + r0 + i] = dot(rows_f32 + i * C, x + t * C, C);
    } else {
      block_dots(out, R, r0, rows_f32, nr, x, T, C);
    }
  }
  if (p.bias != nullptr) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < nr; ++i) out[t * R + r0 + i] += p.bias[r0 + i];
  }
}

}  // namespace

void matmul_parts(const MatmulPart* parts, int n, const float* x, int64_t T, Activations act, RowMode rows) {
  // decode (T < 3, or rows of different sequences): with 8-bit activations, x is rounded once
  // here for every part and every block type takes integer dots on the stored rows (or 8-row
  // tiles; prompt chunks over tiles take them too, each row's sums as a one-row product's),
  // and BF16 rows meet x rounded to bf16 where the CPU has AVX-512 BF16 (avx512bf16::dot_rows);
  // in f32 (and for F16 weights always), Q8_0/Q4_0/Q4_1/F16/BF16 take fused dots;
  // neither needs a dequantization buffer. Every decode row is summed exactly as a one-row
  // product sums it, and every block of rows exactly as in a call of its own.
  const bool decode = T < 3 || rows == RowMode::kIndependent;
  constexpr int kMaxParts = 4;
  PartPlan plan[kMaxParts];
  int64_t first_block[kMaxParts + 1] = {0};
  bool any_int8 = false, any_bf16 = false;
  for (int i = 0; i < n; ++i) {
    const WeightMatrix& w = *parts[i].w;
    PartPlan& p = plan[i];
    p.tiled = w.layout == WeightLayout::kTiles8;  // blocks of rows are multiples of 8
    // prompt chunks over 8-row tiles take the integer products too (VNNI: 1.6x the f32 tiles)
    p.int8 = (decode || p.tiled) && act == Activations::kInt8 && has_q8_dot(w.type);
    // prompt chunks over rows of a block type (no tiles): group tiles unpacked per chunk
    p.grouped = !decode && !p.tiled && act == Activations::kInt8 && has_group16(w.type) && w.rows % 8 == 0;
    p.int8 = p.int8 || p.grouped;
    p.fused = p.int8;
#if SQUEEZEKV_AVX2
    p.fused = p.fused || (decode && has_fused_dot(w.type) && !p.tiled);
#endif
    // prompt chunks over BF16 rows: bf16 activations and vdpbf16ps (AMX tiles) where the CPU has them
#if SQUEEZEKV_BF16_KERNEL
    p.bf16 = !decode && act == Activations::kInt8 && w.type == DType::BF16 && w.layout == WeightLayout::kRows &&
             w.cols % 2 == 0 && avx512bf16::available();
    // decode rows over BF16 rows under 8-bit-mode activations: bf16 activations and vdpbf16ps on
    // the rows as stored (the exact f32 dot widens every weight and takes an FMA for each)
    p.bf16_rows = decode && act == Activations::kInt8 && w.type == DType::BF16 && w.layout == WeightLayout::kRows &&
                  w.cols % 2 == 0 && w.row_bytes % 4 == 0 && avx512bf16::available() && cpu_features().half_rows;
#endif
#if SQUEEZEKV_AVX512_KERNEL
    // and over F16 rows: exact products in 16 lanes (the f32 dot's AVX2 8-lane order is the
    // exact arithmetic's: f32 decode keeps it)
    p.f16_rows = decode && act == Activations::kInt8 && w.type == DType::F16 && w.layout == WeightLayout::kRows && avx512::available() &&
                 cpu_features().half_rows;
#endif
    p.block = (!decode && wide_blocks(T) && !p.grouped) || p.bf16 ? kWideBlock : kRowBlock;
    p.n_blocks = (w.rows + p.block - 1) / p.block;
    first_block[i + 1] = first_block[i] + p.n_blocks;
    any_int8 = any_int8 || p.int8;
    any_bf16 = any_bf16 || p.bf16 || p.bf16_rows;
  }
  const int64_t C = parts[0].w->cols;
  const Q8Block* xq = nullptr;
  if (any_int8) {  // one rounding of x for every part
    thread_local std::vector<Q8Block> xq_buf;  // grown once
    xq_buf.resize(static_cast<size_t>(T * (C / 32)));
    Q8Block* const xq_rows = xq_buf.data();
    for_rows(T, T >= kParallelRows, [&](int64_t t) { quantize_q8(xq_rows + t * (C / 32), x + t * C, C); });
    xq = xq_buf.data();
  }
  const uint32_t* xb = nullptr;
#if SQUEEZEKV_BF16_KERNEL
  if (any_bf16) {  // one rounding of x to bf16 pairs for every part
    thread_local std::vector<uint32_t> xb_buf;  // grown once
    xb_buf.resize(static_cast<size_t>(T * (C / 2)));
    uint32_t* const rows_b = xb_buf.data();
    for_rows(T, T >= kParallelRows, [&](int64_t t) { avx512bf16::to_bf16_pairs(rows_b + t * (C / 2), x + t * C, C); });
    xb = xb_buf.data();
  }
#else
  (void)any_bf16;
#endif
  const int64_t total = first_block[n];
  // A prompt chunk whose blocks of weight rows are too few to keep every thread busy (a small
  // model's 576-row matrices: 18 blocks of 32, against 16 threads) splits its input rows too, into
  // runs of kRunRows (the last one taking the rest), every block of every run one job. kRunRows is
  // a multiple of every kernel's group of input rows (12, 6, 4, 3) and a run has at least kRunRows,
  // so each row is summed exactly as in the whole chunk: the results do not depend on the threads.
  constexpr int64_t kRunRows = 96;
  const int64_t jobs_wanted = 4 * static_cast<int64_t>(omp_get_max_threads());
  const int64_t runs =
      decode || total >= jobs_wanted ? 1 : std::max<int64_t>(1, std::min(T / kRunRows, (jobs_wanted + total - 1) / total));
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < total * runs; ++g) {
    const int64_t b = g / runs, run = g % runs;
    int i = 0;
    while (b >= first_block[i + 1]) ++i;
    const int64_t r0 = (b - first_block[i]) * plan[i].block, nr = std::min(plan[i].block, parts[i].w->rows - r0);
    // input rows [t0, t1) (all T where runs is 1): the part's output, x and its roundings moved
    // along by t0 rows
    const int64_t t0 = run * kRunRows, t1 = run + 1 == runs ? T : t0 + kRunRows, C = parts[i].w->cols;
    MatmulPart at = parts[i];
    at.out = parts[i].out + t0 * parts[i].w->rows;
    const Q8Block* xq_at = xq != nullptr ? xq + t0 * (C / 32) : nullptr;
    const uint32_t* xb_at = xb != nullptr ? xb + t0 * (C / 2) : nullptr;
    part_block(at, plan[i], x + t0 * C, xq_at, xb_at, t1 - t0, decode, r0, nr);
  }
}

void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations act,
            RowMode rows) {
  const MatmulPart part{out, &w, bias};
  matmul_parts(&part, 1, x, T, act, rows);
}

void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps) {
  for_rows(T, T >= kParallelRows, [&](int64_t t) {
    const float* xt = x + t * E;
    float* ot = out + t * E;
    float ss = 0.0f;
    for (int64_t i = 0; i < E; ++i) ss += xt[i] * xt[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(E) + eps);
    for (int64_t i = 0; i < E; ++i) ot[i] = w[i] * (xt[i] * inv);
  });
}

void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq,
          RopePairing pairing) {
  const int half = D / 2;
  for_rows(T, T >= kParallelRows, [&](int64_t t) {
    thread_local std::vector<float> cs;  // each thread's, grown once
    cs.resize(static_cast<size_t>(D));
    for (int i = 0; i < half; ++i) {
      const float a = static_cast<float>(pos[t]) * inv_freq[i];
      cs[2 * i] = std::cos(a);
      cs[2 * i + 1] = std::sin(a);
    }
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * D;
      for (int i = 0; i < half; ++i) {
        const int i0 = pairing == RopePairing::kHalves ? i : 2 * i;
        const int i1 = pairing == RopePairing::kHalves ? i + half : 2 * i + 1;
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = b * c + a * s;
      }
    }
  });
}

namespace {

void silu_mul_serial(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
#if SQUEEZEKV_AVX2
  // silu(g) = g * sigmoid(g); with e = exp(-|g|) (never overflows), sigmoid is 1 / (1 + e) for
  // g >= 0 and e / (1 + e) below
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = simd::exp_nonpositive(_mm256_or_ps(g, sign));
    const __m256 r = _mm256_div_ps(one, _mm256_add_ps(one, e));
    const __m256 sig = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), g);  // g's sign bit picks e / (1 + e)
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// f(i0, n) over [0, n) in pieces of kPiece values (a multiple of 8, so every value takes the path,
// vector or tail, it takes in one call), on every thread from 4 pieces (prompt chunks; decode
// rows stay a plain call).
template <class F>
void for_pieces(int64_t n, F&& f) {
  constexpr int64_t kPiece = 8192;
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  for_rows(pieces, pieces >= 4, [&](int64_t i) { f(i * kPiece, std::min(kPiece, n - i * kPiece)); });
}

}  // namespace

void silu_mul(float* gate, const float* up, int64_t n) {
  for_pieces(n, [&](int64_t i0, int64_t m) { silu_mul_serial(gate + i0, up + i0, m); });
}

void add(float* x, const float* y, int64_t n) {
  for_pieces(n, [&](int64_t i0, int64_t m) {
    for (int64_t i = i0; i < i0 + m; ++i) x[i] += y[i];
  });
}

}  // namespace squeezekv::cpu
