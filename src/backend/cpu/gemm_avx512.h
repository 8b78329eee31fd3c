// The matrix kernels beyond AVX2: AVX-512 prompt products (gemm_avx512.cc; BF16 weights, prompt
// and decode: gemm_bf16.cc) and AMX tiles (BF16 weights: gemm_amx.cc), called only where their
// available() is true.
#pragma once
#include <cstdint>

namespace squeezekv::cpu::avx512 {

// True when this CPU runs AVX-512F, the kernel was built, and SQUEEZEKV_CPU allows it (cpu_features.h).
bool available();

// out[t * ldo + 0..32) = sum_c x[t * C + c] * panel[c * 32 + 0..32) for t in [0, T).
//   panel: 32 weight rows packed column-major [C][32].
void gemm_panel32(float* out, int64_t ldo, const float* x, int64_t T, int64_t C, const float* panel);

// out[t * ldo + i] = sum_c x[t * C + c] * f16(rows[i * stride + c]) for i in [0, nr), t in
// [0, T): F16 weight rows as stored, every value widened exactly and multiplied in f32 in 16
// lanes, each (row, t) summed alone in one fixed order whatever nr and T are (decode rows).
// ahead: as avx512bf16::dot_rows's.
void dot_rows_f16(float* out, int64_t ldo, const float* x, int64_t T, int64_t C, const uint16_t* rows, int64_t stride, int64_t nr,
                  int64_t ahead = 0);

}  // namespace squeezekv::cpu::avx512

namespace squeezekv::cpu::avx512bf16 {

// True when this CPU runs AVX-512 BF16, the kernel was built, and SQUEEZEKV_CPU allows it.
bool available();

// out[n / 2] <- x[n] (n even) as pairs of bf16 (rounded to nearest even), element 2i in the low half.
void to_bf16_pairs(uint32_t* out, const float* x, int64_t n);

// panel[p * 32 + i] <- rows[i * stride + p] for 32 rows of P entries (a BF16 pair each): 32 weight
// rows as the column pairs gemm_panel32 reads (and AMX's B tiles: amx.h).
void pack_pairs32(uint32_t* panel, const uint32_t* rows, int64_t stride, int64_t P);

// out[t * ldo + 0..32) = sum_p x[t * P + p] . panel[p * 32 + 0..32) for t in [0, T): each term a
// pair of bf16 products (vdpbf16ps), P = columns / 2.
//   panel: 32 BF16 weight rows as column pairs [P][32] (row r's columns 2p, 2p + 1 in entry r).
void gemm_panel32(float* out, int64_t ldo, const uint32_t* x, int64_t T, int64_t P, const uint32_t* panel);

// out[t * ldo + i] = sum_p x[t * P + p] . rows[i * stride + p] for i in [0, nr), t in [0, T): BF16
// weight rows as stored (a row's columns 2p, 2p + 1 are its entry p), no packing, each (row, t)
// summed alone in one fixed order whatever nr and T are: the decode products (one pass over the
// weights a step, where packing them would be a second). ahead > 0: row i + ahead's lines are
// asked for (software prefetch) before row i is summed (cpu_features.h: 4 KB on Intel CPUs).
void dot_rows(float* out, int64_t ldo, const uint32_t* x, int64_t T, int64_t P, const uint32_t* rows, int64_t stride, int64_t nr,
              int64_t ahead = 0);

}  // namespace squeezekv::cpu::avx512bf16

namespace squeezekv::cpu::amx {

// True when this CPU has AMX tiles with BF16 products, Linux lets this process use them, the kernel
// was built, and SQUEEZEKV_CPU allows it (cpu_features.h).
bool available();

// What avx512bf16::gemm_panel32 computes (out[t * ldo + 0..32) for t in [0, T)), on AMX tiles:
// tdpbf16ps sums the same pairs of bf16 products into f32 in the tile unit's order, 32 columns a
// step; every row alike, whatever T (tiles of fewer rows for the last). False, and nothing done,
// when P is not a multiple of 16.
bool gemm_bf16_panel32(float* out, int64_t ldo, const uint32_t* x, int64_t T, int64_t P, const uint32_t* panel);

}  // namespace squeezekv::cpu::amx
