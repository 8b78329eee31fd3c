// Causal multi-head attention over a layer's retained keys, with the probes eviction needs (the
// softmax mass each key receives, the attention entropy). Letters as in ops.h: T query rows,
// H query heads, G kv heads, D head dim, N retained keys per kv head (slots in no order).
//
// Fast path (AVX2, D a multiple of 16): the rows of a tile are (token, query head) pairs of one kv
// head, kRowTile at a time, so the query heads sharing a kv head (GQA) read its keys and values
// once. Scores against the keys are formed by 2x4 register tiles (each key quad loaded once for
// all rows of the tile), the softmax runs over whole rows with a vector exp, and P.V is formed by
// 4-row x 16-dim register tiles. Key quads that no row of a tile may see (all positions later than
// the tile's queries: the causal triangle of a prefill chunk) are skipped in both products. With
// few tiles (decode) the keys are also split into segments merged afterwards (flash-decoding).
// The row path is the plain reference shape and the fallback for other builds and sizes.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/half.h"

namespace squeezekv::cpu {
namespace {

using simd::exp_nonpositive;
using simd::hmax;
using simd::hsum;

constexpr int kRowTile = 16;  // query rows whose score rows [kRowTile][N] are held at once

// Everything one head's computation reads and writes.
struct HeadJob {
  const float* q = nullptr;      // row t of this head at q + t * q_stride, D floats
  int64_t q_stride = 0;          // H * D
  float* out = nullptr;          // same layout as q
  const int32_t* q_pos = nullptr;  // [T]
  int64_t T = 0;
  const void* k = nullptr;       // this kv head's [N][D] (f16 or f32)
  const void* v = nullptr;
  const int32_t* pos = nullptr;  // [N]
  int N = 0, D = 0;
  bool f16 = true;
  float scale = 1.0f;
  float* scores = nullptr;       // scratch [min(T, kRowTile)][N]
  float* mass = nullptr;         // [N] += (or max=) probabilities of rows t >= mass_from; null: not wanted
  int64_t mass_from = 0;
  bool mass_max = false;
  bool entropy = false;
  double entropy_sum = 0.0;      // out: sum over rows of H(p) / log(visible keys), rows with >= 2 keys
  int64_t entropy_rows = 0;
};

inline float key_at(const HeadJob& j, int64_t key, int d) {
  return j.f16 ? f16_to_f32(static_cast<const uint16_t*>(j.k)[key * j.D + d]) : static_cast<const float*>(j.k)[key * j.D + d];
}
inline float value_at(const HeadJob& j, int64_t key, int d) {
  return j.f16 ? f16_to_f32(static_cast<const uint16_t*>(j.v)[key * j.D + d]) : static_cast<const float*>(j.v)[key * j.D + d];
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

#if SQUEEZEKV_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline float load_scalar(const float* p) { return *p; }
inline float load_scalar(const uint16_t* p) { return f16_to_f32(*p); }

// scores[r][0..4) = scale * q_r . k_c for R query rows and 4 keys (k: 4 rows at stride D).
template <int R, typename KT>
inline void score_tile(float* s, int64_t s_stride, const float* const* q, const KT* k, int D, float scale) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) a[r][c] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
    const __m256 k0 = load8(k + d), k1 = load8(k + D + d), k2 = load8(k + 2 * D + d), k3 = load8(k + 3 * D + d);
    for (int r = 0; r < R; ++r) {
      const __m256 qr = _mm256_loadu_ps(q[r] + d);
      a[r][0] = _mm256_fmadd_ps(qr, k0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(qr, k1, a[r][1]);
      a[r][2] = _mm256_fmadd_ps(qr, k2, a[r][2]);
      a[r][3] = _mm256_fmadd_ps(qr, k3, a[r][3]);
    }
  }
  for (int r = 0; r < R; ++r) {  // four horizontal sums at once
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[r][0], a[r][1]), _mm256_hadd_ps(a[r][2], a[r][3]));
    const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(s + r * s_stride, _mm_mul_ps(sum, _mm_set1_ps(scale)));
  }
}

