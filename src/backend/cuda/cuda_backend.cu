// The CUDA backend (backend.h): device memory, weights dequantized to bf16 on load (f32 in the
// exact test mode), cuBLAS for the products of prompt chunks, GEMV kernels for decode (q/k/v with
// RoPE and gate/up with SwiGLU each one launch), and element-wise, RoPE, RMSNorm and attention
// kernels of our own. Attention of prompt chunks: on the tensor cores (k_attn_mma, f16 KV) or one
// block per (kv head, tile of query rows) with an online softmax over tiles of keys (k_attn), the
// policies' mass and entropy from a second pass when asked for (the mass sums after k_attn_mma on
// the tensor cores too: k_attn_mma_mass); decode (one query row):
// k_attn_decode, flash-decoding with K/V streamed through shared memory, the mass from its kept
// scores. Every launch goes through the Launcher, which replays a repeated launch list (a decode
// step) as one CUDA graph, each kernel's start overlapping the previous one's end (docs/DESIGN.md
// "Decode as a CUDA graph").
// Letters: T rows, E hidden, H query heads, G kv heads, D head dim, R/C matrix rows/cols, N keys.
// Thread safety: one backend per sequence's thread; all work runs on the backend's one stream in order.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <functional>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/half.h"
#include "core/quant.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("cublas: ") + what + ": status " + std::to_string(int(s)));
}
template <class T>
struct Same {
  using type = T;
};

// The kernel launches of one stream. Launches are recorded until the host next needs the device
// (a copy, a library call, a free), then issued: directly, or, when the same launches with the
// same arguments, byte for byte, came before, as one launch of the CUDA graph captured from them.
// A decode step repeats its launches exactly once the counts that grow with every token are read
// from device memory (KvView::count_dev), so from its third step on a whole step is one graph
// launch instead of ~14 launches a layer (docs/DESIGN.md "Decode as a CUDA graph"). A graph
// replays only the bytes it was captured from, so a replay does exactly what the launches it
// stands for would do. Thread safety: one host thread at a time (the backend's).
class Launcher {
 public:
  // pdl: each launch may begin while the previous kernel finishes (the kernels' pdl_enter()).
  Launcher(bool graphs, bool pdl) : graphs_on_(graphs), pdl_(pdl) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Launcher() {
    try {
      flush();
    } catch (...) {  // the device is failing; nothing left to report to
    }
    for (Graph& g : graphs_) cudaGraphExecDestroy(g.exec);
    cudaStreamDestroy(stream_);
  }
  cudaStream_t stream() const { return stream_; }

  // Records fn<<<grid, block, smem>>>(args...); the arguments are copied now.
  template <class... P>
  void launch(void (*fn)(P...), dim3 grid, dim3 block, size_t smem, typename Same<P>::type... args) {
    static_assert(sizeof...(P) <= kMaxArgs, "Launcher: too many kernel arguments");
    Rec r{reinterpret_cast<const void*>(fn), grid, block, static_cast<unsigned>(smem), static_cast<uint32_t>(arg_off_.size()),
          static_cast<uint32_t>(sizeof...(P))};
    put(&r.fn, sizeof(r.fn), 8);
    put(&r.grid, sizeof(dim3), 4);
    put(&r.block, sizeof(dim3), 4);
    put(&r.smem, sizeof(unsigned), 4);
    (arg_off_.push_back(put(&args, sizeof(P), alignof(P))), ...);
    recs_.push_back(r);
  }

  // The launch recorded last, taken back if it was recorded by launch_tagged(tag, ...) and nothing
  // came after it: its work is then the caller's to do (a later kernel does it on the way).
  template <class... P>
  void launch_tagged(const void* tag, void (*fn)(P...), dim3 grid, dim3 block, size_t smem, typename Same<P>::type... args) {
    const Undo u{recs_.size(), arg_off_.size(), sig_.size()};
    launch(fn, grid, block, smem, args...);
    tag_ = tag, undo_ = u;
  }
  bool take_back(const void* tag) {
    if (tag_ != tag || recs_.size() != undo_.recs + 1) return false;
    recs_.resize(undo_.recs), arg_off_.resize(undo_.args), sig_.resize(undo_.sig);
    tag_ = nullptr;
    return true;
  }

  // Issues what was recorded (in order, on the stream; does not wait for the device).
  void flush() {
    if (recs_.empty()) return;
    struct Clear {
      Launcher* l;
      ~Clear() { l->recs_.clear(), l->arg_off_.clear(), l->sig_.clear(), l->tag_ = nullptr; }
    } clear{this};
    if (!graphs_on_ || recs_.size() < kMinGraphLaunches) return issue();
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the record's 8-byte words (the tail zero-padded)
    sig_.resize((sig_.size() + 7) / 8 * 8, 0);
    for (size_t i = 0; i < sig_.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, sig_.data() + i, 8);
      h = (h ^ w) * 1099511628211ull;
    }
    for (Graph& g : graphs_)
      if (g.hash == h && g.sig == sig_) {
        g.used = ++clock_;
        ++replays_;
        return check(cudaGraphLaunch(g.exec, stream_), "cudaGraphLaunch");
      }
    // a first sighting runs directly; the second is captured (one-off launch lists cost no capture)
    if (std::find(seen_.begin(), seen_.end(), h) == seen_.end()) {
      seen_[seen_next_++ % seen_.size()] = h;
      return issue();
    }
    capture(h);
  }
  // Graph launches so far (tests check that a decode loop replays).
  int64_t replays() const { return replays_; }
  // Called by a buffer about to be freed (its bytes): the backend drops work it still owes there.
  std::function<void(const void*, size_t)> on_free;

 private:
  static constexpr size_t kMinGraphLaunches = 16;
  static constexpr size_t kMaxGraphs = 8;
  static constexpr size_t kMaxArgs = 24;
  struct Rec {
    const void* fn;
    dim3 grid, block;
    unsigned smem;
    uint32_t first_arg, n_args;
  };
  struct Graph {
    uint64_t hash;
    std::vector<unsigned char> sig;
    cudaGraphExec_t exec;
    uint64_t used;
  };

  // Appends n bytes at the next multiple of align (the gap stays zero); returns their offset.
  uint32_t put(const void* p, size_t n, size_t align) {
    const size_t off = (sig_.size() + align - 1) / align * align;
    sig_.resize(off + n, 0);
    std::memcpy(sig_.data() + off, p, n);
    return static_cast<uint32_t>(off);
  }
  void issue() {
    cudaLaunchAttribute pdl[1];
    pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl[0].val.programmaticStreamSerializationAllowed = 1;
    for (const Rec& r : recs_) {
      void* args[kMaxArgs];
      for (uint32_t i = 0; i < r.n_args; ++i) args[i] = sig_.data() + arg_off_[r.first_arg + i];
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = r.grid, cfg.blockDim = r.block, cfg.dynamicSmemBytes = r.smem, cfg.stream = stream_;
      cfg.attrs = pdl_ ? pdl : nullptr, cfg.numAttrs = pdl_ ? 1 : 0;
      check(cudaLaunchKernelExC(&cfg, r.fn, args), "kernel launch");
    }
  }
  void capture(uint64_t h) {
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
      issue();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(e, "cudaGraphInstantiate");
    if (graphs_.size() == kMaxGraphs) {  // the least recently used goes
      auto lru = std::min_element(graphs_.begin(), graphs_.end(), [](const Graph& a, const Graph& b) { return a.used < b.used; });
      cudaGraphExecDestroy(lru->exec);
      graphs_.erase(lru);
    }
    graphs_.push_back({h, sig_, exec, ++clock_});
    check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
  }

  struct Undo {
    size_t recs, args, sig;
  };
  const void* tag_ = nullptr;  // launch_tagged's, while its launch is the last recorded
  Undo undo_{};
  bool graphs_on_, pdl_;
  cudaStream_t stream_ = nullptr;
  std::vector<Rec> recs_;
  std::vector<uint32_t> arg_off_;   // offsets of every recorded argument in sig_
  std::vector<unsigned char> sig_;  // the launches: function, sizes, argument bytes
  std::vector<Graph> graphs_;
  std::array<uint64_t, 16> seen_{};  // hashes of recent launch lists
  size_t seen_next_ = 0;
  uint64_t clock_ = 0;
  int64_t replays_ = 0;
};

class DeviceBuffer final : public Buffer {
 public:
  // Zeroed; the launcher's pending work is issued before the memory is freed.
  DeviceBuffer(size_t bytes, std::shared_ptr<Launcher> launcher) : launcher_(std::move(launcher)) {
    bytes_ = bytes;
    check(cudaMalloc(&data_, std::max<size_t>(bytes, 16)), "cudaMalloc");
    check(cudaMemsetAsync(data_, 0, std::max<size_t>(bytes, 16), launcher_->stream()), "cudaMemset");
  }
  ~DeviceBuffer() override {
    try {
      if (launcher_->on_free) launcher_->on_free(data_, bytes_);
      launcher_->flush();  // launches that still use this memory go first (cudaFree then waits for them)
    } catch (...) {
    }
    cudaFree(data_);
  }

 private:
  std::shared_ptr<Launcher> launcher_;
};

constexpr int kThreads = 256;

// ---- programmatic dependent launch ----------------------------------------------------------
// With the Launcher's PDL on, a kernel may start while the one before it in the stream is still
// running. Every kernel first lets the next one launch (pdl_launch_next: its blocks are placed as
// SMs free up, so their start-up runs under this kernel's tail), then waits
// (pdl_wait) before it reads what earlier kernels wrote or writes anything: until the previous
// kernel has completed, and so, by induction, every earlier one. No deadlock: a kernel launches
// only once every block of the one before it is resident, and resident blocks wait only on earlier
// kernels. Without PDL both are no-ops.
__device__ inline void pdl_launch_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ inline void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ inline void pdl_enter() {
  pdl_launch_next();
  pdl_wait();
}

// ---- reductions ---------------------------------------------------------------------------

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  v = l < nw ? red[l] : 0.0f;
  return warp_sum(v);
}

// ---- element-wise, norm, rope --------------------------------------------------------------

__global__ void k_rmsnorm(float* out, const float* x, const float* w, int E, float eps) {
  pdl_enter();
  __shared__ float red[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * E;
  float* o = out + static_cast<size_t>(blockIdx.x) * E;
  float ss = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < E; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(E) + eps);
  for (int i = threadIdx.x; i < E; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

// x[row] += y[row]; out[row] = rmsnorm(x[row]) (grid T)
__global__ void k_add_rmsnorm(float* out, float* x, const float* y, const float* w, int E, float eps) {
  pdl_enter();
  __shared__ float red[32];
  float* xr = x + static_cast<size_t>(blockIdx.x) * E;
  const float* yr = y + static_cast<size_t>(blockIdx.x) * E;
  float* o = out + static_cast<size_t>(blockIdx.x) * E;
  float ss = 0.0f;
#pragma unroll 4
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    const float v = xr[i] + yr[i];
    xr[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(E) + eps);
  for (int i = threadIdx.x; i < E; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

// The same two ops for rows of E % 4 == 0 floats that fit a block's registers (NV float4 a
// thread): one pass over memory instead of two, the norm weights loaded before the PDL wait (they
// do not depend on the kernels before). y null: rmsnorm alone (x is not written). grid T.
constexpr int kNormThreads = 1024, kNormMaxVec = 4;
template <int NV>
__global__ void __launch_bounds__(kNormThreads) k_add_rmsnorm4(float* out, float* x, const float* y, const float* w, int E, float eps) {
  pdl_launch_next();
  __shared__ float red[32];
  const int n4 = E / 4;
  float4 wv[NV], v[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n4) wv[k] = reinterpret_cast<const float4*>(w)[i];
  }
  pdl_wait();
  float4* xr = reinterpret_cast<float4*>(x + static_cast<size_t>(blockIdx.x) * E);
  const float4* yr = y != nullptr ? reinterpret_cast<const float4*>(y + static_cast<size_t>(blockIdx.x) * E) : nullptr;
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n4) continue;
    v[k] = xr[i];
    if (yr != nullptr) {
      const float4 b = yr[i];
      v[k].x += b.x, v[k].y += b.y, v[k].z += b.z, v[k].w += b.w;
      xr[i] = v[k];
    }
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(E) + eps);
  float4* o = reinterpret_cast<float4*>(out + static_cast<size_t>(blockIdx.x) * E);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < n4) o[i] = make_float4(wv[k].x * (v[k].x * inv), wv[k].y * (v[k].y * inv), wv[k].z * (v[k].z * inv), wv[k].w * (v[k].w * inv));
  }
}

