// CPU math kernels. They know nothing of models: plain arrays with shapes in comments.
// Letters: T tokens (query rows), R/C matrix rows/cols, H query heads, G kv heads, D head dim,
// N retained keys. Every fast path has a scalar reference in namespace `ref` that tests compare to.
// Thread safety: kernels are re-entrant; they use OpenMP threads internally.
#pragma once
#include <cstdint>

#include "core/weight.h"

namespace squeezekv::cpu {

// Number of OpenMP threads kernels use (process-wide).
void set_threads(int n);
int threads();

// a . b over n floats.
float dot(const float* a, const float* b, int64_t n);

// How a decode product (T < 3) treats the activations.
//   kF32:  f32 throughout (the reference arithmetic; fused dequantize-and-dot for Q8_0/Q4_0/Q4_1,
//          bit-identical to dequantize_row + dot).
//   kInt8: each block of 32 activations is rounded to 8 bits with one f32 scale (llama.cpp's
//          Q8 activations) and every block type is multiplied with integer dot products
//          (quant_dot.h); plain float weights keep the f32 path. Faster; each product moves by at
//          most the activations' rounding (sum over blocks of sum|w| * max|x| / 254).
enum class Activations : uint8_t { kF32, kInt8 };

// out[T][R] = x[T][C] @ W[R][C]^T (+ bias[R] when not null). W is dequantized on the fly.
void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias = nullptr,
            Activations act = Activations::kF32);

// out[T][E] = x * rsqrt(mean(x^2) + eps) * w[E]   (Hugging Face LlamaRMSNorm order of operations)
void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps);

enum class RopePairing : uint8_t {
  kHalves,    // dimension i pairs with i + D/2 (Hugging Face checkpoints, GGUF qwen2)
  kAdjacent,  // dimension 2i pairs with 2i + 1 (GGUF llama, llama2.c)
};

// Rotates x[T][n_heads*D] in place; inv_freq[D/2]; pos[T] absolute positions.
void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq,
          RopePairing pairing);

// x[n] = silu(gate[n]) * up[n]  (in place over gate)
void silu_mul(float* gate, const float* up, int64_t n);

// Half-precision helpers for KV storage.
void f32_to_f16_row(uint16_t* dst, const float* src, int64_t n);

enum class KvType : uint8_t { kF16, kF32 };

// Read-only view of one layer's retained keys and values.
struct KvView {
  KvType type = KvType::kF16;
  const void* k = nullptr;         // [G][capacity][D]
  const void* v = nullptr;         // [G][capacity][D]
  const int32_t* pos = nullptr;    // [G][capacity] absolute positions (slots in no particular order)
  int count = 0;                   // N rows held per head
  int capacity = 0;
  int n_kv_heads = 0;              // G
  int head_dim = 0;                // D
};

// What attention can report besides its output; every field is optional and costs nothing unset.
struct AttentionProbe {
  float* mass = nullptr;       // [G][mass_stride] += per kv head, the mean over its H/G query heads
                               // of the sum over rows t >= mass_row_begin of the softmax probabilities
  int64_t mass_stride = 0;     // 0: N
  int64_t mass_row_begin = 0;
  bool entropy = false;        // accumulate 1 - H(p)/log(n) ... as sums below (rows with n >= 2)
  double entropy_sum = 0.0;    // out: sum over heads and rows of H(p) / log(n)
  int64_t entropy_rows = 0;    // out: rows counted
};

// Causal multi-head attention of T query rows over the retained keys: query row t (at absolute
// position q_pos[t]) sees key j of its kv head iff pos[j] <= q_pos[t].
//   out[T][H*D], q[T][H*D] (already rotated), scale = 1/sqrt(D).
//   probe: may be null. scratch: at least attention_scratch_floats(T, H, N) floats.
void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
               AttentionProbe* probe, float* scratch);
int64_t attention_scratch_floats(int64_t T, int H, int N);

namespace ref {
float dot(const float* a, const float* b, int64_t n);
void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias);
// One query row and one key at a time; the entropy by -sum p log p per key.
void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
               AttentionProbe* probe, float* scratch);
}  // namespace ref

}  // namespace squeezekv::cpu
