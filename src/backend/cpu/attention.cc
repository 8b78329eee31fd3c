// Causal multi-head attention over a layer's retained keys, with the probes eviction needs (the
// softmax mass each key receives, the attention entropy). Letters as in ops.h: T query rows,
// H query heads, G kv heads, D head dim, N retained keys per kv head (slots in no order).
//
// Fast path (AVX2 build, D a multiple of 16): the rows of a tile are (token, query head) pairs of
// one kv head, kRowTile at a time, so the query heads sharing a kv head (GQA) read its keys and
// values once; the tile kernel (attention_kernel.h) runs in 256-bit registers here and in 512-bit
// ones on CPUs with AVX-512 (attention_avx512.cc, chosen at run time). With few tiles (decode)
// the keys are also split into segments merged afterwards (flash-decoding).
// The row path is the plain reference shape and the fallback for other builds and sizes.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/attention_tile.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/half.h"
#include "core/kv_rows.h"
#include "core/quant.h"

namespace squeezekv::cpu {

namespace attn {

void quantize_query(const float* x, float scale, Q8Query& out) {
  quantize_q8(out.b, x, 64);
  out.d[0] = out.b[0].d * scale, out.d[1] = out.b[1].d * scale;
}

float q8_score(const Q8Query& q, const uint8_t* k) {
  constexpr int kBlock = dtype_info(DType::Q8_0).block_bytes;  // a KV row's Q8_0 blocks are GGUF's
  int32_t i[2] = {0, 0};
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 32; ++j) i[b] += static_cast<int32_t>(q.b[b].q[j]) * static_cast<int8_t>(k[kBlock * b + 2 + j]);
  const float d0 = load_f16(k), d1 = load_f16(k + kBlock);
  const float s = static_cast<float>(i[0]) * (d0 * q.d[0]);
  return std::fma(static_cast<float>(i[1]), d1 * q.d[1], s);
}

#if !SQUEEZEKV_VNNI_KERNEL
Q8ScoresFn vnni_q8_scores16() { return nullptr; }
#endif

}  // namespace attn