// grid (T, n_heads), block D/2 threads (one rotation pair each)
__global__ void k_rope(float* x, const int32_t* pos, int n_heads, int D, const float* inv_freq, int adjacent) {
  pdl_enter();
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = D / 2;
  if (i >= half) return;
  float* v = x + (static_cast<size_t>(t) * n_heads + h) * D;
  const float a = static_cast<float>(pos[t]) * inv_freq[i];
  float s, c;
  sincosf(a, &s, &c);
  const int i0 = adjacent ? 2 * i : i, i1 = adjacent ? 2 * i + 1 : i + half;
  const float p = v[i0], q = v[i1];
  v[i0] = p * c - q * s;
  v[i1] = q * c + p * s;
}

__global__ void k_silu_mul(float* g, const float* u, int64_t n) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ void k_add(float* x, const float* y, int64_t n) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// out[T][R] += bias[R]
__global__ void k_add_bias(float* out, const float* bias, int64_t n, int R) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] += bias[i % R];
}

__global__ void k_to_bf16(__nv_bfloat16* out, const float* x, int64_t n) {
  pdl_enter();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16(x[i]);
}

// ---- decode products: T <= kGemvRows activation rows ------------------------------------------
// One launch serves up to kMaxParts matrices that share their input (q, k, v; gate and up): the
// grid's blocks are dealt out to the parts, kGemvBlockRows matrix rows a block, all its warps
// splitting the columns (so even a 1024-row matrix fills its share of the device): each lane
// streams 16 bytes of every row per step, two steps in flight, the x values it loads serving all
// rows; partial sums meet in shared memory, where an epilogue may finish the op that follows the
// product: RoPE on q and k (a block's rows are whole rotation pairs), or SwiGLU (a block's rows are
// 4 of the gate's and the same 4 of the up's). Each output is the same float sum, in the same order,
// as a one-part launch, and the epilogues compute exactly what k_rope and k_silu_mul compute.
// Weights are read once, so their loads skip L1 (where x stays).

constexpr int kGemvRows = 4;       // activation rows a launch serves
constexpr int kGemvBlockRows = 8;  // matrix rows a block serves
constexpr int kGemvWarps = 8;
constexpr int kMaxParts = 4;

enum GemvEpilogue : int32_t { kEpiPlain = 0, kEpiRopeHalves = 1, kEpiRopeAdjacent = 2 };

// The products of one launch. Recorded as argument bytes, so it has no padding (value-initialise).
struct GemvParts {
  const void* w[kMaxParts];            // [rows][C] of WT
  float* out[kMaxParts];               // [T][rows]
  const float* bias[kMaxParts];        // [rows] or null
  const int32_t* pos;                  // [T] rope positions
  const float* inv_freq;               // [D/2]
  int32_t first_block[kMaxParts + 1];  // part p: blocks [first_block[p], first_block[p + 1])
  int32_t rows[kMaxParts];
  int32_t epi[kMaxParts];              // GemvEpilogue
  int32_t n, C, D;                     // parts, columns, head dim (rope)
  int32_t swiglu;                      // parts 0 (gate) and 1 (up), equal rows: out[0] = silu(gate) * up
  int32_t unused;
};
static_assert(sizeof(GemvParts) == 14 * 8 + 18 * 4, "GemvParts: no padding (a recorded kernel argument)");

// 16 bytes of weights, read once: not kept in L1 (which holds x)
__device__ inline uint4 load_stream(const void* p) {
  uint4 u;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  return u;
}
__device__ inline void load8(const __nv_bfloat16* w, float* f) {
  const uint4 u = load_stream(w);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 p = __bfloat1622float2(h[k]);
    f[2 * k] = p.x;
    f[2 * k + 1] = p.y;
  }
}
__device__ inline void load8(const float* w, float* f) {
  const uint4 a = load_stream(w), b = load_stream(w + 4);
  f[0] = __uint_as_float(a.x), f[1] = __uint_as_float(a.y), f[2] = __uint_as_float(a.z), f[3] = __uint_as_float(a.w);
  f[4] = __uint_as_float(b.x), f[5] = __uint_as_float(b.y), f[6] = __uint_as_float(b.z), f[7] = __uint_as_float(b.w);
}

template <class A, int N>
__device__ inline A pick(const A (&a)[N], int i) {  // a[i] without indexing parameter memory at run time
  A v = a[0];
#pragma unroll
  for (int j = 1; j < N; ++j) v = i == j ? a[j] : v;
  return v;
}

// A block's rows as two groups of kGemvBlockRows / 2 consecutive rows: group 0 starts at row
// first0 of part part0, group 1 at first1 of part1. Plain parts and adjacent rotation pairs
// (2d, 2d + 1): 8 rows in a row; rotation halves: 4 dims (d..d+3) of one head and their partners
// (d + D/2 ..); SwiGLU: 4 rows of the gate and the same 4 of the up. Block row i < 4 is row
// first0 + i of part0, row i >= 4 is first1 + i - 4 of part1.
struct GemvRows {
  int part0, part1, first0, first1;
  __device__ int row(int i) const { return (i < kGemvBlockRows / 2 ? first0 : first1) + i % (kGemvBlockRows / 2); }
  __device__ int part_of(int i) const { return i < kGemvBlockRows / 2 ? part0 : part1; }
};
__device__ inline GemvRows gemv_rows(const GemvParts& P, int p, int b) {
  constexpr int RB = kGemvBlockRows, HB = RB / 2;
  if (P.swiglu) return {0, 1, b * HB, b * HB};
  if (pick(P.epi, p) == kEpiRopeHalves) {
    const int per_head = P.D / RB, first = (b / per_head) * P.D + (b % per_head) * HB;
    return {p, p, first, first + P.D / 2};
  }
  return {p, p, b * RB, b * RB + HB};
}

// What a block does with a row group's sums fin[RB][T] (part p, rows g): the output rows,
// rotated (RoPE) or gated (SwiGLU) where the parts ask.
template <int T>
__device__ inline void gemv_epilogue(const GemvParts& P, int p, const GemvRows& g, const float* fin, int tid) {
  constexpr int RB = kGemvBlockRows, HB = RB / 2;
  const int epi = pick(P.epi, p);
  if (P.swiglu) {  // as k_silu_mul
    if (tid < HB * T) {
      const int i = tid / T, t = tid % T, R = P.rows[0], r = g.row(i);
      const float gv = fin[i * T + t], u = fin[(i + HB) * T + t];
      if (r < R) P.out[0][static_cast<size_t>(t) * R + r] = gv / (1.0f + expf(-gv)) * u;
    }
  } else if (epi != kEpiPlain) {  // as k_rope: pair (i0, i1) turns by pos * inv_freq[d]
    if (tid < HB * T) {
      const int k = tid / T, t = tid % T, R = pick(P.rows, p);
      const int i0 = epi == kEpiRopeHalves ? k : 2 * k, i1 = epi == kEpiRopeHalves ? k + HB : 2 * k + 1;
      const int r0 = g.row(i0), r1 = g.row(i1);
      const int d = epi == kEpiRopeHalves ? r0 % P.D : (r0 % P.D) / 2;
      const float a = static_cast<float>(P.pos[t]) * P.inv_freq[d];
      float sn, cs;
      sincosf(a, &sn, &cs);
      const float u = fin[i0 * T + t], v = fin[i1 * T + t];
      float* o = pick(P.out, p) + static_cast<size_t>(t) * R;
      o[r0] = u * cs - v * sn;
      o[r1] = v * cs + u * sn;
    }
  } else if (tid < RB * T) {
    const int i = tid / T, t = tid % T, R = pick(P.rows, p), r = g.row(i);
    if (r < R) pick(P.out, p)[static_cast<size_t>(t) * R + r] = fin[tid];
  }
}

template <typename WT, int T>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) k_gemv(const float* x, GemvParts P) {
  constexpr int RB = kGemvBlockRows, HB = RB / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, C = P.C;
  int p = 0;
#pragma unroll
  for (int j = 1; j < kMaxParts; ++j) p += j < P.n && static_cast<int>(blockIdx.x) >= P.first_block[j] ? 1 : 0;
  pdl_launch_next();
  const GemvRows g = gemv_rows(P, p, blockIdx.x - pick(P.first_block, p));
  // the last row of each group's part (a short last block repeats it; its sums are dropped)
  const WT *base0 = static_cast<const WT*>(pick(P.w, g.part0)), *base1 = static_cast<const WT*>(pick(P.w, g.part1));
  const int last0 = pick(P.rows, g.part0) - 1, last1 = pick(P.rows, g.part1) - 1;
  const WT* wr[RB];
#pragma unroll
  for (int i = 0; i < RB; ++i)
    wr[i] = i < HB ? base0 + static_cast<size_t>(min(g.row(i), last0)) * C : base1 + static_cast<size_t>(min(g.row(i), last1)) * C;
  pdl_wait();
  float acc[RB][T] = {};
#pragma unroll 2
  for (int c = threadIdx.x * 8; c < C; c += kGemvWarps * 32 * 8) {
    float xv[T][8];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<size_t>(t) * C + c;
      const float4 a = *reinterpret_cast<const float4*>(xt), e = *reinterpret_cast<const float4*>(xt + 4);
      xv[t][0] = a.x, xv[t][1] = a.y, xv[t][2] = a.z, xv[t][3] = a.w, xv[t][4] = e.x, xv[t][5] = e.y, xv[t][6] = e.z, xv[t][7] = e.w;
    }
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      float w[8];
      load8(wr[i] + c, w);
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[i][t] += w[k] * xv[t][k];
    }
  }
  __shared__ float part[kGemvWarps][RB * T];
  __shared__ float fin[RB * T];  // [row i][t]: the block's sums, bias added
#pragma unroll
  for (int i = 0; i < RB; ++i)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = warp_sum(acc[i][t]);
      if (lane == 0) part[warp][i * T + t] = s;
    }
  __syncthreads();
  const int tid = threadIdx.x;
  if (tid < RB * T) {
    const int i = tid / T, q = g.part_of(i), r = g.row(i);
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kGemvWarps; ++w) s += part[w][tid];
    const float* bias = pick(P.bias, q);
    fin[tid] = r < pick(P.rows, q) ? s + (bias != nullptr ? bias[r] : 0.0f) : 0.0f;
  }
  __syncthreads();
  gemv_epilogue<T>(P, p, g, fin, tid);
}

template <typename WT>
void launch_gemv(Launcher& L, const float* x, const GemvParts& P, int T) {
  const unsigned grid = static_cast<unsigned>(P.first_block[P.n]);
  switch (T) {
    case 1: L.launch(k_gemv<WT, 1>, grid, kGemvWarps * 32, 0, x, P); break;
    case 2: L.launch(k_gemv<WT, 2>, grid, kGemvWarps * 32, 0, x, P); break;
    case 3: L.launch(k_gemv<WT, 3>, grid, kGemvWarps * 32, 0, x, P); break;
    default: L.launch(k_gemv<WT, 4>, grid, kGemvWarps * 32, 0, x, P); break;
  }
}

// ---- attention --------------------------------------------------------------------------------
// One block serves one kv head g and a tile of query tokens: its rows are (token, query head of g)
// pairs, so the heads that share g read each K/V tile once (from shared memory). Keys go in
// tiles of 32, one per lane; each warp keeps an online softmax for its rows (up to 4). Long key
// ranges split over blocks (flash-decoding: partial max, sum and output per split, merged after);
// the split depends on sizes only. The policies' mass and the entropy come from a second kernel
// over the same scores with the final max and sum (only when asked for).

constexpr int kAttnWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kAttnRows = kAttnWarps * kRowsPerWarp;  // rows per block
constexpr int kKeyTile = 32;
constexpr int kMaxHeadDim = 256;