// out[r][d0..d0+16) = sum_n p[r][n] v[n][d0..d0+16) for R rows and keys n in [n0, n1) (n0 a
// multiple of 4), over the key quads not skipped.
template <int R, typename KT>
inline void value_tile(float* const* out, const float* p, int64_t p_stride, const KT* v, int D, int d0, int n0, int n1,
                       const uint8_t* skip_quad) {
  __m256 a[R][2];
  for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
  auto key = [&](int n) {
    const __m256 v0 = load8(v + static_cast<int64_t>(n) * D + d0), v1 = load8(v + static_cast<int64_t>(n) * D + d0 + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(p + r * p_stride + n);
      a[r][0] = _mm256_fmadd_ps(b, v0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(b, v1, a[r][1]);
    }
  };
  const int q1 = n1 / 4;
  for (int c = n0 / 4; c < q1; ++c) {
    if (skip_quad[c]) continue;
    for (int n = 4 * c; n < 4 * c + 4; ++n) key(n);
  }
  for (int n = std::max(n0, 4 * q1); n < n1; ++n) key(n);
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(out[r] + d0, a[r][0]);
    _mm256_storeu_ps(out[r] + d0 + 8, a[r][1]);
  }
}

// One tile of up to kRowTile rows of one kv head. Rows are (token, query head of the group) pairs,
// token-major, so the H/G query heads that share a kv head read its keys and values once (GQA).
struct TileJob {
  int g = 0;            // kv head
  int64_t row0 = 0;     // first row in [0, T * group)
  int rows = 0;
  float* mass = nullptr;  // [N] this tile's share, summed over rows t >= mass_from (not yet / group)
  double entropy_sum = 0.0;
  int64_t entropy_rows = 0;
};

// A key segment's softmax over its own keys, to be merged with the tile's other segments
// (flash-decoding): per row the segment max m, sum l = sum e and sum e x of e = exp(s - m),
// x = s - m, the visible keys, and the unnormalised output sum e v. The e stay in the tile's
// score rows, columns [n0, n1).
struct SegmentPart {
  float m[kRowTile], l[kRowTile], ex[kRowTile];
  int visible[kRowTile];
  float out[kRowTile][256];  // head dims up to 256 split this way; larger ones use one segment
};

struct TiledArgs {
  const float* q;  // [T][H*D]
  float* out;      // [T][H*D]
  const int32_t* q_pos;
  int H, group, D, N, capacity;
  const void* k;
  const void* v;
  const int32_t* pos;  // [G][capacity]
  float scale;
  int64_t mass_from;
  bool want_mass, entropy;
  bool mass_max;
};

