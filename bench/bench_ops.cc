// Each backend op alone at a model's shapes (llama.cpp's `test-backend-ops perf`, llm.c's
// dev/cuda benchmarks): the decode GEMV of every matrix, the prompt products, norms, RoPE,
// attention of one query token and of a prompt chunk at several depths (with and without the
// policies' mass), KV row writes and a decode step's evictions. Prints one row an op: time per
// call (median of rounds), the bytes it must move and the bandwidth that makes, and for the
// products the FLOP rate; the device's measured copy bandwidth heads the table, so each row's
// share of it is the headroom left.
//
//   squeezekv_bench_ops [--device cpu|cuda] [--config bench/configs/llama-3.1-8b.json]
//                       [--depths 512,4096,32768] [--chunk 512] [--rounds 5] [--filter TEXT] [-t THREADS]
//                       [--kv-type f16|f32|q8_0|q4_0|q4_1] [--kv-recent-f16 R] [--decode-activations f32|int8]
//                       [--weights BF16|Q8_0|Q4_0|Q4_K|..]
//
// Times are wall-clock over `reps` back-to-back calls of one op, closed by a copy back (which
// waits for the device); on CUDA the identical launches are replayed as one CUDA graph from their
// second round on, so launch overhead is mostly gone and what is left is each kernel's own time
// plus its start. Inputs are random; weights bf16 (the CUDA backend's matrices).
// Letters: T rows, E hidden, H query heads, G kv heads, D head dim, F feed-forward, V vocabulary.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "core/kv_rows.h"
#include "core/quant.h"
#include "core/random.h"
#include "kv/layer_cache.h"
#include "model/loaders.h"
#include "squeezekv/device.h"
#include "squeezekv/error.h"
#include "squeezekv/kv_cache.h"
#include "squeezekv/session.h"