struct AttnShape {
  int T, H, G, grp, D, N, cap, qt;  // qt: query tokens per block; N: 0 when kv.count_dev holds it
  int splits;                       // most splits of the key range (the grid's z may be fewer)
  int direct;                       // 1: one split at most, the output is written without a merge
  int min_keys;                     // fewest keys a split takes (kMinSplitKeys or kMinDecodeSplitKeys)
  float scale;
};
static_assert(sizeof(AttnShape) == 12 * 4, "AttnShape: no padding (a recorded kernel argument)");

// How the N keys split over blocks: at most max_splits splits of at least min_keys keys, each a
// whole number of 32-key tiles. A prompt chunk's blocks have many query rows each and take 256 keys
// at least; a decode step's (one row) 64, so a short context still spreads over the SMs (the split
// count then changes every 64 keys up to max_splits, and a replayed step is recaptured as often).
// Computed on the device from N (which may live in device memory, so a recorded step replays for
// every N) and on the host to size the grid; results depend on sizes only.
constexpr int kMinSplitKeys = 256;
constexpr int kMinDecodeSplitKeys = 64;
struct KeyRange {
  int N, splits, chunk;
};
__host__ __device__ inline KeyRange key_range(int N, int max_splits, int min_keys) {
  int splits = (N + min_keys - 1) / min_keys < max_splits ? (N + min_keys - 1) / min_keys : max_splits;
  if (splits < 1) splits = 1;
  int chunk = ((N + splits - 1) / splits + kKeyTile - 1) / kKeyTile * kKeyTile;
  if (chunk < kKeyTile) chunk = kKeyTile;
  splits = N > 0 ? (N + chunk - 1) / chunk : 1;
  return {N, splits, chunk};
}
__device__ inline KeyRange key_range(const KvView& kv, const AttnShape& a) {
  return key_range(kv.count_dev != nullptr ? *kv.count_dev : a.N, a.splits, a.min_keys);
}

template <typename KT>
__device__ inline float to_f(KT v);
template <>
__device__ inline float to_f<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ inline float to_f<float>(float v) {
  return v;
}

// The block's shared memory: q rows [rows][D], K tile [32][D + 1] (padded: lanes read different
// banks), V tile [32][D], the tile's positions [32].
struct AttnSmem {
  float *q, *k, *v;
  int* pos;
};
__device__ inline AttnSmem carve(float* smem, int D) {
  AttnSmem s;
  s.q = smem;
  s.k = s.q + kAttnRows * D;
  s.v = s.k + kKeyTile * (D + 1);
  s.pos = reinterpret_cast<int*>(s.v + kKeyTile * D);
  return s;
}

size_t attn_smem_bytes(int D) {
  return sizeof(float) * (static_cast<size_t>(kAttnRows) * D + kKeyTile * (D + 1) + kKeyTile * D) + kKeyTile * sizeof(int);
}

// Loads the block's query rows (scaled) into qs; returns nothing. Row r = (token t0 + r / grp, head g*grp + r % grp).
__device__ inline void load_q(float* qs, const float* q, const AttnShape& a, int g, int t0) {
  const int live = min(a.qt, a.T - t0) * a.grp * a.D;  // rows past it are never read
#pragma unroll 4
  for (int i = threadIdx.x; i < live; i += blockDim.x) {
    const int r = i / a.D, d = i % a.D, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    qs[i] = (r < a.qt * a.grp && t < a.T) ? q[(static_cast<size_t>(t) * a.H + h) * a.D + d] * a.scale : 0.0f;
  }
}

template <typename KT>
__device__ inline void load_tile(float* ks, float* vs, int* ps, const KvView& kv, int g, int start, int end, int D) {
  const KT* K = static_cast<const KT*>(kv.k) + (static_cast<size_t>(g) * kv.capacity + start) * D;
  const KT* V = static_cast<const KT*>(kv.v) + (static_cast<size_t>(g) * kv.capacity + start) * D;
  const int n = min(kKeyTile, end - start);
#pragma unroll 4
  for (int i = threadIdx.x; i < kKeyTile * D; i += blockDim.x) {
    const int j = i / D, d = i % D;
    ks[j * (D + 1) + d] = j < n ? to_f<KT>(K[i]) : 0.0f;
    vs[i] = j < n ? to_f<KT>(V[i]) : 0.0f;
  }
  if (threadIdx.x < kKeyTile) ps[threadIdx.x] = threadIdx.x < n ? kv.pos[static_cast<size_t>(g) * kv.capacity + start + threadIdx.x] : INT_MAX;
}

// grid (G, ceil(T / qt), splits). Writes, per row (t, h) and split, the partial max, sum and
// output; with one split the output is final (out) and so are max and sum (ml).
template <typename KT>
__global__ void k_attn(float* out, float* part_acc, float* ml, const float* q, const int32_t* q_pos, KvView kv, AttnShape a) {
  pdl_enter();
  extern __shared__ float smem[];
  const int D = a.D, g = blockIdx.x, t0 = blockIdx.y * a.qt, split = blockIdx.z;
  const KeyRange kr = key_range(kv, a);
  if (split >= kr.splits) return;  // a split this N does not need
  const AttnSmem sm = carve(smem, D);
  float *qs = sm.q, *ks = sm.k, *vs = sm.v;
  int* ps = sm.pos;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_q(qs, q, a, g, t0);
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxHeadDim / 32];
  int qp[kRowsPerWarp];
  bool live[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp;
    live[i] = r < a.qt * a.grp && t < a.T;
    qp[i] = live[i] ? q_pos[t] : -1;
    m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int dd = 0; dd < kMaxHeadDim / 32; ++dd) acc[i][dd] = 0.0f;
  }
  const int begin = split * kr.chunk, end = min(kr.N, begin + kr.chunk);
  for (int start = begin; start < end; start += kKeyTile) {
    __syncthreads();
    load_tile<KT>(ks, vs, ps, kv, g, start, end, D);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (!live[i]) continue;  // uniform across the warp
      const float* qr = qs + (warp + kAttnWarps * i) * D;
      const float* kr = ks + lane * (D + 1);
      float sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qr[d] * kr[d];
      const bool vis = ps[lane] <= qp[i];
      sc = vis ? sc : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(sc));
      if (mn == -INFINITY) continue;
      const float p = vis ? __expf(sc - mn) : 0.0f;
      const float alpha = m[i] > -INFINITY ? __expf(m[i] - mn) : 0.0f;
      l[i] = l[i] * alpha + warp_sum(p);
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd) acc[i][dd] *= alpha;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* vr = vs + j * D + lane;
#pragma unroll
        for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
          if (dd * 32 + lane < D) acc[i][dd] += pj * vr[dd * 32];
      }
      m[i] = mn;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (!live[i]) continue;
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    const size_t row = static_cast<size_t>(t) * a.H + h;
    if (a.direct) {
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
        if (dd * 32 + lane < D) out[row * D + dd * 32 + lane] = acc[i][dd] * inv;
      if (lane == 0) ml[2 * row] = m[i], ml[2 * row + 1] = l[i];
    } else {
      const size_t prow = static_cast<size_t>(split) * a.T * a.H + row;
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
        if (dd * 32 + lane < D) part_acc[prow * D + dd * 32 + lane] = acc[i][dd];
      if (lane == 0) ml[2 * prow] = m[i], ml[2 * prow + 1] = l[i];
    }
  }
}

// grid T*H, block kMergeThreads: merges the splits of one row; ml_out [T*H][2]. The splits'
// weights exp(m_s - M) are formed once in shared memory, then each thread sums its output values
// over the splits with several loads in flight (the partials sit in L2).
constexpr int kMergeThreads = 128;
constexpr int kMaxSplits = 128;
__global__ void __launch_bounds__(kMergeThreads) k_attn_merge(float* out, float* ml_out, const float* part_acc, const float* part_ml,
                                                              int rows, KvView kv, AttnShape a) {
  pdl_enter();
  __shared__ float w[kMaxSplits];
  __shared__ float red[32];
  const int row = blockIdx.x, splits = key_range(kv, a).splits, D = a.D;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) mx = fmaxf(mx, part_ml[2 * (static_cast<size_t>(s) * rows + row)]);
  mx = warp_max(mx);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < static_cast<int>(blockDim.x) / 32; ++i) M = fmaxf(M, red[i]);
  __syncthreads();
  float l = 0.0f;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    const float ms = part_ml[2 * (static_cast<size_t>(s) * rows + row)];
    const float c = ms > -INFINITY ? __expf(ms - M) : 0.0f;
    w[s] = c;
    l += c * part_ml[2 * (static_cast<size_t>(s) * rows + row) + 1];
  }
  const float L = block_sum(l, red);  // its barriers also publish w
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) o += part_acc[(static_cast<size_t>(s) * rows + row) * D + d] * w[s];
    out[static_cast<size_t>(row) * D + d] = o * inv;
  }
  if (threadIdx.x == 0) ml_out[2 * row] = M, ml_out[2 * row + 1] = L;
}

// The policies' outputs from the final max and sum: mass[g][j] += p / grp over rows with
// t >= mass_row_begin (the grid starts at query tile tile0; summed within the warp first;
// mass_max: mass = max(mass, p), through the bits of non-negative floats, which order as
// integers), and per row the entropy sum -p log p and the visible key count (atomically over
// splits) into ent[row][2].
template <typename KT>
__global__ void k_attn_probe(float* mass, int64_t mass_stride, int64_t mass_row_begin, bool mass_max, float* ent, const float* ml,
                             const float* q, const int32_t* q_pos, KvView kv, AttnShape a, int tile0) {
  pdl_enter();
  extern __shared__ float smem[];
  const int D = a.D, g = blockIdx.x, t0 = (blockIdx.y + tile0) * a.qt, split = blockIdx.z;
  const KeyRange kr = key_range(kv, a);
  if (split >= kr.splits) return;
  const AttnSmem sm = carve(smem, D);
  float *qs = sm.q, *ks = sm.k, *vs = sm.v;
  int* ps = sm.pos;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_q(qs, q, a, g, t0);
  float m[kRowsPerWarp], inv[kRowsPerWarp], h_sum[kRowsPerWarp], n_vis[kRowsPerWarp];
  int qp[kRowsPerWarp];
  bool live[kRowsPerWarp], to_mass[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    live[i] = r < a.qt * a.grp && t < a.T;
    const size_t row = static_cast<size_t>(live[i] ? t : 0) * a.H + h;
    qp[i] = live[i] ? q_pos[t] : -1;
    m[i] = live[i] ? ml[2 * row] : 0.0f;
    inv[i] = live[i] && ml[2 * row + 1] > 0.0f ? 1.0f / ml[2 * row + 1] : 0.0f;
    to_mass[i] = live[i] && mass != nullptr && t >= mass_row_begin;
    h_sum[i] = 0.0f, n_vis[i] = 0.0f;
  }
  const int begin = split * kr.chunk, end = min(kr.N, begin + kr.chunk);
  for (int start = begin; start < end; start += kKeyTile) {
    __syncthreads();
    load_tile<KT>(ks, vs, ps, kv, g, start, end, D);
    __syncthreads();
    float msum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (!live[i]) continue;
      const float* qr = qs + (warp + kAttnWarps * i) * D;
      const float* kr = ks + lane * (D + 1);
      float sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qr[d] * kr[d];
      if (ps[lane] > qp[i]) continue;
      const float p = __expf(sc - m[i]) * inv[i];
      if (to_mass[i]) msum = mass_max ? fmaxf(msum, p) : msum + p;
      if (p > 0.0f) h_sum[i] -= p * __logf(p);
      n_vis[i] += 1.0f;
    }
    if (mass != nullptr && msum > 0.0f && start + lane < end) {
      float* dst = mass + static_cast<size_t>(g) * mass_stride + start + lane;
      if (mass_max) atomicMax(reinterpret_cast<int*>(dst), __float_as_int(msum));
      else atomicAdd(dst, msum / static_cast<float>(a.grp));
    }
  }
  if (ent == nullptr) return;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (!live[i]) continue;
    const float hs = warp_sum(h_sum[i]), nv = warp_sum(n_vis[i]);
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    if (lane == 0) {
      atomicAdd(ent + 2 * (static_cast<size_t>(t) * a.H + h), hs);
      atomicAdd(ent + 2 * (static_cast<size_t>(t) * a.H + h) + 1, nv);
    }
  }
}

