// The tile kernel of the fast attention path, written once over a vector type V and included by
// each file that compiles it for its instruction set (attention.cc: 8 floats, AVX2;
// attention_avx512.cc: 16 floats). Include inside namespace squeezekv::cpu::attn after defining
// V. Internal linkage and no library templates: an inline copy compiled for AVX-512 must never be
// picked by the linker for a path that runs on CPUs without it.
//
// V provides: Reg, kW (floats per register), kScoreRows (query rows per score pass), kValueVecs
// (most registers of dims per value pass), zero, set1, load(float*), load(uint16_t* f16),
// load_i8 (kW int8 as floats), load_u4 (kW nibbles, the low or the high ones of kW bytes, as
// floats), store, add, sub, mul, max, fmadd, exp_nonpositive (x <= 0; x < -87 gives 0), hsum,
// hmax, sum4 (the horizontal sums of four registers, as one __m128), scalar (one f16 as a float),
// set1_f16 (the f16 at a pointer in every lane).
//
// K and V rows are read through a row format (RowF32, RowF16, RowQ8_0, RowQ4_0, RowQ4_1: the
// KvType layouts of core/kv_view.h), which turns the kW values at a dim into a register, so the
// quantized rows are dequantized in registers, never in memory.
//
// Scores against the keys are formed by kScoreRows x 4 register tiles (each key quad loaded once
// for all rows of the tile), the softmax runs over whole rows with a vector exp, and P.V is
// formed by 4-row x (NV x kW)-dim register tiles. Key quads that no row of a tile may see (all
// positions later than the tile's queries: the causal triangle of a prefill chunk) are skipped
// in both products.

