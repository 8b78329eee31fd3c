// Sampling a decode batch's rows on the device (sample.h): one block of 1024 threads a row.
//
// The cuts of core/sample.h are found without sorting: top-k's k-th largest logit and top-p's last
// member are thresholds found by bisection over ordered float bits, each step one pass over the
// row that counts (top-k) or sums (top-p) what lies at or above the trial value; ties at a
// threshold are resolved in id order by a scan of per-thread counts. Every sum is f64, per thread
// over a fixed stride then over the block in a fixed tree, so a row's pick depends only on its
// logits and settings (never on timing); it differs from the host's only where the host's other
// summation order or exp's last bit moves a boundary (cuda_test explains each case). The row's q
// are written once to scratch and the passes read them there (L2-resident at a batch's sizes: 64
// rows of a 128k vocabulary are 33 MB).
#include "backend/cuda/sample.h"

#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"

namespace squeezekv::cuda {

namespace {

constexpr int kSampleThreads = 1024, kWarps = kSampleThreads / 32;
static_assert(kWarps == 32, "the block reductions give each warp one lane of the second level");

struct Add {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Min {
  template <class T>
  __device__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct Max {
  template <class T>
  __device__ T operator()(T a, T b) const { return a < b ? b : a; }
};

// The block's reduction of v, the same value (bit for bit) in every thread: a butterfly in each
// warp, the warps' results through s[32], the same butterfly over them.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* s) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = v;
  __syncthreads();
  v = s[threadIdx.x % 32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  return v;
}

// The sum of v over the threads before this one (thread order), and over all of them in total.
template <class T>
__device__ T block_exclusive_sum(T v, T* s, T& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  T incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  T excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = T(0);
  if (lane == 31) s[warp] = incl;
  __syncthreads();
  T w = s[lane];
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, w, o);
    if (lane >= o) w += y;
  }
  total = __shfl_sync(0xffffffffu, w, 31);
  T before = __shfl_sync(0xffffffffu, w, (warp + 31) % 32);
  if (warp == 0) before = T(0);
  __syncthreads();
  return before + excl;
}

__device__ inline uint32_t bits(float q) { return __float_as_uint(q); }

// The ordered bits of a logit: unsigned order is float order (-0 taken as +0).
__device__ inline uint32_t order_bits(float l) {
  const uint32_t b = __float_as_uint(l + 0.0f);
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

// One row's cuts on q (core/sample.h's SampleCut; top-k's is in q itself: a token it leaves out
// holds -1, its sign bit set).
struct Cut {
  bool cut = false;
  uint32_t tau = 0;  // bits
  int id_tau = 0;
  __device__ bool kept(uint32_t b, int i) const {
    return (b >> 31) == 0 && (!cut || b > tau || (b == tau && i <= id_tau));
  }
};

// The thread's contiguous ids [begin, end) for the passes that go in id order.
struct Chunk {
  int begin, end;
  __device__ explicit Chunk(int V) {
    const int c = (V + kSampleThreads - 1) / kSampleThreads;
    begin = min(V, static_cast<int>(threadIdx.x) * c);
    end = min(V, begin + c);
  }
};

struct Shared {
  double d[kWarps];
  int i[kWarps];
  float f[kWarps];
  int found;
};

// The id of the nth (1-based) token, in id order, for which pred(id) holds; -1 if fewer.
template <class Pred>
__device__ int find_nth(int V, int nth, Pred pred, Shared& sh) {
  const Chunk c(V);
  int count = 0;
  for (int i = c.begin; i < c.end; ++i) count += pred(i) ? 1 : 0;
  if (threadIdx.x == 0) sh.found = -1;
  int total = 0;
  const int before = block_exclusive_sum(count, sh.i, total);
  if (before < nth && nth <= before + count) {
    int k = nth - before;
    for (int i = c.begin; i < c.end; ++i)
      if (pred(i) && --k == 0) {
        sh.found = i;
        break;
      }
  }
  __syncthreads();
  const int found = sh.found;
  __syncthreads();
  return found;
}

// grid n, block kSampleThreads
__global__ void __launch_bounds__(kSampleThreads) k_sample_rows(int32_t* out, const float* x, const SampleParams* params,
                                                         float* q_all, int V) {
  pdl_enter();
  __shared__ Shared sh;
  const float* row = x + static_cast<size_t>(blockIdx.x) * V;
  const SampleParams p = params[blockIdx.x];
  if (p.temperature <= 0.0f) {  // greedy: the first largest (core/argmax.h)
    float best = -INFINITY;
    int at = -1;
    for (int i = threadIdx.x; i < V; i += kSampleThreads) {
      const float v = row[i];
      if (at < 0 || v > best) best = v, at = i;
    }
    // the block's best by value, ties to the lower index: reduce the value, then the index
    const float top = block_reduce(at < 0 ? -INFINITY : best, Max(), sh.f);
    const int first = block_reduce(at >= 0 && best == top ? at : INT32_MAX, Min(), sh.i);
    if (threadIdx.x == 0) out[blockIdx.x] = first == INT32_MAX ? 0 : first;
    return;
  }
  // top-k: the largest ordered bits t with at least k logits at or above it, then the tie in id order
  bool top_k = p.top_k > 0 && p.top_k < V;
  uint32_t l_k = 0;
  int id_k = V;
  if (top_k) {
    uint64_t lo = 0, hi = 1ull << 32;  // count(>= lo) >= k; count(>= hi) < k
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      int n = 0;
      for (int i = threadIdx.x; i < V; i += kSampleThreads) n += order_bits(row[i]) >= mid ? 1 : 0;
      if (block_reduce(n, Add(), sh.i) >= p.top_k) lo = mid;
      else hi = mid;
    }
    l_k = static_cast<uint32_t>(lo);
    int above = 0;
    for (int i = threadIdx.x; i < V; i += kSampleThreads) above += order_bits(row[i]) > l_k ? 1 : 0;
    above = block_reduce(above, Add(), sh.i);
    id_k = find_nth(V, p.top_k - above, [row, l_k](int i) { return order_bits(row[i]) == l_k; }, sh);
  }
  // q = exp(l / temperature - max), written once (-1 where top-k leaves the token out)
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kSampleThreads) mx = fmaxf(mx, row[i] / p.temperature);
  mx = block_reduce(mx, Max(), sh.f);
  float* q = q_all + static_cast<size_t>(blockIdx.x) * V;
  for (int i = threadIdx.x; i < V; i += kSampleThreads) {
    const uint32_t o = order_bits(row[i]);
    q[i] = !top_k || o > l_k || (o == l_k && i <= id_k) ? expf(row[i] / p.temperature - mx) : -1.0f;
  }
  __syncthreads();
  const uint32_t* qb = reinterpret_cast<const uint32_t*>(q);
  Cut cut;
  // min-p: q >= min_p; top-p: the largest bits tau whose mass at or above reaches the target,
  // then how many of tau's ties (in id order) the target needs, accumulated as the host does
  cut.cut = p.min_p > 0.0f || p.top_p < 1.0f;
  cut.tau = bits(p.min_p > 0.0f ? p.min_p : 0.0f);
  cut.id_tau = V;
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    for (int i = threadIdx.x; i < V; i += kSampleThreads)
      if (cut.kept(qb[i], i)) mass += __uint_as_float(qb[i]);
    const double target = p.top_p * block_reduce(mass, Add(), sh.d);
    uint32_t lo = cut.tau, hi = bits(1.0f) + 1;  // mass(>= lo) >= target; mass(>= hi) = 0
    const Cut min_p_cut = cut;
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      double m = 0.0;
      for (int i = threadIdx.x; i < V; i += kSampleThreads)
        if (qb[i] >= mid && min_p_cut.kept(qb[i], i)) m += __uint_as_float(qb[i]);
      if (block_reduce(m, Add(), sh.d) >= target) lo = mid;
      else hi = mid;
    }
    double above = 0.0;
    int ties = 0;
    for (int i = threadIdx.x; i < V; i += kSampleThreads)
      if (min_p_cut.kept(qb[i], i)) {
        if (qb[i] > lo) above += __uint_as_float(qb[i]);
        else if (qb[i] == lo) ++ties;
      }
    above = block_reduce(above, Add(), sh.d);
    ties = block_reduce(ties, Add(), sh.i);
    const float tau = __uint_as_float(lo);
    int need = 1;  // the host's walk over the ties: another while the mass stays below the target
    for (double acc = above; need < ties && acc + tau < target; ++need) acc += tau;
    cut.tau = lo;
    cut.id_tau = find_nth(V, need, [qb, lo, min_p_cut](int i) { return qb[i] == lo && min_p_cut.kept(qb[i], i); }, sh);
  }
  // the draw: each thread's kept mass over its ids in order, the block's scan, the thread where
  // the running sum reaches r walks its ids
  const Chunk c(V);
  double mine = 0.0;
  int last = -1;
  for (int i = c.begin; i < c.end; ++i)
    if (cut.kept(qb[i], i)) mine += __uint_as_float(qb[i]), last = i;
  double total = 0.0;
  const double before = block_exclusive_sum(mine, sh.d, total);
  const double r = p.draw * total;
  const int winner = block_reduce(last >= 0 && before + mine >= r ? static_cast<int>(threadIdx.x) : kSampleThreads, Min(), sh.i);
  if (static_cast<int>(threadIdx.x) == winner) {
    double left = r - before;
    int pick = last;
    for (int i = c.begin; i < c.end; ++i) {
      if (!cut.kept(qb[i], i)) continue;
      left -= __uint_as_float(qb[i]);
      if (left <= 0.0) {
        pick = i;
        break;
      }
    }
    out[blockIdx.x] = pick;
  }
  if (winner == kSampleThreads) {  // rounding left r past every thread's sum: the last kept token
    const int last_all = block_reduce(last, Max(), sh.i);
    if (threadIdx.x == 0) out[blockIdx.x] = last_all < 0 ? 0 : last_all;
  }
}

}  // namespace

void launch_sample_rows(Launcher& L, int32_t* out, const float* x, const SampleParams* params, float* q, int64_t n, int64_t V) {
  L.launch(k_sample_rows, static_cast<unsigned>(n), kSampleThreads, 0, out, x, params, q, static_cast<int>(V));
}

}  // namespace squeezekv::cuda
