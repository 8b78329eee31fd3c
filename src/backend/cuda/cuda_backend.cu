// The CUDA backend (backend.h): device set-up and memory, weights dequantized to bf16 on load
// (f32 in the exact test mode), the choice of kernel for each op and shape, and the work it defers
// (a decode step's new KV row, its mass, its evictions) until a later kernel can do it on the way.
// The kernels live in the files of their jobs, each reached through the launch_* functions of its
// header: launcher.h (recording, CUDA-graph replay), norm.h, elementwise.h, gemv.h (decode
// products), gemm.h (prompt products on cuBLAS), gemm_lt.h (a decode batch's, on cuBLASLt),
// attn_prefill.h and attn_mma.h (prompt attention on the CUDA and the tensor cores), attn_decode.h
// and attn_decode_mma.h (one query token, on the CUDA and the tensor cores), kv_rows.h (write,
// move, evict).
// Every launch goes through the Launcher, which replays a repeated launch list (a decode step) as
// one CUDA graph, each kernel's start overlapping the previous one's end (docs/DESIGN.md, "A decode
// step replays as one CUDA graph").
// Letters: T rows, E hidden, H query heads, G kv heads, D head dim, R/C matrix rows/cols, N keys.
// Thread safety: one backend per sequence's thread; all work runs on the backend's one stream in order.
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attn_common.cuh"
#include "backend/cuda/attn_decode.h"
#include "backend/cuda/attn_decode_mma.h"
#include "backend/cuda/attn_mma.h"
#include "backend/cuda/attn_prefill.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/gemm_rows.h"
#include "backend/cuda/gemm_rows_q.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/gemv_q.h"
#include "backend/cuda/quant_groups.h"
#include "backend/cuda/sample.h"
#include "backend/cuda/kv_rows.h"
#include "backend/cuda/launcher.h"
#include "backend/cuda/norm.h"
#include "core/half.h"
#include "core/quant.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

static_assert(CudaOptions{}.decode_split_keys == cuda::kMinDecodeSplitKeys, "one default for a decode split's fewest keys");