namespace {

using attn::kRowTile;

// Everything one head's computation reads and writes.
struct HeadJob {
  const float* q = nullptr;      // row t of this head at q + t * q_stride, D floats
  int64_t q_stride = 0;          // H * D
  float* out = nullptr;          // same layout as q
  const int32_t* q_pos = nullptr;  // [T]
  int64_t T = 0;
  const uint8_t* k = nullptr;    // this kv head's [N] rows of kb bytes (k_type)
  const uint8_t* v = nullptr;    // [N] rows of vb bytes (v_type)
  const int32_t* pos = nullptr;  // [N]
  int N = 0, D = 0;
  KvType k_type = KvType::kF16, v_type = KvType::kF16;
  size_t kb = 0, vb = 0;
  float scale = 1.0f;
  float* scores = nullptr;       // scratch [min(T, kRowTile)][N]
  float* mass = nullptr;         // [N] += (or max=) probabilities of rows t >= mass_from; null: not wanted
  int64_t mass_from = 0;
  bool mass_max = false;
  bool entropy = false;
  double entropy_sum = 0.0;      // out: sum over rows of H(p) / log(visible keys), rows with >= 2 keys
  int64_t entropy_rows = 0;
  const KvView* kv = nullptr;    // the recent ring's (kv_ring_index)
  const uint16_t* ring_k = nullptr;  // this kv head's [ring][D] f16, or null
  const uint16_t* ring_v = nullptr;
};

// The ring index of key `key` (its row read from the recent ring), or -1.
inline int ring_at(const HeadJob& j, int64_t key) { return j.kv->ring > 0 ? kv_ring_index(*j.kv, j.pos[key]) : -1; }
inline float key_at(const HeadJob& j, int64_t key, int d) {
  if (j.ring_k != nullptr)
    if (const int i = ring_at(j, key); i >= 0) return f16_to_f32(j.ring_k[static_cast<int64_t>(i) * j.D + d]);
  return kv_row_value(j.k_type, j.k + key * j.kb, d);
}
inline float value_at(const HeadJob& j, int64_t key, int d) {
  if (j.ring_v != nullptr)
    if (const int i = ring_at(j, key); i >= 0) return f16_to_f32(j.ring_v[static_cast<int64_t>(i) * j.D + d]);
  return kv_row_value(j.v_type, j.v + key * j.vb, d);
}

// mass[n] += p[n] (or max=) for n in [n0, n1).
inline void add_mass(float* mass, const float* p, int n0, int n1, bool max) {
  if (max) {
    for (int n = n0; n < n1; ++n) mass[n] = std::max(mass[n], p[n]);
  } else {
    for (int n = n0; n < n1; ++n) mass[n] += p[n];
  }
}

// Bookkeeping of one row of probabilities p[N] (already normalised): its mass, and its entropy
// H(p) = -sum p log p normalised by log(visible keys) (rows seeing one key carry no information).
void row_probes(HeadJob& j, const float* p, int64_t t, int visible, double entropy) {
  if (j.mass != nullptr && t >= j.mass_from) add_mass(j.mass, p, 0, j.N, j.mass_max);
  if (j.entropy && visible >= 2) {
    j.entropy_sum += entropy / std::log(static_cast<double>(visible));
    ++j.entropy_rows;
  }
}

// The reference shape: one query row at a time, one key at a time.
void head_rows(HeadJob& j) {
  const int N = j.N, D = j.D;
  float* p = j.scores;
  for (int64_t t = 0; t < j.T; ++t) {
    const float* qt = j.q + t * j.q_stride;
    float* ot = j.out + t * j.q_stride;
    const int32_t qp = j.q_pos[t];
    int visible = 0;
    float mx = -INFINITY;
    for (int n = 0; n < N; ++n) {
      if (j.pos[n] > qp) {  // causal mask by position: masked keys cost a compare, not a dot
        p[n] = -INFINITY;
        continue;
      }
      ++visible;
      float s = 0.0f;
      for (int d = 0; d < D; ++d) s += qt[d] * key_at(j, n, d);
      p[n] = s * j.scale;
      mx = std::max(mx, p[n]);
    }
    float sum = 0.0f;
    for (int n = 0; n < N; ++n) {
      p[n] = std::exp(p[n] - mx);
      sum += p[n];
    }
    const float inv = 1.0f / sum;
    std::fill(ot, ot + D, 0.0f);
    for (int n = 0; n < N; ++n) {
      p[n] *= inv;
      for (int d = 0; d < D; ++d) ot[d] += p[n] * value_at(j, n, d);
    }
    double e = 0.0;
    if (j.entropy)
      for (int n = 0; n < N; ++n)
        if (p[n] > 0.0f) e -= static_cast<double>(p[n]) * std::log(static_cast<double>(p[n]));
    row_probes(j, p, t, visible, e);
  }
}

}  // namespace

#if SQUEEZEKV_AVX2
namespace attn {
namespace {
// 8 floats in a 256-bit register (the AVX2 build's baseline).
struct V {
  using Reg = __m256;
  static constexpr int kW = 8, kScoreRows = 2, kValueVecs = 2;  // 16 registers
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Reg load_i8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static Reg load_u4(const uint8_t* p, bool high) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    if (high) b = _mm_srli_epi16(b, 4);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(0x0F))));
  }
  static Reg set1_f16(const uint8_t* p) {  // the f16 at p in every lane
    uint16_t h;
    __builtin_memcpy(&h, p, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
  }
  static void store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg fmadd(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg exp_nonpositive(Reg x) { return simd::exp_nonpositive(x); }
  static float hsum(Reg x) { return simd::hsum(x); }
  static float hmax(Reg x) { return simd::hmax(x); }
  static __m128 sum4(Reg a0, Reg a1, Reg a2, Reg a3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  }
  static float scalar(uint16_t h) { return _cvtsh_ss(h); }
};
}  // namespace
#include "backend/cpu/attention_kernel.h"
}  // namespace attn

