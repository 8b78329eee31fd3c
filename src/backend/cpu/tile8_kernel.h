#pragma once
// The 8-row tile products (tile8.h) as templates over the integer dot of 4-byte groups, included
// by tile8.cc (AVX2 maddubs) and tile8_vnni.cc (AVX-512 VNNI dpbusd). Everything here has
// internal linkage: each including file, compiled for its own instruction set, has its own copy
// (a shared inline copy could be taken from the AVX-512 file into an AVX2-only path).
// A Dot policy: zero(), add(acc, w_unsigned_bytes, x_signed_bytes) summing each 4-byte group's
// products into its 32-bit lane (exactly), finish(acc) -> the int32 lane sums; kSums16: the sums
// are 16-bit until finish (AVX2's maddubs), so only a few adds fit.
// Include after <immintrin.h> inside namespace squeezekv::cpu.
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

// Q5_0's / Q5_1's fifth bits of chunk c (0..7) of 8 rows, from the tile's transposed qh words
// (tile8.h): bit c of every byte moved to bit 4 by one 16-bit shift, the rest masked off.
__attribute__((always_inline)) inline __m256i fifth_bits(__m256i qh, int c) {
  const __m256i v = c < 4 ? _mm256_slli_epi16(qh, 4 - c) : _mm256_srli_epi16(qh, c - 4);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// The weights' lines kTilePrefetch blocks ahead of the one being read (past a tile's end: the next
// tile, which the same thread reads next).
constexpr int kTilePrefetch = 16;
__attribute__((always_inline)) inline void tile_prefetch(const uint8_t* block, int block_bytes) {
  for (int off = 0; off < block_bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(block + kTilePrefetch * block_bytes + off), _MM_HINT_T0);
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1, N activation rows. Chunk c < 4: low nibbles of q[c]; c >= 4: high
// nibbles of q[c - 4]; the 5-bit types OR in each value's fifth bit (values 0..31, unsigned for the
// products). Min term: Q4_0 -8 d, Q5_0 -16 d, Q4_1 / Q5_1 the stored m. The chunk products go
// through Dot's sums, which with AVX2's maddubs are 16-bit: all 8 chunks fit for 4-bit values
// (8 x 2 x 15 x 128 < 2^15), two chunk pairs for 5-bit ones (4 x 2 x 31 x 128 < 2^15), then widen
// into the block's 32-bit sums.
template <class Dot, DType kType, int N>
__attribute__((always_inline)) inline void tile_q4(const uint8_t* tile, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr bool kQ5 = kType == DType::Q5_0 || kType == DType::Q5_1;
  constexpr bool kMin = kType == DType::Q4_1 || kType == DType::Q5_1;  // a stored min m after d
  constexpr int kQh = kMin ? 32 : 16, kQ = kQh + (kQ5 ? 32 : 0), kBlock = kQ + 128;
  constexpr int kPass = kQ5 && Dot::kSums16 ? 2 : 4;  // chunk pairs per pass through Dot's sums
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, tile += kBlock) {
    tile_prefetch(tile, kBlock);
    [[maybe_unused]] const __m256i qh = kQ5 ? load_chunk(tile + kQh) : low;
    __m256i sum[N];
#pragma GCC unroll 2
    for (int k0 = 0; k0 < 4; k0 += kPass) {
      __m256i part[N];
      for (int n = 0; n < N; ++n) part[n] = Dot::zero();
#pragma GCC unroll 4
      for (int k = k0; k < k0 + kPass; ++k) {
        const __m256i q = load_chunk(tile + kQ + 32 * k);
        __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        if constexpr (kQ5) lo = _mm256_or_si256(lo, fifth_bits(qh, k)), hi = _mm256_or_si256(hi, fifth_bits(qh, k + 4));
        for (int n = 0; n < N; ++n) {
          const int8_t* xq = x[n * x_stride].q;
          part[n] = Dot::add(part[n], lo, chunk_of(xq, k));
          part[n] = Dot::add(part[n], hi, chunk_of(xq, k + 4));
        }
      }
      for (int n = 0; n < N; ++n) sum[n] = k0 == 0 ? Dot::finish(part[n]) : _mm256_add_epi32(sum[n], Dot::finish(part[n]));
    }
    const __m256 d = f16x8(tile);
    const __m256 mn = kMin ? f16x8(tile + 16) : _mm256_mul_ps(_mm256_set1_ps(kQ5 ? -16.0f : -8.0f), d);
    for (int n = 0; n < N; ++n) {
      const Q8Block& xn = x[n * x_stride];
      const __m256 isum = _mm256_cvtepi32_ps(sum[n]);
      acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xn.d)), isum, acc[n]);
      acc[n] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xn.st), acc[n]);
    }
  }
  for (int n = 0; n < N; ++n) _mm256_storeu_ps(out + n * out_stride, acc[n]);
}