// ---- prompt attention on tensor cores ------------------------------------------------------------
// Flash attention (FlashAttention-2's loop) with mma.sync m16n8k16 (f16 in, f32 accumulate) for
// f16 KV and head dims 64 or 128: a block takes the query rows of 64 / grp tokens of one kv head g
// (row r = token t0 + r / grp, query head g * grp + r % grp, so the heads that share g read each
// K/V tile once; rows past qt * grp stay empty), 4 warps of 16 rows; K/V tiles of kMmaKeys keys
// stream through shared memory two deep (cp.async). S = Q K^T and O += P V run on the tensor
// cores; the softmax is online, per row, in base 2 (q is scaled by scale * log2 e); P goes from
// the S accumulators straight into the A operand of the second product (their layouts coincide).
// Key j is visible to row r iff pos[j] <= q_pos[t] (dead slots hold the largest position). It
// writes the output and, per row, the max and sum (ml, natural-log units, as k_attn does), which
// the policies' mass pass reads.
constexpr int kMmaRows = 64;
constexpr int kMmaKeys = 64;
constexpr int kMmaWarps = 4;

template <int D>
__host__ __device__ constexpr size_t mma_smem_bytes() {
  return sizeof(__half) * (kMmaRows + 4 * kMmaKeys) * (D + 8) + sizeof(int32_t) * 2 * kMmaKeys;
}

__device__ inline void ldsm_x4(uint32_t* r, const __half* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ inline void ldsm_x4_trans(uint32_t* r, const __half* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// c[4] += a[4] (16x16, row) * b[2] (16x8, col)
__device__ inline void mma16816(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ inline uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// What k_attn_mma and k_attn_mma_mass share, so both compute S = Q K^T with the same bits.
// One tile's copies into stage st: K (and V when sv is given) rows j0.. (past N: zeros, a finite
// V row times P = 0) and their positions (past N: INT_MAX, masked), then one commit.
template <int D, bool kWithV>
__device__ inline void mma_issue_tile(__half* sk, __half* sv, int32_t* sp, const __half* Kg, const __half* Vg,
                                      const int32_t* Pg, int j0, int st, int N, int tid) {
  constexpr int LD = D + 8, CH = D / 8;  // CH: 16-byte pieces of a row
  for (int c = tid; c < kMmaKeys * CH; c += kMmaWarps * 32) {
    const int r = c / CH, piece = c % CH, j = j0 + r;
    const int src_row = j < N ? j : 0;
    const int zfill = j < N ? 0 : 16;
    __pipeline_memcpy_async(sk + (st * kMmaKeys + r) * LD + piece * 8, Kg + static_cast<size_t>(src_row) * D + piece * 8, 16, zfill);
    if constexpr (kWithV)
      __pipeline_memcpy_async(sv + (st * kMmaKeys + r) * LD + piece * 8, Vg + static_cast<size_t>(src_row) * D + piece * 8, 16, zfill);
  }
  for (int r = tid; r < kMmaKeys; r += kMmaWarps * 32) {
    if (j0 + r < N) __pipeline_memcpy_async(sp + st * kMmaKeys + r, Pg + j0 + r, 4);
    else sp[st * kMmaKeys + r] = INT_MAX;
  }
}
// The block's query rows (row r: token t0 + r / grp, head g * grp + r % grp), scaled by
// scale * log2 e, as f16 into sq [kMmaRows][D + 8]; rows past qt * grp or T are zeros. Then, after
// a barrier, warp rows rb.. rb + 15 as mma A operands qa [D / 16][4].
template <int D>
__device__ inline void mma_load_q(uint32_t (&qa)[D / 16][4], __half* sq, const float* q, const AttnShape& a, int g, int t0,
                                  int rb, int lane, int tid) {
  constexpr int LD = D + 8;
  constexpr float kLog2e = 1.4426950408889634f;
  for (int i = tid; i < kMmaRows * D / 2; i += kMmaWarps * 32) {
    const int r = i / (D / 2), d = (i % (D / 2)) * 2, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    float2 v = make_float2(0.0f, 0.0f);
    if (r < a.qt * a.grp && t < a.T) v = *reinterpret_cast<const float2*>(q + (static_cast<size_t>(t) * a.H + h) * D + d);
    const float s = a.scale * kLog2e;
    *reinterpret_cast<__half2*>(sq + r * LD + d) = __floats2half2_rn(v.x * s, v.y * s);
  }
  __syncthreads();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int mi = lane / 8, rr = lane % 8;
    ldsm_x4(qa[ks], sq + (rb + rr + (mi & 1) * 8) * LD + ks * 16 + (mi >> 1) * 8);
  }
}
// s[4] = the warp's 16 rows against keys nt * 8.. nt * 8 + 7 of the tile kt [kMmaKeys][D + 8].
template <int D>
__device__ inline void mma_scores(float* s, const uint32_t (&qa)[D / 16][4], const __half* kt, int nt, int lane) {
  constexpr int LD = D + 8;
  s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ks += 2) {
    uint32_t b[4];  // b[0..1]: k-step ks, b[2..3]: ks + 1
    ldsm_x4(b, kt + (nt * 8 + lane % 8) * LD + ks * 16 + (lane / 8) * 8);
    mma16816(s, qa[ks], b);
    mma16816(s, qa[ks + 1], b + 2);
  }
}

template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32) k_attn_mma(float* out, float* ml, const float* q, const int32_t* q_pos, KvView kv,
                                                             AttnShape a) {
  pdl_enter();
  constexpr int LD = D + 8;  // row pitch in halves: 8 rows of an ldmatrix fall on different banks
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char msm[];
  __half* sq = reinterpret_cast<__half*>(msm);       // [kMmaRows][LD]
  __half* sk = sq + kMmaRows * LD;                    // [2][kMmaKeys][LD]
  __half* sv = sk + 2 * kMmaKeys * LD;                // [2][kMmaKeys][LD]
  int32_t* sp = reinterpret_cast<int32_t*>(sv + 2 * kMmaKeys * LD);  // [2][kMmaKeys]
  const int g = blockIdx.x, t0 = blockIdx.y * a.qt, grp = a.grp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int N = kv.count_dev != nullptr ? *kv.count_dev : a.N;
  const __half* Kg = static_cast<const __half*>(kv.k) + static_cast<size_t>(g) * kv.capacity * D;
  const __half* Vg = static_cast<const __half*>(kv.v) + static_cast<size_t>(g) * kv.capacity * D;
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  const int n_tiles = (N + kMmaKeys - 1) / kMmaKeys;
  auto issue = [&](int tile) {
    if (tile < n_tiles) mma_issue_tile<D, true>(sk, sv, sp, Kg, Vg, Pg, tile * kMmaKeys, tile % 2, N, tid);
    __pipeline_commit();
  };
  issue(0);
  const int rb = warp * 16;
  uint32_t qa[D / 16][4];
  mma_load_q<D>(qa, sq, q, a, g, t0, rb, lane, tid);
  // this thread's two rows: rb + lane / 4 and rb + 8 + lane / 4
  int qp[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rb + lane / 4 + 8 * i, t = t0 + r / grp;
    qp[i] = (r < a.qt * grp && t < a.T) ? q_pos[t] : INT_MIN;  // INT_MIN: sees nothing
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int tile = 0; tile < n_tiles; ++tile) {
    issue(tile + 1);
    __pipeline_wait_prior(1);
    __syncthreads();
    const int st = tile % 2;
    const __half* kt = sk + st * kMmaKeys * LD;
    const __half* vt = sv + st * kMmaKeys * LD;
    const int32_t* pt = sp + st * kMmaKeys;
    float s[kMmaKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) mma_scores<D>(s[nt], qa, kt, nt, lane);
    // mask, then the online softmax of the two rows
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kMmaKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = nt * 8 + (lane % 4) * 2 + e;
          float& x = s[nt][2 * i + e];
          x = pt[j] <= qp[i] ? x : -INFINITY;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[i], mx), ref = mn == -INFINITY ? 0.0f : mn;
      const float alpha = exp2f(m[i] - ref);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kMmaKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * i + e];
          x = exp2f(x - ref);
          sum += x;
        }
      l[i] = l[i] * alpha + sum;
      m[i] = mn;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) o[nd][2 * i] *= alpha, o[nd][2 * i + 1] *= alpha;
    }
    // O += P V: P from the S accumulators (k-step kk: key tiles 2kk and 2kk + 1)
#pragma unroll
    for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int nd = 0; nd < D / 8; nd += 2) {
        uint32_t b[4];  // b[0..1]: d tile nd, b[2..3]: nd + 1
        const int mi = lane / 8, rr = lane % 8;
        ldsm_x4_trans(b, vt + (kk * 16 + rr + (mi & 1) * 8) * LD + nd * 8 + (mi >> 1) * 8);
        mma16816(o[nd], pa, b);
        mma16816(o[nd + 1], pa, b + 2);
      }
    }
    __syncthreads();  // the stage is refilled by a later issue()
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int r = rb + lane / 4 + 8 * i, t = t0 + r / grp;
    if (r >= a.qt * grp || t >= a.T) continue;
    const size_t row = static_cast<size_t>(t) * a.H + g * grp + r % grp;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      *reinterpret_cast<float2*>(out + row * D + nd * 8 + (lane % 4) * 2) = make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
    if (lane % 4 == 0) ml[2 * row] = m[i] == -INFINITY ? -INFINITY : m[i] / kLog2e, ml[2 * row + 1] = l[i];
  }
}

// The policies' mass of a prompt chunk on the tensor cores, after k_attn_mma wrote the rows' max
// and sum (ml): S = Q K^T again as k_attn_mma computes it (the same f16 operands and tiles), then
// p = exp(s - m) / l per visible key, summed over the block's rows with t >= mass_row_begin
// (within a warp by shuffles, over the warps in shared memory) and added as mass[g][j] += sum /
// grp. Grid (G, query tiles from tile0 on, key splits): the rows before mass_row_begin (snapkv's
// window) cost nothing, and the key tiles split over blocks (no merge: each key's sum is atomic).
// It replaces, after k_attn_mma, the CUDA-core pass (k_attn_probe: one dot product per lane and key).
template <int D>
__host__ __device__ constexpr size_t mma_mass_smem_bytes() {
  return sizeof(__half) * (kMmaRows + 2 * kMmaKeys) * (D + 8) + sizeof(int32_t) * 2 * kMmaKeys +
         sizeof(float) * kMmaWarps * kMmaKeys;
}