namespace {
using attn::SegmentPart;
using attn::TiledArgs;
using attn::TileFn;
using attn::TileJob;

// Finishes a tile split into S segments (segment j holds keys [bounds[j], bounds[j+1])): with
// M = max m_j and w_j = exp(m_j - M), L = sum w_j l_j; out = sum w_j o_j / L; p = e w_j / L for
// the mass; H = log L - sum w_j (ex_j + (m_j - M) l_j) / L.
void merge_segments(const TiledArgs& a, TileJob& job, const SegmentPart* parts, const int* bounds, int S, float* s) {
  const int D = a.D;
  const int64_t Ns = a.N;
  for (int r = 0; r < job.rows; ++r) {
    const int64_t row = job.row0 + r, t = row / a.group;
    const int h = job.g * a.group + static_cast<int>(row % a.group);
    float M = -INFINITY;
    int visible = 0;
    for (int j = 0; j < S; ++j)
      if (parts[j].visible[r] > 0) {
        M = std::max(M, parts[j].m[r]);
        visible += parts[j].visible[r];
      }
    float w[64];
    double L = 0.0, wex = 0.0;
    for (int j = 0; j < S; ++j) {
      w[j] = parts[j].visible[r] > 0 ? std::exp(parts[j].m[r] - M) : 0.0f;
      L += static_cast<double>(w[j]) * parts[j].l[r];
      wex += static_cast<double>(w[j]) * (parts[j].ex[r] + (parts[j].m[r] - M) * parts[j].l[r]);
    }
    const float inv_l = static_cast<float>(1.0 / L);
    float* o = a.out + (t * a.H + h) * D;
    for (int d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int j = 0; j < S; ++j) acc += w[j] * parts[j].out[r][d];
      o[d] = acc * inv_l;
    }
    float* sr = s + r * Ns;
    for (int j = 0; j < S; ++j) {
      const float f = w[j] * inv_l;
      for (int n = bounds[j]; n < bounds[j + 1]; ++n) sr[n] *= f;
    }
    if (a.want_mass && t >= a.mass_from) add_mass(job.mass, sr, 0, a.N, a.mass_max);
    if (a.entropy && visible >= 2) {
      const double H = std::log(L) - wex / L;
      job.entropy_sum += H / std::log(static_cast<double>(visible));
      ++job.entropy_rows;
    }
  }
}

// Tiles of every kv head, in parallel; per-tile mass and entropy combined in tile order afterwards.
// When there are few tiles (decode: one per kv head), each tile's keys are also split into
// segments of kSegmentKeys, so long contexts use every thread. The split depends on the sizes
// only, never on the thread count, so results do not either.
constexpr int kFewTiles = 8, kSegmentKeys = 1024, kMaxSegments = 64;

// One attention call planned as tiles: its arguments, tile geometry and key segments.
struct TiledPlan {
  TiledArgs a;
  int G = 0, N = 0, S = 1;
  int64_t rows_per_head = 0, tiles_per_head = 0, n_tiles = 0;
  TileFn tile = nullptr;  // the kernel for this KV type and CPU
};

// The tile kernel for these K and V row types: AVX-512 where the CPU runs it, else AVX2; null
// for a pair neither has (the row path's then).
TileFn tile_kernel(KvType k, KvType v) {
  const TileFn wide = attn::avx512_tile(k, v);
  return wide != nullptr ? wide : attn::tile_for(k, v);
}

// This thread's skip scratch for a tile over N keys (grown once).
uint8_t* skip_scratch(int N) {
  thread_local std::vector<uint8_t> skip;
  if (skip.size() < static_cast<size_t>(N / 4 + 1)) skip.resize(static_cast<size_t>(N / 4 + 1));
  return skip.data();
}