// Q8_0, N activation rows: maddubs takes |w| and x with w's sign; int32 sums per chunk.
template <class Dot, int N>
void tile_q8(const uint8_t* tile, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr int kBlock = 272, kQ = 16;
  __m256 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, tile += kBlock) {
    tile_prefetch(tile, kBlock);
    __m256i sum32[N];
    for (int n = 0; n < N; ++n) sum32[n] = Dot::zero();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i w = load_chunk(tile + kQ + 32 * c);
      const __m256i wabs = _mm256_sign_epi8(w, w);
      for (int n = 0; n < N; ++n) {
        const __m256i xs = _mm256_sign_epi8(chunk_of(x[n * x_stride].q, c), w);
        sum32[n] = Dot::add(sum32[n], wabs, xs);
      }
    }
    const __m256 d = f16x8(tile);
    for (int n = 0; n < N; ++n)
      acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x[n * x_stride].d)), _mm256_cvtepi32_ps(Dot::finish(sum32[n])), acc[n]);
  }
  for (int n = 0; n < N; ++n) _mm256_storeu_ps(out + n * out_stride, acc[n]);
}

// IQ4_NL, N activation rows: each nibble looked up in the format's grid (kIq4Values) as a signed
// byte w, the products taken as Q8_0's (|w| and x with w's sign), then 128 x the activations' sum
// added: the block's integer is the sum of (w + 128) x, which the 512-bit kernel forms in one
// dpbusd, and the floats follow Q4_0's recipe with the offset's term -128 d.
template <class Dot, int N>
void tile_iq4(const uint8_t* tile, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  constexpr int kBlock = 144, kQ = 16;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
  __m256 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, tile += kBlock) {
    __m256i sum[N];
    for (int n = 0; n < N; ++n) sum[n] = Dot::zero();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i q = load_chunk(tile + kQ + 32 * k);
      const __m256i lo = _mm256_shuffle_epi8(grid, _mm256_and_si256(q, low));
      const __m256i hi = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(q, 4), low));
      const __m256i lo_abs = _mm256_sign_epi8(lo, lo), hi_abs = _mm256_sign_epi8(hi, hi);
      for (int n = 0; n < N; ++n) {
        const int8_t* xq = x[n * x_stride].q;
        sum[n] = Dot::add(sum[n], lo_abs, _mm256_sign_epi8(chunk_of(xq, k), lo));
        sum[n] = Dot::add(sum[n], hi_abs, _mm256_sign_epi8(chunk_of(xq, k + 4), hi));
      }
    }
    const __m256 d = f16x8(tile);
    const __m256 mn = _mm256_mul_ps(_mm256_set1_ps(-128.0f), d);
    for (int n = 0; n < N; ++n) {
      const Q8Block& xn = x[n * x_stride];
      const __m256i isum = _mm256_add_epi32(Dot::finish(sum[n]), _mm256_set1_epi32(128 * xn.qsum));
      acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xn.d)), _mm256_cvtepi32_ps(isum), acc[n]);
      acc[n] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xn.st), acc[n]);
    }
  }
  for (int n = 0; n < N; ++n) _mm256_storeu_ps(out + n * out_stride, acc[n]);
}

template <class DotQ4, class DotQ8, int N>
void tile_n(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  if (t == DType::Q4_0) tile_q4<DotQ4, DType::Q4_0, N>(tile, x, x_stride, C, out, out_stride);
  else if (t == DType::Q4_1) tile_q4<DotQ4, DType::Q4_1, N>(tile, x, x_stride, C, out, out_stride);
  else if (t == DType::Q5_0) tile_q4<DotQ4, DType::Q5_0, N>(tile, x, x_stride, C, out, out_stride);
  else if (t == DType::Q5_1) tile_q4<DotQ4, DType::Q5_1, N>(tile, x, x_stride, C, out, out_stride);
  else if (t == DType::IQ4_NL) tile_iq4<DotQ8, N>(tile, x, x_stride, C, out, out_stride);
  else tile_q8<DotQ8, N>(tile, x, x_stride, C, out, out_stride);
}