template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32) k_attn_mma_mass(float* mass, int64_t mass_stride, int64_t mass_row_begin,
                                                                  const float* ml, const float* q, const int32_t* q_pos,
                                                                  KvView kv, AttnShape a, int tile0) {
  pdl_enter();
  constexpr int LD = D + 8;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char msm[];
  __half* sq = reinterpret_cast<__half*>(msm);                       // [kMmaRows][LD]
  __half* sk = sq + kMmaRows * LD;                                    // [2][kMmaKeys][LD]
  int32_t* sp = reinterpret_cast<int32_t*>(sk + 2 * kMmaKeys * LD);  // [2][kMmaKeys]
  float* red = reinterpret_cast<float*>(sp + 2 * kMmaKeys);          // [kMmaWarps][kMmaKeys]
  const int g = blockIdx.x, t0 = (blockIdx.y + tile0) * a.qt, grp = a.grp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int N = kv.count_dev != nullptr ? *kv.count_dev : a.N;
  const __half* Kg = static_cast<const __half*>(kv.k) + static_cast<size_t>(g) * kv.capacity * D;
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  // this block's key tiles: split z of gridDim.z (a key's mass needs no merge across splits)
  const int all_tiles = (N + kMmaKeys - 1) / kMmaKeys, per_split = (all_tiles + gridDim.z - 1) / gridDim.z;
  const int first_tile = blockIdx.z * per_split, n_tiles = min(all_tiles, first_tile + per_split);
  if (first_tile >= n_tiles) return;
  auto issue = [&](int tile) {
    if (tile < n_tiles) mma_issue_tile<D, false>(sk, nullptr, sp, Kg, nullptr, Pg, tile * kMmaKeys, tile % 2, N, tid);
    __pipeline_commit();
  };
  issue(first_tile);
  const int rb = warp * 16;
  uint32_t qa[D / 16][4];
  mma_load_q<D>(qa, sq, q, a, g, t0, rb, lane, tid);
  // this thread's two rows: rb + lane / 4 and rb + 8 + lane / 4, in base-2 units
  int qp[2];
  float m2[2], inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rb + lane / 4 + 8 * i, t = t0 + r / grp;
    const bool live = r < a.qt * grp && t < a.T && t >= mass_row_begin;
    const size_t row = static_cast<size_t>(live ? t : 0) * a.H + g * grp + r % grp;
    const float l = live ? ml[2 * row + 1] : 0.0f;
    qp[i] = live && l > 0.0f ? q_pos[t] : INT_MIN;  // INT_MIN: adds nothing
    m2[i] = qp[i] != INT_MIN ? ml[2 * row] * kLog2e : 0.0f;
    inv[i] = qp[i] != INT_MIN ? 1.0f / l : 0.0f;
  }
  for (int tile = first_tile; tile < n_tiles; ++tile) {
    issue(tile + 1);
    __pipeline_wait_prior(1);
    __syncthreads();
    const int st = tile % 2;
    const __half* kt = sk + st * kMmaKeys * LD;
    const int32_t* pt = sp + st * kMmaKeys;
    float cs[kMmaKeys / 8][2];
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
      float s[4];
      mma_scores<D>(s, qa, kt, nt, lane);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = nt * 8 + (lane % 4) * 2 + e;
        float c = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (pt[j] <= qp[i]) c += exp2f(s[2 * i + e] - m2[i]) * inv[i];
        // the 8 lanes holding this column (same lane % 4) for the warp's 16 rows
        c += __shfl_xor_sync(0xffffffffu, c, 4);
        c += __shfl_xor_sync(0xffffffffu, c, 8);
        c += __shfl_xor_sync(0xffffffffu, c, 16);
        cs[nt][e] = c;
      }
    }
    if (lane < 4) {
#pragma unroll
      for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
        red[warp * kMmaKeys + nt * 8 + lane * 2] = cs[nt][0];
        red[warp * kMmaKeys + nt * 8 + lane * 2 + 1] = cs[nt][1];
      }
    }
    __syncthreads();
    if (tid < kMmaKeys) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) sum += red[w * kMmaKeys + tid];
      const int j = tile * kMmaKeys + tid;
      if (j < N && sum > 0.0f) atomicAdd(mass + static_cast<size_t>(g) * mass_stride + j, sum / static_cast<float>(grp));
    }
    __syncthreads();  // the stage and red are reused
  }
}

// ---- decode attention (one query token) ----------------------------------------------------------
// Flash-decoding for T = 1: grid (G, splits), WARPS warps (dec_max_warps). The block streams its split's K/V
// rows through shared memory in tiles of 8 KB of K and 8 KB of V, kDecStages tiles in flight
// (cp.async: the copies run while the warps compute on an earlier tile, so enough bytes are on
// their way to keep HBM busy). The grp query heads of kv head g ride together, so each row is read
// once: LPK lanes hold a row, 16 bytes each (8 f16 or 4 f32 values), a warp covers 32 / LPK rows
// per step; each warp keeps an online softmax per query head over its rows, updated once a tile
// (its scores first, then one max and one rescale, then P V: the kernel was bound by its own
// instructions when it rescaled for every key); at the end the warps
// merge in shared memory and the block writes its split's partial max, sum and output, which
// k_attn_merge combines. With `scores` the scaled logits are kept ([G][GMAX][capacity], -inf where
// masked), and the policies' mass comes from them (k_attn_mass) without reading K again.

constexpr int kDecStages = 3;
constexpr int kDecTileBytes = 8192;  // of K (and as much of V) per tile
// The most warps a block may have: 8 for up to 4 query heads a kv head where the warps' partial
// outputs fit the stages' memory for the merge (with 8 heads the registers would leave one block
// an SM), else 4. Short splits take the 8 (their blocks are latency-bound: more warps hide the
// score reductions' shuffles), long ones 4 (fewer per-tile steps); see launch_decode_one.
template <typename KT, int LPK, int GMAX>
__host__ __device__ constexpr int dec_max_warps() {
  constexpr int D = LPK * 16 / static_cast<int>(sizeof(KT));
  return GMAX <= 4 && sizeof(float) * 8 * GMAX * (2 + D) <= 2 * kDecStages * kDecTileBytes ? 8 : 4;
}
// Splits of at most this many keys take the most warps.
constexpr int kDecShortSplit = 64;

template <typename KT>
__device__ inline void load16(const KT* p, float* f);
template <>
__device__ inline void load16<__half>(const __half* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 x = __half22float2(h[k]);
    f[2 * k] = x.x, f[2 * k + 1] = x.y;
  }
}
template <>
__device__ inline void load16<float>(const float* p, float* f) {
  const float4 x = *reinterpret_cast<const float4*>(p);
  f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w;
}

// Shared memory of k_attn_decode for rows of `row_bytes`: the stages' K, V and positions.
__host__ __device__ constexpr int dec_tile_keys(int row_bytes) { return kDecTileBytes / row_bytes; }
__host__ __device__ constexpr size_t dec_smem_bytes(int row_bytes) {
  return static_cast<size_t>(kDecStages) * (2 * kDecTileBytes + dec_tile_keys(row_bytes) * sizeof(int32_t));
}

// The decode step's new row (what k_kv_write would write for T = 1 at slot N - 1, N read on the
// device), written by the decode attention itself when its kv_write was the launch just before
// (CudaBackend::attention_decode): k, v [G][D] f32; null k: nothing to write.
struct KvRowWrite {
  void* K = nullptr;             // the view's K, V, positions (writable) and the mass [G][cap]
  void* V = nullptr;
  int32_t* P = nullptr;
  float* M = nullptr;
  const float* k = nullptr;      // [G][D]
  const float* v = nullptr;      // [G][D]
  const int32_t* pos = nullptr;  // [1]
};

// GMAX: the most query heads per kv head this instantiation serves (a.grp <= GMAX).
template <typename KT, int LPK, int GMAX, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) k_attn_decode(float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                                                                 const float* q, const int32_t* q_pos, KvView kv, AttnShape a,
                                                                 KvRowWrite w) {
  pdl_enter();
  constexpr int kDecWarps = WARPS;
  constexpr int EPV = 16 / sizeof(KT);  // values a lane holds of a row
  constexpr int D = LPK * EPV;
  constexpr int KPW = 32 / LPK;         // rows a warp covers per step
  constexpr int ROW = D * sizeof(KT);   // bytes of a row
  constexpr int TILE = dec_tile_keys(ROW);
  static_assert(TILE % (kDecWarps * KPW) == 0, "a tile splits evenly over the warps");
  constexpr int STEPS = TILE / (kDecWarps * KPW);  // key groups a warp takes per tile
  extern __shared__ __align__(16) unsigned char dsm[];
  unsigned char* sk = dsm;                                  // [stage][TILE][ROW]
  unsigned char* sv = dsm + kDecStages * kDecTileBytes;     // [stage][TILE][ROW]
  int32_t* sp = reinterpret_cast<int32_t*>(dsm + 2 * kDecStages * kDecTileBytes);  // [stage][TILE]

  const int g = blockIdx.x, split = blockIdx.y, grp = a.grp;
  const KeyRange kr = key_range(kv, a);
  if (split >= kr.splits) return;
  const int begin = split * kr.chunk, end = min(kr.N, begin + kr.chunk);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / LPK, part = lane % LPK;
  const int qp = q_pos[0];
  const unsigned char* Kg = static_cast<const unsigned char*>(kv.k) + static_cast<size_t>(g) * kv.capacity * ROW;
  const unsigned char* Vg = static_cast<const unsigned char*>(kv.v) + static_cast<size_t>(g) * kv.capacity * ROW;
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  const int n_tiles = (end - begin + TILE - 1) / TILE;
  if (w.k != nullptr && end == kr.N) {  // this split holds the new row: it goes in first
    const size_t slot = static_cast<size_t>(g) * kv.capacity + kr.N - 1;
    KT* K = static_cast<KT*>(w.K);
    KT* V = static_cast<KT*>(w.V);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      if constexpr (sizeof(KT) == 2) {
        K[slot * D + d] = __float2half_rn(w.k[g * D + d]);
        V[slot * D + d] = __float2half_rn(w.v[g * D + d]);
      } else {
        K[slot * D + d] = w.k[g * D + d];
        V[slot * D + d] = w.v[g * D + d];
      }
    }
    if (threadIdx.x == 0) w.P[slot] = w.pos[0], w.M[slot] = 0.0f;
    __threadfence_block();
    __syncthreads();  // the block's copies below read the row
  }
  // issues the copies of tile t (rows past `end` are not copied; their slots are never read)
  auto issue = [&](int t) {
    if (t < n_tiles) {
      const int j0 = begin + t * TILE, rows = min(TILE, end - j0), st = t % kDecStages;
      for (int c = threadIdx.x; c < rows * (ROW / 16); c += blockDim.x) {
        __pipeline_memcpy_async(sk + st * kDecTileBytes + c * 16, Kg + static_cast<size_t>(j0) * ROW + c * 16, 16);
        __pipeline_memcpy_async(sv + st * kDecTileBytes + c * 16, Vg + static_cast<size_t>(j0) * ROW + c * 16, 16);
      }
      for (int c = threadIdx.x; c < rows; c += blockDim.x) __pipeline_memcpy_async(sp + st * TILE + c, Pg + j0 + c, 4);
    }
    __pipeline_commit();  // an empty group past the last tile keeps the counting uniform
  };

  float qv[GMAX][EPV], m[GMAX], l[GMAX], acc[GMAX][EPV];
#pragma unroll
  for (int r = 0; r < GMAX; ++r) {
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < EPV; ++e) {
      qv[r][e] = r < grp ? q[static_cast<size_t>(g * grp + r) * D + part * EPV + e] * a.scale : 0.0f;
      acc[r][e] = 0.0f;
    }
  }
  for (int t = 0; t < kDecStages - 1; ++t) issue(t);
  for (int t = 0; t < n_tiles; ++t) {
    issue(t + kDecStages - 1);
    __pipeline_wait_prior(kDecStages - 1);  // this thread's copies of tile t have landed
    __syncthreads();                          // and everyone's
    const int st = t % kDecStages, j0 = begin + t * TILE;
    const unsigned char* kt = sk + st * kDecTileBytes;
    const unsigned char* vt = sv + st * kDecTileBytes;
    const int32_t* pt = sp + st * TILE;
    // warp w takes rows [w * TILE / kDecWarps, (w + 1) * TILE / kDecWarps) of the tile, KPW a step:
    // first all their scores, then one max and one rescale per head for the tile, then P V
    float sc[STEPS][GMAX];
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
      const int i = warp * (TILE / kDecWarps) + step * KPW + sub, j = j0 + i;
      const bool in = j < end, vis = in && pt[i] <= qp;
      float kf[EPV];
      load16<KT>(reinterpret_cast<const KT*>(kt + i * ROW + part * 16), kf);
#pragma unroll
      for (int r = 0; r < GMAX; ++r) {
        if (r >= grp) break;  // uniform
        float x = 0.0f;
#pragma unroll
        for (int e = 0; e < EPV; ++e) x += qv[r][e] * kf[e];
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        x = vis ? x : -INFINITY;
        if (scores != nullptr && part == 0 && in) scores[(static_cast<size_t>(g) * GMAX + r) * kv.capacity + j] = x;
        sc[step][r] = x;
      }
    }
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
      if (r >= grp) break;
      float mx = sc[0][r];
#pragma unroll
      for (int step = 1; step < STEPS; ++step) mx = fmaxf(mx, sc[step][r]);
#pragma unroll
      for (int o = LPK; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float mn = fmaxf(m[r], mx);
      if (mn == -INFINITY) continue;  // uniform: nothing visible yet
      const float alpha = m[r] > -INFINITY ? __expf(m[r] - mn) : 0.0f;
      l[r] *= alpha;
#pragma unroll
      for (int e = 0; e < EPV; ++e) acc[r][e] *= alpha;
      m[r] = mn;
    }
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
      const int i = warp * (TILE / kDecWarps) + step * KPW + sub;
      float vf[EPV];
      load16<KT>(reinterpret_cast<const KT*>(vt + i * ROW + part * 16), vf);
      if (j0 + i >= end)  // a row past the split's end was never copied: whatever is there, p = 0 must not meet NaN
#pragma unroll
        for (int e = 0; e < EPV; ++e) vf[e] = 0.0f;