TiledPlan plan_tiled(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                     const AttentionProbe* probe, Activations act) {
  TiledPlan p;
  p.G = kv.n_kv_heads;
  p.N = kv.count;
  const int group = H / p.G;
  p.a = TiledArgs{q, out, q_pos, H, group, kv.head_dim, p.N, kv.capacity, kv.k, kv.v, kv.pos,
                  1.0f / std::sqrt(static_cast<float>(kv.head_dim)), probe != nullptr ? probe->mass_row_begin : 0,
                  probe != nullptr && probe->mass != nullptr, probe != nullptr && probe->entropy,
                  probe != nullptr && probe->reduce == MassReduce::kMax, kv.capacity};
  p.a.ring_k = kv.ring_k, p.a.ring_v = kv.ring_v, p.a.ring_pos = kv.ring_pos, p.a.ring = kv.ring, p.a.ring_from = kv.ring_from;
  p.rows_per_head = T * group;
  p.tiles_per_head = (p.rows_per_head + kRowTile - 1) / kRowTile;
  p.n_tiles = p.tiles_per_head * p.G;
  if (p.n_tiles <= kFewTiles && kv.head_dim <= 256)
    p.S = static_cast<int>(std::clamp<int64_t>(p.N / kSegmentKeys, 1, kMaxSegments));
  p.tile = tile_kernel(kv.type, kv.v_type);
  // 8-bit queries against Q8_0 keys: under int8 decode arithmetic, for one query token (decode
  // steps; a longer chunk's held rows come dequantized, kv.type f32), head dim 64, on the AVX-512
  // tiles of a CPU with VNNI (elsewhere f32 queries, as before)
  if (act == Activations::kInt8 && T == 1 && kv.type == KvType::kQ8_0 && kv.head_dim == 64 && p.tile == attn::avx512_tile(kv.type, kv.v_type))
    p.a.q8_scores = attn::vnni_q8_scores16();
  return p;
}

// The plan's tiles into jobs[n_tiles]; their mass rows from scratch (n_tiles * N floats).
void make_jobs(const TiledPlan& p, TileJob* jobs, float* scratch) {
  for (int64_t i = 0; i < p.n_tiles; ++i) {
    jobs[i] = TileJob{};
    jobs[i].g = static_cast<int>(i / p.tiles_per_head);
    jobs[i].row0 = (i % p.tiles_per_head) * kRowTile;
    jobs[i].rows = static_cast<int>(std::min<int64_t>(kRowTile, p.rows_per_head - jobs[i].row0));
    if (p.a.want_mass) {
      jobs[i].mass = scratch + i * p.N;
      std::fill(jobs[i].mass, jobs[i].mass + p.N, 0.0f);
    }
  }
}

// Per-tile mass and entropy combined in tile order (so results do not depend on the threads).
void finish_tiled(const TiledPlan& p, const TileJob* jobs, AttentionProbe* probe, const float* scratch) {
  if (p.a.entropy) {
    for (int64_t i = 0; i < p.n_tiles; ++i) {
      probe->entropy_sum += jobs[i].entropy_sum;
      probe->entropy_rows += jobs[i].entropy_rows;
    }
  }
  if (p.a.want_mass) {
    const float inv_group = 1.0f / static_cast<float>(p.a.group);
    const int64_t stride = probe->mass_stride > 0 ? probe->mass_stride : p.N;
    for (int g = 0; g < p.G; ++g) {
      float* mg = probe->mass + g * stride;
      for (int64_t tile = 0; tile < p.tiles_per_head; ++tile) {
        const float* m = scratch + (g * p.tiles_per_head + tile) * p.N;
        if (p.a.mass_max) {
          for (int n = 0; n < p.N; ++n) mg[n] = std::max(mg[n], m[n]);
        } else {
          for (int n = 0; n < p.N; ++n) mg[n] += m[n] * inv_group;
        }
      }
    }
  }
}

// A tile over all its keys (one segment).
void run_whole_tile(const TiledArgs& a, TileJob& job, TileFn tile) {
  thread_local std::vector<float> score_buf;  // [kRowTile][N], grown once per thread
  if (score_buf.size() < static_cast<size_t>(kRowTile) * a.N) score_buf.resize(static_cast<size_t>(kRowTile) * a.N);
  tile(a, job, 0, a.N, score_buf.data(), nullptr, skip_scratch(a.N));
}

// A prompt chunk over block-quantized rows: every tile of a kv head would dequantize the same
// rows again in registers (16 query rows a tile; a 512-row chunk over q4_1 rows ran at 0.54x the
// f16 speed), so the N held rows of every head are dequantized once, in parallel, into f32
// scratch [G][N][D] (kv_dequantize_row: the values the reference reads), and the f32 tile kernel
// runs over them; a row the recent ring holds is its ring row (KvView::ring_k). Returns the view
// to attend over (kv itself when nothing was done).
bool dequantizes_for_tiles(const KvView& kv, int64_t T, int H) {
  return (kv_quantized(kv.type) || kv_quantized(kv.v_type)) && T * (H / kv.n_kv_heads) > kRowTile;
}

