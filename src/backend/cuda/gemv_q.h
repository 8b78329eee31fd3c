// Products over weights kept in their GGUF blocks on the device (--device-weights native): decode
// rows through an integer GEMV against 8-bit activations (llama.cpp's Q8 activations: each block
// of 32 rounded to int8 with one f32 scale, as the CPU's quantize_q8, bit for bit), and any
// number of rows through a dequantization to bf16 feeding the tensor-core products.
// Letters: T activation rows, R weight rows (outputs), C columns.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

constexpr int kGemvQRows = 4;  // activation rows a packed GEMV launch serves

// xq [T][C] int8, xs [T][C/32][4] = {d, d * (sum of q over values 0..15), over 16..31, 0} <- x
// [T][C] (C a multiple of 32): q = round-half-even(x / d), d = max|x| / 127 per block of 32
// (cpu::quantize_q8's arithmetic, so the integer sums equal the CPU's).
void launch_quantize_q8(Launcher& L, int8_t* xq, float* xs, const float* x, int64_t T, int64_t C);

// Every part's out [T][R] = x @ W^T (+ bias [R]) from x quantized by launch_quantize_q8 (T <=
// kGemvQRows) in one launch, as launch_gemv does for bf16 weights (its parts' RoPE in the
// epilogue; swiglu: parts 0 (gate) and 1 (up), out[0] = silu(gate) * up). The parts' weights of
// one packed_type (quant_groups.h) and width, laid out by upload_packed (planes, rows 16-byte
// aligned). Each output row's sums are formed in the same order whatever T and the other parts
// are (a sequence's result does not depend on what shares the launch). False, launching nothing,
// where the parts differ in type or width.
bool launch_gemv_q(Launcher& L, const MatmulPart* parts, int n, const int8_t* xq, const float* xs, int T, bool swiglu);

// out [R][C] bf16 <- W (a packed_type): value = scale * q + min as core/quant.h's
// dequantize_row, rounded to bf16.
void launch_dequantize_bf16(Launcher& L, __nv_bfloat16* out, const WeightMatrix& w);

}  // namespace squeezekv::cuda
