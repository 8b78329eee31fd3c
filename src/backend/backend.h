// The seam between the forward pass and the device that runs it (ggml-backend's idea, smaller):
// a Backend owns memory (Buffers) and runs the math ops of a step on pointers into that memory.
// The forward pass (runtime/session.cc) and the KV storage (kv/kv_storage.cc) call only this
// interface; the CPU (backend/cpu/cpu_backend.cc) is its first implementation. Host code reads
// backend memory only through download(), so a device backend needs no other change above it.
// Argument order as in the kernels: outputs, inputs, weights, sizes. Letters: T rows, E hidden,
// H query heads, G kv heads, D head dim, R/C matrix rows/cols, N retained keys.
// Thread safety: a Backend is used by one sequence's thread at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/op_types.h"
#include "core/kv_view.h"
#include "core/weight.h"
#include "squeezekv/device.h"
#include "squeezekv/sampling.h"

namespace squeezekv {

// A block of one backend's memory, freed with the Buffer.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 protected:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// The bytes a device backend's allocation of `bytes` takes: whole 2 MiB blocks from 1 MiB up (the
// CUDA driver's granularity for large allocations, which backend/cuda's block cache keeps), 512-byte
// units below. What a KV pool counts for a buffer on a device.
int64_t device_alloc_bytes(int64_t bytes);

// One layer's KV arrays in a backend's memory.
struct KvArrays {
  void* k = nullptr;         // [G][capacity] rows of type (kv_row_bytes)
  void* v = nullptr;         // [G][capacity] rows of v_type
  int32_t* pos = nullptr;    // [G][capacity] absolute positions
  float* mass = nullptr;     // [G][capacity] accumulated attention mass
  KvType type = KvType::kF16;
  int G = 0, D = 0, capacity = 0;
  const int32_t* count_dev = nullptr;  // [1] the rows held once this step's are in (KvView::count_dev), or null
  KvType v_type = KvType::kF16;
  // [G][D] for a kv_rotates_keys type: subtracted from every key before its rotation, so that a
  // channel's common offset does not coarsen the 4-bit blocks (q.k - q.offset differs from q.k by
  // the same amount for every key of a query: the softmax, and so every output and mass, is the
  // same). Set from the rows of the first write into an empty cache; null: none.
  float* k_offset = nullptr;
  // The recent ring (KvTypes::recent_f16, KvView::ring_k): kv_write puts each row's f16 values at
  // index position % ring too and records the position in ring_pos; ring 0: none.
  uint16_t* ring_k = nullptr;  // [G][ring][D], or null
  uint16_t* ring_v = nullptr;  // [G][ring][D], or null
  int32_t* ring_pos = nullptr; // [ring]
  int ring = 0;
  size_t row_bytes() const { return kv_row_bytes(type, D); }      // K's
  size_t v_row_bytes() const { return kv_row_bytes(v_type, D); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device kind() const = 0;
  // A line for reports: the device and its settings ("cpu, 2 threads").
  virtual std::string describe() const = 0;

  // Memory. alloc returns zeroed memory of at least `bytes`; upload copies host memory into this
  // backend's and returns once src may be reused (the copy comes before any later work);
  // download copies this backend's memory to the host and returns once the bytes are there.
  virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;
  // Zeroed host memory that this backend copies to and from fastest (a device's: page-locked),
  // for what travels every step (logits). By default plain host memory.
  virtual std::unique_ptr<Buffer> alloc_host(size_t bytes);
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // within this backend's memory
  // download in two halves: the copy queued after the work given so far into dst, host memory from
  // alloc_host, and the call returns at once; dst holds the bytes once wait() returns (or any call
  // that waits, a download among them). By default (host memory) the copy is made at once.
  virtual void download_later(void* dst, const void* src, size_t bytes) { download(dst, src, bytes); }
  // Returns once the work given so far is done. By default nothing to wait for.
  virtual void wait() {}
  // height rows of width bytes within this backend's memory: row i from src + i * src_pitch to
  // dst + i * dst_pitch (a storage re-laid for a new capacity); by default a copy() a row.
  virtual void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height) {
    for (size_t i = 0; i < height; ++i)
      copy(static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch, width);
  }
  // A weight as this backend uses it: the CPU uses the stored (mapped) bytes as they are; a device
  // copies them into `keep` memory (matrices may be converted, stated by the backend; vectors,
  // 1 x n F32 norms and biases, stay f32).
  enum class WeightUse : uint8_t { kMatrix, kVector };
  virtual WeightMatrix prepare_weight(const WeightMatrix& w, WeightUse use, std::unique_ptr<Buffer>& keep) = 0;
  // Matrices that multiply the same input (q, k, v; gate, up), each prepared as prepare_weight
  // does, out[n]; their memory joins `keep`. A device may lay them out one after another in one
  // buffer (out[i + 1] starting where out[i] ends), so that its products over several of them run
  // as one product (matmuls, matmul_swiglu). By default one prepare_weight each.
  virtual void prepare_weights(const WeightMatrix* in, int n, WeightMatrix* out, std::vector<std::unique_ptr<Buffer>>& keep);