KvView dequantized_for_tiles(const KvView& kv, int64_t T, int H) {
  if (!dequantizes_for_tiles(kv, T, H)) return kv;
  thread_local std::vector<float> kf, vf;  // grown once per thread
  const int G = kv.n_kv_heads, N = kv.count, D = kv.head_dim;
  const size_t n = static_cast<size_t>(G) * N * D;
  if (kf.size() < n) kf.resize(n), vf.resize(n);
  const size_t kb = kv.k_row_bytes(), vb = kv.v_row_bytes();
  float* const kd = kf.data();
  float* const vd = vf.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < static_cast<int64_t>(G) * N; ++i) {
    const int64_t g = i / N, r = i % N, at = g * kv.capacity + r;
    const int ring = kv_ring_index(kv, kv.pos[at]);
    const int64_t ring_at = (g * kv.ring + ring) * D;
    if (ring >= 0 && kv.ring_k != nullptr) f16_to_f32_row(kd + i * D, kv.ring_k + ring_at, D);
    else kv_dequantize_row(kv.type, static_cast<const uint8_t*>(kv.k) + at * kb, kd + i * D, D);
    if (ring >= 0 && kv.ring_v != nullptr) f16_to_f32_row(vd + i * D, kv.ring_v + ring_at, D);
    else kv_dequantize_row(kv.v_type, static_cast<const uint8_t*>(kv.v) + at * vb, vd + i * D, D);
  }
  KvView f = kv;
  f.k = kd, f.v = vd;
  f.type = f.v_type = KvType::kF32;
  f.ring_k = f.ring_v = nullptr, f.ring_pos = nullptr, f.ring = 0;  // applied
  return f;
}

void attention_tiled(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv_in,
                     AttentionProbe* probe, float* scratch, Activations act) {
  const KvView kv = dequantized_for_tiles(kv_in, T, H);
  TiledPlan p = plan_tiled(out, q, q_pos, T, H, kv, probe, act);
  if (kv.k != kv_in.k) p.a.kv_rows = kv.count;  // the scratch holds N rows a head
  const TiledArgs& a = p.a;
  const int N = p.N, S = p.S;
  const int64_t n_tiles = p.n_tiles;
  thread_local std::vector<TileJob> jobs_of_caller;  // grown once; worker threads use them by pointer
  thread_local std::vector<SegmentPart> parts_of_caller;
  thread_local std::vector<float> scores_of_caller;
  jobs_of_caller.resize(static_cast<size_t>(n_tiles));
  TileJob* const jobs = jobs_of_caller.data();
  make_jobs(p, jobs, scratch);
  if (S == 1) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tiles; ++i) run_whole_tile(a, jobs[i], p.tile);
  } else {
    // segment bounds: multiples of 4, the last one takes the rest
    int bounds[kMaxSegments + 1];
    const int per = (N / S) / 4 * 4;
    for (int j = 0; j < S; ++j) bounds[j] = j * per;
    bounds[S] = N;
    if (parts_of_caller.size() < static_cast<size_t>(n_tiles * S)) parts_of_caller.resize(static_cast<size_t>(n_tiles * S));
    if (scores_of_caller.size() < static_cast<size_t>(n_tiles * kRowTile * N))
      scores_of_caller.resize(static_cast<size_t>(n_tiles * kRowTile * N));
    SegmentPart* const parts = parts_of_caller.data();
    float* const scores = scores_of_caller.data();
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_tiles * S; ++i) {
      const int64_t tile = i / S;
      const int j = static_cast<int>(i % S);
      float* s = scores + tile * kRowTile * N;
      p.tile(a, jobs[tile], bounds[j], bounds[j + 1], s, parts + i, skip_scratch(N));
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t tile = 0; tile < n_tiles; ++tile)
      merge_segments(a, jobs[tile], parts + tile * S, bounds, S, scores + tile * kRowTile * N);
  }
  finish_tiled(p, jobs, probe, scratch);
}