namespace {

using namespace squeezekv;

struct Args {
  Device device = Device::kCpu;
  std::string config = "bench/configs/llama-3.1-8b.json";
  std::vector<int> depths{512, 4096, 32768};
  int chunk = 512;
  int rounds = 5;
  int threads = 0;
  std::vector<int> batch{1, 4};  // rows of the decode products; sequences of a decode batch's attention (past 1)
  std::string filter;
  KvDType kv_type = KvDType::kF16;  // the attention rows' K and V type
  int recent_f16 = 0;                // the newest rows also in f16 (--kv-recent-f16; CPU, quantized rows)
  DecodeActivations act = DecodeActivations::kF32;  // the products' activations (--decode-activations, as the CLI's)
  DType weights = DType::BF16;  // the products' matrices (--weights: BF16 or a block type, random blocks)
};

// --weights: BF16 or a block type by its GGUF name (Q8_0, Q4_K, ...).
DType parse_weights(const std::string& s) {
  std::string names;
  for (int i = 0; i < kDTypeCount; ++i) {
    const DType t = static_cast<DType>(i);
    if (t == DType::F32 || t == DType::F16) continue;
    if (s == dtype_info(t).name) return t;
    names += (names.empty() ? "" : ", ") + std::string(dtype_info(t).name);
  }
  throw Error("--weights: expected one of " + names + ", got '" + s + "'");
}

std::vector<int> int_list(const std::string& flag, const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, comma - at);
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v < 1) throw Error(flag + ": expected positive integers separated by commas, got '" + s + "'");
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(f + ": expected a value after it");
      return argv[++i];
    };
    if (f == "--device") {
      const std::string d = value();
      if (d == "cpu") a.device = Device::kCpu;
      else if (d == "cuda") a.device = Device::kCuda;
      else throw Error("--device: expected cpu or cuda, got '" + d + "'");
    } else if (f == "--config") {
      a.config = value();
    } else if (f == "--depths") {
      a.depths = int_list(f, value());
    } else if (f == "--chunk") {
      a.chunk = int_list(f, value()).at(0);
    } else if (f == "--rounds") {
      a.rounds = int_list(f, value()).at(0);
    } else if (f == "-t") {
      a.threads = int_list(f, value()).at(0);
    } else if (f == "--batch") {
      a.batch = int_list(f, value());
    } else if (f == "--filter") {
      a.filter = value();
    } else if (f == "--kv-type") {
      a.kv_type = parse_kv_dtype(value());
    } else if (f == "--kv-recent-f16") {
      a.recent_f16 = int_list(f, value()).at(0);
    } else if (f == "--decode-activations") {
      a.act = parse_decode_activations(value());
    } else if (f == "--weights") {
      a.weights = parse_weights(value());
    } else if (f == "-h" || f == "--help") {
      std::printf(
          "usage: squeezekv_bench_ops [--device cpu|cuda] [--config CONFIG.json] [--depths N,N,..] [--chunk T] [--rounds R]\n"
          "                           [--batch B,B,..] [--filter TEXT] [-t THREADS] [--kv-type f16|f32|q8_0|q4_0|q4_1]\n"
          "                           [--kv-recent-f16 R] [--decode-activations f32|int8] [--weights BF16|Q8_0|Q4_0|Q4_K|..]\n"
          "Times every backend op alone at the config's shapes (Hugging Face config.json). --batch: the rows of\n"
          "the decode products and, past 1, the sequences of a decode batch's attention (default 1,4; at most --chunk).\n"
          "--kv-type: the attention's K and V rows (default f16). --kv-recent-f16: the newest R rows of each depth\n"
          "also in f16, read in their place (the CPU, a quantized --kv-type). --decode-activations: the products', as the\n"
          "CLI's (default here f32, exact; int8: what generate runs, 8-bit rows, bf16 prompt rows for BF16 weights where the CPU has them).\n"
          "--weights: the products' matrices, BF16 (default) or random blocks of a block type (the config's widths a\n"
          "multiple of its block).\n");
      std::exit(0);
    } else {
      throw Error("unknown argument '" + f + "' (--help lists them)");
    }
  }
  for (int b : a.batch)
    if (b > a.chunk) throw Error("--batch: " + std::to_string(b) + " rows exceed --chunk " + std::to_string(a.chunk));
  if (a.recent_f16 > 0 && (a.device != Device::kCpu || !kv_quantized(kv_type_of(a.kv_type)) || a.recent_f16 > kMaxRingRows))
    throw Error("--kv-recent-f16: expected at most " + std::to_string(kMaxRingRows) + " rows, with --device cpu and a quantized --kv-type, got " +
                std::to_string(a.recent_f16));
  return a;
}