#pragma unroll
      for (int r = 0; r < GMAX; ++r) {
        if (r >= grp) break;
        const float p = sc[step][r] == -INFINITY ? 0.0f : __expf(sc[step][r] - m[r]);
        l[r] += p;
#pragma unroll
        for (int e = 0; e < EPV; ++e) acc[r][e] += p * vf[e];
      }
    }
    __syncthreads();  // the stage is refilled by a later issue()
  }
  // the warp's row groups share one max per head: sum their sums and outputs
#pragma unroll
  for (int r = 0; r < GMAX; ++r) {
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], o);
#pragma unroll
      for (int e = 0; e < EPV; ++e) acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], o);
    }
  }
  // the block's warps (the stages' memory, free now): each puts its max, sum and output there;
  // then per head the merge
  float* s_ml = reinterpret_cast<float*>(dsm);               // [warp][GMAX][2]
  float* s_acc = s_ml + kDecWarps * GMAX * 2;                // [warp][GMAX][D]
  static_assert(sizeof(float) * kDecWarps * GMAX * (2 + D) <= 2 * kDecStages * kDecTileBytes, "merge fits the stages");
#pragma unroll
  for (int r = 0; r < GMAX; ++r) {
    if (lane == 0) s_ml[(warp * GMAX + r) * 2] = m[r], s_ml[(warp * GMAX + r) * 2 + 1] = l[r];
    if (sub == 0)
#pragma unroll
      for (int e = 0; e < EPV; ++e) s_acc[(warp * GMAX + r) * D + part * EPV + e] = acc[r][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < grp * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, s_ml[(w * GMAX + r) * 2]);
    float L = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float mw = s_ml[(w * GMAX + r) * 2];
      if (mw == -INFINITY) continue;
      const float c = __expf(mw - M);
      L += s_ml[(w * GMAX + r) * 2 + 1] * c;
      o += s_acc[(w * GMAX + r) * D + d] * c;
    }
    const size_t h = static_cast<size_t>(g) * grp + r;  // rows: T * H with T = 1
    if (gridDim.y == 1) {  // one split: the final output, no merge
      out[h * D + d] = L > 0.0f ? o / L : 0.0f;
      if (d == 0) ml[2 * h] = M, ml[2 * h + 1] = L;
    } else {
      const size_t prow = static_cast<size_t>(split) * a.H + h;
      part_acc[prow * D + d] = o;
      if (d == 0) part_ml[2 * prow] = M, part_ml[2 * prow + 1] = L;
    }
  }
}

// One kv head's query group's final softmax (max M and 1/L of each of its grp <= GMAX heads, from
// ml [H][2]) and the mass a key gets from it: the one definition that the mass kernel and the
// eviction kernel's deferred mass both use, so both give the same bits. Products and sums are
// rounded explicitly (no contraction into an FMA, which the compiler may choose differently in
// two kernels).
template <int GMAX>
struct GroupSoftmax {
  float M[GMAX], inv[GMAX];
  int grp;
  __device__ __forceinline__ GroupSoftmax(const float* ml, int g, int grp_) : grp(grp_) {
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
      const int h = g * grp + (r < grp ? r : 0);
      M[r] = ml[2 * h];
      inv[r] = ml[2 * h + 1] > 0.0f ? 1.0f / ml[2 * h + 1] : 0.0f;
    }
  }
  // old mass of key j + this step's: sc holds the group's score rows [GMAX][cap] (-inf: masked)
  __device__ __forceinline__ float add_mass(float old, const float* sc, size_t cap, int j, bool mass_max) const {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
      if (r >= grp) break;
      const float s = sc[static_cast<size_t>(r) * cap + j];
      if (s == -INFINITY) continue;
      const float p = __fmul_rn(__expf(s - M[r]), inv[r]);
      acc = mass_max ? fmaxf(acc, p) : __fadd_rn(acc, p);
    }
    return mass_max ? fmaxf(old, acc) : __fadd_rn(old, __fdiv_rn(acc, static_cast<float>(grp)));
  }
};

// The policies' mass from the kept scores and the final max and sum (ml [H][2]): per key j of the
// split, mass[g][j] += sum over the grp heads of exp(s - M) / L, / grp (or the max over them). One
// thread per key: no atomics, the same sums every run.
template <int GMAX>
__global__ void k_attn_mass(float* mass, int64_t stride, bool mass_max, const float* scores, const float* ml, KvView kv,
                            AttnShape a) {
  pdl_enter();
  const int g = blockIdx.x, split = blockIdx.y, grp = a.grp;
  const KeyRange kr = key_range(kv, a);
  if (split >= kr.splits) return;
  const int begin = split * kr.chunk, end = min(kr.N, begin + kr.chunk);
  const GroupSoftmax<GMAX> sm(ml, g, grp);
  const float* sc = scores + static_cast<size_t>(g) * GMAX * kv.capacity;
  for (int j = begin + threadIdx.x; j < end; j += blockDim.x) {
    float* dst = mass + static_cast<size_t>(g) * stride + j;
    *dst = sm.add_mass(*dst, sc, kv.capacity, j, mass_max);
  }
}