using namespace cuda;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaOptions& o) : opt_(o) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
      throw Error("--device cuda: no CUDA device is visible (cudaGetDeviceCount found none)");
    check(cudaSetDevice(0), "cudaSetDevice");
    cudaDeviceProp p;
    check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    name_ = p.name;
    sms_ = p.multiProcessorCount;
    launcher_ = std::make_shared<Launcher>(opt_.graphs, opt_.pdl);
    // a deferred mass into memory being freed is dropped with it (no one can read it any more)
    launcher_->on_free = [this](const void* p, size_t n) {
      const char* b = static_cast<const char*>(p);
      pending_mass_.erase(std::remove_if(pending_mass_.begin(), pending_mass_.end(),
                                         [b, n](const PendingMass& m) {
                                           const char* at = reinterpret_cast<const char*>(m.mass);
                                           return at >= b && at < b + n;
                                         }),
                          pending_mass_.end());
      // and that layer's score buffers (a server frees sequences all day); they are freed after
      // the map is consistent again, since freeing one calls this hook in turn
      std::vector<LayerScratch> gone;
      for (auto it = layer_scratch_.begin(); it != layer_scratch_.end();) {
        const char* at = reinterpret_cast<const char*>(it->first);
        if (at >= b && at < b + n) {
          gone.push_back(std::move(it->second));
          it = layer_scratch_.erase(it);
        } else {
          ++it;
        }
      }
    };
    launcher_->on_flush = [this] { upload_evictions(); };
    check(cublasCreate(&blas_), "cublasCreate");
    check(cublasSetStream(blas_, launcher_->stream()), "cublasSetStream");
    // a workspace of its own, so that a product captured into a graph allocates nothing
    blas_workspace_ = alloc(kBlasWorkspaceBytes);
    check(cublasSetWorkspace(blas_, blas_workspace_->data(), kBlasWorkspaceBytes), "cublasSetWorkspace");
    lt_ = std::make_unique<LtProducts>(*launcher_, blas_workspace_->data(), kBlasWorkspaceBytes, opt_.lt_algos, opt_.lt_runs);
    // the exact test mode must not round through TF32
    check(cublasSetMathMode(blas_, opt_.f32_weights ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  ~CudaBackend() override {
    launcher_->on_free = nullptr;  // buffers may outlive the backend
    try {
      launcher_->flush();
      cudaStreamSynchronize(launcher_->stream());
    } catch (...) {
    }
    launcher_->on_flush = nullptr;
    lt_.reset();
    cublasDestroy(blas_);
    stage_.reset();
    blas_workspace_.reset();
  }

  Device kind() const override { return Device::kCuda; }
  std::string describe() const override {
    const char* batch = opt_.batch == CudaOptions::BatchProducts::kTuned  ? ", batches by tuned cublasLt"
                        : opt_.batch == CudaOptions::BatchProducts::kBlas ? ", batches by cublas"
                        : opt_.batch == CudaOptions::BatchProducts::kGemv ? ", batches by 4-row gemv"
                                                                          : ", batch-invariant (gemm_rows)";
    const char* weights = opt_.f32_weights ? "f32" : opt_.native_weights ? "native (quantized types as stored)" : "bf16";
    return "cuda, " + name_ + ", " + weights + " weights" + (opt_.graphs ? "" : ", no graphs") + batch;
  }
  bool host_visible() const override { return false; }

  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<DeviceBuffer>(bytes, launcher_, blocks_); }
  void submit() override {
    if (!opt_.layer_submit) return;
    const bool twin = bf16_rows_.serial == launcher_->serial();
    launcher_->flush();
    if (twin) bf16_rows_.serial = launcher_->serial();  // issuing what was recorded writes nothing new
  }
  MemoryInfo memory() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return {static_cast<int64_t>(free) + blocks_->cached_bytes(), static_cast<int64_t>(total)};
  }
  std::unique_ptr<Buffer> alloc_host(size_t bytes) override { return std::make_unique<PinnedBuffer>(bytes); }
  // Copies are ordered on the one stream after the recorded launches (a deferred mass first: any
  // memory may be a mass array). An upload of up to kStageBytes / 4 goes through the pinned
  // staging area and does not wait: the host bytes are copied there and the device copy queued
  // (a decode step's per-sequence counts, positions and embedding rows: dozens of small copies
  // that each waited for the device before); the area is reused from its start once the stream
  // has been waited for. Larger uploads and downloads wait; copies within the device do not (copy_rows).
  void upload(void* dst, const void* src, size_t bytes) override {
    flush_mass();
    if (bytes == 0) return;
    if (bytes > kStageBytes / 4) return sync_copy(dst, src, bytes, cudaMemcpyHostToDevice, "upload");
    launcher_->flush();  // first: issuing may stage an eviction table (upload_evictions)
    staged_upload(dst, src, bytes, "upload");
  }
  // bytes (at most kStageBytes) copied into the pinned staging area and their copy to dst queued
  // on the stream, after whatever was issued; the area starts over once the device has read it.
  void staged_upload(void* dst, const void* src, size_t bytes, const char* what) {
    if (!stage_) stage_ = std::make_unique<PinnedBuffer>(kStageBytes);
    if (stage_used_ + bytes > kStageBytes) {  // full: wait until the device has read it
      check(cudaStreamSynchronize(launcher_->stream()), what);
      stage_used_ = 0;
    }
    unsigned char* at = stage_->as<unsigned char>() + stage_used_;
    std::memcpy(at, src, bytes);
    check(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyHostToDevice, launcher_->stream()), what);
    stage_used_ += (bytes + 255) / 256 * 256;
  }
  void download(void* dst, const void* src, size_t bytes) override {
    flush_mass();
    sync_copy(dst, src, bytes, cudaMemcpyDeviceToHost, "download");
  }
  void download_later(void* dst, const void* src, size_t bytes) override {
    flush_mass();
    if (bytes == 0) return;
    launcher_->flush();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, launcher_->stream()), "download");
  }
  void wait() override {
    flush_mass();
    launcher_->flush();
    check(cudaStreamSynchronize(launcher_->stream()), "wait");
    stage_used_ = 0;  // every staged upload has landed
  }
  // Within the device the host need not wait: the stream orders the copy before any later work
  // (and before a freed source's block is taken again).
  void copy(void* dst, const void* src, size_t bytes) override { copy_rows(dst, bytes, src, bytes, bytes, 1); }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height) override {
    flush_mass();
    if (width == 0 || height == 0) return;
    launcher_->flush();
    check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, launcher_->stream()), "copy");
  }
  int64_t graph_replays() const override { return launcher_->replays(); }

  WeightMatrix prepare_weight(const WeightMatrix& w, WeightUse use, std::unique_ptr<Buffer>& keep) override {
    if (use == WeightUse::kMatrix && packed(w.type)) return upload_packed(w, keep);
    // vectors stay f32; matrices become bf16 (f32 in the exact mode), dequantized row by row
    const bool f32 = use == WeightUse::kVector || opt_.f32_weights;
    keep = alloc(device_row_bytes(w, f32) * static_cast<size_t>(w.rows));
    return convert_weight(keep->as<uint8_t>(), w, f32);
  }
  // One buffer for matrices of the same columns, one after another: their joined products
  // (joined_product) read them as one matrix.
  void prepare_weights(const WeightMatrix* in, int n, WeightMatrix* out, std::vector<std::unique_ptr<Buffer>>& keep) override {
    const bool f32 = opt_.f32_weights;
    size_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      // packed matrices one by one: their products run part by part (packed_product)
      if (in[i].cols != in[0].cols || packed(in[i].type)) return Backend::prepare_weights(in, n, out, keep);
      bytes += device_row_bytes(in[i], f32) * static_cast<size_t>(in[i].rows);
    }
    std::unique_ptr<Buffer> buf = alloc(bytes);
    uint8_t* at = buf->as<uint8_t>();
    for (int i = 0; i < n; ++i) {
      out[i] = convert_weight(at, in[i], f32);
      at += out[i].row_bytes * static_cast<size_t>(out[i].rows);
    }
    keep.push_back(std::move(buf));
  }

  void embed(float* x, const WeightMatrix& table, const int32_t* tokens, int T) override {
    // the table stays in host memory (rows picked by host ids); T rows travel per step
    host_rows_.resize(static_cast<size_t>(T) * table.cols);
    for (int t = 0; t < T; ++t) dequantize_row(table.type, table.row(tokens[t]), host_rows_.data() + static_cast<size_t>(t) * table.cols, table.cols);
    upload(x, host_rows_.data(), host_rows_.size() * sizeof(float));
  }

  // A decode batch: more than kGemvRows rows as opt_.batch says (cuBLAS or gemm_rows: bf16
  // activations on the tensor cores; gemm_rows takes any number, one included), else up to
  // kGemvRows rows per GEMV launch, each row's sums formed exactly as in a one-row launch (its own
  // accumulators, the same order), the weights read once per launch.
  void matmul_rows(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations act) override {
    const MatmulPart one{out, &w, bias, nullptr};
    if (packed_product(&one, 1, x, T, RowMode::kIndependent, false)) return;
    if (batch_rows(&one, 1, x, T)) return;
    for (int64_t t0 = 0; t0 < T; t0 += kGemvRows) {
      const int n = static_cast<int>(std::min<int64_t>(kGemvRows, T - t0));
      const MatmulPart part{out + t0 * w.rows, &w, bias, nullptr};
      if (!launch_gemv(*launcher_, &part, 1, x + t0 * w.cols, n, false)) Backend::matmul_rows(out + t0 * w.rows, x + t0 * w.cols, w, n, bias, act);
    }
  }

  void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations) override {
    const MatmulPart part{out, &w, bias, nullptr};
    if (T == 1 && all_rows_on_gemm_rows()) {  // a lone decode step's row as a decode batch's
      matmul_rows(out, x, w, T, bias, Activations::kF32);
      return;
    }
    if (packed_product(&part, 1, x, T, RowMode::kChunk, false)) return;
    if (T <= kGemvRows && launch_gemv(*launcher_, &part, 1, x, static_cast<int>(T), false)) return;
    gemm_parts(&part, 1, x, T);
  }

  // One launch for all parts where the GEMV serves them (their RoPE in its epilogue); else one
  // product for parts laid out together (joined_product), or x converted to bf16 once and one
  // product per part.
  void matmuls(const MatmulPart* parts, int n, const float* x, int64_t T, Activations act, RowMode rows) override {
    if (packed_product(parts, n, x, T, rows, false)) return;
    if (T <= kGemvRows && !rows_on_gemm_rows(rows) && launch_gemv(*launcher_, parts, n, x, static_cast<int>(T), false)) return;
    if (joined_product(parts, n, x, T, rows, false)) return;
    if (decode_rows(T, rows)) {
      if (!batch_rows(parts, n, x, T)) return Backend::matmuls(parts, n, x, T, act, rows);
    } else {
      gemm_parts(parts, n, x, T);
    }
    rope_parts(parts, n, T);
  }

  void matmul_swiglu(float* gate, float* up, const float* x, const WeightMatrix& w_gate, const WeightMatrix& w_up, int64_t T,
                     Activations act, RowMode rows) override {
    const MatmulPart parts[2] = {{gate, &w_gate, nullptr, nullptr}, {up, &w_up, nullptr, nullptr}};
    if (w_gate.rows == w_up.rows && packed_product(parts, 2, x, T, rows, true)) return;
    if (T <= kGemvRows && !rows_on_gemm_rows(rows) && w_gate.rows == w_up.rows && launch_gemv(*launcher_, parts, 2, x, static_cast<int>(T), true))
      return;
    if (w_gate.rows == w_up.rows && joined_product(parts, 2, x, T, rows, true)) return;
    Backend::matmul_swiglu(gate, up, x, w_gate, w_up, T, act, rows);
  }

  // A norm's rows are what the next products read: past the GEMV's rows, in bf16 too (bf16_rows_)
  void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps) override {
    __nv_bfloat16* ob = bf16_twin(T, E);
    launch_rmsnorm(*launcher_, out, ob, const_cast<float*>(x), nullptr, w, T, E, eps);  // x is not written
    if (ob != nullptr) bf16_written(out, T * E);
  }
  void add_rmsnorm(float* out, float* x, const float* y, const float* w, int64_t T, int64_t E, float eps) override {
    __nv_bfloat16* ob = bf16_twin(T, E);
    launch_rmsnorm(*launcher_, out, ob, x, y, w, T, E, eps);
    if (ob != nullptr) bf16_written(out, T * E);
  }
  void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq, RopePairing pairing) override {
    launch_rope(*launcher_, x, pos, T, n_heads, D, inv_freq, pairing == RopePairing::kAdjacent);
  }
  void silu_mul(float* gate, const float* up, int64_t n) override {
    launch_silu_mul(*launcher_, gate, up, n);
  }
  void add(float* x, const float* y, int64_t n) override {
    launch_add(*launcher_, x, y, n);
  }
  void sample_rows(int32_t* out, const float* x, const SampleParams* params, int64_t n, int64_t V) override {
    if (n < 1) return;
    grow(sample_q_, static_cast<size_t>(n) * V * sizeof(float));
    launch_sample_rows(*launcher_, out, x, params, sample_q_->as<float>(), n, V);
  }

  void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& view,
                 AttentionProbe* probe) override {
    if (T == 1 && attention_decode(out, q, q_pos, H, view, probe)) return;
    if (kv_quantized(view.type) || kv_quantized(view.v_type)) {  // the other kernels read f16 or f32 rows: the held rows converted once
      attention(out, q, q_pos, T, H, dequantized(view), probe);
      return;
    }
    flush_mass();
    KvView kv;
    AttnShape a = attn_shape(view, static_cast<int>(T), H, probe, kv);
    const bool dev_n = kv.count_dev != nullptr;
    if (a.D > kMaxHeadDim) throw Error("cuda attention: head dim " + std::to_string(a.D) + " above 256");
    if (a.grp > kAttnRows) throw Error("cuda attention: more than 32 query heads per kv head");
    a.qt = std::max(1, std::min(a.T, kAttnRows / a.grp));
    const int qtiles = (a.T + a.qt - 1) / a.qt;
    // split long key ranges when the blocks alone would not fill the device (sizes only; with N
    // on the device the most splits follow the capacity, so the arguments stay the same)
    const int blocks = a.G * qtiles, n_bound = dev_n ? kv.capacity : view.count;
    a.min_keys = kMinSplitKeys;
    a.splits = blocks < 2 * sms_ ? std::max(1, std::min({(2 * sms_) / blocks, (n_bound + a.min_keys - 1) / a.min_keys, 64})) : 1;
    const int grid_splits = key_range(view.count, a.splits, a.min_keys).splits;  // as in attention_decode
    a.direct = grid_splits == 1;
    const size_t rows = static_cast<size_t>(a.T) * H;
    grow(ml_, rows * 2 * sizeof(float));
    if (!a.direct) {
      grow(part_acc_, grid_splits * rows * a.D * sizeof(float));
      grow(part_ml_, grid_splits * rows * 2 * sizeof(float));
    }
    const dim3 grid(a.G, qtiles, grid_splits);
    float* part_ml = a.direct ? nullptr : part_ml_->as<float>();
    float* part_acc = a.direct ? nullptr : part_acc_->as<float>();
    Launcher& L = *launcher_;
    // the tensor-core kernel writes the output's bf16 twin too, which the output product reads
    // (marked after the mass passes, which leave both alone)
    __nv_bfloat16* ob = opt_.attn_bf16_out ? bf16_twin(a.T, static_cast<int64_t>(H) * a.D) : nullptr;
    const bool mma = attention_mma(out, ob, q, q_pos, kv, a);
    if (!mma) launch_attn_tiles(L, grid, out, ml_->as<float>(), part_acc, part_ml, q, q_pos, kv, a);
    auto twin_written = [&] {
      if (mma && ob != nullptr) bf16_written(out, static_cast<int64_t>(rows) * a.D);
    };
    float* mass = probe != nullptr ? probe->mass : nullptr;
    const bool ent = probe != nullptr && probe->entropy;
    if (mass == nullptr && !ent) return twin_written();  // no second pass unless a policy needs it
    const int64_t stride = probe->mass_stride > 0 ? probe->mass_stride : view.count;
    float* e = nullptr;
    if (ent) {
      grow(ent_, rows * 2 * sizeof(float));
      L.flush();
      check(cudaMemsetAsync(ent_->data(), 0, rows * 2 * sizeof(float), L.stream()), "memset");
      e = ent_->as<float>();
    }
    const bool mass_max = probe->reduce == MassReduce::kMax;
    if (mma && !ent && !mass_max && opt_.mma_mass) {
      mass_mma(mass, stride, probe->mass_row_begin, q, q_pos, kv, a);
      return twin_written();
    }
    // without the entropy, the query tiles before the first row that adds mass are left out
    const int tile0 = ent ? 0 : first_mass_tile(probe->mass_row_begin, a.qt, qtiles);
    const dim3 pgrid(a.G, qtiles - tile0, grid_splits);
    launch_attn_probe(L, pgrid, mass, stride, probe->mass_row_begin, mass_max, e, ml_->as<float>(), q, q_pos, kv, a, tile0);
    if (ent) {  // the one step that reports a squeeze metric
      std::vector<float> h(rows * 2);
      download(h.data(), e, h.size() * sizeof(float));
      for (size_t r = 0; r < rows; ++r)
        if (h[2 * r + 1] >= 2.0f) probe->entropy_sum += h[2 * r] / std::log(h[2 * r + 1]), ++probe->entropy_rows;
    }
    twin_written();
  }

  // A decode batch (one row per sequence, the rows of the step in order, as the forward pass
  // makes them): the rows' writes and attention in one launch, then one merge and
  // one mass launch, every sequence with its lone launch's splits and arithmetic. Where the calls
  // do not have that shape, one after another.
  void attention_batch(AttentionCall* calls, int n) override {
    for (int c0 = 0; c0 < n; c0 += kMaxBatchSeqs) {
      const int m = std::min(kMaxBatchSeqs, n - c0);
      if (!decode_batch(calls + c0, m) && !prompt_batch(calls + c0, m)) Backend::attention_batch(calls + c0, m);
    }
  }
  // Prompt chunks of several sequences (a served batch's prefill step), the step's rows in order:
  // every part's attention in one tensor-core launch and their mass in a second, each block as
  // in the part's lone k_attn_mma launch. A short chunk alone leaves most SMs idle and takes the
  // CUDA-core kernels (attention_mma's fill rule); together the parts fill the device. Where the
  // shapes do not serve (q8_0 or f32 rows, the entropy, kvzip's max, or too few blocks in all):
  // one call after another.
  bool prompt_batch(const AttentionCall* c, int n) {
    if (n < 2 || n > kMaxPromptParts || !opt_.batch_attention || !opt_.mma_attention || !opt_.mma_mass) return false;
    const AttentionCall& c0 = c[0];
    const int H = c0.H, G = c0.kv.n_kv_heads, D = c0.kv.head_dim;
    if (G < 1 || H % G != 0 || H / G > 16 || (D != 64 && D != 128)) return false;
    AttnShape a{};
    a.H = H, a.G = G, a.grp = H / G, a.D = D, a.qt = kMmaRows / a.grp, a.splits = 1, a.direct = 1;
    a.min_keys = kMinSplitKeys;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    const size_t HD = static_cast<size_t>(H) * D;
    int rows = 0, most_tiles = 0, most_mass_tiles = 0, blocks = 0, mass_blocks = 0, max_key_tiles = 1;
    for (int i = 0; i < n; ++i) {
      const AttentionCall& x = c[i];
      const KvView& v = x.kv;
      if (x.H != H || v.n_kv_heads != G || v.head_dim != D || v.type != KvType::kF16 || v.v_type != KvType::kF16 ||
          x.write.arrays != nullptr || x.T < 1)
        return false;
      if (x.q != c0.q + rows * HD || x.out != c0.out + rows * HD || x.q_pos != c0.q_pos + rows) return false;
      const AttentionProbe* p = x.probe;
      const bool mass = p != nullptr && p->mass != nullptr;
      if (p != nullptr && (p->entropy || (mass && p->reduce == MassReduce::kMax))) return false;
      if (mass && p->mass_stride <= 0 && v.count_dev != nullptr) return false;  // (the lone call's error)
      const int T = static_cast<int>(x.T), qtiles = (T + a.qt - 1) / a.qt;
      MmaPart& e = parts_.p[i];
      e = MmaPart{v.k, v.v, v.pos, v.count_dev, mass ? p->mass : nullptr, mass ? (p->mass_stride > 0 ? p->mass_stride : v.count) : 0,
                  mass ? p->mass_row_begin : 0, v.count_dev != nullptr ? 0 : v.count, v.capacity, rows, T,
                  mass ? first_mass_tile(p->mass_row_begin, a.qt, qtiles) : 0, 0};
      rows += T;
      most_tiles = std::max(most_tiles, qtiles);
      blocks += G * qtiles;
      if (mass) {
        most_mass_tiles = std::max(most_mass_tiles, qtiles - e.mass_tile0);
        mass_blocks += G * (qtiles - e.mass_tile0);
        max_key_tiles = std::max(max_key_tiles, (v.capacity + kMmaKeys - 1) / kMmaKeys);
      }
    }
    if (blocks < sms_ / 2) return false;  // the lone calls split their keys over the SMs instead
    flush_mass();
    std::fill(parts_.p + n, parts_.p + kMaxPromptParts, MmaPart{});
    grow(ml_, static_cast<size_t>(rows) * H * 2 * sizeof(float));
    Launcher& L = *launcher_;
    launch_attn_mma_parts(L, dim3(G, most_tiles, n), c0.out, ml_->as<float>(), c0.q, c0.q_pos, parts_, a);
    if (mass_blocks > 0) {
      // the keys split over blocks until the grid fills the device 4 times over, as mass_mma
      const int splits = std::max(1, std::min((4 * sms_ + mass_blocks - 1) / mass_blocks, max_key_tiles));
      launch_attn_mma_mass_parts(L, dim3(G, most_mass_tiles, n * splits), ml_->as<float>(), c0.q, c0.q_pos, parts_, a, splits);
    }
    return true;
  }
  bool decode_batch(const AttentionCall* c, int n) {
    if (n < 2 || !opt_.batch_attention) return false;
    const AttentionCall& c0 = c[0];
    const int H = c0.H, G = c0.kv.n_kv_heads, D = c0.kv.head_dim;
    const KvType type = c0.kv.type, v_type = c0.kv.v_type;
    if (G < 1 || H % G != 0 || H / G > 8) return false;
    // K and V of one type: either kernel; Q4_1 values: the tensor-core kernel only
    const bool same = v_type == type && (type == KvType::kF16 || type == KvType::kQ8_0);
    const int lpk = same ? decode_lanes(type, D) : 0;
    if (same ? lpk == 0 : !mma_decode(c0.kv, H / G)) return false;
    const bool writes = c0.write.arrays != nullptr;
    const bool mass_max = c0.probe != nullptr && c0.probe->reduce == MassReduce::kMax;
    const size_t HD = static_cast<size_t>(H) * D, GD = static_cast<size_t>(G) * D;
    bool any_mass = false;
    int cap_max = 0;
    for (int i = 0; i < n; ++i) {
      const AttentionCall& x = c[i];
      const KvView& v = x.kv;
      if (x.T != 1 || x.H != H || v.n_kv_heads != G || v.head_dim != D || v.type != type || v.v_type != v_type || v.count_dev == nullptr) return false;
      if (x.q != c0.q + i * HD || x.out != c0.out + i * HD || x.q_pos != c0.q_pos + i) return false;
      if ((x.write.arrays != nullptr) != writes) return false;
      if (writes && (x.write.k != c0.write.k + i * GD || x.write.v != c0.write.v + i * GD || x.write.pos != x.q_pos ||
                     x.write.arrays->k != v.k || x.write.arrays->count_dev != v.count_dev)) return false;
      if (const AttentionProbe* p = x.probe) {
        if (p->entropy) return false;
        if (p->mass != nullptr) {
          if (p->mass_row_begin > 0 || (p->mass_stride != 0 && p->mass_stride != v.capacity) || (p->reduce == MassReduce::kMax) != mass_max)
            return false;
          any_mass = true;
        }
      }
      cap_max = std::max(cap_max, v.capacity);
    }
    // each sequence's splits as its lone launch has them (attention_decode), or with
    // batch_lone_splits off at most as many as fill the GPU over the whole batch
    AttnShape a{};
    a.T = 1, a.H = H, a.G = G, a.grp = H / G, a.D = D, a.N = 0, a.cap = 0, a.qt = 1, a.direct = 0;
    a.min_keys = opt_.decode_split_keys;
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    const int gmax = a.grp <= 4 ? 4 : 8;
    const bool mma = mma_decode(c0.kv, a.grp);
    const int blocks = decode_blocks(c0.kv, a.grp);
    const int batch_cap = opt_.batch_lone_splits ? kMaxSplits : std::max(1, (blocks * sms_) / (n * G));
    int most = 1;
    for (int i = 0; i < n; ++i) {
      const KvView& v = c[i].kv;
      const int splits = std::min(decode_splits(v.capacity, G, blocks), batch_cap);
      const KeyRange kr = key_range(v.count, splits, a.min_keys);
      most = std::max(most, kr.splits);
      const AttentionProbe* p = c[i].probe;
      const bool add = p != nullptr && p->mass != nullptr;
      float* mass = writes ? c[i].write.arrays->mass : nullptr;
      if (add) mass = p->mass;
      batch_.s[i] = DecodeSeq{const_cast<void*>(v.k), const_cast<void*>(v.v), const_cast<int32_t*>(v.pos), mass, v.count_dev,
                              v.capacity, splits, i, add ? 1 : 0};
      if (add || writes) flush_mass(mass);  // a mass this layer still owes comes first
    }
    pending_row_ = KvRowWrite{};
    const int64_t part_stride = static_cast<int64_t>(most) * HD, part_ml_stride = static_cast<int64_t>(most) * H * 2;
    const int64_t score_stride = any_mass ? static_cast<int64_t>(G) * gmax * cap_max : 0;
    grow(batch_ml_, static_cast<size_t>(n) * H * 2 * sizeof(float));
    grow(batch_acc_, static_cast<size_t>(n) * part_stride * sizeof(float));
    grow(batch_pml_, static_cast<size_t>(n) * part_ml_stride * sizeof(float));
    grow(batch_info_, static_cast<size_t>(n) * sizeof(DecodeInfo));
    if (any_mass) grow(batch_scores_, static_cast<size_t>(n) * score_stride * sizeof(float));
    // the tensor-core kernel and the merge write the rows in bf16 too, the output product's operand
    // (noted after the mass pass, which touches neither copy)
    __nv_bfloat16* ob = mma && opt_.attn_bf16_out ? bf16_twin(n, static_cast<int64_t>(HD)) : nullptr;
    const DecodeRows r{c0.out, batch_ml_->as<float>(), batch_acc_->as<float>(), batch_pml_->as<float>(),
                       any_mass ? batch_scores_->as<float>() : nullptr, batch_info_->as<DecodeInfo>(), c0.q, c0.q_pos,
                       writes ? c0.write.k : nullptr, writes ? c0.write.v : nullptr, part_stride, part_ml_stride, score_stride, ob};
    Launcher& L = *launcher_;
    std::fill(batch_.s + n, batch_.s + kMaxBatchSeqs, DecodeSeq{});  // the recorded bytes repeat from step to step
    if (mma) launch_attn_decode_mma_batch(L, type, v_type, gmax, most, n, sms_, batch_, r, a);
    else launch_attn_decode_batch(L, type, lpk, gmax, most, n, sms_, batch_, r, a);
    if (most > 1) launch_attn_merge_batch(L, n, r, a);
    if (any_mass) launch_attn_mass_batch(L, gmax, dim3(G, (cap_max + kMassBlockKeys - 1) / kMassBlockKeys, n), mass_max, r, a);
    if (ob != nullptr) bf16_written(c0.out, static_cast<int64_t>(n) * static_cast<int64_t>(HD));
    return true;
  }

  // A prompt chunk's attention on the tensor cores (k_attn_mma) where it serves the shape: KV f16,
  // head dim 64 or 128, up to 16 query heads per kv head (a block takes 64 / grp whole tokens; with
  // a grp that does not divide 64 its last rows stay empty), and enough blocks to fill half the SMs
  // without splitting the keys (fewer rows: the general kernel splits them). Writes out and ml_,
  // and where ob is not null out in bf16 there (the output product's operand: no conversion).
  bool attention_mma(float* out, __nv_bfloat16* ob, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& general) {
    const int grp = general.grp, D = general.D;
    if (!opt_.mma_attention || kv.type != KvType::kF16 || (D != 64 && D != 128) || grp < 1 || grp > 16) return false;
    AttnShape a = general;
    a.qt = kMmaRows / grp, a.splits = 1, a.direct = 1;
    const int qtiles = (a.T + a.qt - 1) / a.qt;
    if (a.G * qtiles < sms_ / 2) return false;
    const dim3 grid(a.G, qtiles);
    launch_attn_mma(*launcher_, grid, out, ob, ml_->as<float>(), q, q_pos, kv, a);
    return true;
  }
  // The first of qtiles query tiles (qt tokens each) holding a row t >= row_begin, the first
  // row that adds mass: the mass passes' grids start there.
  static int first_mass_tile(int64_t row_begin, int qt, int qtiles) {
    return static_cast<int>(std::min<int64_t>(std::max<int64_t>(row_begin, 0) / qt, qtiles - 1));
  }
  // The mass (sums) of the chunk k_attn_mma just ran, on the tensor cores: its shape and ml_.
  void mass_mma(float* mass, int64_t stride, int64_t row_begin, const float* q, const int32_t* q_pos, const KvView& kv,
                const AttnShape& general) {
    AttnShape a = general;
    a.qt = kMmaRows / a.grp, a.splits = 1, a.direct = 1;
    const int qtiles = (a.T + a.qt - 1) / a.qt;
    const int tile0 = first_mass_tile(row_begin, a.qt, qtiles);
    // the keys split over blocks until the grid fills the device 4 times over (at most the
    // capacity's tiles: with N on the device a split may find none and return)
    const int blocks = a.G * (qtiles - tile0), max_tiles = (kv.capacity + kMmaKeys - 1) / kMmaKeys;
    const int splits = std::max(1, std::min((4 * sms_ + blocks - 1) / blocks, max_tiles));
    const dim3 grid(a.G, qtiles - tile0, splits);
    launch_attn_mma_mass(*launcher_, grid, mass, stride, row_begin, ml_->as<float>(), q, q_pos, kv, a, tile0);
  }
  // What both attention paths share: the view as the kernels get it (with the count in device
  // memory they read N there, and the host count leaves the arguments, so a recorded decode step's
  // stay the same from step to step) and the shape's sizes; each path sets its splits.
  AttnShape attn_shape(const KvView& view, int T, int H, const AttentionProbe* probe, KvView& kv) const {
    kv = view;
    const bool dev_n = kv.count_dev != nullptr;
    if (dev_n) kv.count = 0;
    if (probe != nullptr && (probe->mass != nullptr || probe->entropy) && probe->mass_stride <= 0 && dev_n)
      throw Error("cuda attention: a mass accumulator needs its stride when N is on the device");
    AttnShape a{};
    a.T = T, a.H = H, a.G = kv.n_kv_heads, a.grp = H / kv.n_kv_heads, a.D = kv.head_dim;
    a.N = dev_n ? 0 : view.count;
    a.cap = kv.capacity;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
    return a;
  }

  // The view with its quantized rows (Q8_0, Q4_1: K, V or both) converted in scratch
  // (launch_kv_dequantize: the rows held, N read where the view has it), positions and count as
  // they are: what every kernel but the decode kernels reads. f16 (the tensor-core prompt
  // kernel's rows), f32 in the exact test mode (f16 rows beside quantized ones converted too). A
  // prompt chunk converts each held row once a layer (the CPU's tile kernels do the same in f32,
  // backend/cpu/attention.cc).
  KvView dequantized(const KvView& view) {
    const KvType to = opt_.f32_weights ? KvType::kF32 : KvType::kF16;
    const size_t bytes = static_cast<size_t>(view.n_kv_heads) * view.capacity * view.head_dim * kv_type_bytes(to);
    KvView f = view;
    if (view.type != to) {
      grow(kv_rows_k_, bytes);
      launch_kv_dequantize(*launcher_, view.type, to, kv_rows_k_->data(), view.k, view);
      f.k = kv_rows_k_->data(), f.type = to;
    }
    if (view.v_type != to) {
      grow(kv_rows_v_, bytes);
      launch_kv_dequantize(*launcher_, view.v_type, to, kv_rows_v_->data(), view.v, view);
      f.v = kv_rows_v_->data(), f.v_type = to;
    }
    return f;
  }

  // A decode step's mass not yet added (attention_decode), waiting for the layer's eviction.
  struct PendingMass {
    float* mass;
    const float* scores;
    const float* ml;
    int64_t stride;
    bool mass_max;
    int gmax, count;
    dim3 grid;
    KvView kv;
    AttnShape a;
  };
  // One query token (decode) where k_attn_decode serves the shape: splits of the keys, their merge,
  // and the mass from the kept scores when a policy asks for it. False: the general kernel's turn.
  bool attention_decode(float* out, const float* q, const int32_t* q_pos, int H, const KvView& view, AttentionProbe* probe) {
    const int G = view.n_kv_heads, grp = H / G, D = view.head_dim;
    // K and V of one type: either kernel; Q4_1 values: the tensor-core kernel only (else the
    // general kernel over the rows converted)
    const int lpk = view.type == view.v_type ? decode_lanes(view.type, D) : 0;
    if (grp > 8 || H % G != 0 || (lpk == 0 && !mma_decode(view, grp))) return false;
    if (probe != nullptr && probe->entropy) return false;
    const bool use_mass = probe != nullptr && probe->mass != nullptr && probe->mass_row_begin <= 0;
    KvView kv;
    AttnShape a = attn_shape(view, 1, H, probe, kv);
    const bool dev_n = kv.count_dev != nullptr;
    a.qt = 1;
    a.min_keys = opt_.decode_split_keys;
    a.splits = decode_splits(dev_n ? kv.capacity : view.count, G, decode_blocks(kv, grp));
    // the grid from this step's N (the host knows it): a replayed step has the same N's split
    // count, and the kernels, reading N on the device, find the same splits
    const KeyRange kr = key_range(view.count, a.splits, a.min_keys);
    const int grid_splits = kr.splits;
    a.direct = grid_splits == 1;
    const size_t rows = static_cast<size_t>(H);
    if (use_mass) flush_mass(probe->mass);  // a mass this layer still owes comes first
    grow(ml_, rows * 2 * sizeof(float));
    grow(part_acc_, grid_splits * rows * D * sizeof(float));
    grow(part_ml_, grid_splits * rows * 2 * sizeof(float));
    const int gmax = grp <= 4 ? 4 : 8;
    const size_t score_bytes = static_cast<size_t>(G) * gmax * kv.capacity * sizeof(float);
    const int64_t stride = use_mass && probe->mass_stride > 0 ? probe->mass_stride : view.count;
    // the mass may wait for this layer's eviction at the end of the step (the eviction kernel adds
    // it before it picks the row to drop: one launch a layer fewer); the scores and max/sum then
    // need this layer's own buffers until then
    const bool defer = use_mass && opt_.defer_mass && dev_n && stride == kv.capacity && score_bytes <= kMaxDeferredScoreBytes;
    float* scores = nullptr;
    float* ml = nullptr;
    if (defer) {
      LayerScratch& ls = layer_scratch_[probe->mass];
      grow(ls.scores, score_bytes);
      grow(ls.ml, rows * 2 * sizeof(float));
      scores = ls.scores->as<float>(), ml = ls.ml->as<float>();
    } else {
      if (use_mass) {
        grow(scores_, score_bytes);
        scores = scores_->as<float>();
      }
      ml = ml_->as<float>();
    }
    Launcher& L = *launcher_;
    const dim3 grid(G, grid_splits);
    float *pa = part_acc_->as<float>(), *pm = part_ml_->as<float>();
    // this layer's new row, if its k_kv_write was the launch just before: written by the split
    // that holds it, one launch fewer a layer
    KvRowWrite w;
    if (pending_row_.k != nullptr && pending_row_.K == kv.k && dev_n && L.take_back(&pending_row_)) w = pending_row_;
    pending_row_ = KvRowWrite{};
    if (mma_decode(kv, grp)) launch_attn_decode_mma(L, gmax, grid, out, ml, pa, pm, scores, q, q_pos, kv, a, w);
    else launch_attn_decode(L, lpk, gmax, grid, out, ml, pa, pm, scores, q, q_pos, kv, a, w);
    if (use_mass) {
      const PendingMass pm_rec{probe->mass, scores, ml, stride, probe->reduce == MassReduce::kMax, gmax, view.count, grid, kv, a};
      if (defer) pending_mass_.push_back(pm_rec);
      else launch_mass(pm_rec);
    }
    return true;
  }
  // The most splits of a decode step's keys (n_bound keys at most, G kv heads, `blocks` of its
  // kernel an SM: decode_blocks): enough blocks to keep every SM streaming, at least
  // decode_split_keys each: a lone sequence's, and a batch's too with batch_lone_splits
  // (otherwise capped by the batch: decode_batch).
  int decode_splits(int n_bound, int G, int blocks) const {
    return std::max(1, std::min({(blocks * sms_) / G, (n_bound + opt_.decode_split_keys - 1) / opt_.decode_split_keys, kMaxSplits}));
  }
  // A decode step's attention blocks a sequence takes per SM: CudaOptions::decode_blocks_per_sm,
  // or as many as its kernel's blocks an SM holds at once (the tensor-core kernel's,
  // decode_mma_blocks_per_sm; 4 for the CUDA-core kernel's).
  int decode_blocks(const KvView& kv, int grp) const {
    if (opt_.decode_blocks_per_sm > 0) return opt_.decode_blocks_per_sm;
    return mma_decode(kv, grp) ? decode_mma_blocks_per_sm() : 4;
  }
  // Whether a decode step's attention runs on the tensor cores (attn_decode_mma.h): a lone
  // sequence and a batch choose alike, so a sequence's bits do not depend on the batch.
  bool mma_decode(const KvView& kv, int grp) const { return opt_.mma_decode && decode_mma_serves(kv, grp); }
  // A decode step's mass from the kept scores (k_attn_mass), now.
  void launch_mass(const PendingMass& p) {
    launch_attn_mass(*launcher_, p.gmax, p.grid, p.mass, p.stride, p.mass_max, p.scores, p.ml, p.kv, p.a);
  }
  // The deferred masses of the layer whose mass array is `mass` (null: of every layer) launched
  // now: before anything else reads or writes those arrays.
  void flush_mass(const float* mass = nullptr) {
    for (size_t i = 0; i < pending_mass_.size();) {
      if (mass == nullptr || pending_mass_[i].mass == mass) {
        launch_mass(pending_mass_[i]);
        pending_mass_.erase(pending_mass_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  void kv_evict_one(const KvArrays& a, int count, int32_t keep_below, int32_t keep_from, const int32_t* newest_dev,
                    int n_recent) override {
    if (newest_dev != nullptr) keep_from = 0;  // the kernel reads it (the arguments stay the same from step to step)
    else n_recent = 0;
    EvictOne e{static_cast<uint32_t*>(a.k), static_cast<uint32_t*>(a.v), a.pos, a.mass, newest_dev, nullptr, nullptr,
               static_cast<uint32_t>(a.row_bytes() / 4), static_cast<uint32_t>(a.v_row_bytes() / 4), a.capacity, count, keep_below, keep_from,
               n_recent, 0, 0, 0};
    // this layer's deferred mass, added by the eviction kernel (the same step's: the same rows)
    for (size_t i = 0; i < pending_mass_.size(); ++i) {
      const PendingMass& p = pending_mass_[i];
      if (p.mass != a.mass) continue;
      if (p.count == count && p.stride == a.capacity) {
        e.scores = p.scores, e.ml = p.ml, e.grp = p.a.grp, e.gmax = p.gmax, e.mass_max = p.mass_max;
        pending_mass_.erase(pending_mass_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        flush_mass(a.mass);
      }
      break;
    }
    // the evictions at the end of a step come one after another, every layer of every sequence:
    // while the last launch is this kind's, it is taken back and relaunched with one entry more
    // (one launch a step). The entries go to a table in device memory when the launcher issues
    // them (upload_evictions), so a relaunch copies two words, not the table.
    if (evicts_.size() == kEvictTable) launcher_->flush();  // full: issued (and evicts_ emptied)
    if (!evict_dev_) evict_dev_ = alloc(kEvictTable * sizeof(EvictOne));
    if (evicts_.size() == evict_first_ || evict_g_ != a.G || !launcher_->take_back(&evicts_)) evict_first_ = evicts_.size();
    evicts_.push_back(e);
    evict_g_ = a.G;
    launch_kv_evict(*launcher_, &evicts_, evict_dev_->as<EvictOne>() + evict_first_, static_cast<int>(evicts_.size() - evict_first_), a.G);
  }
  // Launcher::on_flush: the evictions recorded since the last issue to evict_dev_[0, n), through
  // the pinned staging area (no wait), where they differ from what it holds already: a batch's
  // steps repeat the same table, so a step copies nothing. Stream order puts the copy after the
  // launches issued before, which read the table's earlier bytes, and before the recorded ones.
  void upload_evictions() {
    if (evicts_.empty()) return;
    const size_t n = evicts_.size(), bytes = n * sizeof(EvictOne);
    if (evicts_held_.size() < n || std::memcmp(evicts_held_.data(), evicts_.data(), bytes) != 0) {
      staged_upload(evict_dev_->data(), evicts_.data(), bytes, "eviction table");
      if (evicts_held_.size() < n) evicts_held_.resize(n);
      std::copy(evicts_.begin(), evicts_.end(), evicts_held_.begin());
    }
    evicts_.clear();
    evict_first_ = 0;
  }

  double copy_bandwidth() override {
    if (bandwidth_ > 0) return bandwidth_;
    const size_t bytes = size_t{1} << 30;  // 1 GiB each way, well past the L2
    auto a = alloc(bytes), b = alloc(bytes);
    const cudaStream_t st = launcher_->stream();
    launcher_->flush();
    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    std::vector<float> ms;
    for (int i = 0; i < 6; ++i) {
      check(cudaEventRecord(e0, st), "event");
      check(cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, st), "copy");
      check(cudaEventRecord(e1, st), "event");
      check(cudaEventSynchronize(e1), "event");
      float t = 0;
      check(cudaEventElapsedTime(&t, e0, e1), "event");
      if (i > 0) ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    std::sort(ms.begin(), ms.end());
    bandwidth_ = 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);  // read + written
    return bandwidth_;
  }

  void kv_write(const KvArrays& a, int at, const float* k, const float* v, const int32_t* rows_pos, int T) override {
    flush_mass(a.mass);
    if (a.D > 1024) throw Error("cuda kv_write: head dim above 1024");
    if (!cuda_kv_types({a.type, a.v_type}, a.D))  // the runner refuses such a cache first, naming the flag
      throw Error("cuda kv_write: K and V rows of one type, f16, f32 or q8_0, or q4_1 values beside f16 or q8_0 keys (q8_0 for head "
                  "dims that are multiples of 64)");
    if (a.count_dev != nullptr) at = 0;  // the kernel reads it (the arguments stay the same from step to step)
    // one row with N on the device: the decode attention that follows may take the write over
    const bool fusable = T == 1 && a.count_dev != nullptr && opt_.fuse_kv_write;
    pending_row_ = fusable ? KvRowWrite{a.k, a.v, a.pos, a.mass, k, v, rows_pos} : KvRowWrite{};
    launch_kv_write(*launcher_, fusable ? &pending_row_ : nullptr, a, at, k, v, rows_pos, T);
  }
  void kv_evict_top(const KvArrays& a, int count, int n_evict, int32_t keep_below, int32_t keep_from,
                    int32_t* dead_pos) override {
    flush_mass(a.mass);  // the mass the rule reads, final
    if (n_evict <= 0) return;
    int* scratch = nullptr;
    if (dead_pos == nullptr) {
      const size_t need = 2 * static_cast<size_t>(a.G) * n_evict * sizeof(int);
      if (!top_scratch_ || top_scratch_->bytes() < need) top_scratch_ = alloc(std::max<size_t>(need, 4096));
      scratch = top_scratch_->as<int>();
    }
    launch_kv_evict_top(*launcher_, a, count, n_evict, keep_below, keep_from, dead_pos, scratch);
  }
  void error_energy(double* out, const float* o, const float* o_cut, int64_t n) override {
    launch_error_energy(*launcher_, out, o, o_cut, n);
  }
  void kv_move(const KvArrays& a, const int* from, const int* to, int n) override {
    flush_mass(a.mass);
    if (n == 0) return;
    const size_t need = 2 * static_cast<size_t>(n) * sizeof(int);
    if (!moves_ || moves_->bytes() < need) moves_ = alloc(std::max<size_t>(need, 4096));
    upload(moves_->data(), from, n * sizeof(int));
    upload(moves_->as<int>() + n, to, n * sizeof(int));
    launch_kv_move(*launcher_, a, moves_->as<int>(), moves_->as<int>() + n, n);
  }

 private:
  // Whether matrices of type t stay in their GGUF blocks on the device (native weights).
  bool packed(DType t) const { return opt_.native_weights && !opt_.f32_weights && packed_type(t); }

  // w's blocks uploaded as they are stored, each row's fields rearranged into planes
  // (quant_groups.h PlaneSpec: the same bytes) and rows padded to 16 bytes (none for the 8B and
  // 70B shapes, whose rows are multiples of 16 bytes; SmolLM2's Q4_1 rows of 360 bytes gain 8);
  // `bench` reports the matrices' device bytes. The scratch that its products dequantize into
  // (packed_product) grown now, at load, so that the KV pool sized after the weights leaves room.
  WeightMatrix upload_packed(const WeightMatrix& w, std::unique_ptr<Buffer>& keep) {
    if (w.cols % dtype_info(w.type).block_values != 0 || w.row_bytes != dtype_bytes(w.type, w.cols))
      throw Error("cuda: a " + std::string(dtype_info(w.type).name) + " matrix of " + std::to_string(w.cols) +
                  " columns is not whole blocks a row");
    const size_t stride = (w.row_bytes + 15) / 16 * 16;
    const int64_t nb = w.cols / dtype_info(w.type).block_values;
    keep = alloc(stride * static_cast<size_t>(w.rows));
    constexpr size_t kChunkBytes = size_t{8} << 20;  // rows rearranged on the host this many bytes at a time
    const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / stride));
    std::vector<uint8_t> planar(static_cast<size_t>(std::min(rows, w.rows)) * stride);
    for (int64_t r0 = 0; r0 < w.rows; r0 += rows) {
      const int64_t n = std::min(rows, w.rows - r0);
      for (int64_t i = 0; i < n; ++i) to_planes(w.type, w.row(r0 + i), planar.data() + static_cast<size_t>(i) * stride, nb);
      upload(keep->as<uint8_t>() + static_cast<size_t>(r0) * stride, planar.data(), static_cast<size_t>(n) * stride);
    }
    grow(dequantized_, static_cast<size_t>(w.rows) * w.cols * sizeof(__nv_bfloat16));
    WeightMatrix d = w;
    d.data = keep->as<uint8_t>();
    d.row_bytes = stride;
    return d;
  }

  // Products where a part's weights are packed (opt_.native_weights): false, launching nothing,
  // where none is. Rows through the integer GEMV (x rounded to 8 bits once for every part;
  // kGemvQRows rows a launch, the parts of one type in one launch with their RoPE or SwiGLU)
  // while that reads the weights fewer times than the other way costs: up to opt_.packed_gemv_rows
  // rows, and any number in the batch-invariant mode, where each row keeps its lone arithmetic;
  // more rows: a decode batch of up to 64 rows through gemm_rows_q.h (each matrix's blocks read
  // once, dequantized to f16 in shared memory, on the tensor cores) where its shape allows, and
  // prompt chunks and larger batches through each matrix dequantized to bf16 (dequantized_, one
  // matrix at a time) and cuBLAS; RoPE and SwiGLU after. Parts that are not packed take the bf16
  // GEMV or cuBLAS beside them.
  // The crossing (opt_.packed_gemv_rows; H200, 8B shape, Q4_K: 4.9 GB of blocks, 15 GB as bf16):
  // a GEMV pass reads the blocks once per 4 rows, gemm_rows_q once for up to 64 (the crossing
  // measured between 16 and 32 rows: 8 rows 1,052 tok/s on the GEMV against 455, 16 rows 1,110
  // against 890; 32 rows 2,293 on gemm_rows_q).
  bool packed_product(const MatmulPart* parts, int n, const float* x, int64_t T, RowMode rows, bool swiglu) {
    bool any = false;
    for (int i = 0; i < n; ++i) any = any || packed(parts[i].w->type);
    if (!any || T == 0) return false;
    const int64_t C = parts[0].w->cols;
    const bool invariant = rows == RowMode::kIndependent &&
                           (opt_.batch == CudaOptions::BatchProducts::kGemv || opt_.batch == CudaOptions::BatchProducts::kMma);
    if (T > opt_.packed_gemv_rows && !invariant) {
      const bool tiles = rows == RowMode::kIndependent && opt_.packed_mma && T <= kGemmRowsQMaxRows;  // a decode batch of one row tile
      bool converted = false;  // x as f16 for gemm_rows_q, once for every part
      for (int i = 0; i < n; ++i) {
        MatmulPart p = parts[i];
        p.rope = nullptr;
        if (tiles && gemm_rows_q_serves(*p.w)) {
          if (!converted) {
            grow(xh_, static_cast<size_t>(T * C) * sizeof(__half));
            launch_to_f16(*launcher_, xh_->as<__half>(), x, T * C);
            converted = true;
          }
          launch_gemm_rows_q(*launcher_, p.out, xh_->as<__half>(), *p.w, p.bias, static_cast<int>(T));
          continue;
        }
        WeightMatrix bf = *p.w;
        if (packed(bf.type)) {
          launch_dequantize_bf16(*launcher_, dequantized_->as<__nv_bfloat16>(), bf);
          bf.type = DType::BF16;
          bf.data = dequantized_->as<uint8_t>();
          bf.row_bytes = static_cast<size_t>(bf.cols) * sizeof(__nv_bfloat16);
          p.w = &bf;
        }
        gemm_parts(&p, 1, x, T);
      }
      if (swiglu) launch_silu_mul(*launcher_, parts[0].out, parts[1].out, T * parts[0].w->rows);
      else rope_parts(parts, n, T);
      return true;
    }
    grow(xq_, static_cast<size_t>(T * C));
    grow(xs_, static_cast<size_t>(T * (C / 32)) * 4 * sizeof(float));
    launch_quantize_q8(*launcher_, xq_->as<int8_t>(), xs_->as<float>(), x, T, C);  // C: whole blocks (upload_packed)
    // SwiGLU in the launch where gate and up are of one type; else each alone, and silu_mul after
    const bool fused_swiglu = swiglu && parts[0].w->type == parts[1].w->type;
    for (int64_t t0 = 0; t0 < T; t0 += kGemvQRows) {
      const int m = static_cast<int>(std::min<int64_t>(kGemvQRows, T - t0));
      // the parts at rows t0.. (their outputs and rotation positions moved along)
      MatmulPart at[kMaxSplitParts];
      RopeSpec rope[kMaxSplitParts];
      for (int i = 0; i < n; ++i) {
        at[i] = parts[i];
        at[i].out = parts[i].out + t0 * parts[i].w->rows;
        if (parts[i].rope != nullptr) {
          rope[i] = *parts[i].rope;
          rope[i].pos += t0;
          at[i].rope = &rope[i];
        }
      }
      const int8_t* xq = xq_->as<int8_t>() + t0 * C;
      const float* xs = xs_->as<float>() + t0 * (C / 32) * 4;
      // runs of parts of one type, each one launch
      for (int i = 0; i < n;) {
        int e = i + 1;
        while (e < n && at[e].w->type == at[i].w->type && !(swiglu && !fused_swiglu)) ++e;
        const bool sw = fused_swiglu && i == 0 && e == 2;
        if (packed(at[i].w->type)) {
          if (!launch_gemv_q(*launcher_, at + i, e - i, xq, xs, m, sw)) throw Error("cuda: packed product of parts not one launch");
        } else if (!launch_gemv(*launcher_, at + i, e - i, x + t0 * C, m, sw)) {
          for (int k = i; k < e; ++k) {
            MatmulPart one = at[k];
            one.rope = nullptr;
            gemm_parts(&one, 1, x + t0 * C, m);
          }
          if (sw) launch_silu_mul(*launcher_, at[0].out, at[1].out, m * at[0].w->rows);
          else rope_parts(at + i, e - i, m);
        }
        i = e;
      }
    }
    if (swiglu && !fused_swiglu) launch_silu_mul(*launcher_, parts[0].out, parts[1].out, T * parts[0].w->rows);
    return true;
  }

  // A decode batch of more than kGemvRows rows on the tensor cores (opt_.batch kTuned, kBlas or
  // kMma): x converted to bf16 once for all parts, one product per part (no RoPE: the caller's).
  // False, launching nothing, where the path does not serve the parts (kGemv, few rows, not
  // bf16; gemm_rows: columns not a multiple of kGemmRowsK).
  bool batch_rows(const MatmulPart* parts, int n, const float* x, int64_t T) {
    if (opt_.batch == CudaOptions::BatchProducts::kGemv || (T <= kGemvRows && !all_rows_on_gemm_rows())) return false;
    const int64_t C = parts[0].w->cols;
    for (int i = 0; i < n; ++i)
      if (parts[i].w->type != DType::BF16 || parts[i].w->cols != C) return false;
    if (opt_.batch == CudaOptions::BatchProducts::kBlas) {
      gemm_parts(parts, n, x, T);
      return true;
    }
    if (opt_.batch == CudaOptions::BatchProducts::kMma && C % kGemmRowsK != 0) return false;
    if (!bf16_ready(x, T * C)) {
      grow(xb_, static_cast<size_t>(T) * C * 2);
      launch_to_bf16(*launcher_, xb_->as<__nv_bfloat16>(), x, T * C);
    }
    for (int i = 0; i < n; ++i) {
      const MatmulPart& p = parts[i];
      const auto* W = reinterpret_cast<const __nv_bfloat16*>(p.w->data);
      const int R = static_cast<int>(p.w->rows);
      if (opt_.batch == CudaOptions::BatchProducts::kMma) {
        launch_gemm_rows(*launcher_, p.out, xb_->as<__nv_bfloat16>(), W, p.bias, static_cast<int>(T), R, static_cast<int>(C),
                         opt_.gemm_rows_step);
        continue;
      }
      if (lt_->product(p.out, xb_->as<__nv_bfloat16>(), W, R, static_cast<int>(T), static_cast<int>(C))) {
        if (p.bias != nullptr) launch_add_bias(*launcher_, p.out, p.bias, T * R, R);
      } else {  // no cuBLASLt algorithm for the shape: cuBLAS's own (x is converted already)
        gemm(blas_, *launcher_, &p, 1, x, T, xb_->as<__nv_bfloat16>(), true);
      }
    }
    return true;
  }

  static size_t device_row_bytes(const WeightMatrix& w, bool f32) { return static_cast<size_t>(w.cols) * (f32 ? 4 : 2); }
  // w in device memory at dst (device_row_bytes a row): bf16 (f32), dequantized row by row
  WeightMatrix convert_weight(uint8_t* dst, const WeightMatrix& w, bool f32) {
    const size_t row = device_row_bytes(w, f32);
    WeightMatrix d = w;
    d.type = f32 ? DType::F32 : DType::BF16;
    d.data = dst;
    d.row_bytes = row;
    if (!f32 && w.type == DType::BF16) {  // stored as used: one copy
      upload(dst, w.data, row * static_cast<size_t>(w.rows));
      return d;
    }
    constexpr int64_t kRowsPerCopy = 256;
    std::vector<float> f(static_cast<size_t>(w.cols * kRowsPerCopy));
    std::vector<uint16_t> b(f32 ? 0 : f.size());
    for (int64_t r0 = 0; r0 < w.rows; r0 += kRowsPerCopy) {
      const int64_t n = std::min(kRowsPerCopy, w.rows - r0);
      for (int64_t i = 0; i < n; ++i) dequantize_row(w.type, w.row(r0 + i), f.data() + i * w.cols, w.cols);
      const void* src = f.data();
      if (!f32) {
        for (size_t i = 0; i < static_cast<size_t>(n * w.cols); ++i) b[i] = f32_to_bf16(f[i]);
        src = b.data();
      }
      upload(dst + static_cast<size_t>(r0) * row, src, static_cast<size_t>(n) * row);
    }
    return d;
  }

  // The parts' matrices as one (prepare_weights laid them out one after another, of one type and
  // width, every part's rows even), with their RoPE alike; nothing where they are not.
  static std::optional<WeightMatrix> joined(const MatmulPart* parts, int n) {
    if (n < 2 || n > kMaxSplitParts) return std::nullopt;
    WeightMatrix w = *parts[0].w;
    const RopeSpec* rope = nullptr;
    for (int i = 0; i < n; ++i) {
      const WeightMatrix& p = *parts[i].w;
      if (p.rows % 2 != 0) return std::nullopt;
      if (const RopeSpec* r = parts[i].rope) {
        if (rope != nullptr && (r->pos != rope->pos || r->inv_freq != rope->inv_freq || r->D != rope->D || r->pairing != rope->pairing))
          return std::nullopt;
        if (p.rows % r->D != 0) return std::nullopt;
        rope = r;
      }
      if (i == 0) continue;
      if (p.type != w.type || p.cols != w.cols || p.row_bytes != w.row_bytes || p.data != w.data + static_cast<size_t>(w.rows) * w.row_bytes)
        return std::nullopt;
      w.rows += p.rows;
    }
    return w;
  }

  // The parts as one product into joined_ (a decode batch's rows through batch_rows, a prompt
  // chunk's through cuBLAS), then split into their outputs with their biases and RoPE (swiglu:
  // gate and up, into silu(gate) * up). False, launching nothing, where the parts are not laid
  // out together or the batch path does not serve them: the caller multiplies part by part.
  // H200, 8B shape: q, k and v are one product of 6144 rows, gate and up one of 28672.
  bool joined_product(const MatmulPart* parts, int n, const float* x, int64_t T, RowMode rows, bool swiglu) {
    if (!opt_.join_products) return false;
    const std::optional<WeightMatrix> w = joined(parts, n);
    if (!w) return false;
    grow(joined_, static_cast<size_t>(T) * w->rows * sizeof(float));
    const MatmulPart one{joined_->as<float>(), &*w, nullptr, nullptr};
    if (decode_rows(T, rows)) {
      if (!batch_rows(&one, 1, x, T)) return false;
    } else {
      gemm_parts(&one, 1, x, T);
    }
    if (swiglu) {
      const int64_t F = parts[0].w->rows;
      __nv_bfloat16* gb = bf16_twin(T, F);  // the down product reads the gate next
      launch_silu_mul_split(*launcher_, parts[0].out, gb, joined_->as<float>(), T, static_cast<int>(F));
      if (gb != nullptr) bf16_written(parts[0].out, T * F);
      return true;
    }
    SplitRows sp;
    std::memset(&sp, 0, sizeof sp);  // recorded bytes: every one set
    sp.n = n;
    for (int i = 0; i < n; ++i) {
      sp.out[i] = parts[i].out;
      sp.bias[i] = parts[i].bias;
      sp.begin[i + 1] = sp.begin[i] + static_cast<int32_t>(parts[i].w->rows);
      if (const RopeSpec* r = parts[i].rope) {
        sp.rope[i] = 1;
        sp.D = r->D, sp.adjacent = r->pairing == RopePairing::kAdjacent ? 1 : 0, sp.pos = r->pos, sp.inv_freq = r->inv_freq;
      }
    }
    launch_split_rows(*launcher_, sp, joined_->as<float>(), T);
    return true;
  }

  // out = x @ W^T (+ bias) for every part by cuBLAS (a prompt chunk), x converted to bf16 once
  void gemm_parts(const MatmulPart* parts, int n, const float* x, int64_t T) {
    bool bf16 = false;
    for (int i = 0; i < n; ++i) bf16 = bf16 || parts[i].w->type == DType::BF16;
    const bool ready = bf16 && bf16_ready(x, T * parts[0].w->cols);
    if (bf16) grow(xb_, static_cast<size_t>(T) * parts[0].w->cols * 2);
    gemm(blas_, *launcher_, parts, n, x, T, bf16 ? xb_->as<__nv_bfloat16>() : nullptr, ready);
  }

  void sync_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (bytes == 0) return;
    launcher_->flush();
    check(cudaMemcpyAsync(dst, src, bytes, kind, launcher_->stream()), what);
    check(cudaStreamSynchronize(launcher_->stream()), what);
    stage_used_ = 0;  // every staged upload has landed
  }

  CudaOptions opt_;
  KvRowWrite pending_row_;  // the last kv_write, while the decode attention may still take it over
  // a decode step's evictions (kv_evict_one), recorded since the last issue: the last launch
  // reads [evict_first_, end) of evict_dev_ [kEvictTable], whose bytes are evicts_held_ once issued
  static constexpr size_t kEvictTable = 32768;  // 256 sequences of 128 layers
  std::vector<EvictOne> evicts_, evicts_held_;
  size_t evict_first_ = 0;
  int evict_g_ = 0;  // the kv heads of the last launch's entries
  std::unique_ptr<Buffer> evict_dev_;
  DecodeBatch batch_{};  // a decode batch's table (the launch's argument)
  MmaParts parts_{};     // a prompt batch's table (the launches' argument)
  std::vector<PendingMass> pending_mass_;
  // per layer (its mass array) while masses are deferred: the kept scores and the max/sum
  struct LayerScratch {
    std::unique_ptr<Buffer> scores, ml;
  };
  std::unordered_map<const float*, LayerScratch> layer_scratch_;
  static constexpr size_t kMaxDeferredScoreBytes = size_t{4} << 20;  // a layer's, past it no deferral
  std::shared_ptr<Launcher> launcher_;  // shared with every buffer (a free issues what still uses it)
  std::string name_;
  cublasHandle_t blas_ = nullptr;
  static constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;  // as NVIDIA advises for Hopper
  std::shared_ptr<BlockCache> blocks_ = std::make_shared<BlockCache>();  // shared with every buffer, which gives its block back here
  std::unique_ptr<Buffer> blas_workspace_;  // cuBLAS's and cuBLASLt's (one stream: never both at once)
  std::unique_ptr<LtProducts> lt_;
  void grow(std::unique_ptr<Buffer>& b, size_t bytes) {
    if (!b || b->bytes() < bytes) b = alloc(bytes);
  }

  // Rows that the launch recorded last wrote twice: in f32 at `of` ([n], what its caller asked
  // for) and in bf16 in xb_ (what the products on the tensor cores read: cuBLAS, gemm_rows). A
  // product over exactly those rows, with nothing recorded or copied since (the launcher's serial;
  // freeing a buffer flushes, so it counts too), takes xb_ as it is instead of converting the rows
  // again: a launch and a pass over the rows fewer (H200, 8B shape, 64 sequences: three a layer,
  // ~11 us of a 240 us layer). Where the rows were changed in between, the serial has moved and the
  // product converts them as before, so the twin is never read stale.
  struct Bf16Rows {
    const float* of = nullptr;
    int64_t n = 0;
    uint64_t serial = ~uint64_t{0};
  };
  // xb_ ready for n values where rows of that count go to the tensor cores (past the GEMV's few
  // rows); null where they do not
  __nv_bfloat16* bf16_twin(int64_t T, int64_t cols) {
    if (T <= kGemvRows && !all_rows_on_gemm_rows()) return nullptr;
    grow(xb_, static_cast<size_t>(T * cols) * 2);
    return xb_->as<__nv_bfloat16>();
  }
  // kMma: every decode row on gemm_rows, a lone sequence's too, so that a sequence's products
  // are the same bits in any batch (--batch-invariant on)
  bool all_rows_on_gemm_rows() const { return opt_.batch == CudaOptions::BatchProducts::kMma; }
  bool rows_on_gemm_rows(RowMode rows) const { return all_rows_on_gemm_rows() && rows == RowMode::kIndependent; }
  // products whose rows are decode rows of different sequences, served as a decode batch
  // (batch_rows): more than one, or any number where every row goes to gemm_rows
  bool decode_rows(int64_t T, RowMode rows) const { return rows == RowMode::kIndependent && (T > 1 || all_rows_on_gemm_rows()); }
  void bf16_written(const float* of, int64_t n) { bf16_rows_ = {of, n, launcher_->serial()}; }
  bool bf16_ready(const float* x, int64_t n) const {
    return bf16_rows_.of == x && bf16_rows_.n == n && bf16_rows_.serial == launcher_->serial() && xb_ &&
           xb_->bytes() >= static_cast<size_t>(n) * 2;
  }
  Bf16Rows bf16_rows_;
  int sms_ = 1;
  // scratch: bf16 activations, entropies, compaction moves (kv_move's, kv_evict_top's), attention
  // max/sum and split partials
  std::unique_ptr<Buffer> xb_, ent_, moves_, top_scratch_, ml_, part_acc_, part_ml_, scores_;
  std::unique_ptr<Buffer> kv_rows_k_, kv_rows_v_;  // [G][capacity][D] f16 or f32: a Q8_0 layer's rows (dequantized)
  std::unique_ptr<Buffer> joined_;  // [T][rows of the joined matrices] (joined_product)
  std::unique_ptr<Buffer> sample_q_;  // [n][V] sample_rows' probabilities
  // packed weights' products: x rounded to 8 bits ([T][C] int8, [T][C/32][4] scales and sums),
  // x as f16 for gemm_rows_q ([T][C]), and the largest packed matrix dequantized to bf16 [R][C]
  std::unique_ptr<Buffer> xq_, xs_, xh_, dequantized_;
  // a decode batch's: max/sum, split partials, kept scores and what its later launches read, per row
  std::unique_ptr<Buffer> batch_ml_, batch_acc_, batch_pml_, batch_scores_, batch_info_;
  std::vector<float> host_rows_;              // embedding rows on their way up
  static constexpr size_t kStageBytes = size_t{16} << 20;
  std::unique_ptr<Buffer> stage_;             // pinned: staged uploads (upload)
  size_t stage_used_ = 0;
  double bandwidth_ = 0.0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) { return std::make_unique<CudaBackend>(options); }

}  // namespace squeezekv

// What libsqueezekv looks up when it loads this library (backend.cc, make_backend).
extern "C" squeezekv::Backend* squeezekv_make_cuda_backend(const squeezekv::CudaOptions& options) {
  return squeezekv::make_cuda_backend(options).release();
}