float uniform(uint64_t& s) { return static_cast<float>(splitmix64(s) >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f; }

class Bench {
 public:
  Bench(Backend& b, const Args& a) : b_(b), args_(a) {}

  std::unique_ptr<Buffer> floats(size_t n, float scale = 1.0f) {
    std::vector<float> h(n);
    for (float& v : h) v = uniform(seed_) * scale;
    auto buf = b_.alloc(n * sizeof(float));
    b_.upload(buf->data(), h.data(), n * sizeof(float));
    return buf;
  }
  std::unique_ptr<Buffer> ints(const std::vector<int32_t>& h) {
    auto buf = b_.alloc(h.size() * sizeof(int32_t));
    b_.upload(buf->data(), h.data(), h.size() * sizeof(int32_t));
    return buf;
  }
  // A matrix [R][C] of type t (BF16: uniform values; a block type: random blocks, core/quant.h) as
  // the backend uses it: a device's own copy (in keep_), or on the CPU the host bytes themselves
  // (kept in host_ for as long as the bench runs).
  WeightMatrix matrix(DType t, int64_t R, int64_t C, float scale) {
    const int64_t per = dtype_info(t).block_values;
    if (C % per != 0)
      throw Error("--weights " + std::string(dtype_info(t).name) + ": a matrix of " + std::to_string(C) + " columns is not whole blocks of " +
                  std::to_string(per));
    std::vector<uint8_t>& h = host_.emplace_back(dtype_bytes(t, R * C));
    if (t == DType::BF16) {
      for (size_t i = 0; i < h.size(); i += 2) {
        const uint16_t v = f32_to_bf16(uniform(seed_) * scale);
        std::memcpy(h.data() + i, &v, 2);
      }
    } else {
      random_blocks(t, h.data(), R * C / per, scale, splitmix64(seed_), host_.size());
    }
    WeightMatrix w;
    w.type = t, w.data = h.data(), w.rows = R, w.cols = C, w.row_bytes = dtype_bytes(t, C);
    keep_.emplace_back();
    const WeightMatrix used = b_.prepare_weight(w, Backend::WeightUse::kMatrix, keep_.back());
    if (!b_.host_visible()) host_.pop_back();  // the device copied it
    return used;
  }
  void hold(std::unique_ptr<Buffer> b) { keep_.push_back(std::move(b)); }

  // Times op (one call) as reps back-to-back calls, rounds times; prints a row.
  void time(const std::string& name, const std::string& shape, double bytes, double flops, const std::function<void()>& op) {
    if (!args_.filter.empty() && name.find(args_.filter) == std::string::npos) return;
    float sink = 0;
    auto sync = [&] { b_.download(&sink, sync_->data(), sizeof(float)); };
    // reps: enough calls for ~2 ms a round, from a call's cost after a first one (which may load
    // the kernel's module), and at least 32 (a launch list the CUDA backend replays as a graph)
    op();
    sync();
    auto t0 = std::chrono::steady_clock::now();
    op();
    sync();
    const double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int reps = static_cast<int>(std::clamp(2e-3 / std::max(once, 1e-7), 32.0, 400.0));
    std::vector<double> us;
    for (int r = 0; r < args_.rounds + 2; ++r) {  // two warm-up rounds (on CUDA: a direct run, then the graph's capture)
      sync();
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) op();
      sync();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 2) us.push_back(s * 1e6 / reps);
    }
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    const double gbs = bytes / (med * 1e-6) / 1e9;
    char flop[32] = "";
    if (flops > 0) std::snprintf(flop, sizeof flop, "%.0f", flops / (med * 1e-6) / 1e9);
    char share[32] = "";
    if (bw_ > 0) std::snprintf(share, sizeof share, "%.0f%%", 100.0 * gbs * 1e9 / bw_);
    std::printf("| %-24s | %-26s | %9.4g | %9.4g-%-9.4g | %8.4g | %6s | %7s |\n", name.c_str(), shape.c_str(), med, us.front(), us.back(),
                gbs, share, flop);
    std::fflush(stdout);
  }
  void start(double bandwidth) {
    bw_ = bandwidth;
    sync_ = b_.alloc(16);
  }

 private:
  Backend& b_;
  const Args& args_;
  uint64_t seed_ = 1;
  double bw_ = 0;
  std::unique_ptr<Buffer> sync_;
  std::vector<std::unique_ptr<Buffer>> keep_;
  std::deque<std::vector<uint8_t>> host_;  // a deque: earlier matrices' bytes stay where they are
};

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(v);
  }
  return s;
}