// Group tiles (tile8.h), rows [8 half, 8 half + 8) of the 16, N activation rows. Signed bytes
// take Q8_0's sign trick; the halves' integer sums are kept apart unless the halves share their
// scale and offset.
template <class Dot, bool kSigned, bool kUniform, int N>
void group_n(const uint8_t* g, int half, const Q8Block* x, int64_t x_stride, int64_t C, float* out, int64_t out_stride) {
  __m256 acc[N];
  for (int n = 0; n < N; ++n) acc[n] = _mm256_setzero_ps();
  for (int64_t b = 0; b < C / 32; ++b, ++x, g += kGroupBytes) {
    __m256i s0[N], s1[N];
    for (int n = 0; n < N; ++n) s0[n] = s1[n] = Dot::zero();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i w = load_chunk(g + k * 4 * kGroupRows + 32 * half);
      const __m256i wu = kSigned ? _mm256_sign_epi8(w, w) : w;
      for (int n = 0; n < N; ++n) {
        __m256i xc = chunk_of(x[n * x_stride].q, k);
        if constexpr (kSigned) xc = _mm256_sign_epi8(xc, w);
        if (kUniform || k < 4) s0[n] = Dot::add(s0[n], wu, xc);
        else s1[n] = Dot::add(s1[n], wu, xc);
      }
    }
    const float* sc = reinterpret_cast<const float*>(g + 8 * 4 * kGroupRows) + 8 * half;
    const __m256 sc0 = _mm256_loadu_ps(sc), sc1 = _mm256_loadu_ps(sc + kGroupRows);
    const __m256 mn0 = _mm256_loadu_ps(sc + 2 * kGroupRows), mn1 = _mm256_loadu_ps(sc + 3 * kGroupRows);
    for (int n = 0; n < N; ++n) {
      const Q8Block& xn = x[n * x_stride];
      const __m256 dx = _mm256_set1_ps(xn.d);
      acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(sc0, dx), _mm256_cvtepi32_ps(Dot::finish(s0[n])), acc[n]);
      if constexpr (kUniform) {
        acc[n] = _mm256_fmadd_ps(mn0, _mm256_set1_ps(xn.st), acc[n]);
      } else {
        acc[n] = _mm256_fmadd_ps(_mm256_mul_ps(sc1, dx), _mm256_cvtepi32_ps(Dot::finish(s1[n])), acc[n]);
        acc[n] = _mm256_fmadd_ps(mn0, _mm256_set1_ps(xn.s[0]), acc[n]);
        acc[n] = _mm256_fmadd_ps(mn1, _mm256_set1_ps(xn.s[1]), acc[n]);
      }
    }
  }
  for (int n = 0; n < N; ++n) _mm256_storeu_ps(out + n * out_stride, acc[n]);
}

// n activation rows of 8 rows of a group tile, in groups of up to kMaxN.
template <class Dot, bool kSigned, bool kUniform, int kMaxN>
void group_rows(const uint8_t* g, int half, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out, int64_t out_stride) {
  int i = 0;
  auto one = [&]<int N>(int at) { group_n<Dot, kSigned, kUniform, N>(g, half, x + at * x_stride, x_stride, C, out + at * out_stride, out_stride); };
  if constexpr (kMaxN == 8)
    for (; i + 8 <= n; i += 8) one.template operator()<8>(i);
  for (; i + 4 <= n; i += 4) one.template operator()<4>(i);
  for (; i < n; ++i) one.template operator()<1>(i);
}

template <class Dot, int kMaxN>
void group8_products(GroupKind kind, const uint8_t* g, int half, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                     int64_t out_stride) {
  if (kind.is_signed && kind.uniform) group_rows<Dot, true, true, kMaxN>(g, half, x, x_stride, n, C, out, out_stride);
  else if (kind.is_signed) group_rows<Dot, true, false, kMaxN>(g, half, x, x_stride, n, C, out, out_stride);
  else if (kind.uniform) group_rows<Dot, false, true, kMaxN>(g, half, x, x_stride, n, C, out, out_stride);
  else group_rows<Dot, false, false, kMaxN>(g, half, x, x_stride, n, C, out, out_stride);
}

// n activation rows in groups of up to kMaxN (each weight chunk unpacked once per group): 4 with
// AVX2's 16 vector registers, 8 with AVX-512's 32; the rest in one pass of its own width (6 rows:
// one pass over the weights, not 4 + 2). A row's sums do not depend on its group.
template <class DotQ4, class DotQ8, int kMaxN = 4>
void tile8_products(DType t, const uint8_t* tile, const Q8Block* x, int64_t x_stride, int n, int64_t C, float* out,
                    int64_t out_stride) {
  int i = 0;
  for (; i + kMaxN <= n; i += kMaxN) tile_n<DotQ4, DotQ8, kMaxN>(t, tile, x + i * x_stride, x_stride, C, out + i * out_stride, out_stride);
  auto rest = [&]<int N>() {
    if constexpr (N < kMaxN) tile_n<DotQ4, DotQ8, N>(t, tile, x + i * x_stride, x_stride, C, out + i * out_stride, out_stride);
  };
  switch (n - i) {
    case 7: return rest.template operator()<7>();
    case 6: return rest.template operator()<6>();
    case 5: return rest.template operator()<5>();
    case 4: return rest.template operator()<4>();
    case 3: return rest.template operator()<3>();
    case 2: return rest.template operator()<2>();
    case 1: return rest.template operator()<1>();
    default: return;
  }
}

}  // namespace