// Several calls (a decode batch: one per sequence) whose tiles all run in one parallel loop, so
// that a few tiles per call (one per kv head) still keep every thread busy. Each tile computes
// exactly what it computes in a call of its own; calls whose keys are split into segments (long
// contexts) and prompt chunks over quantized rows (dequantized once into the caller's scratch,
// dequantizes_for_tiles) run on their own, as alone: the same path, so the same bits (a packed
// prefill of several sequences once read 4-bit rows through the register path and answered
// otherwise than alone, 2026-12-06).
void attention_batch_tiled(const AttentionCall* calls, int n, float* scratch, Activations act) {
  thread_local std::vector<TiledPlan> plans;
  thread_local std::vector<float*> scratch_of;
  thread_local std::vector<int64_t> first_job;  // [n + 1] each pooled call's first job
  thread_local std::vector<TileJob> jobs;
  thread_local std::vector<int> call_of;
  thread_local std::vector<char> alone;  // [n] run as a call of its own
  plans.clear();
  alone.clear();
  scratch_of.clear();
  first_job.assign(1, 0);
  float* next = scratch;
  for (int c = 0; c < n; ++c) {
    const AttentionCall& k = calls[c];
    plans.push_back(plan_tiled(k.out, k.q, k.q_pos, k.T, k.H, k.kv, k.probe, act));
    scratch_of.push_back(next);
    next += attention_scratch_floats(k.T, k.H, k.kv.capacity);
    alone.push_back(plans[c].S != 1 || dequantizes_for_tiles(k.kv, k.T, k.H));
    first_job.push_back(first_job.back() + (alone[c] ? 0 : plans[c].n_tiles));
  }
  jobs.resize(static_cast<size_t>(first_job.back()));
  call_of.resize(jobs.size());
  for (int c = 0; c < n; ++c) {
    if (alone[c]) {
      attention_tiled(calls[c].out, calls[c].q, calls[c].q_pos, calls[c].T, calls[c].H, calls[c].kv, calls[c].probe, scratch_of[c], act);
      continue;
    }
    make_jobs(plans[c], jobs.data() + first_job[c], scratch_of[c]);
    std::fill(call_of.begin() + first_job[c], call_of.begin() + first_job[c + 1], c);
  }
  const int64_t n_jobs = first_job.back();
  TileJob* const all = jobs.data();
  const int* const owner = call_of.data();
  const TiledPlan* const plan = plans.data();
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n_jobs; ++i) run_whole_tile(plan[owner[i]].a, all[i], plan[owner[i]].tile);
  for (int c = 0; c < n; ++c)
    if (!alone[c]) finish_tiled(plans[c], all + first_job[c], calls[c].probe, scratch_of[c]);
}
#endif

}  // namespace

#if SQUEEZEKV_AVX2 && !SQUEEZEKV_AVX512_KERNEL
attn::TileFn attn::avx512_tile(KvType, KvType) { return nullptr; }  // not built: the AVX2 kernel runs
#endif

int64_t attention_scratch_floats(int64_t T, int H, int N) {
  // rows path: per head a score row and a mass row; tiled path: a mass row per tile, and a kv
  // head has at most ceil(T * group / kRowTile) tiles
  const int64_t tiles = (std::max<int64_t>(T, 1) * H + kRowTile - 1) / kRowTile + H;
  return std::max<int64_t>(2 * static_cast<int64_t>(H), tiles) * N;
}

