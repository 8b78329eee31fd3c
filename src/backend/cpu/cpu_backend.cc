// The CPU backend: host memory, the kernels of ops.h / attention.cc, OpenMP threads. Every op
// first sets this backend's thread count for the calling thread (an OpenMP per-thread setting),
// so the count belongs to the object rather than to the process.
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/tile8.h"
#include "backend/cpu/cpu_topology.h"
#include "core/half.h"
#include "core/sample.h"
#include "core/kv_rows.h"
#include "core/quant.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

// Zeroed host memory, 64-byte aligned. Large buffers (a sequence's KV cache sized for its whole
// context) are mapped pages that the kernel zeroes when first touched, so a cache costs memory and
// time only for the rows it actually holds; small ones come from the heap.
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) {
    bytes_ = bytes;
    constexpr size_t kMapFrom = 1u << 20;
    if (bytes >= kMapFrom) {
      mapped_ = (bytes + 4095) / 4096 * 4096;
      void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw Error("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
      data_ = p;
      return;
    }
    // at least one byte so data() is never null
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (data_ == nullptr) throw Error("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    std::memset(data_, 0, rounded);
  }
  ~HostBuffer() override {
    if (mapped_ > 0) ::munmap(data_, mapped_);
    else std::free(data_);
  }

 private:
  size_t mapped_ = 0;  // bytes mapped (0: heap)
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool int8_decode)
      : threads_(threads > 0 ? threads : cpu::default_threads()),
        int8_decode_(int8_decode) {}

  Device kind() const override { return Device::kCpu; }
  std::string describe() const override { return "cpu, " + std::to_string(threads_) + " threads"; }

  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<HostBuffer>(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  // The stored bytes as they are, or (int8 decode) Q4_0/Q4_1/Q8_0/IQ4_NL matrices as 8-row tiles.
  WeightMatrix prepare_weight(const WeightMatrix& w, WeightUse use, std::unique_ptr<Buffer>& keep) override {
    if (!int8_decode_ || use != WeightUse::kMatrix || !cpu::can_tile8(w)) return w;
    keep = std::make_unique<HostBuffer>(cpu::tile8_bytes(w));
    const WeightMatrix tiled = cpu::make_tile8(w, keep->as<uint8_t>());
    if (w.file_backed) {  // the file's pages of this matrix are not read again: memory holds one copy
      const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
      const uintptr_t begin = (reinterpret_cast<uintptr_t>(w.data) + page - 1) / page * page;
      const uintptr_t end = (reinterpret_cast<uintptr_t>(w.data) + w.rows * w.row_bytes) / page * page;
      if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    }
    return tiled;
  }

  void embed(float* x, const WeightMatrix& table, const int32_t* tokens, int T) override {
    for (int t = 0; t < T; ++t) dequantize_row(table.type, table.row(tokens[t]), x + static_cast<size_t>(t) * table.cols, table.cols);
  }
  void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations act) override {
    use_threads();
    cpu::matmul(out, x, w, T, bias, act);
  }
  void matmuls(const MatmulPart* parts, int n, const float* x, int64_t T, Activations act, RowMode rows) override {
    use_threads();
    cpu::matmul_parts(parts, n, x, T, act, rows);
    rope_parts(parts, n, T);
  }
  void matmul_rows(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias,
                   Activations act) override {
    use_threads();
    cpu::matmul(out, x, w, T, bias, act, RowMode::kIndependent);
  }
  void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps) override {
    use_threads();
    cpu::rmsnorm(out, x, w, T, E, eps);
  }
  void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq, RopePairing pairing) override {
    use_threads();
    cpu::rope(x, pos, T, n_heads, D, inv_freq, pairing);
  }
  void silu_mul(float* gate, const float* up, int64_t n) override {
    use_threads();
    cpu::silu_mul(gate, up, n);
  }
  void sample_rows(int32_t* out, const float* x, const SampleParams* params, int64_t n, int64_t V) override {
    use_threads();
    if (static_cast<int>(sample_scratch_.size()) < threads_) sample_scratch_.resize(static_cast<size_t>(threads_));
#pragma omp parallel for schedule(dynamic) if (n > 1)
    for (int64_t r = 0; r < n; ++r)
      out[r] = sample_row({x + r * V, static_cast<size_t>(V)}, params[r], sample_scratch_[static_cast<size_t>(omp_get_thread_num())]);
  }
  void add(float* x, const float* y, int64_t n) override {
    use_threads();
    cpu::add(x, y, n);
  }
  void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                 AttentionProbe* probe) override {
    use_threads();
    // scratch grows to the largest step seen (once per capacity change), never per step
    const size_t need = static_cast<size_t>(cpu::attention_scratch_floats(T, H, kv.capacity));
    if (scratch_.size() < need) scratch_.resize(need);
    if (kv_rotates_keys(kv.type)) q = rotate_queries(q, T * H, kv.head_dim, 0);
    cpu::attention(out, q, q_pos, T, H, kv, probe, scratch_.data(), attention_act());
  }
  void attention_batch(AttentionCall* calls, int n) override {
    use_threads();
    for (int i = 0; i < n; ++i) write_rows(calls[i]);
    size_t need = 0, rows = 0;
    for (int i = 0; i < n; ++i) {
      need += static_cast<size_t>(cpu::attention_scratch_floats(calls[i].T, calls[i].H, calls[i].kv.capacity));
      if (kv_rotates_keys(calls[i].kv.type)) rows += static_cast<size_t>(calls[i].T) * calls[i].H * calls[i].kv.head_dim;
    }
    if (scratch_.size() < need) scratch_.resize(need);
    if (rows == 0) return cpu::attention_batch(calls, n, scratch_.data(), attention_act());
    // the calls whose keys are rotated meet rotated queries (their own copies, side by side)
    batch_calls_.assign(calls, calls + n);
    if (rotated_q_.size() < rows) rotated_q_.resize(rows);
    size_t at = 0;
    for (AttentionCall& c : batch_calls_) {
      if (!kv_rotates_keys(c.kv.type)) continue;
      c.q = rotate_queries(c.q, c.T * c.H, c.kv.head_dim, at);
      at += static_cast<size_t>(c.T) * c.H * c.kv.head_dim;
    }
    cpu::attention_batch(batch_calls_.data(), n, scratch_.data(), attention_act());
  }
  // Sessions with int8 decode activations meet Q8_0 keys with 8-bit queries too (cpu::attention).
  Activations attention_act() const { return int8_decode_ ? Activations::kInt8 : Activations::kF32; }
  // rows [n][D] of queries rotated as their keys were (kv_rotate), into rotated_q_ from `at`.
  const float* rotate_queries(const float* q, int64_t n, int D, size_t at) {
    if (rotated_q_.size() < at + static_cast<size_t>(n) * D) rotated_q_.resize(at + static_cast<size_t>(n) * D);
    float* dst = rotated_q_.data() + at;
    std::copy(q, q + n * D, dst);
#pragma omp parallel for schedule(static) if (n >= 64)
    for (int64_t r = 0; r < n; ++r) kv_rotate(dst + r * D, D);
    return dst;
  }

  void kv_write(const KvArrays& a, int at, const float* k, const float* v, const int32_t* rows_pos, int T) override {
    const size_t kb = a.row_bytes(), vb = a.v_row_bytes();
    const int G = a.G, D = a.D;
    for (int g = 0; g < G; ++g) {
      for (int r = 0; r < T; ++r) {
        const size_t slot = static_cast<size_t>(g) * a.capacity + at + r;
        const float* ks = k + (static_cast<size_t>(r) * G + g) * D;
        const float* vs = v + (static_cast<size_t>(r) * G + g) * D;
        if (kv_rotates_keys(a.type)) {  // R (k - offset): kv_rotate, KvArrays::k_offset
          rotated_.assign(ks, ks + D);
          if (float* off = a.k_offset != nullptr ? a.k_offset + static_cast<size_t>(g) * D : nullptr) {
            if (at == 0 && r == 0) {  // the first rows into an empty cache: their mean
              std::fill(off, off + D, 0.0f);
              for (int t = 0; t < T; ++t)
                for (int d = 0; d < D; ++d) off[d] += k[(static_cast<size_t>(t) * G + g) * D + d];
              for (int d = 0; d < D; ++d) off[d] /= static_cast<float>(T);
            }
            for (int d = 0; d < D; ++d) rotated_[d] -= off[d];
          }
          kv_rotate(rotated_.data(), D);
          ks = rotated_.data();
        }
        kv_quantize_row(a.type, ks, static_cast<uint8_t*>(a.k) + slot * kb, D);
        kv_quantize_row(a.v_type, vs, static_cast<uint8_t*>(a.v) + slot * vb, D);
        a.pos[slot] = rows_pos[r];
        a.mass[slot] = 0.0f;
        if (a.ring > 0) {  // the recent ring: the same values in f16, at the position's index
          const int i = rows_pos[r] % a.ring;
          const size_t at_ring = (static_cast<size_t>(g) * a.ring + i) * D;
          if (a.ring_k != nullptr) f32_to_f16_row(a.ring_k + at_ring, ks, D);
          if (a.ring_v != nullptr) f32_to_f16_row(a.ring_v + at_ring, vs, D);
          a.ring_pos[i] = rows_pos[r];
        }
      }
    }
  }
  void kv_move(const KvArrays& a, const int* from, const int* to, int n) override {
    uint8_t* k = static_cast<uint8_t*>(a.k);
    uint8_t* v = static_cast<uint8_t*>(a.v);
    const size_t row = a.row_bytes(), vrow = a.v_row_bytes();
    for (int i = 0; i < n; ++i) {
      std::memcpy(k + static_cast<size_t>(to[i]) * row, k + static_cast<size_t>(from[i]) * row, row);
      std::memcpy(v + static_cast<size_t>(to[i]) * vrow, v + static_cast<size_t>(from[i]) * vrow, vrow);
      a.pos[to[i]] = a.pos[from[i]];
      a.mass[to[i]] = a.mass[from[i]];
    }
  }
  void kv_evict_one(const KvArrays& a, int count, int32_t keep_below, int32_t keep_from, const int32_t*, int) override {
    kv_evict_top(a, count, 1, keep_below, keep_from, nullptr);  // one row: count - 1 into its hole
  }
  void kv_evict_top(const KvArrays& a, int count, int n_evict, int32_t keep_below, int32_t keep_from,
                    int32_t* dead_pos) override {
    // the plain reference of the rule (the device's kernel is tested against it): per head the
    // candidates ordered by (mass, newer position first), the first n_evict of them chosen
    const int new_count = count - n_evict;
    std::vector<int> cand, from, to;
    std::vector<uint8_t> out;
    for (int g = 0; g < a.G; ++g) {
      const size_t base = static_cast<size_t>(g) * a.capacity;
      const int32_t* pos = a.pos + base;
      const float* m = a.mass + base;
      cand.clear();
      for (int j = 0; j < count; ++j)
        if (pos[j] >= keep_below && pos[j] < keep_from) cand.push_back(j);
      const int k = std::min(n_evict, static_cast<int>(cand.size()));
      std::nth_element(cand.begin(), cand.begin() + (k > 0 ? k - 1 : 0), cand.end(), [&](int x, int y) {
        return m[x] < m[y] || (m[x] == m[y] && pos[x] > pos[y]);
      });
      out.assign(static_cast<size_t>(count), 0);
      for (int i = 0; i < k; ++i) out[static_cast<size_t>(cand[i])] = 1;
      if (dead_pos != nullptr) {
        for (int j = 0; j < count; ++j) dead_pos[base + j] = out[j] ? kDeadPosition : pos[j];
        continue;
      }
      // holes below new_count, lowest first, take the kept rows above it, highest first
      int src = count - 1;
      for (int j = 0; j < new_count; ++j) {
        if (!out[j]) continue;
        while (out[static_cast<size_t>(src)]) --src;
        from.push_back(static_cast<int>(base) + src--);
        to.push_back(static_cast<int>(base) + j);
      }
    }
    if (dead_pos == nullptr) kv_move(a, from.data(), to.data(), static_cast<int>(from.size()));
  }
  void error_energy(double* out, const float* o, const float* o_cut, int64_t n) override {
    double err = 0.0, energy = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = o[i], d = x - o_cut[i];
      err += d * d;
      energy += x * x;
    }
    out[0] = err;
    out[1] = energy;
  }
  bool host_visible() const override { return true; }

  // A copy by this backend's threads (cpu_topology.h), measured at the first call.
  double copy_bandwidth() override {
    if (bandwidth_ <= 0) bandwidth_ = cpu::copy_bandwidth(threads_);
    return bandwidth_;
  }

 private:
  void use_threads() const { omp_set_num_threads(threads_); }
  int threads_;
  double bandwidth_ = 0.0;      // copy_bandwidth(), once measured
  bool int8_decode_;            // int8 decode: Q4_0/Q4_1/Q8_0/IQ4_NL matrices as 8-row tiles, Q8_0 keys met by 8-bit queries
  std::vector<float> scratch_;  // attention
  std::vector<float> rotated_;  // a key row on its way into a rotated type [D]
  std::vector<float> rotated_q_;  // queries meeting rotated keys [rows][D]
  std::vector<AttentionCall> batch_calls_;  // a batch's calls with their rotated queries
  std::vector<SampleScratch> sample_scratch_;  // sample_rows' buffers, one an OpenMP thread
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, bool int8_decode) {
  return std::make_unique<CpuBackend>(threads, int8_decode);
}

}  // namespace squeezekv