// Keys [n0, n1) of one tile. part == null: the segment is all keys; the rows are normalised and
// the output, mass and entropy written here. Otherwise the segment's partial results go to part,
// the exponentials to s (the tile's score rows [rows][N]), and merge_segments finishes the tile.
template <typename KT>
void run_tile(const TiledArgs& a, TileJob& job, int n0, int n1, float* s, SegmentPart* part) {
  const int D = a.D;
  const int64_t Ns = a.N;
  const KT* k = static_cast<const KT*>(a.k) + static_cast<int64_t>(job.g) * a.capacity * D;
  const KT* v = static_cast<const KT*>(a.v) + static_cast<int64_t>(job.g) * a.capacity * D;
  const int32_t* pos = a.pos + static_cast<int64_t>(job.g) * a.capacity;
  thread_local std::vector<uint8_t> skip;  // per key quad of the whole row, grown once per thread
  skip.resize(static_cast<size_t>(a.N / 4 + 1));
  const int c0 = n0 / 4, c1 = n1 / 4;  // whole quads [c0, c1); keys [4 c1, n1) are a tail
  const float* qr[kRowTile];
  float* orow[kRowTile];
  int32_t qp[kRowTile];
  int64_t tok[kRowTile];
  int32_t tile_max = std::numeric_limits<int32_t>::min();
  for (int r = 0; r < job.rows; ++r) {
    const int64_t row = job.row0 + r, t = row / a.group;
    const int h = job.g * a.group + static_cast<int>(row % a.group);
    qr[r] = a.q + (t * a.H + h) * D;
    orow[r] = part != nullptr ? part->out[r] : a.out + (t * a.H + h) * D;
    qp[r] = a.q_pos[t];
    tok[r] = t;
    tile_max = std::max(tile_max, qp[r]);
  }
  // key quads later than every query of the tile (the causal triangle of a prefill chunk)
  for (int c = c0; c < c1; ++c)
    skip[c] = std::min(std::min(pos[4 * c], pos[4 * c + 1]), std::min(pos[4 * c + 2], pos[4 * c + 3])) > tile_max;
  // scores, key quad outer so each quad is loaded once for the whole tile
  for (int c = c0; c < c1; ++c) {
    if (skip[c]) {
      for (int r = 0; r < job.rows; ++r) std::fill_n(s + r * Ns + 4 * c, 4, -INFINITY);
      continue;
    }
    const KT* kc = k + static_cast<int64_t>(4 * c) * D;
    int r = 0;
    for (; r + 2 <= job.rows; r += 2) score_tile<2>(s + r * Ns + 4 * c, Ns, qr + r, kc, D, a.scale);
    if (r < job.rows) score_tile<1>(s + r * Ns + 4 * c, Ns, qr + r, kc, D, a.scale);
  }
  for (int r = 0; r < job.rows; ++r)
    for (int n = std::max(n0, 4 * c1); n < n1; ++n) {
      float acc = 0.0f;
      for (int d = 0; d < D; ++d) acc += qr[r][d] * load_scalar(k + static_cast<int64_t>(n) * D + d);
      s[r * Ns + n] = acc * a.scale;
    }
  // causal mask by position, softmax over the segment, probes
  for (int r = 0; r < job.rows; ++r) {
    float* sr = s + r * Ns;
    int visible = 0;
    for (int n = n0; n < n1; ++n) {
      if (pos[n] > qp[r]) sr[n] = -INFINITY;
      else ++visible;
    }
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    int n = n0;
    for (; n + 8 <= n1; n += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(sr + n));
    float mx = hmax(m8);
    for (; n < n1; ++n) mx = std::max(mx, sr[n]);
    if (visible == 0) mx = 0.0f;  // a segment no query of this row may see: every e is 0
    // e = exp(x), x = s - max; with sum = sum e, H(p) = log(sum) - (sum e x) / sum, which needs
    // no logarithm per key (x is floored where e is 0, so masked keys add 0, not 0 * -inf)
    const __m256 mxv = _mm256_set1_ps(mx), floor = _mm256_set1_ps(-87.0f);
    __m256 sum8 = _mm256_setzero_ps(), ex8 = _mm256_setzero_ps();
    for (n = n0; n + 8 <= n1; n += 8) {
      const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(sr + n), mxv);
      const __m256 e = exp_nonpositive(x);
      _mm256_storeu_ps(sr + n, e);
      sum8 = _mm256_add_ps(sum8, e);
      ex8 = _mm256_fmadd_ps(e, _mm256_max_ps(x, floor), ex8);
    }
    float sum = hsum(sum8), ex = hsum(ex8);
    for (; n < n1; ++n) {
      const float x = sr[n] - mx;
      sr[n] = std::exp(x);
      sum += sr[n];
      ex += sr[n] * std::max(x, -87.0f);
    }
    if (part != nullptr) {
      part->m[r] = mx;
      part->l[r] = sum;
      part->ex[r] = ex;
      part->visible[r] = visible;
      continue;
    }
    const float inv_sum = 1.0f / sum;
    const __m256 inv = _mm256_set1_ps(inv_sum);
    for (n = n0; n + 8 <= n1; n += 8) _mm256_storeu_ps(sr + n, _mm256_mul_ps(_mm256_loadu_ps(sr + n), inv));
    for (; n < n1; ++n) sr[n] *= inv_sum;
    if (a.want_mass && tok[r] >= a.mass_from) add_mass(job.mass, sr, n0, n1, a.mass_max);
    if (a.entropy && visible >= 2) {
      const double h = std::log(static_cast<double>(sum)) - static_cast<double>(ex) / sum;
      job.entropy_sum += h / std::log(static_cast<double>(visible));
      ++job.entropy_rows;
    }
  }
  // out = P V (unnormalised for a part)
  int r = 0;
  for (; r + 4 <= job.rows; r += 4)
    for (int d0 = 0; d0 < D; d0 += 16) value_tile<4>(orow + r, s + r * Ns, Ns, v, D, d0, n0, n1, skip.data());
  const int left = job.rows - r;  // 1..3 rows (decode: the query heads of one kv head)
  for (int d0 = 0; d0 < D && left > 0; d0 += 16) {
    if (left == 3) value_tile<3>(orow + r, s + r * Ns, Ns, v, D, d0, n0, n1, skip.data());
    else if (left == 2) value_tile<2>(orow + r, s + r * Ns, Ns, v, D, d0, n0, n1, skip.data());
    else value_tile<1>(orow + r, s + r * Ns, Ns, v, D, d0, n0, n1, skip.data());
  }
}

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
  bool f16 = true;
};