namespace {
// One head at a time, one row at a time (the reference, and the path for other builds and sizes).
void attention_rows(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                    AttentionProbe* probe, float* scratch) {
  const int G = kv.n_kv_heads, D = kv.head_dim, N = kv.count;
  const int group = H / G;
  float* const mass = probe != nullptr ? probe->mass : nullptr;
  float* head_mass = scratch + static_cast<int64_t>(H) * N;  // [H][N]
  const size_t kb = kv.k_row_bytes(), vb = kv.v_row_bytes();
  thread_local std::vector<HeadJob> jobs_of_caller;  // grown once; worker threads use it by pointer
  jobs_of_caller.assign(static_cast<size_t>(H), HeadJob{});
  HeadJob* const jobs = jobs_of_caller.data();
#pragma omp parallel for schedule(dynamic, 1)
  for (int h = 0; h < H; ++h) {
    const int g = h / group;
    HeadJob& j = jobs[h];
    j.q = q + static_cast<int64_t>(h) * D;
    j.out = out + static_cast<int64_t>(h) * D;
    j.q_stride = static_cast<int64_t>(H) * D;
    j.q_pos = q_pos;
    j.T = T;
    j.k = static_cast<const uint8_t*>(kv.k) + static_cast<size_t>(g) * kv.capacity * kb;
    j.v = static_cast<const uint8_t*>(kv.v) + static_cast<size_t>(g) * kv.capacity * vb;
    j.kb = kb, j.vb = vb;
    j.k_type = kv.type, j.v_type = kv.v_type;
    j.pos = kv.pos + static_cast<int64_t>(g) * kv.capacity;
    j.N = N;
    j.D = D;
    j.scale = 1.0f / std::sqrt(static_cast<float>(D));
    j.scores = scratch + static_cast<int64_t>(h) * N;
    j.mass = mass != nullptr ? head_mass + static_cast<int64_t>(h) * N : nullptr;
    j.mass_from = probe != nullptr ? probe->mass_row_begin : 0;
    j.mass_max = probe != nullptr && probe->reduce == MassReduce::kMax;
    j.entropy = probe != nullptr && probe->entropy;
    j.kv = &kv;
    j.ring_k = kv.ring_k != nullptr ? kv.ring_k + static_cast<int64_t>(g) * kv.ring * D : nullptr;
    j.ring_v = kv.ring_v != nullptr ? kv.ring_v + static_cast<int64_t>(g) * kv.ring * D : nullptr;
    if (j.mass != nullptr) std::fill(j.mass, j.mass + N, 0.0f);
    head_rows(j);
  }
  // per-head results are combined in head order, so nothing depends on the thread count
  if (probe != nullptr && probe->entropy) {
    for (int h = 0; h < H; ++h) {
      probe->entropy_sum += jobs[h].entropy_sum;
      probe->entropy_rows += jobs[h].entropy_rows;
    }
  }
  if (mass != nullptr) {
    const float inv_group = 1.0f / static_cast<float>(group);
    for (int g = 0; g < G; ++g) {
      float* mg = mass + static_cast<int64_t>(g) * (probe->mass_stride > 0 ? probe->mass_stride : N);
      for (int n = 0; n < N; ++n) {
        if (probe->reduce == MassReduce::kMax) {
          for (int k = 0; k < group; ++k) mg[n] = std::max(mg[n], head_mass[static_cast<int64_t>(g * group + k) * N + n]);
          continue;
        }
        float s = 0.0f;
        for (int k = 0; k < group; ++k) s += head_mass[static_cast<int64_t>(g * group + k) * N + n];
        mg[n] += s * inv_group;
      }
    }
  }
}
}  // namespace

void attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
               AttentionProbe* probe, float* scratch, Activations act) {
#if SQUEEZEKV_AVX2
  if (kv.head_dim % 16 == 0 && tile_kernel(kv.type, kv.v_type) != nullptr)
    return attention_tiled(out, q, q_pos, T, H, kv, probe, scratch, act);
#else
  (void)act;
#endif
  attention_rows(out, q, q_pos, T, H, kv, probe, scratch);
}

void attention_batch(const AttentionCall* calls, int n, float* scratch, Activations act) {
#if SQUEEZEKV_AVX2
  bool tiled = true;
  for (int c = 0; c < n; ++c) tiled = tiled && calls[c].kv.head_dim % 16 == 0 && tile_kernel(calls[c].kv.type, calls[c].kv.v_type) != nullptr;
  if (tiled) return attention_batch_tiled(calls, n, scratch, act);
#endif
  for (int c = 0; c < n; ++c) {
    attention(calls[c].out, calls[c].q, calls[c].q_pos, calls[c].T, calls[c].H, calls[c].kv, calls[c].probe, scratch, act);
    scratch += attention_scratch_floats(calls[c].T, calls[c].H, calls[c].kv.capacity);
  }
}

void ref::attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                    AttentionProbe* probe, float* scratch) {
  attention_rows(out, q, q_pos, T, H, kv, probe, scratch);
}

}  // namespace squeezekv::cpu