namespace {

constexpr int kKeyAhead = 4;  // key quads fetched ahead of the score tiles
constexpr int kMaxRingKeys = kMaxRingRows;  // ring keys of one tile at most (one per position the ring holds)

inline uint16_t u16_at(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return h;
}

// Row formats: bytes(D) of a row; kBlock, the dims that share one block's scales (0: none);
// scale(row, d): the scales of the block holding dim d, as registers (once per block, not per
// register: a decode step is bound by these instructions, not by the bytes, for the block types);
// load(row, d, scale): the kW values from dim d (a multiple of kW) given its block's scales;
// scalar(row, d): one value.
struct NoScale {};
struct RowF32 {
  static constexpr int kBlock = 0;
  using Scale = NoScale;
  static int64_t bytes(int D) { return 4 * static_cast<int64_t>(D); }
  static Scale scale(const uint8_t*, int) { return {}; }
  static typename V::Reg load(const uint8_t* r, int d, Scale) { return V::load(reinterpret_cast<const float*>(r) + d); }
  static float scalar(const uint8_t* r, int d) {
    float x;
    __builtin_memcpy(&x, r + 4 * d, 4);
    return x;
  }
};
struct RowF16 {
  static constexpr int kBlock = 0;
  using Scale = NoScale;
  static int64_t bytes(int D) { return 2 * static_cast<int64_t>(D); }
  static Scale scale(const uint8_t*, int) { return {}; }
  static typename V::Reg load(const uint8_t* r, int d, Scale) { return V::load(reinterpret_cast<const uint16_t*>(r) + d); }
  static float scalar(const uint8_t* r, int d) { return V::scalar(u16_at(r + 2 * d)); }
};
// blocks of 32: [f16 scale][32 int8]; value scale * q
struct RowQ8_0 {
  static constexpr int kBlock = 32;
  struct Scale {
    typename V::Reg s;
  };
  static int64_t bytes(int D) { return static_cast<int64_t>(D) / 32 * 34; }
  static Scale scale(const uint8_t* r, int d) { return {V::set1_f16(r + (d >> 5) * 34)}; }
  static typename V::Reg load(const uint8_t* r, int d, Scale sc) { return V::mul(V::load_i8(r + (d >> 5) * 34 + 2 + (d & 31)), sc.s); }
  static float scalar(const uint8_t* r, int d) {
    const uint8_t* b = r + (d >> 5) * 34;
    return V::scalar(u16_at(b)) * static_cast<float>(static_cast<int8_t>(b[2 + (d & 31)]));
  }
};
// blocks of 32: [f16 scale][16 bytes: value i in the low nibble of byte i, i + 16 in its high];
// value (q - 8) * scale, formed as q * scale + (-8 scale): the same float (both products exact,
// one rounding of the same sum)
struct RowQ4_0 {
  static constexpr int kBlock = 32;
  struct Scale {
    typename V::Reg s, m;
  };
  static int64_t bytes(int D) { return static_cast<int64_t>(D) / 32 * 18; }
  static Scale scale(const uint8_t* r, int d) {
    const typename V::Reg s = V::set1_f16(r + (d >> 5) * 18);
    return {s, V::mul(s, V::set1(-8.0f))};
  }
  static typename V::Reg load(const uint8_t* r, int d, Scale sc) {
    const int i = d & 31;
    return V::fmadd(V::load_u4(r + (d >> 5) * 18 + 2 + (i & 15), i >= 16), sc.s, sc.m);
  }
  static float scalar(const uint8_t* r, int d) {
    const uint8_t* b = r + (d >> 5) * 18;
    const int i = d & 31, q = (i < 16 ? b[2 + i] & 0x0F : b[2 + i - 16] >> 4) - 8;
    return static_cast<float>(q) * V::scalar(u16_at(b));
  }
};
// blocks of 32: [f16 scale][f16 minimum][16 bytes as Q4_0's]; value q * scale + minimum
struct RowQ4_1 {
  static constexpr int kBlock = 32;
  struct Scale {
    typename V::Reg s, m;
  };
  static int64_t bytes(int D) { return static_cast<int64_t>(D) / 32 * 20; }
  static Scale scale(const uint8_t* r, int d) {
    const uint8_t* b = r + (d >> 5) * 20;
    return {V::set1_f16(b), V::set1_f16(b + 2)};
  }
  static typename V::Reg load(const uint8_t* r, int d, Scale sc) {
    const int i = d & 31;
    return V::fmadd(V::load_u4(r + (d >> 5) * 20 + 4 + (i & 15), i >= 16), sc.s, sc.m);
  }
  static float scalar(const uint8_t* r, int d) {
    const uint8_t* b = r + (d >> 5) * 20;
    const int i = d & 31, q = i < 16 ? b[4 + i] & 0x0F : b[4 + i - 16] >> 4;
    return static_cast<float>(q) * V::scalar(u16_at(b)) + V::scalar(u16_at(b + 2));
  }
};

// scores[r][0..4) = scale * q_r . k_c for R query rows and 4 keys (k: 4 rows of kb bytes).
template <int R, typename KR>
inline void score_tile(float* s, int64_t s_stride, const float* const* q, const uint8_t* k, int64_t kb, int D, float scale) {
  typename V::Reg a[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) a[r][c] = V::zero();
  // dims a block of scales at a time (kW for rows without scales)
  constexpr int kSpan = KR::kBlock > V::kW ? KR::kBlock : V::kW;
  for (int d0 = 0; d0 < D; d0 += kSpan) {
    const typename KR::Scale c0 = KR::scale(k, d0), c1 = KR::scale(k + kb, d0), c2 = KR::scale(k + 2 * kb, d0),
                             c3 = KR::scale(k + 3 * kb, d0);
    for (int d = d0; d < d0 + kSpan; d += V::kW) {
      const typename V::Reg k0 = KR::load(k, d, c0), k1 = KR::load(k + kb, d, c1), k2 = KR::load(k + 2 * kb, d, c2),
                            k3 = KR::load(k + 3 * kb, d, c3);
      for (int r = 0; r < R; ++r) {
        const typename V::Reg qr = V::load(q[r] + d);
        a[r][0] = V::fmadd(qr, k0, a[r][0]);
        a[r][1] = V::fmadd(qr, k1, a[r][1]);
        a[r][2] = V::fmadd(qr, k2, a[r][2]);
        a[r][3] = V::fmadd(qr, k3, a[r][3]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm_storeu_ps(s + r * s_stride, _mm_mul_ps(V::sum4(a[r][0], a[r][1], a[r][2], a[r][3]), _mm_set1_ps(scale)));
}

// The same for R query rows and one key pair at a time (the quad's two pairs one after the
// other): R x 2 accumulators, so R = kScoreRows + 1 rows fit the registers where R x 4 would not
// (a GQA group of 3 on AVX2: each key converted once for the group, not once per 2-row pass).
// For keys in blocks, whose conversion costs more than the extra loads of q; f16 keys were as
// fast or slower this way (AMD EPYC, 2 threads, 2026-12-06).
template <int R, typename KR>
inline void score_pairs(float* s, int64_t s_stride, const float* const* q, const uint8_t* k, int64_t kb, int D, float scale) {
  constexpr int kSpan = KR::kBlock > V::kW ? KR::kBlock : V::kW;
  typename V::Reg a[2][R][2];
  for (int h = 0; h < 2; ++h) {
    const uint8_t* kp = k + 2 * h * kb;
    for (int r = 0; r < R; ++r) a[h][r][0] = a[h][r][1] = V::zero();
    for (int d0 = 0; d0 < D; d0 += kSpan) {
      const typename KR::Scale c0 = KR::scale(kp, d0), c1 = KR::scale(kp + kb, d0);
      for (int d = d0; d < d0 + kSpan; d += V::kW) {
        const typename V::Reg k0 = KR::load(kp, d, c0), k1 = KR::load(kp + kb, d, c1);
        for (int r = 0; r < R; ++r) {
          const typename V::Reg qr = V::load(q[r] + d);
          a[h][r][0] = V::fmadd(qr, k0, a[h][r][0]);
          a[h][r][1] = V::fmadd(qr, k1, a[h][r][1]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    _mm_storeu_ps(s + r * s_stride, _mm_mul_ps(V::sum4(a[0][r][0], a[0][r][1], a[1][r][0], a[1][r][1]), _mm_set1_ps(scale)));
}

// score_tile for the `left` (< R + 1) rows at the end of a tile.
template <int R, typename KR>
inline void score_rest(int left, float* s, int64_t s_stride, const float* const* q, const uint8_t* k, int64_t kb, int D, float scale) {
  if constexpr (R > 0) {
    if (left == R) return score_tile<R, KR>(s, s_stride, q, k, kb, D, scale);
    score_rest<R - 1, KR>(left, s, s_stride, q, k, kb, D, scale);
  }
}

// scores[r][0..4) for all `rows` rows of a tile against the key quad at k: score_pairs where
// it applies, else kScoreRows-row tiles and the rows left.
template <typename KR>
inline void score_quad(float* s, int64_t s_stride, const float* const* q, int rows, const uint8_t* k, int64_t kb, int D, float scale) {
  if (KR::kBlock > 0 && rows == 3 && V::kScoreRows == 2) return score_pairs<3, KR>(s, s_stride, q, k, kb, D, scale);  // see score_pairs
  int r = 0;
  for (; r + V::kScoreRows <= rows; r += V::kScoreRows) score_tile<V::kScoreRows, KR>(s + r * s_stride, s_stride, q + r, k, kb, D, scale);
  score_rest<V::kScoreRows - 1, KR>(rows - r, s + r * s_stride, s_stride, q + r, k, kb, D, scale);
}

// out[r][d0..d0 + NV kW) = sum_n p[r][n] v[n][d0..) for R rows and keys n in [n0, n1) (n0 a
// multiple of 4), over the key quads not skipped (skip_quad null: none); v: rows of vb bytes.
// kAdd: added to what out holds.
template <int R, int NV, typename VR, bool kAdd = false>
inline void value_tile(float* const* out, const float* p, int64_t p_stride, const uint8_t* v, int64_t vb, int d0, int n0, int n1,
                       const uint8_t* skip_quad) {
  typename V::Reg a[R][NV];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) a[r][j] = kAdd ? V::load(out[r] + d0 + j * V::kW) : V::zero();
  auto key = [&](int n) {
    const uint8_t* row = v + static_cast<int64_t>(n) * vb;
    typename V::Reg vj[NV];
    typename VR::Scale sc{};
    for (int j = 0; j < NV; ++j) {
      // d0 is a multiple of NV kW: a pass of at least a block starts blocks at multiples of
      // kBlock, a shorter one lies within one block
      if (j == 0 || (VR::kBlock > 0 && (j * V::kW) % VR::kBlock == 0)) sc = VR::scale(row, d0 + j * V::kW);
      vj[j] = VR::load(row, d0 + j * V::kW, sc);
    }
    for (int r = 0; r < R; ++r) {
      const typename V::Reg b = V::set1(p[r * p_stride + n]);
      for (int j = 0; j < NV; ++j) a[r][j] = V::fmadd(b, vj[j], a[r][j]);
    }
  };
  const int q1 = n1 / 4;
  for (int c = n0 / 4; c < q1; ++c) {
    if (skip_quad != nullptr && skip_quad[c]) continue;
    for (int n = 4 * c; n < 4 * c + 4; ++n) key(n);
  }
  for (int n = n0 > 4 * q1 ? n0 : 4 * q1; n < n1; ++n) key(n);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j) V::store(out[r] + d0 + j * V::kW, a[r][j]);
}

// P V for `rows` rows: 4 at a time, then the 1..3 left (decode: the query heads of one kv head).
template <int NV, typename VR, bool kAdd = false>
void value_rows(float* const* orow, const float* s, int64_t Ns, int rows, const uint8_t* v, int64_t vb, int D, int n0, int n1,
                const uint8_t* skip) {
  constexpr int kStep = NV * V::kW;
  int r = 0;
  for (; r + 4 <= rows; r += 4)
    for (int d0 = 0; d0 < D; d0 += kStep) value_tile<4, NV, VR, kAdd>(orow + r, s + r * Ns, Ns, v, vb, d0, n0, n1, skip);
  const int left = rows - r;
  for (int d0 = 0; d0 < D && left > 0; d0 += kStep) {
    if (left == 3) value_tile<3, NV, VR, kAdd>(orow + r, s + r * Ns, Ns, v, vb, d0, n0, n1, skip);
    else if (left == 2) value_tile<2, NV, VR, kAdd>(orow + r, s + r * Ns, Ns, v, vb, d0, n0, n1, skip);
    else value_tile<1, NV, VR, kAdd>(orow + r, s + r * Ns, Ns, v, vb, d0, n0, n1, skip);
  }
}
// value_rows with the widest pass over the dims that D and the registers allow.
template <typename VR, bool kAdd = false>
void value_rows_wide(float* const* orow, const float* s, int64_t Ns, int rows, const uint8_t* v, int64_t vb, int D, int n0, int n1,
                     const uint8_t* skip) {
  if (V::kValueVecs >= 4 && D % (4 * V::kW) == 0) value_rows<(V::kValueVecs >= 4 ? 4 : 1), VR, kAdd>(orow, s, Ns, rows, v, vb, D, n0, n1, skip);
  else if (D % (2 * V::kW) == 0) value_rows<2, VR, kAdd>(orow, s, Ns, rows, v, vb, D, n0, n1, skip);
  else value_rows<1, VR, kAdd>(orow, s, Ns, rows, v, vb, D, n0, n1, skip);
}

// mass[n] += p[n] (or max=) for n in [n0, n1).
inline void add_mass_to(float* mass, const float* p, int n0, int n1, bool max) {
  if (max) {
    for (int n = n0; n < n1; ++n) mass[n] = p[n] > mass[n] ? p[n] : mass[n];
  } else {
    for (int n = n0; n < n1; ++n) mass[n] += p[n];
  }
}

// The recent ring's keys among a tile's (TiledArgs::ring_k): which keys, their ring rows, and the
// probabilities they carry while the value pass runs without them ([key][kRowTile]). Per thread,
// on the heap and grown once, on the first tile that has a ring: static thread-local arrays of
// this size would come out of every thread's stack in any program that loads the library (an
// HTTP server's handler threads overflowed theirs, 2026-12-06).
// Where both K and V have ring rows, a key quad wholly in the ring on 4 consecutive ring rows (the
// usual case: the ring holds the newest positions, the newest slots) is a ring quad instead: the
// quantized passes skip it (skip 2), its scores come from the ring's rows by the f16 score tile,
// and its values from runs of ring quads on consecutive ring rows by the f16 value pass.
struct RingKeys {
  int n = 0;
  std::vector<int> key, index;
  std::vector<float> p;
  int quads = 0;
  std::vector<int> quad, quad_index;  // ring quads: the quad, its first ring row
  void reserve() {
    if (key.empty()) {
      key.resize(kMaxRingKeys), index.resize(kMaxRingKeys), p.resize(static_cast<size_t>(kMaxRingKeys) * kRowTile);
      quad.resize(kMaxRingKeys / 4 + 1), quad_index.resize(kMaxRingKeys / 4 + 1);
    }
  }
};

// Adds key n to ring keys when its position has a row in the ring.
inline void note_ring_key(const TiledArgs& a, const int32_t* pos, int n, RingKeys& rk) {
  const int32_t p = pos[n];
  if (p < a.ring_from || p == kDeadPosition) return;
  const int i = p % a.ring;
  if (a.ring_pos[i] != p || rk.n == kMaxRingKeys) return;
  rk.key[rk.n] = n;
  rk.index[rk.n++] = i;
}

// Whether quad c's four keys are in the ring on consecutive ring rows (then noted as a ring quad).
inline bool note_ring_quad(const TiledArgs& a, const int32_t* pos, int c, RingKeys& rk) {
  const int32_t p0 = pos[4 * c];
  if (p0 < a.ring_from || p0 == kDeadPosition || rk.quads * 4 + 4 > kMaxRingKeys) return false;
  const int i0 = p0 % a.ring;
  if (i0 + 4 > a.ring) return false;
  for (int j = 0; j < 4; ++j)
    if (pos[4 * c + j] != p0 + j || a.ring_pos[i0 + j] != p0 + j) return false;
  rk.quad[rk.quads] = c;
  rk.quad_index[rk.quads++] = i0;
  return true;
}

// scale * q . k for one f16 ring row k of D values.
inline float ring_score(const float* q, const uint16_t* k, int D, float scale) {
  typename V::Reg acc = V::zero();
  for (int d = 0; d < D; d += V::kW) acc = V::fmadd(V::load(q + d), V::load(k + d), acc);
  return V::hsum(acc) * scale;
}

// The ring quads' scores (s [rows][Ns], their columns) from the ring's f16 rows ring_k [ring][D],
// by the f16 score tile. Out of line, as ring_quad_values: inlined, their tiles changed how the
// compiler laid out run_tile's own loops (f16 rows without a ring 20-40% slower, 2026-12-07).
__attribute__((noinline)) inline void ring_quad_scores(const RingKeys& rk, float* s, int64_t Ns, const float* const* qr, int rows,
                                                        const uint16_t* ring_k, int D, float scale) {
  for (int i = 0; i < rk.quads; ++i)
    score_quad<RowF16>(s + 4 * rk.quad[i], Ns, qr, rows, reinterpret_cast<const uint8_t*>(ring_k + static_cast<int64_t>(rk.quad_index[i]) * D),
                       2 * D, D, scale);
}
// The ring quads' values added to the rows' outputs: each run of quads on consecutive ring rows
// (ring_v [ring][D]) in one f16 value pass.
__attribute__((noinline)) inline void ring_quad_values(const RingKeys& rk, float* const* orow, const float* s, int64_t Ns, int rows,
                                                        const uint16_t* ring_v, int D) {
  for (int i = 0; i < rk.quads;) {
    int e = i + 1;
    while (e < rk.quads && rk.quad[e] == rk.quad[e - 1] + 1 && rk.quad_index[e] == rk.quad_index[e - 1] + 4) ++e;
    const uint8_t* vr = reinterpret_cast<const uint8_t*>(ring_v + static_cast<int64_t>(rk.quad_index[i]) * D);
    value_rows_wide<RowF16, true>(orow, s + 4 * rk.quad[i], Ns, rows, vr, 2 * D, D, 0, 4 * (e - i), nullptr);
    i = e;
  }
}

// The tile kernel (attention_tile.h, TileFn) for K rows of format KR and V rows of format VR.
template <typename KR, typename VR>
void run_tile(const TiledArgs& a, TileJob& job, int n0, int n1, float* s, SegmentPart* part, uint8_t* skip) {
  const int D = a.D;
  const int64_t Ns = a.N, kb = KR::bytes(D), vb = VR::bytes(D);
  const uint8_t* k = static_cast<const uint8_t*>(a.k) + static_cast<int64_t>(job.g) * a.kv_rows * kb;
  const uint8_t* v = static_cast<const uint8_t*>(a.v) + static_cast<int64_t>(job.g) * a.kv_rows * vb;
  const int32_t* pos = a.pos + static_cast<int64_t>(job.g) * a.capacity;
  const int c0 = n0 / 4, c1 = n1 / 4;  // whole quads [c0, c1); keys [4 c1, n1) are a tail
  const float* qr[kRowTile];
  float* orow[kRowTile];
  int32_t qp[kRowTile];
  int64_t tok[kRowTile];
  int32_t tile_max = INT32_MIN;
  for (int r = 0; r < job.rows; ++r) {
    const int64_t row = job.row0 + r, t = row / a.group;
    const int h = job.g * a.group + static_cast<int>(row % a.group);
    qr[r] = a.q + (t * a.H + h) * D;
    orow[r] = part != nullptr ? part->out[r] : a.out + (t * a.H + h) * D;
    qp[r] = a.q_pos[t];
    tok[r] = t;
    tile_max = qp[r] > tile_max ? qp[r] : tile_max;
  }
  // key quads later than every query of the tile (the causal triangle of a prefill chunk), the
  // segment's latest position: a row at or past it sees every key (every decode row), and the keys
  // read from the recent ring: positions at or after ring_from (a compare a quad where none is,
  // the usual case: the ring is the newest rows)
  thread_local RingKeys ring_keys;
  RingKeys& rk = ring_keys;
  rk.n = 0, rk.quads = 0;
  const bool ring = a.ring > 0;
  const bool ring_quads = ring && a.ring_k != nullptr && a.ring_v != nullptr;
  if (ring) rk.reserve();
  int32_t last = INT32_MIN;
  for (int c = c0; c < c1; ++c) {
    int32_t first = pos[4 * c], latest = pos[4 * c];
    for (int i = 1; i < 4; ++i) {
      first = pos[4 * c + i] < first ? pos[4 * c + i] : first;
      latest = pos[4 * c + i] > latest ? pos[4 * c + i] : latest;
    }
    skip[c] = first > tile_max;
    last = latest > last ? latest : last;
    if (ring && !skip[c] && latest >= a.ring_from) {
      if (ring_quads && note_ring_quad(a, pos, c, rk)) skip[c] = 2;
      else
        for (int i = 0; i < 4; ++i) note_ring_key(a, pos, 4 * c + i, rk);
    }
  }
  for (int n = n0 > 4 * c1 ? n0 : 4 * c1; n < n1; ++n) {
    last = pos[n] > last ? pos[n] : last;
    if (ring) note_ring_key(a, pos, n, rk);
  }
  const uint16_t* ring_k = a.ring_k != nullptr ? a.ring_k + static_cast<int64_t>(job.g) * a.ring * D : nullptr;
  const uint16_t* ring_v = a.ring_v != nullptr ? a.ring_v + static_cast<int64_t>(job.g) * a.ring * D : nullptr;
  // Q8_0 keys against 8-bit queries (TiledArgs::q8_scores): the rows' queries rounded once here,
  // 16 keys a call where four quads in a row are to be scored, q8_score for the quads and keys left
  constexpr bool kQ8Keys = std::is_same_v<KR, RowQ8_0>;
  const bool q8 = kQ8Keys && a.q8_scores != nullptr;
  Q8Query q8q[kRowTile];
  if (q8)
    for (int r = 0; r < job.rows; ++r) quantize_query(qr[r], a.scale, q8q[r]);
  auto prefetch_quad = [&](int c) {
    // the quad's values are read after the softmax: fetched now, while the scores are formed
    // (a decode step's tiles read short runs of rows, which the hardware prefetcher misses)
    const char* vc = reinterpret_cast<const char*>(v + static_cast<int64_t>(4 * c) * vb);
#pragma GCC unroll 8
    for (int64_t b = 0; b < 4 * vb; b += 64) _mm_prefetch(vc + b, _MM_HINT_T0);
    // and the keys a few quads ahead
    const char* kn = reinterpret_cast<const char*>(k + static_cast<int64_t>(4 * (c + kKeyAhead)) * kb);
    if (c + kKeyAhead < c1)
#pragma GCC unroll 8
      for (int64_t b = 0; b < 4 * kb; b += 64) _mm_prefetch(kn + b, _MM_HINT_T0);
  };
  // scores, key quad outer so each quad is loaded once for the whole tile
  for (int c = c0; c < c1; ++c) {
    if (q8 && c + 4 <= c1 && (skip[c] | skip[c + 1] | skip[c + 2] | skip[c + 3]) == 0) {
      for (int i = 0; i < 4; ++i) prefetch_quad(c + i);
      a.q8_scores(s + 4 * c, Ns, q8q, job.rows, k + static_cast<int64_t>(4 * c) * kb, kb);
      c += 3;
      continue;
    }
    if (skip[c] == 2) continue;  // a ring quad: below
    if (skip[c]) {
      for (int r = 0; r < job.rows; ++r)
        for (int i = 0; i < 4; ++i) s[r * Ns + 4 * c + i] = -INFINITY;
      continue;
    }
    const uint8_t* kc = k + static_cast<int64_t>(4 * c) * kb;
    prefetch_quad(c);
    if (q8) {
      for (int r = 0; r < job.rows; ++r)
        for (int i = 0; i < 4; ++i) s[r * Ns + 4 * c + i] = q8_score(q8q[r], kc + i * kb);
    } else {
      score_quad<KR>(s + 4 * c, Ns, qr, job.rows, kc, kb, D, a.scale);
    }
  }
  for (int r = 0; r < job.rows; ++r)
    for (int n = n0 > 4 * c1 ? n0 : 4 * c1; n < n1; ++n) {
      if (q8) {
        s[r * Ns + n] = q8_score(q8q[r], k + static_cast<int64_t>(n) * kb);
        continue;
      }
      float acc = 0.0f;
      for (int d = 0; d < D; ++d) acc += qr[r][d] * KR::scalar(k + static_cast<int64_t>(n) * kb, d);
      s[r * Ns + n] = acc * a.scale;
    }
  if (rk.quads > 0) ring_quad_scores(rk, s, Ns, qr, job.rows, ring_k, D, a.scale);
  if (ring_k != nullptr)
    for (int i = 0; i < rk.n; ++i)
      for (int r = 0; r < job.rows; ++r) s[r * Ns + rk.key[i]] = ring_score(qr[r], ring_k + static_cast<int64_t>(rk.index[i]) * D, D, a.scale);
  // causal mask by position, softmax over the segment, probes
  for (int r = 0; r < job.rows; ++r) {
    float* sr = s + r * Ns;
    int visible = n1 - n0;
    if (qp[r] < last) {  // some key of the segment is later than this row
      visible = 0;
      for (int n = n0; n < n1; ++n) {
        if (pos[n] > qp[r]) sr[n] = -INFINITY;
        else ++visible;
      }
    }
    typename V::Reg mv = V::set1(-INFINITY);
    int n = n0;
    for (; n + V::kW <= n1; n += V::kW) mv = V::max(mv, V::load(sr + n));
    float mx = V::hmax(mv);
    for (; n < n1; ++n) mx = sr[n] > mx ? sr[n] : mx;
    if (visible == 0) mx = 0.0f;  // a segment no query of this row may see: every e is 0
    // e = exp(x), x = s - max; with sum = sum e, H(p) = log(sum) - (sum e x) / sum, which needs
    // no logarithm per key (x is floored where e is 0, so masked keys add 0, not 0 * -inf)
    const typename V::Reg mxv = V::set1(mx), floor = V::set1(-87.0f);
    typename V::Reg sumv = V::zero(), exv = V::zero();
    for (n = n0; n + V::kW <= n1; n += V::kW) {
      const typename V::Reg x = V::sub(V::load(sr + n), mxv);
      const typename V::Reg e = V::exp_nonpositive(x);
      V::store(sr + n, e);
      sumv = V::add(sumv, e);
      exv = V::fmadd(e, V::max(x, floor), exv);
    }
    float sum = V::hsum(sumv), ex = V::hsum(exv);
    for (; n < n1; ++n) {
      const float x = sr[n] - mx;
      sr[n] = __builtin_expf(x);  // builtins: no inline library copy (see the top)
      sum += sr[n];
      ex += sr[n] * (x > -87.0f ? x : -87.0f);
    }
    if (part != nullptr) {
      part->m[r] = mx;
      part->l[r] = sum;
      part->ex[r] = ex;
      part->visible[r] = visible;
      continue;
    }
    // p = e / sum, and the mass it adds in the same pass (the same arithmetic as two passes)
    const float inv_sum = 1.0f / sum;
    const typename V::Reg inv = V::set1(inv_sum);
    const bool mass = a.want_mass && tok[r] >= a.mass_from;
    n = n0;
    if (mass && a.mass_max) {
      for (; n + V::kW <= n1; n += V::kW) {
        const typename V::Reg p = V::mul(V::load(sr + n), inv);
        V::store(sr + n, p);
        V::store(job.mass + n, V::max(V::load(job.mass + n), p));
      }
    } else if (mass) {
      for (; n + V::kW <= n1; n += V::kW) {
        const typename V::Reg p = V::mul(V::load(sr + n), inv);
        V::store(sr + n, p);
        V::store(job.mass + n, V::add(V::load(job.mass + n), p));
      }
    } else {
      for (; n + V::kW <= n1; n += V::kW) V::store(sr + n, V::mul(V::load(sr + n), inv));
    }
    const int tail = n;
    for (; n < n1; ++n) sr[n] *= inv_sum;
    if (mass) add_mass_to(job.mass, sr, tail, n1, a.mass_max);
    if (a.entropy && visible >= 2) {
      const double h = __builtin_log(static_cast<double>(sum)) - static_cast<double>(ex) / sum;
      job.entropy_sum += h / __builtin_log(static_cast<double>(visible));
      ++job.entropy_rows;
    }
  }
  // out = P V (unnormalised for a part), as wide a pass over the dims as D and the registers allow;
  // the ring's keys weigh their f16 values instead: out of the pass (their p set aside as 0), in
  // after it, and their p back in the score rows (a segment merge reads them for the mass)
  const int n_ring_v = ring_v != nullptr ? rk.n : 0;
  float* ring_p = rk.p.data();
  for (int i = 0; i < n_ring_v; ++i)
    for (int r = 0; r < job.rows; ++r) ring_p[i * kRowTile + r] = s[r * Ns + rk.key[i]], s[r * Ns + rk.key[i]] = 0.0f;
  value_rows_wide<VR>(orow, s, Ns, job.rows, v, vb, D, n0, n1, skip);
  if (rk.quads > 0) ring_quad_values(rk, orow, s, Ns, job.rows, ring_v, D);
  for (int i = 0; i < n_ring_v; ++i) {
    const uint16_t* vr = ring_v + static_cast<int64_t>(rk.index[i]) * D;
    for (int r = 0; r < job.rows; ++r) {
      const float p = ring_p[i * kRowTile + r];
      s[r * Ns + rk.key[i]] = p;
      if (p == 0.0f) continue;
      const typename V::Reg pv = V::set1(p);
      for (int d = 0; d < D; d += V::kW) V::store(orow[r] + d, V::fmadd(pv, V::load(vr + d), V::load(orow[r] + d)));
    }
  }
}

// The kernel for K rows of type k and V rows of type v (f32 only with f32).
inline TileFn tile_for(KvType k, KvType v) {
  if (k == KvType::kF32 || v == KvType::kF32) return k == v ? run_tile<RowF32, RowF32> : nullptr;
  auto with_k = [v](auto kr) -> TileFn {
    using KR = decltype(kr);
    switch (v) {
      case KvType::kF16: return run_tile<KR, RowF16>;
      case KvType::kQ8_0: return run_tile<KR, RowQ8_0>;
      case KvType::kQ4_0: return run_tile<KR, RowQ4_0>;
      case KvType::kQ4_1: return run_tile<KR, RowQ4_1>;
      default: return nullptr;
    }
  };
  switch (k) {
    case KvType::kF16: return with_k(RowF16{});
    case KvType::kQ8_0: return with_k(RowQ8_0{});
    case KvType::kQ4_0: return with_k(RowQ4_0{});
    case KvType::kQ4_1: return with_k(RowQ4_1{});
    default: return nullptr;
  }
}

}  // namespace