TiledPlan plan_tiled(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                     const AttentionProbe* probe) {
  TiledPlan p;
  p.G = kv.n_kv_heads;
  p.N = kv.count;
  const int group = H / p.G;
  p.a = TiledArgs{q, out, q_pos, H, group, kv.head_dim, p.N, kv.capacity, kv.k, kv.v, kv.pos,
                  1.0f / std::sqrt(static_cast<float>(kv.head_dim)), probe != nullptr ? probe->mass_row_begin : 0,
                  probe != nullptr && probe->mass != nullptr, probe != nullptr && probe->entropy,
                  probe != nullptr && probe->reduce == MassReduce::kMax};
  p.rows_per_head = T * group;
  p.tiles_per_head = (p.rows_per_head + kRowTile - 1) / kRowTile;
  p.n_tiles = p.tiles_per_head * p.G;
  if (p.n_tiles <= kFewTiles && kv.head_dim <= 256)
    p.S = static_cast<int>(std::clamp<int64_t>(p.N / kSegmentKeys, 1, kMaxSegments));
  p.f16 = kv.type == KvType::kF16;
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
void run_whole_tile(const TiledArgs& a, TileJob& job, bool f16) {
  thread_local std::vector<float> score_buf;  // [kRowTile][N], grown once per thread
  if (score_buf.size() < static_cast<size_t>(kRowTile) * a.N) score_buf.resize(static_cast<size_t>(kRowTile) * a.N);
  if (f16) run_tile<uint16_t>(a, job, 0, a.N, score_buf.data(), nullptr);
  else run_tile<float>(a, job, 0, a.N, score_buf.data(), nullptr);
}

void attention_tiled(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                     AttentionProbe* probe, float* scratch) {
  const TiledPlan p = plan_tiled(out, q, q_pos, T, H, kv, probe);
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
    for (int64_t i = 0; i < n_tiles; ++i) run_whole_tile(a, jobs[i], p.f16);
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
      if (p.f16) run_tile<uint16_t>(a, jobs[tile], bounds[j], bounds[j + 1], s, parts + i);
      else run_tile<float>(a, jobs[tile], bounds[j], bounds[j + 1], s, parts + i);
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
// contexts) run on their own.
void attention_batch_tiled(const AttentionCall* calls, int n, float* scratch) {
  thread_local std::vector<TiledPlan> plans;
  thread_local std::vector<float*> scratch_of;
  thread_local std::vector<int64_t> first_job;  // [n + 1] each pooled call's first job
  thread_local std::vector<TileJob> jobs;
  thread_local std::vector<int> call_of;
  plans.clear();
  scratch_of.clear();
  first_job.assign(1, 0);
  float* next = scratch;
  for (int c = 0; c < n; ++c) {
    const AttentionCall& k = calls[c];
    plans.push_back(plan_tiled(k.out, k.q, k.q_pos, k.T, k.H, k.kv, k.probe));
    scratch_of.push_back(next);
    next += attention_scratch_floats(k.T, k.H, k.kv.capacity);
    first_job.push_back(first_job.back() + (plans[c].S == 1 ? plans[c].n_tiles : 0));
  }
  jobs.resize(static_cast<size_t>(first_job.back()));
  call_of.resize(jobs.size());
  for (int c = 0; c < n; ++c) {
    if (plans[c].S != 1) {
      attention_tiled(calls[c].out, calls[c].q, calls[c].q_pos, calls[c].T, calls[c].H, calls[c].kv, calls[c].probe, scratch_of[c]);
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
  for (int64_t i = 0; i < n_jobs; ++i) run_whole_tile(plan[owner[i]].a, all[i], plan[owner[i]].f16);
  for (int c = 0; c < n; ++c)
    if (plans[c].S == 1) finish_tiled(plans[c], all + first_job[c], calls[c].probe, scratch_of[c]);
}
#endif

}  // namespace

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
  const size_t elem = kv.type == KvType::kF16 ? sizeof(uint16_t) : sizeof(float);
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
    j.k = static_cast<const char*>(kv.k) + static_cast<size_t>(g) * kv.capacity * D * elem;
    j.v = static_cast<const char*>(kv.v) + static_cast<size_t>(g) * kv.capacity * D * elem;
    j.pos = kv.pos + static_cast<int64_t>(g) * kv.capacity;
    j.N = N;
    j.D = D;
    j.f16 = kv.type == KvType::kF16;
    j.scale = 1.0f / std::sqrt(static_cast<float>(D));
    j.scores = scratch + static_cast<int64_t>(h) * N;
    j.mass = mass != nullptr ? head_mass + static_cast<int64_t>(h) * N : nullptr;
    j.mass_from = probe != nullptr ? probe->mass_row_begin : 0;
    j.mass_max = probe != nullptr && probe->reduce == MassReduce::kMax;
    j.entropy = probe != nullptr && probe->entropy;
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
               AttentionProbe* probe, float* scratch) {
#if SQUEEZEKV_AVX2
  if (kv.head_dim % 16 == 0) return attention_tiled(out, q, q_pos, T, H, kv, probe, scratch);
#endif
  attention_rows(out, q, q_pos, T, H, kv, probe, scratch);
}

void attention_batch(const AttentionCall* calls, int n, float* scratch) {
#if SQUEEZEKV_AVX2
  bool tiled = true;
  for (int c = 0; c < n; ++c) tiled = tiled && calls[c].kv.head_dim % 16 == 0;
  if (tiled) return attention_batch_tiled(calls, n, scratch);
#endif
  for (int c = 0; c < n; ++c) {
    attention(calls[c].out, calls[c].q, calls[c].q_pos, calls[c].T, calls[c].H, calls[c].kv, calls[c].probe, scratch);
    scratch += attention_scratch_floats(calls[c].T, calls[c].H, calls[c].kv.capacity);
  }
}

void ref::attention(float* out, const float* q, const int32_t* q_pos, int64_t T, int H, const KvView& kv,
                    AttentionProbe* probe, float* scratch) {
  attention_rows(out, q, q_pos, T, H, kv, probe, scratch);
}

}  // namespace squeezekv::cpu
