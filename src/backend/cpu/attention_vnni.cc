// Q8_0 keys' scores against 8-bit queries with AVX-512 VNNI (attention_tile.h Q8ScoresFn), 16 keys
// at once: their 64 int8 values loaded as 16 registers and transposed as 16 x 16 dwords, so that
// register j holds dims 4j..4j+3 of every key; per query row 16 vpdpbusd (the keys offset by 128
// as unsigned bytes, the query's 4 bytes broadcast) sum each key's exact integer products of a
// block in its own lane, so no (row, key) product needs a horizontal sum. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni; chosen only where cpu_features().avx512vnni.
#include <immintrin.h>

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's 512-bit intrinsics (tile8_vnni.cc)
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cstdint>
#include <cstring>

#include "backend/cpu/attention_tile.h"
#include "backend/cpu/cpu_features.h"

namespace squeezekv::cpu::attn {
namespace {

// x[i] lane j -> x[j] lane i (16 x 16 dwords).
__attribute__((always_inline)) inline void transpose16(__m512i* x) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    x[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]), x[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    x[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]), x[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {  // the 128-bit lanes of registers i, i + 4, i + 8, i + 12
    const __m512i ab_lo = _mm512_shuffle_i32x4(x[i], x[i + 4], 0x88), ab_hi = _mm512_shuffle_i32x4(x[i], x[i + 4], 0xDD);
    const __m512i cd_lo = _mm512_shuffle_i32x4(x[i + 8], x[i + 12], 0x88), cd_hi = _mm512_shuffle_i32x4(x[i + 8], x[i + 12], 0xDD);
    x[i] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88), x[i + 8] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
    x[i + 4] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88), x[i + 12] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
  }
}

// A Q8_0 row of 64 values: [f16 d0][32 int8][f16 d1][32 int8].
constexpr int kBlockBytes = dtype_info(DType::Q8_0).block_bytes;

void scores16(float* s, int64_t s_stride, const Q8Query* q, int rows, const uint8_t* k, int64_t kb) {
  __m512i x[16];
  for (int i = 0; i < 16; ++i) {
    const uint8_t* row = k + i * kb;
    x[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + kBlockBytes + 2)), 1);
  }
  transpose16(x);
  const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int j = 0; j < 16; ++j) x[j] = _mm512_xor_si512(x[j], top);  // k + 128, unsigned
  // the 16 keys' two scales: the dword at each row's start (d0) and at its second block (d1)
  const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(static_cast<int>(kb)));
  const __m512 d0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(at, k, 1)));
  const __m512 d1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(at, k + kBlockBytes, 1)));
  for (int r = 0; r < rows; ++r) {
    const Q8Query& qr = q[r];
    __m512i i0 = _mm512_setzero_si512(), i1 = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      int32_t w0, w1;
      std::memcpy(&w0, qr.b[0].q + 4 * j, 4);
      std::memcpy(&w1, qr.b[1].q + 4 * j, 4);
      i0 = _mm512_dpbusd_epi32(i0, x[j], _mm512_set1_epi32(w0));
      i1 = _mm512_dpbusd_epi32(i1, x[8 + j], _mm512_set1_epi32(w1));
    }
    i0 = _mm512_sub_epi32(i0, _mm512_set1_epi32(128 * qr.b[0].qsum));  // (k + 128) q less 128 q
    i1 = _mm512_sub_epi32(i1, _mm512_set1_epi32(128 * qr.b[1].qsum));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(d0, _mm512_set1_ps(qr.d[0])));
    v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(d1, _mm512_set1_ps(qr.d[1])), v);
    _mm512_storeu_ps(s + r * s_stride, v);
  }
}

}  // namespace

Q8ScoresFn vnni_q8_scores16() { return cpu_features().avx512vnni ? scores16 : nullptr; }

}  // namespace squeezekv::cpu::attn