template <typename KT, int LPK, int GMAX, int WARPS>
void launch_decode_warps(Launcher& L, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                         const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  constexpr size_t smem = dec_smem_bytes(LPK * 16);
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) {
    check(cudaFuncSetAttribute(k_attn_decode<KT, LPK, GMAX, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "decode attention smem");
    attribute_set = true;
  }
  L.launch(k_attn_decode<KT, LPK, GMAX, WARPS>, grid, WARPS * 32, smem, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
}

// chunk: the keys of a split (this step's, from the host's N)
template <typename KT, int LPK, int GMAX>
void launch_decode_one(Launcher& L, int chunk, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                       const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  if constexpr (dec_max_warps<KT, LPK, GMAX>() == 8)
    if (chunk <= kDecShortSplit) return launch_decode_warps<KT, LPK, GMAX, 8>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
  launch_decode_warps<KT, LPK, GMAX, 4>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
}

template <typename KT, int GMAX>
void launch_decode(Launcher& L, int lpk, int chunk, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                   const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  switch (lpk) {
    case 4: launch_decode_one<KT, 4, GMAX>(L, chunk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
    case 8: launch_decode_one<KT, 8, GMAX>(L, chunk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
    case 16: launch_decode_one<KT, 16, GMAX>(L, chunk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
    default: launch_decode_one<KT, 32, GMAX>(L, chunk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
  }
}

// ---- KV rows ----------------------------------------------------------------------------------

// grid (T, G), block D (<= 1024); the first slot is at, or *count_dev - T when count_dev is set
template <typename KT>
__global__ void k_kv_write(KT* K, KT* V, int32_t* P, float* M, int G, int D, int cap, int at, const int32_t* count_dev,
                           const float* k, const float* v, const int32_t* rows_pos) {
  pdl_enter();
  const int r = blockIdx.x, g = blockIdx.y, d = threadIdx.x;
  if (count_dev != nullptr) at = *count_dev - static_cast<int>(gridDim.x);
  const size_t slot = static_cast<size_t>(g) * cap + at + r;
  const size_t src = (static_cast<size_t>(r) * G + g) * D + d;
  if (d < D) {
    if constexpr (sizeof(KT) == 2) {
      K[slot * D + d] = __float2half_rn(k[src]);
      V[slot * D + d] = __float2half_rn(v[src]);
    } else {
      K[slot * D + d] = k[src];
      V[slot * D + d] = v[src];
    }
  }
  if (d == 0) P[slot] = rows_pos[r], M[slot] = 0.0f;
}

// grid n, block 128: row from[i] -> to[i] in K, V (row_words 32-bit words each), pos, mass
__global__ void k_kv_move(uint32_t* K, uint32_t* V, int32_t* P, float* M, size_t row_words, const int* from,
                          const int* to) {
  pdl_enter();
  const size_t f = from[blockIdx.x], t = to[blockIdx.x];
  for (size_t w = threadIdx.x; w < row_words; w += blockDim.x) {
    K[t * row_words + w] = K[f * row_words + w];
    V[t * row_words + w] = V[f * row_words + w];
  }
  if (threadIdx.x == 0) P[t] = P[f], M[t] = M[f];
}

// Which of two rows goes first as one integer: less mass first, between equal masses the newer
// position; ~0 for none. (Float bits ordered as integers: negative values flipped whole, the rest
// with the sign bit set; positions ordered as signed, then reversed.)
__device__ inline unsigned long long evict_key(float m, int32_t p) {
  uint32_t b = __float_as_uint(m);
  b = (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
  return (static_cast<unsigned long long>(b) << 32) | ~(static_cast<uint32_t>(p) ^ 0x80000000u);
}

// One layer's eviction (CudaBackend::kv_evict_one): its arrays, sizes and the protected positions.
struct EvictOne {
  uint32_t* K;
  uint32_t* V;
  int32_t* P;
  float* M;
  const int32_t* newest;  // the newest position on the device (keep_from = *newest - n_recent + 1), or null
  // this step's mass, not yet added (CudaBackend's deferred mass): the decode attention's kept
  // scores [G][gmax][cap] and final max and sum [H][2]; null scores: the mass is up to date
  const float* scores;
  const float* ml;
  size_t row_words;
  int cap, count, keep_below, keep_from, n_recent, grp, gmax, mass_max;
};
// The evictions of consecutive layers at the end of a decode step, one launch for all of them.
constexpr int kEvictBatch = 32;
struct EvictBatch {
  EvictOne e[kEvictBatch];
  int n;
  int pad_;
};
static_assert(sizeof(EvictOne) == 8 * 8 + 8 * 4 && sizeof(EvictBatch) == kEvictBatch * sizeof(EvictOne) + 8,
              "EvictBatch: no padding (a recorded kernel argument)");

// grid (G, layers), block kEvictThreads: per layer and head the least-mass slot among positions
// [keep_below, keep_from) (ties: the newer position goes), then row count - 1 into its hole
// (cpu_backend.cc's loop, in parallel).
constexpr int kEvictThreads = 256;
__global__ void __launch_bounds__(kEvictThreads) k_kv_evict_one(const __grid_constant__ EvictBatch b) {
  pdl_enter();
  const EvictOne& e = b.e[blockIdx.y];
  uint32_t *K = e.K, *V = e.V;
  int32_t* P = e.P;
  float* M = e.M;
  const size_t row_words = e.row_words;
  const int count = e.count;
  const int32_t keep_below = e.keep_below, keep_from = e.newest != nullptr ? *e.newest - e.n_recent + 1 : e.keep_from;
  const size_t base = static_cast<size_t>(blockIdx.x) * e.cap;
  const int32_t* pos = P + base;
  const float* m = M + base;
  // each thread's least key over its rows (loads independent of each other), then the warp's
  // through shuffles, then the block's through shared memory
  unsigned long long best = ~0ull;
  int at = -1;
  if (e.scores == nullptr) {
#pragma unroll 4
    for (int j = threadIdx.x; j < count; j += kEvictThreads) {
      const int32_t p = pos[j];
      const unsigned long long k = p < keep_below || p >= keep_from ? ~0ull : evict_key(m[j], p);
      if (k < best) best = k, at = j;
    }
  } else {  // the step's mass first, with k_attn_mass's operations (the same values), then the key
    const GroupSoftmax<8> sm(e.ml, blockIdx.x, e.grp);
    const float* sc = e.scores + static_cast<size_t>(blockIdx.x) * e.gmax * e.cap;
    for (int j = threadIdx.x; j < count; j += kEvictThreads) {
      float* dst = M + base + j;
      const float mj = sm.add_mass(*dst, sc, e.cap, j, e.mass_max);
      *dst = mj;
      const int32_t p = pos[j];
      const unsigned long long k = p < keep_below || p >= keep_from ? ~0ull : evict_key(mj, p);
      if (k < best) best = k, at = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long k = __shfl_xor_sync(0xffffffffu, best, o);
    const int j = __shfl_xor_sync(0xffffffffu, at, o);
    if (k < best) best = k, at = j;
  }
  __shared__ unsigned long long s_key[kEvictThreads / 32];
  __shared__ int s_at[kEvictThreads / 32];
  __shared__ int s_victim;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) s_key[warp] = best, s_at[warp] = at;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kEvictThreads / 32; ++w)
      if (s_key[w] < best) best = s_key[w], at = s_at[w];
    s_victim = best == ~0ull ? -1 : at;
  }
  __syncthreads();
  const int victim = s_victim, last = count - 1;
  if (victim < 0 || victim == last) return;
  for (size_t w = threadIdx.x; w < row_words; w += kEvictThreads) {
    K[(base + victim) * row_words + w] = K[(base + last) * row_words + w];
    V[(base + victim) * row_words + w] = V[(base + last) * row_words + w];
  }
  if (threadIdx.x == 0) P[base + victim] = P[base + last], M[base + victim] = M[base + last];
}

unsigned blocks_for(int64_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ---- the backend ------------------------------------------------------------------------------

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
    check(cublasCreate(&blas_), "cublasCreate");
    check(cublasSetStream(blas_, launcher_->stream()), "cublasSetStream");
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
    cublasDestroy(blas_);
  }

  Device kind() const override { return Device::kCuda; }
  std::string describe() const override {
    return "cuda, " + name_ + ", " + (opt_.f32_weights ? "f32" : "bf16") + " weights" + (opt_.graphs ? "" : ", no graphs");
  }
  bool host_visible() const override { return false; }

  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<DeviceBuffer>(bytes, launcher_); }
  // Copies wait for the device: the recorded launches go first, then the copy, on the one stream.
  // (any memory may be a mass array: a deferred mass goes first)
  void upload(void* dst, const void* src, size_t bytes) override {
    flush_mass();
    sync_copy(dst, src, bytes, cudaMemcpyHostToDevice, "upload");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    flush_mass();
    sync_copy(dst, src, bytes, cudaMemcpyDeviceToHost, "download");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    flush_mass();
    sync_copy(dst, src, bytes, cudaMemcpyDeviceToDevice, "copy");
  }
  int64_t graph_replays() const override { return launcher_->replays(); }

  WeightMatrix prepare_weight(const WeightMatrix& w, WeightUse use, std::unique_ptr<Buffer>& keep) override {
    // vectors stay f32; matrices become bf16 (f32 in the exact mode), dequantized row by row
    const bool f32 = use == WeightUse::kVector || opt_.f32_weights;
    const size_t eb = f32 ? 4 : 2, row = static_cast<size_t>(w.cols) * eb;
    keep = alloc(row * static_cast<size_t>(w.rows));
    if (!f32 && w.type == DType::BF16) {  // stored as used: one copy
      upload(keep->data(), w.data, row * static_cast<size_t>(w.rows));
      WeightMatrix d = w;
      d.data = keep->as<uint8_t>();
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
      upload(keep->as<uint8_t>() + static_cast<size_t>(r0) * row, src, static_cast<size_t>(n) * row);
    }
    WeightMatrix d = w;
    d.type = f32 ? DType::F32 : DType::BF16;
    d.data = keep->as<uint8_t>();
    d.row_bytes = row;
    return d;
  }

  void embed(float* x, const WeightMatrix& table, const int32_t* tokens, int T) override {
    // the table stays in host memory (rows picked by host ids); T rows travel per step
    host_rows_.resize(static_cast<size_t>(T) * table.cols);
    for (int t = 0; t < T; ++t) dequantize_row(table.type, table.row(tokens[t]), host_rows_.data() + static_cast<size_t>(t) * table.cols, table.cols);
    upload(x, host_rows_.data(), host_rows_.size() * sizeof(float));
  }

  // A decode batch: up to kGemvRows rows per GEMV launch, each row's sums formed exactly as in a
  // one-row launch (its own accumulators, the same order), the weights read once per launch.
  void matmul_rows(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations act) override {
    for (int64_t t0 = 0; t0 < T; t0 += kGemvRows) {
      const int n = static_cast<int>(std::min<int64_t>(kGemvRows, T - t0));
      const MatmulPart part{out + t0 * w.rows, &w, bias, nullptr};
      if (!gemv(&part, 1, x + t0 * w.cols, n, false)) Backend::matmul_rows(out + t0 * w.rows, x + t0 * w.cols, w, n, bias, act);
    }
  }

  void matmul(float* out, const float* x, const WeightMatrix& w, int64_t T, const float* bias, Activations) override {
    const MatmulPart part{out, &w, bias, nullptr};
    if (T <= kGemvRows && gemv(&part, 1, x, static_cast<int>(T), false)) return;
    gemm(&part, 1, x, T);
  }

  // One launch for all parts where the GEMV serves them (their RoPE in its epilogue); prompt
  // chunks: x converted to bf16 once, one cuBLAS product per part.
  void matmuls(const MatmulPart* parts, int n, const float* x, int64_t T, Activations act, RowMode rows) override {
    if (T <= kGemvRows && gemv(parts, n, x, static_cast<int>(T), false)) return;
    if (rows == RowMode::kIndependent && T > 1) return Backend::matmuls(parts, n, x, T, act, rows);
    gemm(parts, n, x, T);
    rope_parts(parts, n, T);
  }

  void matmul_swiglu(float* gate, float* up, const float* x, const WeightMatrix& w_gate, const WeightMatrix& w_up, int64_t T,
                     Activations act, RowMode rows) override {
    const MatmulPart parts[2] = {{gate, &w_gate, nullptr, nullptr}, {up, &w_up, nullptr, nullptr}};
    if (T <= kGemvRows && w_gate.rows == w_up.rows && gemv(parts, 2, x, static_cast<int>(T), true)) return;
    Backend::matmul_swiglu(gate, up, x, w_gate, w_up, T, act, rows);
  }

  void rmsnorm(float* out, const float* x, const float* w, int64_t T, int64_t E, float eps) override {
    if (norm_in_registers(out, const_cast<float*>(x), nullptr, w, T, E, eps)) return;  // x is not written
    launcher_->launch(k_rmsnorm, static_cast<unsigned>(T), 1024, 0, out, x, w, static_cast<int>(E), eps);  // one row: latency-bound
  }
  void add_rmsnorm(float* out, float* x, const float* y, const float* w, int64_t T, int64_t E, float eps) override {
    if (norm_in_registers(out, x, y, w, T, E, eps)) return;
    launcher_->launch(k_add_rmsnorm, static_cast<unsigned>(T), 1024, 0, out, x, y, w, static_cast<int>(E), eps);
  }
  // k_add_rmsnorm4 where rows are whole float4s (aligned) and fit kNormMaxVec a thread
  bool norm_in_registers(float* out, float* x, const float* y, const float* w, int64_t T, int64_t E, float eps) {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (E % 4 != 0 || E / 4 > kNormThreads * kNormMaxVec || !aligned(out) || !aligned(x) || !aligned(w) ||
        (y != nullptr && !aligned(y)))
      return false;
    const int n4 = static_cast<int>(E / 4), nv = (n4 + kNormThreads - 1) / kNormThreads;
    const int threads = std::max(32, ((n4 + nv - 1) / nv + 31) / 32 * 32);
    const unsigned grid = static_cast<unsigned>(T);
    const int e = static_cast<int>(E);
    switch (nv) {
      case 1: launcher_->launch(k_add_rmsnorm4<1>, grid, threads, 0, out, x, y, w, e, eps); break;
      case 2: launcher_->launch(k_add_rmsnorm4<2>, grid, threads, 0, out, x, y, w, e, eps); break;
      case 3: launcher_->launch(k_add_rmsnorm4<3>, grid, threads, 0, out, x, y, w, e, eps); break;
      default: launcher_->launch(k_add_rmsnorm4<4>, grid, threads, 0, out, x, y, w, e, eps); break;
    }
    return true;
  }
  void rope(float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq, RopePairing pairing) override {
    launcher_->launch(k_rope, dim3(static_cast<unsigned>(T), n_heads), std::max(32, D / 2), 0, x, pos, n_heads, D, inv_freq,
                      pairing == RopePairing::kAdjacent ? 1 : 0);
  }
  void silu_mul(float* gate, const float* up, int64_t n) override {
    launcher_->launch(k_silu_mul, blocks_for(n), kThreads, 0, gate, up, n);
  }
  void add(float* x, const float* y, int64_t n) override {
    launcher_->launch(k_add, blocks_for(n), kThreads, 0, x, y, n);
  }

  void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& view,
                 AttentionProbe* probe) override {
    if (T == 1 && attention_decode(out, q, q_pos, H, view, probe)) return;
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
    const size_t smem = attn_smem_bytes(a.D);
    const dim3 grid(a.G, qtiles, grid_splits);
    const bool f16 = kv.type == KvType::kF16;
    if (smem > 48 * 1024 && smem_set_ < smem) {
      check(cudaFuncSetAttribute(k_attn<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      check(cudaFuncSetAttribute(k_attn<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      check(cudaFuncSetAttribute(k_attn_probe<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      check(cudaFuncSetAttribute(k_attn_probe<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "smem");
      smem_set_ = smem;
    }
    float* part_ml = a.direct ? ml_->as<float>() : part_ml_->as<float>();
    float* part_acc = a.direct ? nullptr : part_acc_->as<float>();
    Launcher& L = *launcher_;
    const bool mma = attention_mma(out, q, q_pos, kv, a);
    if (!mma) {
      if (f16) L.launch(k_attn<__half>, grid, kAttnWarps * 32, smem, out, part_acc, part_ml, q, q_pos, kv, a);
      else L.launch(k_attn<float>, grid, kAttnWarps * 32, smem, out, part_acc, part_ml, q, q_pos, kv, a);
      if (!a.direct) L.launch(k_attn_merge, static_cast<unsigned>(rows), kMergeThreads, 0, out, ml_->as<float>(), part_acc, part_ml, static_cast<int>(rows), kv, a);
    }
    float* mass = probe != nullptr ? probe->mass : nullptr;
    const bool ent = probe != nullptr && probe->entropy;
    if (mass == nullptr && !ent) return;  // no second pass unless a policy needs it
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
      return;
    }
    // without the entropy, the query tiles before the first row that adds mass are left out
    const int tile0 = ent ? 0 : first_mass_tile(probe->mass_row_begin, a.qt, qtiles);
    const dim3 pgrid(a.G, qtiles - tile0, grid_splits);
    if (f16) L.launch(k_attn_probe<__half>, pgrid, kAttnWarps * 32, smem, mass, stride, probe->mass_row_begin, mass_max, e, ml_->as<float>(), q, q_pos, kv, a, tile0);
    else L.launch(k_attn_probe<float>, pgrid, kAttnWarps * 32, smem, mass, stride, probe->mass_row_begin, mass_max, e, ml_->as<float>(), q, q_pos, kv, a, tile0);
    if (ent) {  // the one step that reports a squeeze metric
      std::vector<float> h(rows * 2);
      download(h.data(), e, h.size() * sizeof(float));
      for (size_t r = 0; r < rows; ++r)
        if (h[2 * r + 1] >= 2.0f) probe->entropy_sum += h[2 * r] / std::log(h[2 * r + 1]), ++probe->entropy_rows;
    }
  }

  // A prompt chunk's attention on the tensor cores (k_attn_mma) where it serves the shape: KV f16,
  // head dim 64 or 128, up to 16 query heads per kv head (a block takes 64 / grp whole tokens; with
  // a grp that does not divide 64 its last rows stay empty), and enough blocks to fill half the SMs
  // without splitting the keys (fewer rows: the general kernel splits them). Writes out and ml_.
  bool attention_mma(float* out, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& general) {
    const int grp = general.grp, D = general.D;
    if (!opt_.mma_attention || kv.type != KvType::kF16 || (D != 64 && D != 128) || grp < 1 || grp > 16) return false;
    AttnShape a = general;
    a.qt = kMmaRows / grp, a.splits = 1, a.direct = 1;
    const int qtiles = (a.T + a.qt - 1) / a.qt;
    if (a.G * qtiles < sms_ / 2) return false;
    const dim3 grid(a.G, qtiles);
    if (D == 64) launch_mma<64>(grid, out, q, q_pos, kv, a);
    else launch_mma<128>(grid, out, q, q_pos, kv, a);
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
    if (a.D == 64) launch_mma_mass<64>(grid, mass, stride, row_begin, q, q_pos, kv, a, tile0);
    else launch_mma_mass<128>(grid, mass, stride, row_begin, q, q_pos, kv, a, tile0);
  }
  template <int D>
  void launch_mma_mass(dim3 grid, float* mass, int64_t stride, int64_t row_begin, const float* q, const int32_t* q_pos,
                       const KvView& kv, const AttnShape& a, int tile0) {
    constexpr size_t smem = mma_mass_smem_bytes<D>();
    static bool attribute_set = false;
    if (!attribute_set) {
      check(cudaFuncSetAttribute(k_attn_mma_mass<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "mma mass smem");
      attribute_set = true;
    }
    launcher_->launch(k_attn_mma_mass<D>, grid, kMmaWarps * 32, smem, mass, stride, row_begin, ml_->as<float>(), q, q_pos, kv, a, tile0);
  }
  template <int D>
  void launch_mma(dim3 grid, float* out, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a) {
    constexpr size_t smem = mma_smem_bytes<D>();
    static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
    if (!attribute_set) {
      check(cudaFuncSetAttribute(k_attn_mma<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "mma attention smem");
      attribute_set = true;
    }
    launcher_->launch(k_attn_mma<D>, grid, kMmaWarps * 32, smem, out, ml_->as<float>(), q, q_pos, kv, a);
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
    const int vbytes = D * static_cast<int>(kv_type_bytes(view.type)), lpk = vbytes / 16;
    if (vbytes % 16 != 0 || (lpk != 4 && lpk != 8 && lpk != 16 && lpk != 32) || grp > 8 || H % G != 0) return false;
    if (probe != nullptr && probe->entropy) return false;
    const bool use_mass = probe != nullptr && probe->mass != nullptr && probe->mass_row_begin <= 0;
    KvView kv;
    AttnShape a = attn_shape(view, 1, H, probe, kv);
    const bool dev_n = kv.count_dev != nullptr;
    a.qt = 1;
    // enough blocks to keep every SM streaming (about four per SM), at least 64 keys each
    const int n_bound = dev_n ? kv.capacity : view.count;
    a.min_keys = kMinDecodeSplitKeys;
    a.splits = std::max(1, std::min({(4 * sms_) / G, (n_bound + a.min_keys - 1) / a.min_keys, kMaxSplits}));
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
    const bool f16 = kv.type == KvType::kF16;
    // this layer's new row, if its k_kv_write was the launch just before: written by the split
    // that holds it, one launch fewer a layer
    KvRowWrite w;
    if (pending_row_.k != nullptr && pending_row_.K == kv.k && dev_n && L.take_back(&pending_row_)) w = pending_row_;
    pending_row_ = KvRowWrite{};
    if (f16 && gmax == 4) launch_decode<__half, 4>(L, lpk, kr.chunk, grid, out, ml, pa, pm, scores, q, q_pos, kv, a, w);
    else if (f16) launch_decode<__half, 8>(L, lpk, kr.chunk, grid, out, ml, pa, pm, scores, q, q_pos, kv, a, w);
    else if (gmax == 4) launch_decode<float, 4>(L, lpk, kr.chunk, grid, out, ml, pa, pm, scores, q, q_pos, kv, a, w);
    else launch_decode<float, 8>(L, lpk, kr.chunk, grid, out, ml, pa, pm, scores, q, q_pos, kv, a, w);
    if (!a.direct)
      L.launch(k_attn_merge, static_cast<unsigned>(rows), kMergeThreads, 0, out, ml, static_cast<const float*>(pa),
               static_cast<const float*>(pm), static_cast<int>(rows), kv, a);
    if (use_mass) {
      const PendingMass pm_rec{probe->mass, scores, ml, stride, probe->reduce == MassReduce::kMax, gmax, view.count, grid, kv, a};
      if (defer) pending_mass_.push_back(pm_rec);
      else launch_mass(pm_rec);
    }
    return true;
  }
  // A decode step's mass from the kept scores (k_attn_mass), now.
  void launch_mass(const PendingMass& p) {
    if (p.gmax == 4) launcher_->launch(k_attn_mass<4>, p.grid, 256, 0, p.mass, p.stride, p.mass_max, p.scores, p.ml, p.kv, p.a);
    else launcher_->launch(k_attn_mass<8>, p.grid, 256, 0, p.mass, p.stride, p.mass_max, p.scores, p.ml, p.kv, p.a);
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
               a.row_bytes() / 4, a.capacity, count, keep_below, keep_from, n_recent, 0, 0, 0};
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
    // the layers' evictions at the end of a step come one after another: while the last launch
    // is this kind's, it is taken back and relaunched with one layer more (one launch a step)
    if (evicts_.n == 0 || evicts_.n == kEvictBatch || evict_g_ != a.G || !launcher_->take_back(&evicts_))
      evicts_ = EvictBatch{};  // a new batch (the unused entries zero: the recorded bytes repeat from step to step)
    evicts_.e[evicts_.n++] = e;
    evict_g_ = a.G;
    launcher_->launch_tagged(&evicts_, k_kv_evict_one, dim3(static_cast<unsigned>(a.G), static_cast<unsigned>(evicts_.n)), kEvictThreads,
                             0, evicts_);
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
    const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(a.G));
    if (a.count_dev != nullptr) at = 0;  // the kernel reads it (the arguments stay the same from step to step)
    // one row with N on the device: the decode attention that follows may take the write over
    const bool fusable = T == 1 && a.count_dev != nullptr && opt_.fuse_kv_write;
    pending_row_ = fusable ? KvRowWrite{a.k, a.v, a.pos, a.mass, k, v, rows_pos} : KvRowWrite{};
    const void* tag = fusable ? &pending_row_ : nullptr;
    if (a.type == KvType::kF16)
      launcher_->launch_tagged(tag, k_kv_write<__half>, grid, a.D, 0, static_cast<__half*>(a.k), static_cast<__half*>(a.v), a.pos, a.mass,
                               a.G, a.D, a.capacity, at, a.count_dev, k, v, rows_pos);
    else
      launcher_->launch_tagged(tag, k_kv_write<float>, grid, a.D, 0, static_cast<float*>(a.k), static_cast<float*>(a.v), a.pos, a.mass,
                               a.G, a.D, a.capacity, at, a.count_dev, k, v, rows_pos);
  }
  void kv_move(const KvArrays& a, const int* from, const int* to, int n) override {
    flush_mass(a.mass);
    if (n == 0) return;
    const size_t need = 2 * static_cast<size_t>(n) * sizeof(int);
    if (!moves_ || moves_->bytes() < need) moves_ = alloc(std::max<size_t>(need, 4096));
    upload(moves_->data(), from, n * sizeof(int));
    upload(moves_->as<int>() + n, to, n * sizeof(int));
    launcher_->launch(k_kv_move, static_cast<unsigned>(n), 128, 0, static_cast<uint32_t*>(a.k), static_cast<uint32_t*>(a.v), a.pos,
                      a.mass, a.row_bytes() / 4, static_cast<const int*>(moves_->as<int>()), static_cast<const int*>(moves_->as<int>() + n));
  }

 private:
  // The parts as one k_gemv launch (T <= kGemvRows), their rotations in its epilogue (or, where it
  // cannot take one, by rope() after it): false, launching nothing, where the GEMV does not serve
  // them (columns not a multiple of 8 or not shared, mixed weight types).
  bool gemv(const MatmulPart* parts, int n, const float* x, int T, bool swiglu) {
    if (n < 1 || n > kMaxParts || T < 1 || T > kGemvRows) return false;
    const WeightMatrix& w0 = *parts[0].w;
    GemvParts P{};
    P.n = n, P.C = static_cast<int>(w0.cols), P.swiglu = swiglu ? 1 : 0;
    if (P.C % 8 != 0 || (w0.type != DType::BF16 && w0.type != DType::F32)) return false;
    for (int i = 0; i < n; ++i) {
      const MatmulPart& m = parts[i];
      if (m.w->cols != w0.cols || m.w->type != w0.type) return false;
      P.w[i] = m.w->data, P.out[i] = m.out, P.bias[i] = m.bias, P.rows[i] = static_cast<int>(m.w->rows);
      int blocks = (P.rows[i] + kGemvBlockRows - 1) / kGemvBlockRows;
      const RopeSpec* r = m.rope;
      const bool same_rope = r != nullptr && (P.D == 0 || (r->D == P.D && r->pos == P.pos && r->inv_freq == P.inv_freq));
      if (same_rope && fusable(*r, *m.w)) {  // one rotation per launch (q and k share the runner's)
        P.epi[i] = r->pairing == RopePairing::kHalves ? kEpiRopeHalves : kEpiRopeAdjacent;
        P.D = r->D, P.pos = r->pos, P.inv_freq = r->inv_freq;
      }
      if (swiglu) blocks = (P.rows[0] + kGemvBlockRows / 2 - 1) / (kGemvBlockRows / 2) * (i == 0 ? 1 : 0);
      P.first_block[i + 1] = P.first_block[i] + blocks;
    }
    if (w0.type == DType::BF16) launch_gemv<__nv_bfloat16>(*launcher_, x, P, T);
    else launch_gemv<float>(*launcher_, x, P, T);
    for (int i = 0; i < n; ++i)  // a rotation the epilogue could not take
      if (const RopeSpec* r = parts[i].rope; r != nullptr && P.epi[i] == kEpiPlain)
        rope(parts[i].out, r->pos, T, static_cast<int>(parts[i].w->rows / r->D), r->D, r->inv_freq, r->pairing);
    return true;
  }
  // Whether k_gemv's epilogue rotates w's output: whole heads of a head dim that its blocks divide.
  static bool fusable(const RopeSpec& r, const WeightMatrix& w) {
    return r.D > 0 && r.D % kGemvBlockRows == 0 && w.rows % r.D == 0;
  }

  // out = x @ W^T (+ bias) for every part by cuBLAS (a prompt chunk); the parts share x[T][C],
  // converted to bf16 once for those with bf16 weights.
  void gemm(const MatmulPart* parts, int n, const float* x, int64_t T) {
    const float one = 1.0f, zero = 0.0f;
    const int C = static_cast<int>(parts[0].w->cols);
    bool converted = false;
    for (int i = 0; i < n; ++i) {
      const WeightMatrix& w = *parts[i].w;
      const int R = static_cast<int>(w.rows);
      // column-major view: out (R x T) = W^T-as-stored (C x R, transposed) x x (C x T)
      if (w.type == DType::BF16) {
        if (!converted) {
          grow(xb_, static_cast<size_t>(T) * C * 2);
          launcher_->launch(k_to_bf16, blocks_for(T * C), kThreads, 0, xb_->as<__nv_bfloat16>(), x, T * C);
          converted = true;
        }
        launcher_->flush();  // cuBLAS issues its own work on the stream
        check(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, R, static_cast<int>(T), C, &one, w.data, CUDA_R_16BF, C,
                           xb_->data(), CUDA_R_16BF, C, &zero, parts[i].out, CUDA_R_32F, R, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              "gemm bf16");
      } else {
        launcher_->flush();
        check(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, R, static_cast<int>(T), C, &one, reinterpret_cast<const float*>(w.data), C,
                          x, C, &zero, parts[i].out, R),
              "gemm f32");
      }
      if (parts[i].bias != nullptr)
        launcher_->launch(k_add_bias, blocks_for(T * R), kThreads, 0, parts[i].out, parts[i].bias, T * R, R);
    }
  }



  void sync_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (bytes == 0) return;
    launcher_->flush();
    check(cudaMemcpyAsync(dst, src, bytes, kind, launcher_->stream()), what);
    check(cudaStreamSynchronize(launcher_->stream()), what);
  }

  CudaOptions opt_;
  KvRowWrite pending_row_;  // the last kv_write, while the decode attention may still take it over
  EvictBatch evicts_{};     // the evictions of the last launch, while it may take one layer more
  int evict_g_ = 0;
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
  void grow(std::unique_ptr<Buffer>& b, size_t bytes) {
    if (!b || b->bytes() < bytes) b = alloc(bytes);
  }
  int sms_ = 1;
  size_t smem_set_ = 0;
  // scratch: bf16 activations, entropies, compaction moves, attention max/sum and split partials
  std::unique_ptr<Buffer> xb_, ent_, moves_, ml_, part_acc_, part_ml_, scores_;
  std::vector<float> host_rows_;              // embedding rows on their way up
  double bandwidth_ = 0.0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options) { return std::make_unique<CudaBackend>(options); }

}  // namespace squeezekv