int run(const Args& args) {
  bool tied = false;
  const ModelConfig c = read_hf_config(args.config, &tied);
  BackendOptions bo;
  bo.device = args.device;
  bo.threads = args.threads;
  // int8: the backend of a session with int8 decode (the CPU's 8-row weight tiles, 8-bit queries
  // against Q8_0 keys), as generate runs
  bo.decode = args.act == DecodeActivations::kInt8 ? Activations::kInt8 : Activations::kF32;
  std::unique_ptr<Backend> be = make_backend(bo);
  Backend& b = *be;
  Bench bench(b, args);
  const double bw = b.copy_bandwidth();
  const int E = c.dim, H = c.n_heads, G = c.n_kv_heads, D = c.head_dim, F = c.ffn_dim, V = c.vocab_size, Tc = args.chunk;
  const KvType kv_type = kv_type_of(args.kv_type);
  const Activations act = args.act == DecodeActivations::kInt8 ? Activations::kInt8 : Activations::kF32;
  const std::string where = b.describe() + (args.device == Device::kCpu ? " (kernels " + cpu_kernels() + ")" : "");
  std::printf("# %s; %s: E %d, H %d, G %d, D %d, F %d, V %d; %s weights, %s activations, %s KV\n", where.c_str(), args.config.c_str(),
              E, H, G, D, F, V, std::string(dtype_info(args.weights).name).c_str(), decode_activations_name(args.act),
              kv_dtype_name(args.kv_type));
  if (bw > 0) std::printf("# copy bandwidth %.0f GB/s (read + written); %% = the row's bytes over it\n", bw / 1e9);
  std::printf("| %-24s | %-26s | %9s | %-19s | %8s | %6s | %7s |\n", "op", "shape", "us", "min-max us", "GB/s", "% bw", "GFLOP/s");
  std::printf("|---|---|---:|---|---:|---:|---:|\n");
  bench.start(bw);

  // activations: the largest row set any op takes
  const int64_t widest = std::max<int64_t>({E, F, H * D, V});
  auto x = bench.floats(static_cast<size_t>(Tc) * widest);
  auto y = bench.floats(static_cast<size_t>(Tc) * widest);
  auto out = b.alloc(static_cast<size_t>(Tc) * widest * sizeof(float));
  auto out2 = b.alloc(static_cast<size_t>(Tc) * widest * sizeof(float));
  auto out3 = b.alloc(static_cast<size_t>(Tc) * widest * sizeof(float));
  auto norm_w = bench.floats(static_cast<size_t>(E));
  std::vector<float> inv_freq_h(static_cast<size_t>(D / 2));
  for (int i = 0; i < D / 2; ++i) inv_freq_h[i] = std::pow(c.rope_theta, -2.0f * i / D);
  auto inv_freq = b.alloc(inv_freq_h.size() * sizeof(float));
  b.upload(inv_freq->data(), inv_freq_h.data(), inv_freq_h.size() * sizeof(float));
  std::vector<int32_t> pos_h(static_cast<size_t>(Tc));
  for (int t = 0; t < Tc; ++t) pos_h[t] = t;
  auto pos = bench.ints(pos_h);
  float *xp = x->as<float>(), *yp = y->as<float>(), *op = out->as<float>(), *op2 = out2->as<float>(), *op3 = out3->as<float>();

  // ---- products
  const float ws = 1.0f / std::sqrt(static_cast<float>(E));
  struct Mat {
    const char* name;
    WeightMatrix w;
  };
  const DType wt = args.weights;
  auto bytes_of = [&](int64_t R, int64_t C) { return static_cast<double>(dtype_bytes(wt, R * C)); };
  std::vector<Mat> mats{{"q", bench.matrix(wt, int64_t{H} * D, E, ws)}, {"k", bench.matrix(wt, int64_t{G} * D, E, ws)},
                        {"v", bench.matrix(wt, int64_t{G} * D, E, ws)}, {"o", bench.matrix(wt, E, int64_t{H} * D, ws)},
                        {"gate", bench.matrix(wt, F, E, ws)},           {"up", bench.matrix(wt, F, E, ws)},
                        {"down", bench.matrix(wt, E, F, ws)},           {"head", bench.matrix(wt, V, E, ws)}};
  for (const Mat& m : mats)
    for (int T : args.batch) {
      const double wbytes = bytes_of(m.w.rows, m.w.cols);
      bench.time(std::string("gemv ") + m.name + (T > 1 ? " x" + std::to_string(T) : ""), dims({T, m.w.cols}) + " @ " + dims({m.w.rows, m.w.cols}) + "^T",
                 wbytes, 2.0 * T * m.w.rows * m.w.cols,
                 [&, T] { b.matmul_rows(op, xp, m.w, T, nullptr, act); });
    }
  {
    const RopeSpec rope{pos->as<int32_t>(), inv_freq->as<float>(), D, c.rope_adjacent_pairs ? RopePairing::kAdjacent : RopePairing::kHalves};
    const MatmulPart parts[3] = {{op, &mats[0].w, nullptr, &rope}, {op2, &mats[1].w, nullptr, &rope}, {op3, &mats[2].w, nullptr, nullptr}};
    const double wbytes = bytes_of(mats[0].w.rows + mats[1].w.rows + mats[2].w.rows, E);
    bench.time("gemv qkv+rope", dims({1, E}) + " @ q,k,v", wbytes, 2.0 * (mats[0].w.rows + mats[1].w.rows + mats[2].w.rows) * E, [&] { b.matmuls(parts, 3, xp, 1, act, RowMode::kChunk); });
    bench.time("gemv gate,up+swiglu", dims({1, E}) + " @ 2x" + dims({F, E}), 2.0 * bytes_of(F, E), 4.0 * F * E,
               [&] { b.matmul_swiglu(op, op2, xp, mats[4].w, mats[5].w, 1, act, RowMode::kChunk); });
  }
  for (const Mat& m : mats) {
    if (std::strcmp(m.name, "k") == 0 || std::strcmp(m.name, "v") == 0 || std::strcmp(m.name, "up") == 0) continue;
    const double fl = 2.0 * Tc * m.w.rows * m.w.cols;
    bench.time(std::string("gemm ") + m.name, dims({Tc, m.w.cols}) + " @ " + dims({m.w.rows, m.w.cols}) + "^T",
               bytes_of(m.w.rows, m.w.cols) + 4.0 * Tc * (m.w.rows + m.w.cols), fl,
               [&] { b.matmul(op, xp, m.w, Tc, nullptr, act); });
  }

  // ---- element-wise
  for (int T : {1, Tc}) {
    const std::string t = std::to_string(T);
    bench.time("rmsnorm T=" + t, dims({T, E}), 8.0 * T * E, 0, [&, T] { b.rmsnorm(op, xp, norm_w->as<float>(), T, E, c.norm_eps); });
    bench.time("add+rmsnorm T=" + t, dims({T, E}), 16.0 * T * E, 0, [&, T] { b.add_rmsnorm(op, op2, yp, norm_w->as<float>(), T, E, c.norm_eps); });
    bench.time("rope q T=" + t, dims({T, H, D}), 8.0 * T * H * D, 0,
               [&, T] { b.rope(op, pos->as<int32_t>(), T, H, D, inv_freq->as<float>(), RopePairing::kHalves); });
    bench.time("silu_mul T=" + t, dims({T, F}), 12.0 * T * F, 0, [&, T] { b.silu_mul(op, op2, int64_t{T} * F); });
  }

  // ---- a decode batch's picks from its logits [B][V] (uniform logits in [-4, 4): a flat row,
  // where top-p keeps most of the vocabulary and its cut takes the most passes)
  for (int B : args.batch) {
    auto logits = bench.floats(static_cast<size_t>(B) * V, 4.0f);
    auto picks = b.alloc(static_cast<size_t>(B) * sizeof(int32_t));
    struct Setting {
      const char* name;
      SampleParams p;
    };
    for (const Setting& st : {Setting{"greedy", {0.0, 0.0f, 1.0f, 0.0f, 0}}, Setting{"temp 1", {0.5, 1.0f, 1.0f, 0.0f, 0}},
                              Setting{"top_p 0.95", {0.5, 0.8f, 0.95f, 0.0f, 0}},
                              Setting{"top_k 40 top_p 0.95 min_p 0.05", {0.5, 0.8f, 0.95f, 0.05f, 40}}}) {
      const std::vector<SampleParams> ph(static_cast<size_t>(B), st.p);
      auto params = b.alloc(ph.size() * sizeof(SampleParams));
      b.upload(params->data(), ph.data(), ph.size() * sizeof(SampleParams));
      bench.time(std::string("sample ") + st.name + " x" + std::to_string(B), dims({B, V}), 4.0 * B * V, 0, [&, B] {
        b.sample_rows(picks->as<int32_t>(), logits->as<float>(), params->as<SampleParams>(), B, V);
      });
    }
  }

  // ---- attention and KV rows at each depth: one layer's cache of depth + chunk rows
  for (int N : args.depths) {
    const int cap = N + Tc;
    const size_t row = kv_row_bytes(kv_type, D);
    const size_t kv_bytes = static_cast<size_t>(G) * cap * row;
    std::vector<uint8_t> kh(kv_bytes);
    uint64_t s = 7;
    std::vector<float> xr(static_cast<size_t>(D));
    for (size_t r = 0; r < static_cast<size_t>(G) * cap; ++r) {
      for (float& v : xr) v = uniform(s);
      kv_quantize_row(kv_type, xr.data(), kh.data() + r * row, D);
    }
    auto K = b.alloc(kv_bytes), Vb = b.alloc(kv_bytes);
    b.upload(K->data(), kh.data(), kv_bytes);
    b.upload(Vb->data(), kh.data(), kv_bytes);
    std::vector<int32_t> ph(static_cast<size_t>(G) * cap);
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < cap; ++j) ph[static_cast<size_t>(g) * cap + j] = j;
    auto P = bench.ints(ph);
    auto M = b.alloc(static_cast<size_t>(G) * cap * sizeof(float));
    KvView kv;
    kv.k = K->data(), kv.v = Vb->data(), kv.pos = P->as<int32_t>(), kv.count = N, kv.capacity = cap, kv.n_kv_heads = G, kv.head_dim = D;
    kv.type = kv.v_type = kv_type;
    // the ring: the newest R positions' rows in f16 too (position p at index p % R), host memory
    const int R = std::min(args.recent_f16, N);
    std::vector<uint16_t> ring_rows(static_cast<size_t>(G) * R * D);
    std::vector<int32_t> ring_pos(static_cast<size_t>(R));
    if (R > 0) {
      for (uint16_t& h : ring_rows) h = f32_to_f16(uniform(s));
      for (int p = N - R; p < N; ++p) ring_pos[static_cast<size_t>(p % R)] = p;
      kv.ring_k = kv.ring_v = ring_rows.data(), kv.ring_pos = ring_pos.data(), kv.ring = R, kv.ring_from = N - R;
    }
    std::vector<int32_t> qp1{N - 1};
    auto qpos1 = bench.ints(qp1);
    const std::string depth = std::to_string(N);
    const double read1 = 2.0 * G * N * row + 4.0 * G * N;
    bench.time("attn decode N=" + depth, dims({1, H, D}) + " over " + dims({G, N, D}), read1, 4.0 * H * N * D,
               [&] { b.attention(op, xp, qpos1->as<int32_t>(), 1, H, kv, nullptr); });
    // a decode batch: B sequences' layers, each its own arrays at this depth (the count on the
    // device, as a sequence stages it), one row each
    for (int B : args.batch) {
      if (B < 2) continue;
      std::vector<std::unique_ptr<Buffer>> hold;
      std::vector<AttentionCall> calls(static_cast<size_t>(B));
      const int32_t n_h = N;
      hold.push_back(bench.ints(std::vector<int32_t>{n_h}));
      const int32_t* count = hold.back()->as<int32_t>();
      std::vector<int32_t> qpb(static_cast<size_t>(B), N - 1);
      hold.push_back(bench.ints(qpb));
      const int32_t* qposb = hold.back()->as<int32_t>();
      for (int i = 0; i < B; ++i) {
        hold.push_back(b.alloc(kv_bytes));
        b.upload(hold.back()->data(), kh.data(), kv_bytes);
        KvView v = kv;
        v.k = hold.back()->data();
        hold.push_back(b.alloc(kv_bytes));
        b.upload(hold.back()->data(), kh.data(), kv_bytes);
        v.v = hold.back()->data();
        v.count_dev = count;
        calls[i] = AttentionCall{op + static_cast<size_t>(i) * H * D, xp + static_cast<size_t>(i) * H * D, qposb + i, 1, H, v, nullptr, {}};
      }
      bench.time("attn decode x" + std::to_string(B) + " N=" + depth, dims({B, H, D}) + " over " + dims({B, G, N, D}), B * read1,
                 4.0 * B * H * N * D, [&] { b.attention_batch(calls.data(), B); });
      // the same with every sequence's mass (h2o, squeeze): its own mass array each
      std::vector<AttentionProbe> probes(static_cast<size_t>(B));
      for (int i = 0; i < B; ++i) {
        hold.push_back(b.alloc(static_cast<size_t>(G) * cap * sizeof(float)));
        probes[i].mass = hold.back()->as<float>(), probes[i].mass_stride = cap;
        calls[i].probe = &probes[i];
      }
      bench.time("attn decode+mass x" + std::to_string(B) + " N=" + depth, dims({B, H, D}) + " over " + dims({B, G, N, D}),
                 B * (read1 + 8.0 * G * N), 4.0 * B * H * N * D, [&] { b.attention_batch(calls.data(), B); });
    }
    AttentionProbe probe;
    probe.mass = M->as<float>(), probe.mass_stride = cap;
    bench.time("attn decode+mass N=" + depth, dims({1, H, D}) + " over " + dims({G, N, D}), read1 + 8.0 * G * N, 4.0 * H * N * D,
               [&] { b.attention(op, xp, qpos1->as<int32_t>(), 1, H, kv, &probe); });
    // a prompt chunk of Tc rows after N - Tc earlier ones (N keys visible at its end)
    if (N >= Tc) {
      std::vector<int32_t> qph(static_cast<size_t>(Tc));
      for (int t = 0; t < Tc; ++t) qph[t] = N - Tc + t;
      auto qpos = bench.ints(qph);
      const double fl = 4.0 * H * D * (static_cast<double>(Tc) * (N - Tc) + 0.5 * Tc * Tc);
      const double rd = 2.0 * G * N * row + 8.0 * Tc * H * D;
      bench.time("attn prompt N=" + depth, dims({Tc, H, D}) + " over " + dims({G, N, D}), rd, fl,
                 [&] { b.attention(op, xp, qpos->as<int32_t>(), Tc, H, kv, nullptr); });
      AttentionProbe pm;
      pm.mass = M->as<float>(), pm.mass_stride = cap, pm.mass_row_begin = 0;
      bench.time("attn prompt+mass N=" + depth, dims({Tc, H, D}) + " over " + dims({G, N, D}), rd, 2 * fl,
                 [&] { b.attention(op, xp, qpos->as<int32_t>(), Tc, H, kv, &pm); });
    }
    // KV rows: one new row; a decode step's eviction in every layer of the model (each its own
    // arrays; the backend batches consecutive layers' evictions into one launch)
    KvArrays a;
    a.k = K->data(), a.v = Vb->data(), a.pos = P->as<int32_t>(), a.mass = M->as<float>(), a.G = G, a.D = D, a.capacity = cap;
    a.type = a.v_type = kv_type;
    bench.time("kv_write T=1 N=" + depth, dims({1, G, D}), 2.0 * G * row + 8.0 * G * D, 0,
               [&] { b.kv_write(a, N, op, op2, pos->as<int32_t>(), 1); });
    const int layers = std::min(c.n_layers, 32);
    std::vector<std::unique_ptr<Buffer>> lk, lv, lp, lm;
    std::vector<KvArrays> la(static_cast<size_t>(layers), a);
    for (int l = 0; l < layers; ++l) {
      lk.push_back(b.alloc(kv_bytes)), lv.push_back(b.alloc(kv_bytes)), lp.push_back(bench.ints(ph)), lm.push_back(b.alloc(static_cast<size_t>(G) * cap * 4));
      la[l].k = lk.back()->data(), la[l].v = lv.back()->data(), la[l].pos = lp.back()->as<int32_t>(), la[l].mass = lm.back()->as<float>();
    }
    // count N + 1: the step's row is in; sinks 4 and a recent window of N / 2 stay
    bench.time("kv_evict x" + std::to_string(layers) + " layers N=" + depth, dims({layers, G, N + 1}),
               static_cast<double>(layers) * G * (N + 1) * 8.0, 0, [&] {
                 for (int l = 0; l < layers; ++l) b.kv_evict_one(la[l], N + 1, 4, N + 1 - N / 2);
               });
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
