// CPU math kernels. They know nothing of models: plain arrays with shapes in comments.
// Letters: T tokens (query rows), R/C matrix rows/cols, H query heads, G kv heads, D head dim,
// N retained keys. Every fast path has a scalar reference in namespace `ref` that tests compare to.
// Thread safety: kernels are re-entrant; they use OpenMP threads internally, as many as the calling
// thread's OpenMP setting (the CPU backend sets it from its own thread count before each call).
#pragma once
#include <cstdint>

#include "backend/op_types.h"
#include "core/half.h"
#include "core/kv_view.h"
#include "core/weight.h"

namespace squeezekv::cpu {

// a . b over n floats.
float dot(const float* a, const float* b, int64_t n);

// The op parameter types are shared by every backend (backend/op_types.h, core/kv_view.h); these
// names keep the CPU kernels' spelling.
using squeezekv::Activations;
using squeezekv::AttentionCall;
using squeezekv::AttentionProbe;
using squeezekv::MatmulPart;
using squeezekv::KvType;
using squeezekv::KvView;
using squeezekv::RopePairing;
using squeezekv::RowMode;
using squeezekv::f32_to_f16_row;

// out[T][R] = x[T][C] @ W[R][C]^T (+ bias[R] when not null). W is dequantized on the fly.
// rows: kIndependent sums every row exactly as a one-row product (a decode batch).
void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias = nullptr,
            Activations act = Activations::kF32, RowMode rows = RowMode::kChunk);

// out[T][E] = x * rsqrt(mean(x^2) + eps) * w[E]   (Hugging Face LlamaRMSNorm order of operations)
void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps);

// Rotates x[T][n_heads*D] in place; inv_freq[D/2]; pos[T] absolute positions.
void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq,
          RopePairing pairing);

// Several products of the same input (q, k and v; gate and up) in one pass: parts[i].out[T][R_i]
// = x[T][C] @ W_i^T (+ bias_i), at most 4 parts with the same C. x is rounded once for int8, and
// all parts' row blocks share one parallel loop; every block is computed exactly as matmul()
// computes it.
void matmul_parts(const MatmulPart* parts, int n, const float* x, int64_t T, Activations act = Activations::kF32,
                  RowMode rows = RowMode::kChunk);

// x[n] = silu(gate[n]) * up[n]  (in place over gate)
void silu_mul(float* gate, const float* up, int64_t n);
// x[n] += y[n]
void add(float* x, const float* y, int64_t n);

// Causal multi-head attention of T query rows over the retained keys: query row t (at absolute
// position q_pos[t]) sees key j of its kv head iff pos[j] <= q_pos[t].
//   out[T][H*D], q[T][H*D] (already rotated), scale = 1/sqrt(D).
//   probe: may be null. scratch: at least attention_scratch_floats(T, H, N) floats.
//   act: kInt8 (int8 decode arithmetic): a one-token call over Q8_0 keys of head dim 64 meets
//   them with its query rows rounded to 8 bits a block of 32, in integer dot products, where the
//   CPU has AVX-512 VNNI (attention_tile.h Q8Query); elsewhere, and with kF32, f32 queries.
void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
               AttentionProbe* probe, float* scratch, Activations act = Activations::kF32);
int64_t attention_scratch_floats(int64_t T, int H, int N);
// Several calls at once (a decode batch, one per sequence), each with exactly its own call's
// results; scratch: the sum of attention_scratch_floats(T, H, kv.capacity) over the calls.
void attention_batch(const AttentionCall* calls, int n, float* scratch, Activations act = Activations::kF32);

namespace ref {
float dot(const float* a, const float* b, int64_t n);
void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias);
// One query row and one key at a time; the entropy by -sum p log p per key.
void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
               AttentionProbe* probe, float* scratch);
}  // namespace ref

}  // namespace squeezekv::cpu