  // x[T][E] <- rows tokens[t] of the embedding table (tokens: host memory).
  virtual void embed(float* x, const WeightMatrix& table, const int32_t* tokens, int T) = 0;
  // out[T][R] = x[T][C] @ W[R][C]^T (+ bias[R] when not null).
  virtual void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias,
                      Activations act) = 0;
  // The same product over rows of different sequences (RowMode::kIndependent): each row's result
  // equals a one-row matmul's (CUDA: see RowMode). By default T one-row products (the weights
  // read T times); a backend overrides it to read them once.
  virtual void matmul_rows(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias,
                           Activations act) {
    for (int64_t t = 0; t < T; ++t) matmul(out + t * w.rows, x + t * w.cols, w, 1, bias, act);
  }
  // Products of one input x[T][C] with up to 4 matrices (q, k, v; gate, up), each result equal to
  // its own matmul (rows: kIndependent as matmul_rows) followed by its rope() where the part asks
  // for one. By default one call after another; a backend may run them as one pass.
  virtual void matmuls(const MatmulPart* parts, int n, const float* x, int64_t T, Activations act, RowMode rows) {
    for (int i = 0; i < n; ++i) {
      if (rows == RowMode::kIndependent && T > 1) matmul_rows(parts[i].out, x, *parts[i].w, T, parts[i].bias, act);
      else matmul(parts[i].out, x, *parts[i].w, T, parts[i].bias, act);
    }
    rope_parts(parts, n, T);
  }
  // The SwiGLU feed-forward's first half: gate[T][F] = silu(x @ w_gate^T) * (x @ w_up^T); up[T][F]
  // is scratch (its contents after the call are unspecified). By default matmuls and silu_mul; a
  // backend may run it as one pass, with results equal to those two.
  virtual void matmul_swiglu(float* gate, float* up, const float* x, const WeightMatrix& w_gate, const WeightMatrix& w_up,
                             int64_t T, Activations act, RowMode rows) {
    const MatmulPart parts[2] = {{gate, &w_gate, nullptr, nullptr}, {up, &w_up, nullptr, nullptr}};
    matmuls(parts, 2, x, T, act, rows);
    silu_mul(gate, up, T * w_gate.rows);
  }
  // out[T][E] = x * rsqrt(mean(x^2) + eps) * w[E]
  virtual void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps) = 0;
  // x[T][E] += y; out = rmsnorm(x) (the residual add and the next norm, one pass where the
  // backend can; by default the two ops).
  virtual void add_rmsnorm(float* out, float* x, const float* y, const float* w, int64_t T, int64_t E, float eps) {
    add(x, y, T * E);
    rmsnorm(out, x, w, T, E, eps);
  }
  // Rotates x[T][n_heads*D] in place; pos[T] (this backend's memory), inv_freq[D/2].
  virtual void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq,
                    RopePairing pairing) = 0;
  // gate[n] = silu(gate[n]) * up[n]
  virtual void silu_mul(float* gate, const float* up, int64_t n) = 0;
  // x[n] += y[n]
  virtual void add(float* x, const float* y, int64_t n) = 0;
  // out[r] = row r's pick from x[r][0, V) under params[r] for r < n (core/sample.h's definition;
  // a temperature of 0 takes the first largest; out, params: this backend's memory): a decode
  // batch's tokens without the logits leaving the backend.
  virtual void sample_rows(int32_t* out, const float* x, const SampleParams* params, int64_t n, int64_t V) = 0;
  // Causal attention of T query rows over the retained keys (query row t at q_pos[t] sees key j
  // of its kv head iff pos[j] <= q_pos[t]); out[T][H*D], q[T][H*D]; probe may be null, and its
  // mass accumulator is this backend's memory.
  virtual void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                         AttentionProbe* probe) = 0;

  // Several sequences' attention (a decode batch), each call exactly as attention() computes it,
  // after its write's rows are in (kv_write); by default one call after another, a backend may
  // run them together.
  virtual void attention_batch(AttentionCall* calls, int n) {
    for (int i = 0; i < n; ++i) {
      write_rows(calls[i]);
      attention(calls[i].out, calls[i].q, calls[i].q_pos, calls[i].T, calls[i].H, calls[i].kv, calls[i].probe);
    }
  }

  // KV rows (one layer's arrays, KvArrays). kv_write puts the T new rows into slots
  // [at, at + T) of every head: k, v [T][G*D] (f32, this backend's memory) into K and V, their
  // positions rows_pos[T] (this backend's memory) into pos, and 0 into mass. With a.count_dev a
  // device may take `at` from there instead (*count_dev - T; the same value).
  virtual void kv_write(const KvArrays& a, int at, const float* k, const float* v, const int32_t* rows_pos, int T) = 0;
  // Compaction: for i < n, slot from[i] moves to slot to[i] in K, V, pos and mass (slots over all
  // heads, [0, G * capacity); from, to: host memory).
  virtual void kv_move(const KvArrays& a, const int* from, const int* to, int n) = 0;
  // A decode step's eviction where the mass lives: for every head, among slots [0, count) whose
  // position p has keep_below <= p < keep_from, the one with the least mass goes (between equal
  // masses the newer position), and row count - 1 moves into its hole (K, V, pos, mass).
  // kv/select.cc's select_sinks_recent_top with one row to evict, run on this backend. With
  // newest_dev (this backend's memory: the newest row's position) a device may take keep_from as
  // *newest_dev - n_recent + 1 instead (the same value; a replayed step reads it there).
  virtual void kv_evict_one(const KvArrays& a, int count, int32_t keep_below, int32_t keep_from,
                            const int32_t* newest_dev = nullptr, int n_recent = 0) = 0;
  // A step's eviction where the mass lives, for any number of rows (kv/select.cc's
  // select_sinks_recent_top run on this backend): for every head, the n_evict rows with the least
  // mass among slots [0, count) whose position p has keep_below <= p < keep_from go (between equal
  // masses the newer position); the caller guarantees at least n_evict such rows a head.
  // dead_pos null: they go as KvStorage::evict moves rows (the i-th lowest evicted slot below
  // count - n_evict takes the i-th highest kept row at or above it). Otherwise nothing moves:
  // dead_pos [G][capacity] (this backend's memory) gets the held positions with kDeadPosition at
  // the chosen slots, the positions of a view without them (a squeeze metric's cut view).
  virtual void kv_evict_top(const KvArrays& a, int count, int n_evict, int32_t keep_below, int32_t keep_from,
                            int32_t* dead_pos = nullptr) = 0;
  // out[0] = sum over i < n of (o[i] - o_cut[i])^2, out[1] = sum of o[i]^2, in double (out: two
  // doubles of this backend's memory; o, o_cut [n]): eviction_error's sums without reading the
  // outputs back.
  virtual void error_energy(double* out, const float* o, const float* o_cut, int64_t n) = 0;
  // The backend's memory: bytes free now (a device's cached free blocks count as free) and in all.
  struct MemoryInfo {
    int64_t free = 0, total = 0;
  };
  // By default the host's (available and physical memory).
  virtual MemoryInfo memory() const;
  // A point where the device may start on the work given so far (the runner offers one after each
  // layer of a step of several rows): a backend that records launches (CUDA) issues them here, so
  // the device runs a layer while the host prepares the next instead of after the whole step. By
  // default nothing.
  virtual void submit() {}
  // The device's copy bandwidth in bytes/s (read + written), measured once; 0 where not measured.
  virtual double copy_bandwidth() { return 0.0; }
  // How many times a recorded launch list was replayed as a whole (a device's CUDA graphs; 0 on
  // the CPU). Tests and the bench read it.
  virtual int64_t graph_replays() const { return 0; }
  // Whether host code may read and write this backend's memory directly (the CPU's).
  virtual bool host_visible() const = 0;

 protected:
  // A call's rows that its attention_batch writes first (none: nothing).
  void write_rows(const AttentionCall& c) {
    if (c.write.arrays != nullptr) kv_write(*c.write.arrays, c.kv.count - static_cast<int>(c.T), c.write.k, c.write.v, c.write.pos, static_cast<int>(c.T));
  }
  // The rope() of every part that asks for one (what matmuls does after its products).
  void rope_parts(const MatmulPart* parts, int n, int64_t T) {
    for (int i = 0; i < n; ++i)
      if (const RopeSpec* r = parts[i].rope)
        rope(parts[i].out, r->pos, T, static_cast<int>(parts[i].w->rows / r->D), r->D, r->inv_freq, r->pairing);
  }
};

// The CPU backend with `threads` OpenMP threads (0: one per physical core, cpu_topology.h). The
// threads belong to the object: two backends with different counts may run side by side on
// different host threads.
// int8_decode: the arithmetic of sessions with 8-bit decode activations: Q4_0/Q4_1/Q8_0/IQ4_NL
// matrices laid out as 8-row tiles for the int8 kernels (backend/cpu/tile8.h; a copy of the same
// size), and a decode step's Q8_0 keys met by 8-bit queries (cpu::attention's act).
std::unique_ptr<Backend> make_cpu_backend(int threads, bool int8_decode = false);

struct BackendOptions {
  Device device = Device::kCpu;
  int threads = 0;                 // CPU threads (0: one per physical core)
  DeviceWeightFormat device_weights = DeviceWeightFormat::kNative;  // how a device holds the matrices
  Activations decode = Activations::kF32;  // the decode arithmetic the session asks for (the CPU lays weights out for it)
  bool cuda_graphs = true;         // CUDA: repeated launch lists replayed as graphs
  bool batch_invariant = false;    // CUDA: a decode batch's products with each row's lone arithmetic (the CPU's always are)
};
// The KV row types the CUDA backend's kernels serve: K and V of one type, f16, f32 or q8_0, or
// q4_1 values beside f16 or q8_0 keys (q8_0 for head dims that are multiples of 64, whose rows
// are whole 32-bit words; q4_1 rows always are). The CPU serves every KvType and any pair.
inline bool cuda_kv_types(KvTypes t, int D) {
  if (t.recent_f16 != 0) return false;
  const bool k_ok = t.k == KvType::kF16 || t.k == KvType::kF32 || (t.k == KvType::kQ8_0 && D % 64 == 0);
  return k_ok && (t.v == t.k || (t.v == KvType::kQ4_1 && t.k != KvType::kF32 && D % 32 == 0));
}

// The backend for options.device; a device this build lacks is refused with a message naming
// --device.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

}  // namespace squeezekv
