// The CUDA backend against the CPU backend on real models (label "cuda": runs on a machine with an
// NVIDIA GPU; skipped where none is visible). Same weights, same token ids, same settings:
//   - exact mode (--device-weights f32, f32 KV): logits within 1e-4 x the logits' scale of the CPU's;
//   - bf16 mode (the default): within a stated bf16 tolerance, argmax agreeing on most rows;
//   - decode steps (the GEMV path) as well as prompt chunks (cuBLAS);
//   - eviction: every policy keeps the same survivor sets on both devices (up to near-ties of the
//     accumulated mass, whose float sums run in another order on the GPU: counted and bounded).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cuda/cuda_backend.h"
#include "core/quant.h"
#include "core/half.h"
#include "core/sample.h"
#include "kv/kv_storage.h"
#include "squeezekv/engine.h"
#include "squeezekv/error.h"
#include "squeezekv/model.h"
#include "squeezekv/session.h"
#include "test_paths.h"

namespace squeezekv {
namespace {

bool have_cuda() {
  if (!device_available(Device::kCuda)) return false;
  try {
    auto m = Model::load(test::stories260k(), LoadOptions{test::tok512()});
    SessionOptions so;
    so.device = Device::kCuda;
    Session s(*m, so);
    return true;
  } catch (const Error&) {
    return false;
  }
}

struct Case {
  std::string name;
  std::unique_ptr<Model> model;
};

std::vector<Case> models() {
  std::vector<Case> c;
  c.push_back({"stories260K", Model::load(test::stories260k(), LoadOptions{test::tok512()})});
  c.push_back({"tinystories-656k", Model::load(test::tinystories())});
  c.push_back({"tiny_qwen2", Model::load(test::ref_dir() + "/tiny_qwen2")});
  c.push_back({"tiny_llama3", Model::load(test::ref_dir() + "/tiny_llama3")});
  c.push_back({"dummy small-llama", Model::dummy(test::ref_dir() + "/../../bench/configs/small-llama.json")});
  return c;
}

std::vector<int> prompt(const Model& m, int n) {
  std::vector<int> ids;
  const int V = m.config().vocab_size;
  for (int i = 0; i < n; ++i) ids.push_back(3 + (i * 7919) % (V - 3));
  return ids;
}

struct Logits {
  std::vector<float> prefill;  // [n][V]
  std::vector<float> decode;   // [steps][V]
};

Logits run(const Model& m, SessionOptions so, const std::vector<int>& ids, int steps) {
  Session s(m, so);
  Logits r;
  auto l = s.forward(ids, true);
  r.prefill.assign(l.begin(), l.end());
  for (int i = 0; i < steps; ++i) {
    auto d = s.forward(std::span<const int>(&ids[i], 1));
    r.decode.insert(r.decode.end(), d.begin(), d.end());
  }
  return r;
}

struct Diff {
  double max_abs = 0, scale = 0, argmax_agree = 0;
};
Diff compare(const std::vector<float>& a, const std::vector<float>& b, int V) {
  Diff d;
  int rows = static_cast<int>(a.size() / V), agree = 0;
  for (int r = 0; r < rows; ++r) {
    const float* x = a.data() + static_cast<size_t>(r) * V;
    const float* y = b.data() + static_cast<size_t>(r) * V;
    for (int i = 0; i < V; ++i) {
      d.max_abs = std::max(d.max_abs, double(std::fabs(x[i] - y[i])));
      d.scale = std::max(d.scale, double(std::fabs(x[i])));
    }
    agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
  }
  d.argmax_agree = double(agree) / rows;
  return d;
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    static const bool ok = have_cuda();
    if (!ok) GTEST_SKIP() << "no CUDA device (or a build without the CUDA backend)";
  }
};

TEST_F(Cuda, ExactModeMatchesTheCpu) {
  for (auto& c : models()) {
    SessionOptions cpu;
    cpu.threads = 2;
    cpu.prefill_chunk = 16;  // several chunks: cuBLAS on chunks over a growing cache
    cpu.cache.dtype = KvDType::kF32;
    SessionOptions gpu = cpu;
    gpu.device = Device::kCuda;
    gpu.device_weights = DeviceWeightFormat::kF32;
    const auto ids = prompt(*c.model, 40);
    const Logits a = run(*c.model, cpu, ids, 8), b = run(*c.model, gpu, ids, 8);
    const int V = c.model->config().vocab_size;
    const Diff p = compare(a.prefill, b.prefill, V), d = compare(a.decode, b.decode, V);
    std::printf("%-18s exact: prefill max err %.3g (scale %.3g), decode max err %.3g\n", c.name.c_str(), p.max_abs, p.scale,
                d.max_abs);
    EXPECT_LE(p.max_abs, 1e-4 * std::max(1.0, p.scale)) << c.name;
    EXPECT_LE(d.max_abs, 1e-4 * std::max(1.0, d.scale)) << c.name;
    EXPECT_EQ(p.argmax_agree, 1.0) << c.name;
  }
}

TEST_F(Cuda, Bf16ModeWithinItsTolerance) {
  for (auto& c : models()) {
    SessionOptions cpu;
    cpu.threads = 2;
    cpu.prefill_chunk = 16;
    SessionOptions gpu = cpu;
    gpu.device = Device::kCuda;
    const auto ids = prompt(*c.model, 40);
    const Logits a = run(*c.model, cpu, ids, 8), b = run(*c.model, gpu, ids, 8);
    const int V = c.model->config().vocab_size;
    const Diff p = compare(a.prefill, b.prefill, V), d = compare(a.decode, b.decode, V);
    std::printf("%-18s bf16: prefill max err %.3g (scale %.3g, argmax agree %.2f), decode max err %.3g\n", c.name.c_str(),
                p.max_abs, p.scale, p.argmax_agree, d.max_abs);
    // bf16 keeps 8 bits of mantissa: weights and prompt activations round at 2^-9 relative
    EXPECT_LE(p.max_abs, 0.05 * std::max(1.0, p.scale)) << c.name;
    EXPECT_LE(d.max_abs, 0.05 * std::max(1.0, d.scale)) << c.name;
    EXPECT_GE(p.argmax_agree, 0.9) << c.name;
  }
}

// Attention with both mass reductions (h2o's group-mean sum, kvzip's max) on the two backends, on
// the same rows: outputs and masses agree (max within float rounding of one probability).
// One attention call of T query rows over N keys held by a fresh KvStorage on the CPU (dev 0) or
// the GPU (dev 1): the output and the mass the keys received. dev_count: the GPU reads N from
// device memory (KvView::count_dev), as a staged decode step does.
struct Attended {
  std::vector<float> out, mass;  // [T][H*D], [G][N]
  std::vector<float> out_again;  // on the device: a second launch's output (no mass asked)
};
Attended attend(int dev, KvTypes type, int G, int H, int D, int N, int T, int cap, const std::vector<float>& k,
                const std::vector<float>& v, const std::vector<int32_t>& pos, const std::vector<float>& q,
                const std::vector<int32_t>& qpos, MassReduce reduce, bool dev_count, int64_t mass_row_begin = 0, bool exact = true) {
  auto be = make_backend({dev == 0 ? Device::kCpu : Device::kCuda, 2, exact ? DeviceWeightFormat::kF32 : DeviceWeightFormat::kBf16, Activations::kF32});
  KvStorage st(G, D, cap, type, be.get());
  auto put = [&](const void* src, size_t bytes) {
    auto buf = be->alloc(bytes);
    be->upload(buf->data(), src, bytes);
    return buf;
  };
  auto kb = put(k.data(), k.size() * 4), vb = put(v.data(), v.size() * 4), pb = put(pos.data(), pos.size() * 4);
  st.append(kb->as<float>(), vb->as<float>(), pos.data(), N, pb->as<int32_t>());
  auto cb = put(&N, sizeof(int));
  if (dev == 1 && dev_count) st.bind_device_count(cb->as<int32_t>());
  auto qb = put(q.data(), q.size() * 4), qpb = put(qpos.data(), qpos.size() * 4);
  auto ob = be->alloc(q.size() * 4);
  AttentionProbe probe;
  probe.mass = st.mass_accumulator();
  probe.mass_stride = cap;
  probe.reduce = reduce;
  probe.mass_row_begin = mass_row_begin;
  be->attention(ob->as<float>(), qb->as<float>(), qpb->as<int32_t>(), T, H, st.view(), &probe);
  Attended r;
  r.out.resize(q.size());
  be->download(r.out.data(), ob->data(), q.size() * 4);
  if (dev == 1) {  // the same attention again (no mass): what the first launch left behind must not change it
    be->attention(ob->as<float>(), qb->as<float>(), qpb->as<int32_t>(), T, H, st.view(), nullptr);
    r.out_again.resize(q.size());
    be->download(r.out_again.data(), ob->data(), q.size() * 4);
  }
  st.sync_to_host();
  for (int g = 0; g < G; ++g) r.mass.insert(r.mass.end(), st.mass(g), st.mass(g) + N);
  return r;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, double(std::fabs(a[i] - b[i])));
  return e;
}

TEST_F(Cuda, AttentionMassSumAndMaxMatchTheCpu) {
  const int G = 2, H = 6, D = 64, N = 300, T = 37, cap = N + T;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(N) * G * D), v(k.size()), q(static_cast<size_t>(T) * H * D);
  for (auto* x : {&k, &v, &q})
    for (float& e : *x) e = nd(rng);
  std::vector<int32_t> pos(N), qpos(T);
  std::iota(pos.begin(), pos.end(), 0);
  for (int t = 0; t < T; ++t) qpos[t] = N - T + t;  // the last T keys are the rows' own (causal)
  for (MassReduce reduce : {MassReduce::kSum, MassReduce::kMax}) {
    const Attended a = attend(0, KvType::kF32, G, H, D, N, T, cap, k, v, pos, q, qpos, reduce, false);
    const Attended b = attend(1, KvType::kF32, G, H, D, N, T, cap, k, v, pos, q, qpos, reduce, false);
    const double eo = max_diff(a.out, b.out), em = max_diff(a.mass, b.mass);
    std::printf("attention %s: max output err %.3g, max mass err %.3g\n", reduce == MassReduce::kMax ? "max" : "sum", eo, em);
    EXPECT_LE(eo, 1e-4);
    EXPECT_LE(em, reduce == MassReduce::kMax ? 1e-5 : 1e-4 * T);
  }
}

// Prompt chunks with f16 KV run on the tensor cores (k_attn_mma: f16 queries and probabilities,
// f32 sums): against the CPU for head dims 64 and 128, 1-8 query heads per kv head (3 and 7 leave
// a block's last rows empty), a context
// before the chunk, dead slots, N from the host or the device; the policies' mass (k_attn_mma_mass,
// from every row or only the last 32). The same call with SQUEEZEKV_CUDA_MMA=0 (the CUDA-core
// kernels) and with SQUEEZEKV_CUDA_MMA_MASS=0 (the mass on the CUDA cores) must differ from it (so
// the tensor-core paths ran) and all must be within the bound.
TEST_F(Cuda, PromptAttentionOnTensorCoresMatchesTheCpu) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  const int G = 8, T = 600, ctx = 300, N = ctx + T, cap = N + 7;
  double worst_out = 0, worst_mass = 0;
  for (int D : {64, 128})
    for (int grp : {1, 2, 3, 4, 7, 8}) {
      const int H = G * grp;
      std::vector<float> k(static_cast<size_t>(N) * G * D), v(k.size()), q(static_cast<size_t>(T) * H * D);
      for (auto* x : {&k, &v, &q})
        for (float& e : *x) e = nd(rng);
      std::vector<int32_t> pos(N), qpos(T);
      std::iota(pos.begin(), pos.end(), 0);
      for (int j = 11; j < ctx; j += 53) pos[j] = KvStorage::kDeadPos;
      for (int t = 0; t < T; ++t) qpos[t] = ctx + t;
      const bool dev_count = grp % 2 == 0;
      // every row adds mass (h2o), or only the last 32 (snapkv's window: the tiles before it skipped)
      const int64_t row_begin = grp == 3 || grp == 8 ? T - 32 : 0;
      const Attended c = attend(0, KvType::kF16, G, H, D, N, T, cap, k, v, pos, q, qpos, MassReduce::kSum, false, row_begin);
      const Attended t = attend(1, KvType::kF16, G, H, D, N, T, cap, k, v, pos, q, qpos, MassReduce::kSum, dev_count, row_begin);
      setenv("SQUEEZEKV_CUDA_MMA", "0", 1);
      const Attended f = attend(1, KvType::kF16, G, H, D, N, T, cap, k, v, pos, q, qpos, MassReduce::kSum, dev_count, row_begin);
      unsetenv("SQUEEZEKV_CUDA_MMA");
      setenv("SQUEEZEKV_CUDA_MMA_MASS", "0", 1);  // the tensor cores' output, the mass on the CUDA cores
      const Attended u = attend(1, KvType::kF16, G, H, D, N, T, cap, k, v, pos, q, qpos, MassReduce::kSum, dev_count, row_begin);
      unsetenv("SQUEEZEKV_CUDA_MMA_MASS");
      double mass_scale = 0;
      for (float e : c.mass) mass_scale = std::max(mass_scale, double(e));
      const double eo = max_diff(t.out, c.out), em = max_diff(t.mass, c.mass) / mass_scale;
      worst_out = std::max(worst_out, eo), worst_mass = std::max(worst_mass, em);
      EXPECT_NE(t.out, f.out) << "D " << D << " grp " << grp << ": the tensor-core kernel did not run";
      EXPECT_NE(t.mass, u.mass) << "D " << D << " grp " << grp << ": the tensor-core mass did not run";
      EXPECT_EQ(t.out, u.out) << "D " << D << " grp " << grp;
      EXPECT_LE(max_diff(f.out, c.out), 1e-4) << "D " << D << " grp " << grp;
      EXPECT_LE(max_diff(f.mass, c.mass) / mass_scale, 1e-3) << "D " << D << " grp " << grp;
      EXPECT_LE(max_diff(u.mass, c.mass) / mass_scale, 1e-2) << "D " << D << " grp " << grp;
      EXPECT_LE(eo, 1e-2) << "D " << D << " grp " << grp;
      EXPECT_LE(em, 1e-2) << "D " << D << " grp " << grp;
    }
  std::printf("prompt attention on tensor cores: max output err %.3g, max mass err %.3g of the largest mass\n", worst_out, worst_mass);
}

// A served batch's prefill step: several sequences' prompt chunks attend in one call
// (Backend::attention_batch), each over its own cache. On the GPU the parts run in one
// tensor-core launch and their mass in a second; each block is the one its part's lone
// k_attn_mma launch runs. Parts of 1-300 rows over 0-500 held keys, dead slots, N from the host or
// the device, mass from every row, from the last 32 or none: the outputs are bit for bit the
// lone launch's where the lone call also takes the tensor cores (enough rows to fill the SMs), and
// within the tensor cores' rounding of the CPU's everywhere (outputs and masses, as
// PromptAttentionOnTensorCoresMatchesTheCpu); a short part's output must differ from its lone
// CUDA-core one (so the batch launch ran).
TEST_F(Cuda, PromptPartsAttendInOneLaunchAsAlone) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  const int G = 8;
  const std::vector<int> Ts = {1, 5, 80, 200, 17, 64, 300}, ctxs = {0, 120, 33, 500, 0, 7, 260};
  const int n = static_cast<int>(Ts.size());
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  double worst_out = 0, worst_mass = 0;
  for (int D : {64, 128})
    for (int grp : {3, 4}) {
      const int H = G * grp;
      const size_t HD = static_cast<size_t>(H) * D;
      auto gpu = make_backend({Device::kCuda, 2, DeviceWeightFormat::kBf16, Activations::kF32});
      std::vector<std::unique_ptr<Buffer>> keep;
      auto put = [&](Backend& be, const void* src, size_t bytes) {
        auto buf = be.alloc(bytes);
        be.upload(buf->data(), src, bytes);
        Buffer* b = buf.get();
        keep.push_back(std::move(buf));
        return b;
      };
      struct Part {
        std::vector<float> k, v, q;
        std::vector<int32_t> pos, qpos;
        int N = 0, T = 0, cap = 0;
        int64_t row_begin = 0;
        bool mass = false, dev_count = false;
      };
      std::vector<Part> parts(static_cast<size_t>(n));
      int rows = 0;
      for (int i = 0; i < n; ++i) {
        Part& p = parts[i];
        p.T = Ts[i], p.N = ctxs[i] + Ts[i], p.cap = p.N + 9;
        p.k.resize(static_cast<size_t>(p.N) * G * D), p.v.resize(p.k.size()), p.q.resize(static_cast<size_t>(p.T) * HD);
        for (auto* x : {&p.k, &p.v, &p.q})
          for (float& e : *x) e = nd(rng);
        p.pos.resize(p.N), p.qpos.resize(p.T);
        std::iota(p.pos.begin(), p.pos.end(), 0);
        for (int j = 5; j < ctxs[i]; j += 41) p.pos[j] = KvStorage::kDeadPos;
        for (int t = 0; t < p.T; ++t) p.qpos[t] = ctxs[i] + t;
        p.mass = i % 3 != 1, p.dev_count = i % 2 == 0;
        p.row_begin = i == 3 ? p.T - 32 : 0;
        rows += p.T;
      }
      // the batch: the parts' rows in one buffer, each part's cache its own storage on the GPU
      std::vector<float> q_all;
      std::vector<int32_t> qpos_all;
      for (const Part& p : parts) q_all.insert(q_all.end(), p.q.begin(), p.q.end()), qpos_all.insert(qpos_all.end(), p.qpos.begin(), p.qpos.end());
      Buffer* qb = put(*gpu, q_all.data(), q_all.size() * 4);
      Buffer* qpb = put(*gpu, qpos_all.data(), qpos_all.size() * 4);
      auto ob = gpu->alloc(q_all.size() * 4);
      std::vector<std::unique_ptr<KvStorage>> stores;
      std::vector<AttentionProbe> probes(static_cast<size_t>(n));
      std::vector<AttentionCall> calls;
      for (int i = 0, r = 0; i < n; r += parts[i].T, ++i) {
        const Part& p = parts[i];
        stores.push_back(std::make_unique<KvStorage>(G, D, p.cap, KvType::kF16, gpu.get()));
        KvStorage& st = *stores.back();
        st.append(put(*gpu, p.k.data(), p.k.size() * 4)->as<float>(), put(*gpu, p.v.data(), p.v.size() * 4)->as<float>(), p.pos.data(),
                  p.N, put(*gpu, p.pos.data(), p.pos.size() * 4)->as<int32_t>());
        if (p.dev_count) st.bind_device_count(put(*gpu, &p.N, sizeof(int))->as<int32_t>());
        if (p.mass) probes[i] = AttentionProbe{st.mass_accumulator(), p.cap, p.row_begin};
        calls.push_back({ob->as<float>() + r * HD, qb->as<float>() + r * HD, qpb->as<int32_t>() + r, p.T, H, st.view(),
                         p.mass ? &probes[i] : nullptr, {}});
      }
      gpu->attention_batch(calls.data(), n);
      std::vector<float> out_all(q_all.size());
      gpu->download(out_all.data(), ob->data(), out_all.size() * 4);
      int short_differ = 0;
      for (int i = 0, r = 0; i < n; r += parts[i].T, ++i) {
        const Part& p = parts[i];
        const std::string at = "D " + std::to_string(D) + " grp " + std::to_string(grp) + " part " + std::to_string(i);
        const std::vector<float> out(out_all.begin() + r * HD, out_all.begin() + (r + p.T) * HD);
        std::vector<float> mass;
        stores[i]->sync_to_host();
        for (int g = 0; g < G; ++g) mass.insert(mass.end(), stores[i]->mass(g), stores[i]->mass(g) + p.N);
        const Attended lone = attend(1, KvType::kF16, G, H, D, p.N, p.T, p.cap, p.k, p.v, p.pos, p.q, p.qpos, MassReduce::kSum,
                                     p.dev_count, p.row_begin, false);
        const Attended cpu = attend(0, KvType::kF16, G, H, D, p.N, p.T, p.cap, p.k, p.v, p.pos, p.q, p.qpos, MassReduce::kSum, false,
                                    p.row_begin);
        const bool lone_mma = G * ((p.T + 64 / grp - 1) / (64 / grp)) >= sms / 2;  // attention_mma's fill rule
        if (lone_mma) EXPECT_EQ(out, lone.out) << at;
        else short_differ += out != lone.out;
        const double eo = max_diff(out, cpu.out);
        worst_out = std::max(worst_out, eo);
        EXPECT_LE(eo, 1e-2) << at;
        if (p.mass) {
          double scale = 0;
          for (float e : cpu.mass) scale = std::max(scale, double(e));
          const double em = max_diff(mass, cpu.mass) / scale;
          worst_mass = std::max(worst_mass, em);
          EXPECT_LE(em, 1e-2) << at;
        } else {
          EXPECT_TRUE(std::all_of(mass.begin(), mass.end(), [](float e) { return e == 0.0f; })) << at << ": a part without a mass got one";
        }
      }
      EXPECT_GT(short_differ, 0) << "D " << D << " grp " << grp << ": the batch launch did not run";
    }
  std::printf("prompt parts in one launch: max output err %.3g, max mass err %.3g of the largest mass\n", worst_out, worst_mass);
}

// The decode kernels (one query token: flash-decoding over splits of the keys, the mass from the
// kept scores) against the CPU's attention over a sweep of shapes: KV f16, f32 and q8_0, and q4_1
// values beside q8_0 or f16 keys (the same stored bytes on both: the kernels read the blocks
// directly; q8_0 for head dims 64-256; q4_1 values where the tensor cores do not serve the shape
// through the general kernel over the rows converted, as with SQUEEZEKV_CUDA_MMA_DECODE=0), head dims
// 16-256, 1-8 query heads per kv head, 1-5000 keys (one split to many), dead slots and keys
// later than the query (masked), N read from the host or from device memory (count_dev). The
// CUDA-core kernel (SQUEEZEKV_CUDA_MMA_DECODE=0) in f32 within 1e-4 (output) and 1e-5 (mass); the
// tensor-core kernel where it serves (f16 and q8_0, head dims 64 and 128, up to 8 heads a kv head)
// rounds q and p to f16 as the prompt kernel does: within 1e-3 and 1e-4 for f16 (seen on the
// H200: 3.4e-4 and 3.5e-5); q8_0's values q * d are rounded to f16 too (2^-11 of a value: up to
// 2e-3 for these N(0, 1) rows), so 3e-3 and 3e-4, and q4_1's q * d + m alike; and it must be the
// one that ran (its bits differ from the CUDA cores' past one key).
TEST_F(Cuda, DecodeAttentionMatchesTheCpu) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int G = 2;
  int cases = 0, on_mma = 0;
  double worst_out = 0, worst_mass = 0, worst_mma_out = 0, worst_mma_mass = 0;
  const KvTypes types[] = {KvType::kF32, KvType::kF16, KvType::kQ8_0, {KvType::kQ8_0, KvType::kQ4_1}, {KvType::kF16, KvType::kQ4_1}};
  for (KvTypes type : types)
    for (int D : {16, 32, 64, 128, 256})
      for (int grp : {1, 3, 4, 7, 8})
        for (int N : {1, 40, 300, 5000})
          for (bool dev_count : {false, true}) {
            if (!cuda_kv_types(type, D)) continue;  // q8_0: whole-word rows (D % 64); q4_1: blocks of 32
            const int H = G * grp, cap = N + 5;
            std::vector<float> k(static_cast<size_t>(N) * G * D), v(k.size()), q(static_cast<size_t>(H) * D);
            for (auto* x : {&k, &v, &q})
              for (float& e : *x) e = nd(rng);
            std::vector<int32_t> pos(N);
            std::iota(pos.begin(), pos.end(), 0);
            for (int j = 7; j < N; j += 97) pos[j] = KvStorage::kDeadPos;  // dead slots
            const std::vector<int32_t> qpos{std::max(0, N - 3)};            // the last two keys are later: masked
            const Attended a = attend(0, type, G, H, D, N, 1, cap, k, v, pos, q, qpos, MassReduce::kSum, false);
            const Attended b = attend(1, type, G, H, D, N, 1, cap, k, v, pos, q, qpos, MassReduce::kSum, dev_count);
            setenv("SQUEEZEKV_CUDA_MMA_DECODE", "0", 1);
            const Attended c = attend(1, type, G, H, D, N, 1, cap, k, v, pos, q, qpos, MassReduce::kSum, dev_count);
            unsetenv("SQUEEZEKV_CUDA_MMA_DECODE");
            EXPECT_EQ(b.out, b.out_again) << "D " << D << " grp " << grp << " N " << N << ": a second launch";
            EXPECT_EQ(c.out, c.out_again) << "D " << D << " grp " << grp << " N " << N << ": a second launch";
            const std::string what = "D " + std::to_string(D) + " grp " + std::to_string(grp) + " N " + std::to_string(N) + " type " +
                                     std::to_string(int(type.k)) + "/" + std::to_string(int(type.v)) + " dev " + std::to_string(dev_count);
            const double eo = max_diff(a.out, c.out), em = max_diff(a.mass, c.mass);
            worst_out = std::max(worst_out, eo), worst_mass = std::max(worst_mass, em);
            ++cases;
            EXPECT_LE(eo, 1e-4) << what;
            EXPECT_LE(em, 1e-5) << what;
            const bool mma = (type.k == KvType::kF16 || type.k == KvType::kQ8_0) && (type.v == type.k || type.v == KvType::kQ4_1) &&
                             (D == 64 || D == 128) && grp <= 8;
            if (!mma) {
              EXPECT_EQ(b.out, c.out) << what << ": the same kernel";
              continue;
            }
            ++on_mma;
            const double mo = max_diff(a.out, b.out), mm = max_diff(a.mass, b.mass);
            worst_mma_out = std::max(worst_mma_out, mo), worst_mma_mass = std::max(worst_mma_mass, mm);
            if (N > 1) {  // one key: v itself in both
              EXPECT_NE(b.out, c.out) << what << ": the tensor-core kernel did not run";
            }
            const double tol = type.k == KvType::kQ8_0 || type.v == KvType::kQ4_1 ? 3e-3 : 1e-3;
            EXPECT_LE(mo, tol) << what;
            EXPECT_LE(mm, tol / 10) << what;
          }
  std::printf("decode attention: %d shapes on the CUDA cores, max output err %.3g, max mass err %.3g; %d on the tensor cores, %.3g, %.3g\n",
              cases, worst_out, worst_mass, on_mma, worst_mma_out, worst_mma_mass);
}

// Q8_0 rows, and Q4_1 values beside Q8_0 or f16 keys, written on the device are the CPU's bytes
// (the same f32 rows quantized by the same f32 operations), and a prompt chunk over such rows
// (converted once a layer, then the kernels of f16 rows: the tensor cores at 600 rows, the CUDA
// cores at 37; in the exact mode of f32 rows) stays within those kernels' bounds of the CPU's
// attention over the same rows.
TEST_F(Cuda, Q8RowsAndPromptAttentionMatchTheCpu) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  const int G = 2;
  const KvTypes pairs[] = {KvType::kQ8_0, {KvType::kQ8_0, KvType::kQ4_1}, {KvType::kF16, KvType::kQ4_1}};
  for (KvTypes types : pairs)
  for (int D : {64, 128, 256}) {
    const int N = 300, cap = N + 9;
    std::vector<float> k(static_cast<size_t>(N) * G * D), v(k.size());
    for (auto* x : {&k, &v})
      for (float& e : *x) e = 3.0f * nd(rng);
    std::vector<int32_t> pos(N);
    std::iota(pos.begin(), pos.end(), 0);
    std::vector<uint8_t> rows[2][2];  // [backend][K, V]
    for (int dev : {0, 1}) {
      auto be = make_backend({dev == 0 ? Device::kCpu : Device::kCuda, 2, DeviceWeightFormat::kF32, Activations::kF32});
      KvStorage st(G, D, cap, types, be.get());
      auto kb = be->alloc(k.size() * 4), vb = be->alloc(v.size() * 4), pb = be->alloc(pos.size() * 4);
      be->upload(kb->data(), k.data(), k.size() * 4), be->upload(vb->data(), v.data(), v.size() * 4);
      be->upload(pb->data(), pos.data(), pos.size() * 4);
      st.append(kb->as<float>(), vb->as<float>(), pos.data(), N, pb->as<int32_t>());
      const KvView view = st.view();
      for (int which : {0, 1}) {
        std::vector<uint8_t>& r = rows[dev][which];
        const size_t rb = kv_row_bytes(which == 0 ? types.k : types.v, D);
        r.resize(static_cast<size_t>(G) * cap * rb);
        be->download(r.data(), which == 0 ? view.k : view.v, r.size());
        for (int g = 0; g < G; ++g)  // slots past N hold nothing written
          std::fill(r.begin() + (static_cast<size_t>(g) * cap + N) * rb, r.begin() + static_cast<size_t>(g + 1) * cap * rb, 0);
      }
    }
    const std::string what = "D " + std::to_string(D) + " types " + std::to_string(int(types.k)) + "/" + std::to_string(int(types.v));
    EXPECT_TRUE(rows[0][0] == rows[1][0]) << what << ": K rows differ from the CPU's";
    EXPECT_TRUE(rows[0][1] == rows[1][1]) << what << ": V rows differ from the CPU's";
  }
  double worst_out = 0, worst_mass = 0;
  for (KvTypes types : pairs)
  for (int D : {64, 128})
    for (int T : {37, 600}) {
      const int grp = 4, H = G * grp, ctx = 300, N = ctx + T, cap = N + 3;
      std::vector<float> k(static_cast<size_t>(N) * G * D), v(k.size()), q(static_cast<size_t>(T) * H * D);
      for (auto* x : {&k, &v, &q})
        for (float& e : *x) e = nd(rng);
      std::vector<int32_t> pos(N), qpos(T);
      std::iota(pos.begin(), pos.end(), 0);
      for (int t = 0; t < T; ++t) qpos[t] = ctx + t;
      const Attended c = attend(0, types, G, H, D, N, T, cap, k, v, pos, q, qpos, MassReduce::kSum, false);
      const Attended t = attend(1, types, G, H, D, N, T, cap, k, v, pos, q, qpos, MassReduce::kSum, T == 600, 0, false);
      const Attended x = attend(1, types, G, H, D, N, T, cap, k, v, pos, q, qpos, MassReduce::kSum, T == 600);
      double mass_scale = 0;
      for (float e : c.mass) mass_scale = std::max(mass_scale, double(e));
      const double eo = max_diff(t.out, c.out), em = max_diff(t.mass, c.mass) / mass_scale;
      worst_out = std::max(worst_out, eo), worst_mass = std::max(worst_mass, em);
      EXPECT_LE(eo, 1e-2) << "D " << D << " T " << T;
      EXPECT_LE(em, 1e-2) << "D " << D << " T " << T;
      EXPECT_LE(max_diff(x.out, c.out), 1e-4) << "D " << D << " T " << T << " exact";
      EXPECT_LE(max_diff(x.mass, c.mass) / mass_scale, 1e-4) << "D " << D << " T " << T << " exact";
    }
  std::printf("q8_0 rows, q4_1 values: the CPU's bytes; prompt attention over them through f16: max output err %.3g, max mass err "
              "%.3g of the largest\n", worst_out, worst_mass);
}

// A decode step's mass deferred to the layer's eviction (the eviction kernel adds it before it
// picks the row to drop) gives the masses and survivors of the mass kernel right after the
// attention, to the bit: sum and max, 4 and 8 query heads a kv head, f16 and f32 rows; a mass
// deferred into a storage that is then freed is dropped with it (the next storage, likely in the
// same memory, gives the same bits).
TEST_F(Cuda, DeferredMassEqualsTheMassKernel) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  const int G = 2, D = 64, N = 700, cap = N + 4;
  for (KvType type : {KvType::kF16, KvType::kF32})
    for (int grp : {3, 7})
      for (MassReduce reduce : {MassReduce::kSum, MassReduce::kMax}) {
        const int H = G * grp;
        std::vector<float> k(static_cast<size_t>(N) * G * D), v(k.size()), q(static_cast<size_t>(H) * D), m0(static_cast<size_t>(G) * cap);
        for (auto* x : {&k, &v, &q, &m0})
          for (float& e : *x) e = std::fabs(nd(rng));
        std::vector<int32_t> pos(N);
        std::iota(pos.begin(), pos.end(), 0);
        std::vector<std::vector<float>> mass(2);
        std::vector<std::vector<int32_t>> kept(2);
        for (int defer = 0; defer < 2; ++defer) {
          if (defer == 0) setenv("SQUEEZEKV_CUDA_DEFER_MASS", "0", 1);
          auto be = make_backend({Device::kCuda, 2, DeviceWeightFormat::kF32, Activations::kF32});
          unsetenv("SQUEEZEKV_CUDA_DEFER_MASS");
          auto put = [&](const void* src, size_t bytes) {
            auto buf = be->alloc(bytes);
            be->upload(buf->data(), src, bytes);
            return buf;
          };
          auto kb = put(k.data(), k.size() * 4), vb = put(v.data(), v.size() * 4), pb = put(pos.data(), pos.size() * 4);
          auto cb = put(&N, sizeof(int));
          const int32_t qp = N - 1;
          auto qb = put(q.data(), q.size() * 4), qpb = put(&qp, 4);
          auto ob = be->alloc(q.size() * 4);
          auto attend_decode = [&](KvStorage& st) {
            AttentionProbe probe;
            probe.mass = st.mass_accumulator();
            probe.mass_stride = cap;
            probe.reduce = reduce;
            be->attention(ob->as<float>(), qb->as<float>(), qpb->as<int32_t>(), 1, H, st.view(), &probe);
          };
          {  // a storage freed with its step's mass still deferred: the mass goes with it
            KvStorage gone(G, D, cap, type, be.get());
            gone.append(kb->as<float>(), vb->as<float>(), pos.data(), N, pb->as<int32_t>());
            gone.bind_device_count(cb->as<int32_t>());
            attend_decode(gone);
          }
          KvStorage st(G, D, cap, type, be.get());
          st.append(kb->as<float>(), vb->as<float>(), pos.data(), N, pb->as<int32_t>());
          be->upload(st.mass_accumulator(), m0.data(), m0.size() * 4);  // some mass already there
          st.bind_device_count(cb->as<int32_t>());
          attend_decode(st);
          st.evict_one_on_backend(N - 1, 4, 32);
          st.sync_to_host();
          for (int g = 0; g < G; ++g) {
            mass[defer].insert(mass[defer].end(), st.mass(g), st.mass(g) + N - 1);
            kept[defer].insert(kept[defer].end(), st.positions(g), st.positions(g) + N - 1);
          }
        }
        EXPECT_TRUE(mass[0] == mass[1]) << "grp " << grp << " f16 " << (type == KvType::kF16) << " max " << (reduce == MassReduce::kMax);
        EXPECT_TRUE(kept[0] == kept[1]) << "grp " << grp << " f16 " << (type == KvType::kF16) << " max " << (reduce == MassReduce::kMax);
      }
}

// A chunk's eviction on the device (Backend::kv_evict_top: a radix select over (mass, position)
// keys, then the moves) leaves every head's arrays exactly as the CPU backend's reference does:
// the same rows in the same slots, K and V with them; with many ties (few distinct masses) and
// without; counts from a few rows to several blocks' worth; the cut view's positions likewise.
// And eviction_error's sums (Backend::error_energy) as the CPU forms them, to double rounding.
TEST_F(Cuda, ChunkEvictionEqualsTheCpuReference) {
  std::mt19937 rng(21);
  auto gpu = make_backend({Device::kCuda, 2, DeviceWeightFormat::kF32, Activations::kF32});
  auto cpu = make_backend({Device::kCpu, 2, DeviceWeightFormat::kF32, Activations::kF32});
  const int G = 8, D = 128;
  struct Shape {
    int count, n_evict, keep_below, recent;
  };
  for (const Shape sh : {Shape{6, 1, 1, 1}, Shape{100, 37, 4, 20}, Shape{1500, 1000, 4, 256}, Shape{2600, 512, 4, 1024},
                         Shape{5000, 4000, 0, 0}, Shape{3000, 2, 4, 900}})
    for (int ties = 0; ties < 2; ++ties)
      for (int mark = 0; mark < 2; ++mark) {
        const int cap = sh.count + 3;
        const size_t rows = static_cast<size_t>(G) * cap;
        std::vector<uint16_t> k(rows * D), v(rows * D);
        std::vector<int32_t> pos(rows);
        std::vector<float> mass(rows);
        for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint16_t>(rng()), v[i] = static_cast<uint16_t>(rng());
        for (int g = 0; g < G; ++g) {
          std::vector<int32_t> p(static_cast<size_t>(sh.count));
          std::iota(p.begin(), p.end(), 0);
          std::shuffle(p.begin(), p.end(), rng);  // slots in no order, as after earlier evictions
          for (int j = 0; j < sh.count; ++j) {
            pos[static_cast<size_t>(g) * cap + j] = p[j];
            mass[static_cast<size_t>(g) * cap + j] =
                ties ? static_cast<float>(rng() % 4) * 0.25f : std::uniform_real_distribution<float>(0, 3)(rng);
          }
        }
        const int32_t keep_from = sh.count - sh.recent;
        struct Arrays {
          std::unique_ptr<Buffer> k, v, p, m, dead;
          KvArrays a;
        };
        auto make = [&](Backend& be) {
          Arrays r;
          r.k = be.alloc(k.size() * 2), r.v = be.alloc(v.size() * 2), r.p = be.alloc(rows * 4), r.m = be.alloc(rows * 4);
          r.dead = be.alloc(rows * 4);
          be.upload(r.k->data(), k.data(), k.size() * 2);
          be.upload(r.v->data(), v.data(), v.size() * 2);
          be.upload(r.p->data(), pos.data(), rows * 4);
          be.upload(r.m->data(), mass.data(), rows * 4);
          r.a = {r.k->data(), r.v->data(), r.p->as<int32_t>(), r.m->as<float>(), KvType::kF16, G, D, cap, nullptr, KvType::kF16, nullptr};
          be.kv_evict_top(r.a, sh.count, sh.n_evict, sh.keep_below, keep_from, mark ? r.dead->as<int32_t>() : nullptr);
          return r;
        };
        Arrays a = make(*cpu), b = make(*gpu);
        auto read = [&](Backend& be, const Buffer& buf, size_t bytes) {
          std::vector<unsigned char> out(bytes);
          be.download(out.data(), buf.data(), bytes);
          return out;
        };
        const std::string what = "count " + std::to_string(sh.count) + " evict " + std::to_string(sh.n_evict) +
                                 (ties ? " ties" : "") + (mark ? " marked" : " moved");
        if (mark) {
          EXPECT_TRUE(read(*cpu, *a.dead, rows * 4) == read(*gpu, *b.dead, rows * 4)) << what;
          continue;
        }
        const int kept = sh.count - sh.n_evict;
        bool same = true;
        const auto pa = read(*cpu, *a.p, rows * 4), pb = read(*gpu, *b.p, rows * 4);
        const auto ma = read(*cpu, *a.m, rows * 4), mb = read(*gpu, *b.m, rows * 4);
        const auto ka = read(*cpu, *a.k, rows * D * 2), kb = read(*gpu, *b.k, rows * D * 2);
        const auto va = read(*cpu, *a.v, rows * D * 2), vb = read(*gpu, *b.v, rows * D * 2);
        for (int g = 0; g < G; ++g) {
          const size_t s0 = static_cast<size_t>(g) * cap;
          same = same && std::equal(pa.begin() + s0 * 4, pa.begin() + (s0 + kept) * 4, pb.begin() + s0 * 4);
          same = same && std::equal(ma.begin() + s0 * 4, ma.begin() + (s0 + kept) * 4, mb.begin() + s0 * 4);
          same = same && std::equal(ka.begin() + s0 * D * 2, ka.begin() + (s0 + kept) * D * 2, kb.begin() + s0 * D * 2);
          same = same && std::equal(va.begin() + s0 * D * 2, va.begin() + (s0 + kept) * D * 2, vb.begin() + s0 * D * 2);
        }
        EXPECT_TRUE(same) << what;
      }
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{32} * 4096}) {
    std::vector<float> o(static_cast<size_t>(n)), c(o.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = std::normal_distribution<float>()(rng), c[i] = o[i] + 0.01f * std::normal_distribution<float>()(rng);
    double want[2];
    cpu->error_energy(want, o.data(), c.data(), n);
    auto ob = gpu->alloc(o.size() * 4), cb = gpu->alloc(c.size() * 4), sb = gpu->alloc(16);
    gpu->upload(ob->data(), o.data(), o.size() * 4);
    gpu->upload(cb->data(), c.data(), c.size() * 4);
    gpu->error_energy(sb->as<double>(), ob->as<float>(), cb->as<float>(), n);
    double got[2];
    gpu->download(got, sb->data(), 16);
    EXPECT_NEAR(got[0], want[0], 1e-9 * want[0]) << n;
    EXPECT_NEAR(got[1], want[1], 1e-9 * want[1]) << n;
  }
}

// The device's picks (Backend::sample_rows) against core/sample.h's on the host. Greedy rows
// equal the CPU's bit for bit (rows of a Llama-3 vocabulary, short rows, ties at the top: the
// lower index wins). Sampled rows (temperature alone, top-k, min-p, top-p, together; rows with
// many exact ties; draws at 0 and near 1) equal the host's pick, or differ only where the host's
// own cut and running sums put the draw (or the cut) within rounding of the boundary between the
// two picks: every difference is checked against that, and there are few.
TEST_F(Cuda, SampleRowsEqualTheHost) {
  std::mt19937 rng(22);
  auto gpu = make_backend({Device::kCuda, 2, DeviceWeightFormat::kF32, Activations::kF32});
  auto cpu = make_backend({Device::kCpu, 2, DeviceWeightFormat::kF32, Activations::kF32});
  auto run_gpu = [&](const std::vector<float>& x, const std::vector<SampleParams>& p, int64_t V) {
    const int64_t n = static_cast<int64_t>(p.size());
    std::vector<int32_t> got(p.size());
    auto xb = gpu->alloc(x.size() * 4), ob = gpu->alloc(n * 4), pb = gpu->alloc(n * sizeof(SampleParams));
    gpu->upload(xb->data(), x.data(), x.size() * 4);
    gpu->upload(pb->data(), p.data(), n * sizeof(SampleParams));
    gpu->sample_rows(ob->as<int32_t>(), xb->as<float>(), pb->as<SampleParams>(), n, V);
    gpu->download(got.data(), ob->data(), n * 4);
    return got;
  };
  for (int64_t V : {int64_t{1}, int64_t{33}, int64_t{1000}, int64_t{128256}}) {  // greedy
    const int n = 9;
    std::vector<float> x(static_cast<size_t>(n * V));
    for (float& v : x) v = std::normal_distribution<float>()(rng);
    for (int r = 0; r < n; r += 2)  // ties: a value equal to the row's maximum further on
      if (V > 1) x[static_cast<size_t>(r * V + V - 1)] = *std::max_element(x.begin() + r * V, x.begin() + (r + 1) * V);
    const std::vector<SampleParams> greedy(n);
    std::vector<int32_t> want(n);
    cpu->sample_rows(want.data(), x.data(), greedy.data(), n, V);
    EXPECT_EQ(run_gpu(x, greedy, V), want) << "V " << V;
  }
  int rows = 0, differ = 0;
  for (int64_t V : {int64_t{7}, int64_t{1000}, int64_t{49152}, int64_t{128256}}) {
    std::vector<SampleParams> p;
    for (float temperature : {0.6f, 1.0f, 1.7f})
      for (int top_k : {0, 1, 40, static_cast<int>(V) - 1})
        for (float top_p : {1.0f, 0.95f, 0.5f})
          for (float min_p : {0.0f, 0.05f}) {
            SampleParams s;
            s.temperature = temperature, s.top_k = top_k, s.top_p = top_p, s.min_p = min_p;
            s.draw = p.size() % 7 == 0 ? 0.0 : p.size() % 7 == 1 ? 0.9999999 : std::uniform_real_distribution<double>()(rng);
            p.push_back(s);
          }
    const int64_t n = static_cast<int64_t>(p.size());
    std::vector<float> x(static_cast<size_t>(n * V));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < V; ++i) {
        float v = 3.0f * std::normal_distribution<float>()(rng);
        if (r % 3 == 2) v = std::round(v * 2.0f) / 2.0f;  // many exact ties
        x[static_cast<size_t>(r * V + i)] = v;
      }
    const std::vector<int32_t> got = run_gpu(x, p, V);
    SampleScratch scratch;
    for (int64_t r = 0; r < n; ++r) {
      const std::span<const float> row(x.data() + r * V, static_cast<size_t>(V));
      SampleCut cut;
      const int want = sample_row(row, p[r], scratch, &cut);
      ++rows;
      ASSERT_GE(got[r], 0);
      ASSERT_LT(got[r], V);
      if (got[r] == want) continue;
      ++differ;
      // the host's q, cut and running sum at the device's pick
      const int d = got[r];
      float mx = -INFINITY;
      for (float l : row) mx = std::max(mx, l / p[r].temperature);
      auto q = [&](int i) { return std::exp(row[i] / p[r].temperature - mx); };
      const double tol = 1e-6 * cut.kept_mass;
      if (cut.kept(row[d], q(d), d)) {
        double before = 0.0;
        for (int i = 0; i < d; ++i)
          if (cut.kept(row[i], q(i), i)) before += q(i);
        EXPECT_TRUE(before <= cut.r + tol && before + q(d) >= cut.r - tol)
            << "V " << V << " row " << r << ": device " << d << " host " << want << ", r " << cut.r << " lies outside ["
            << before << ", " << before + q(d) << "]";
      } else {  // a token the host's cut leaves out: top-k's set is exact, so it must sit at top-p's cut
        const float qd = q(d);
        const bool in_k = cut.in_top_k(row[d], d);
        const bool at_tau = cut.cut && std::abs(qd - cut.tau) <= 1e-6f * cut.tau + 1e-30f;
        EXPECT_TRUE(in_k && at_tau) << "V " << V << " row " << r << ": device " << d << " (q " << qd << ") outside the host's cut (top-k "
                                    << cut.l_k << " at id " << cut.id_k << ", tau " << cut.tau << ")";
      }
    }
  }
  std::printf("sample_rows: %d of %d sampled rows pick another token than the host's (each at a boundary)\n", differ, rows);
  EXPECT_LE(differ, rows / 50 + 1);
}

// The fused decode products (one GEMV launch for q, k, v with RoPE in its epilogue; gate and up
// with SwiGLU in its epilogue) give exactly what the separate ops give on the same device, and
// match the CPU within float rounding: 1-4 rows (the GEMV); 5 rows of a prompt chunk (cuBLAS)
// and 40 of a decode batch (cuBLASLt), bf16 activations, where q, k, v and gate, up, laid out
// together as the runner prepares them, are one product each, split after; both RoPE pairings, head dims the fused path serves (64, 128) and one it leaves to the separate
// ops (12), a bias, an output width that is not a multiple of the block's rows (the FFN's 202).
TEST_F(Cuda, FusedProductsEqualTheSeparateOps) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;

  auto cpu = make_backend({Device::kCpu, 2, DeviceWeightFormat::kBf16, Activations::kF32});
  auto gpu = make_backend({Device::kCuda, 2, DeviceWeightFormat::kBf16, Activations::kF32});
  struct Host {
    std::vector<uint16_t> bits;
    WeightMatrix w;
  };
  auto matrix = [&](int R, int C) {
    Host h;
    for (int i = 0; i < R * C; ++i) h.bits.push_back(f32_to_bf16(nd(rng) * 0.1f));
    h.w = WeightMatrix{DType::BF16, reinterpret_cast<const uint8_t*>(h.bits.data()), R, C, static_cast<size_t>(C) * 2};
    return h;
  };
  std::vector<std::unique_ptr<Buffer>> keep;
  auto up = [&](Backend& b, const void* src, size_t bytes) {
    keep.push_back(b.alloc(bytes));
    b.upload(keep.back()->data(), src, bytes);
    return keep.back()->data();
  };
  auto down = [](Backend& b, const float* src, size_t n) {
    std::vector<float> h(n);
    b.download(h.data(), src, n * 4);
    return h;
  };
  int cases = 0;
  double worst = 0;
  for (int D : {64, 128, 12})
    for (RopePairing pairing : {RopePairing::kHalves, RopePairing::kAdjacent})
      for (int T : {1, 2, 3, 4, 5, 40}) {
        const int H = 4, G = 2, C = 96, F = 202;
        Host wq = matrix(H * D, C), wk = matrix(G * D, C), wv = matrix(G * D, C), wg = matrix(F, C), wu = matrix(F, C);
        std::vector<float> x(static_cast<size_t>(T) * C), bias(H * D), inv(D / 2);
        for (float& e : x) e = nd(rng);
        for (float& e : bias) e = nd(rng);
        for (int i = 0; i < D / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / D);
        std::vector<int32_t> pos;
        for (int t = 0; t < T; ++t) pos.push_back(3 + 9973 * t);
        // outputs per backend and mode: q, k, v, gate (fused), then the separate ops' q, k, v, gate
        std::vector<std::vector<float>> res[2][2];
        for (int dev = 0; dev < 2; ++dev) {
          Backend& b = dev == 0 ? *cpu : *gpu;
          // as the runner prepares them: q, k, v and gate, up in groups (the device lays each
          // group out together and runs its products as one: joined_product)
          const WeightMatrix in_qkv[3] = {wq.w, wk.w, wv.w}, in_gu[2] = {wg.w, wu.w};
          WeightMatrix qkv[3], gu[2];
          b.prepare_weights(in_qkv, 3, qkv, keep);
          b.prepare_weights(in_gu, 2, gu, keep);
          const WeightMatrix &q = qkv[0], &k = qkv[1], &v = qkv[2], &g = gu[0], &u = gu[1];
          // 40 rows as a decode batch (the tensor-core batch path), the rest as prompt chunks
          const RowMode rows = T > 5 ? RowMode::kIndependent : RowMode::kChunk;
          const float* xd = static_cast<const float*>(up(b, x.data(), x.size() * 4));
          const float* bd = static_cast<const float*>(up(b, bias.data(), bias.size() * 4));
          const RopeSpec rope{static_cast<const int32_t*>(up(b, pos.data(), pos.size() * 4)),
                              static_cast<const float*>(up(b, inv.data(), inv.size() * 4)), D, pairing};
          for (int mode = 0; mode < 2; ++mode) {
            keep.push_back(b.alloc(static_cast<size_t>(T) * (H * D + 2 * G * D + 2 * F) * 4));
            float* oq = keep.back()->as<float>();
            float *ok = oq + T * H * D, *ov = ok + T * G * D, *og = ov + T * G * D, *ou = og + T * F;
            if (mode == 0) {
              const MatmulPart parts[3] = {{oq, &q, bd, &rope}, {ok, &k, nullptr, &rope}, {ov, &v, nullptr, nullptr}};
              b.matmuls(parts, 3, xd, T, Activations::kF32, rows);
              b.matmul_swiglu(og, ou, xd, g, u, T, Activations::kF32, rows);
            } else {
              b.matmul(oq, xd, q, T, bd, Activations::kF32);
              b.matmul(ok, xd, k, T, nullptr, Activations::kF32);
              b.matmul(ov, xd, v, T, nullptr, Activations::kF32);
              b.rope(oq, rope.pos, T, H, D, rope.inv_freq, pairing);
              b.rope(ok, rope.pos, T, G, D, rope.inv_freq, pairing);
              b.matmul(og, xd, g, T, nullptr, Activations::kF32);
              b.matmul(ou, xd, u, T, nullptr, Activations::kF32);
              b.silu_mul(og, ou, static_cast<int64_t>(T) * F);
            }
            for (auto [p, n] : {std::pair{oq, T * H * D}, {ok, T * G * D}, {ov, T * G * D}, {og, T * F}})
              res[dev][mode].push_back(down(b, p, n));
          }
        }
        for (int o = 0; o < 4; ++o) {
          const std::vector<float>&f = res[1][0][o], &s = res[1][1][o], &c = res[0][1][o];
          double scale = 0;
          for (float e : c) scale = std::max(scale, double(std::fabs(e)));
          // the GEMV's one launch: the same bits; one joined product: the same bf16 inputs
          // summed in another product's order
          if (T <= 4) EXPECT_EQ(f, s) << "output " << o << " D " << D << " T " << T << " adjacent " << (pairing == RopePairing::kAdjacent);
          else EXPECT_LE(max_diff(f, s) / scale, 1e-4) << "output " << o << " D " << D << " T " << T << ": joined against one by one";
          const double err = max_diff(f, c) / scale;
          worst = T <= 4 ? std::max(worst, err) : worst;
          EXPECT_LE(err, T <= 4 ? 1e-5 : 2e-2) << "output " << o << " D " << D << " T " << T;
          ++cases;
        }
      }
  std::printf("fused and joined products: %d outputs as the separate ops; max error against the CPU (1-4 rows) %.3g\n", cases, worst);
}

// Weights kept in their GGUF blocks on the device (--device-weights native), every block type:
// decode rows (1-16, the integer GEMV against 8-bit activations) within float rounding of the
// CPU's integer products on the same 8-bit activations (cpu::ref::dot_q8, in double), each row the
// same bits alone and in a batch; more rows (a prompt chunk, a large batch: dequantized to bf16
// and cuBLAS) within bf16's rounding of the exact product; parts of different types in one call,
// with bias, RoPE and SwiGLU as the bf16 path applies them.
TEST_F(Cuda, PackedWeightsMatchTheCpu) {
  const std::vector<DType> types = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K,
                                    DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};
  auto gpu = make_backend({Device::kCuda, 2, DeviceWeightFormat::kNative, Activations::kInt8});
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<std::unique_ptr<Buffer>> keep;
  auto up = [&](const void* src, size_t bytes) {
    keep.push_back(gpu->alloc(bytes));
    gpu->upload(keep.back()->data(), src, bytes);
    return keep.back()->data();
  };
  auto down = [&](const float* src, size_t n) {
    std::vector<float> h(n);
    gpu->download(h.data(), src, n * 4);
    return h;
  };
  const int R = 83, C = 512;  // rows not a multiple of the GEMV's 4 a block; two 256-blocks a row
  double worst_gemv = 0, worst_tc = 0, worst_bf16 = 0;
  for (DType t : types) {
    const size_t row_bytes = dtype_bytes(t, C);
    std::vector<uint8_t> raw(row_bytes * R);
    for (int r = 0; r < R; ++r) random_blocks(t, raw.data() + r * row_bytes, C / dtype_info(t).block_values, 0.035f, 9, r);
    const WeightMatrix host{t, raw.data(), R, C, row_bytes};
    std::unique_ptr<Buffer> wkeep;
    const WeightMatrix w = gpu->prepare_weight(host, Backend::WeightUse::kMatrix, wkeep);
    ASSERT_EQ(w.type, t) << "native weights keep the type";
    std::vector<float> deq(static_cast<size_t>(R) * C), bias(R);
    for (int r = 0; r < R; ++r) dequantize_row(t, raw.data() + r * row_bytes, deq.data() + static_cast<size_t>(r) * C, C);
    for (float& b : bias) b = 0.01f * nd(rng);
    const float* bd = static_cast<const float*>(up(bias.data(), bias.size() * 4));
    std::vector<float> alone;  // [R]: row 0 multiplied alone
    std::vector<float> tiles;  // [R]: row 0 in the first batch past the GEMV (gemm_rows_q)
    for (int T : {1, 2, 3, 4, 9, 16, 40, 64, 100}) {
      std::vector<float> x(static_cast<size_t>(T) * C);
      std::mt19937 xr(77);  // the same rows for every T: row i alone and in a batch
      for (float& e : x) e = std::normal_distribution<float>()(xr);
      const float* xd = static_cast<const float*>(up(x.data(), x.size() * 4));
      keep.push_back(gpu->alloc(static_cast<size_t>(T) * R * 4));
      float* od = keep.back()->as<float>();
      if (T > 4) gpu->matmul_rows(od, xd, w, T, bd, Activations::kInt8);
      else gpu->matmul(od, xd, w, T, bd, Activations::kInt8);
      const std::vector<float> out = down(od, static_cast<size_t>(T) * R);
      for (int i = 0; i < T; ++i) {
        std::vector<cpu::Q8Block> xq(C / 32);
        cpu::ref::quantize_q8(xq.data(), x.data() + static_cast<size_t>(i) * C, C);
        for (int r = 0; r < R; ++r) {
          double exact = bias[r], scale = std::fabs(bias[r]);
          for (int c = 0; c < C; ++c) {
            exact += double(deq[static_cast<size_t>(r) * C + c]) * x[static_cast<size_t>(i) * C + c];
            scale += std::fabs(double(deq[static_cast<size_t>(r) * C + c]) * x[static_cast<size_t>(i) * C + c]);
          }
          const float got = out[static_cast<size_t>(i) * R + r];
          if (T <= 16) {
            const double want = cpu::ref::dot_q8(t, raw.data() + r * row_bytes, xq.data(), C) + bias[r];
            const double err = std::fabs(got - want) / scale;
            worst_gemv = std::max(worst_gemv, err);
            ASSERT_LE(err, 1e-5) << dtype_info(t).name << " T " << T << " row " << i << " out " << r;
            if (T == 1) {
              alone.push_back(got);
            } else if (i == 0) {
              ASSERT_EQ(got, alone[r]) << dtype_info(t).name << " T " << T << ": row 0 alone and in a batch";
            }
          } else if (T <= 64) {
            // gemm_rows_q: f16 activations and weights on the tensor cores, each sum in the same
            // order in any batch (40 rows: a row tile partly empty)
            const double err = std::fabs(got - exact) / scale;
            worst_tc = std::max(worst_tc, err);
            ASSERT_LE(err, 2e-3) << dtype_info(t).name << " T " << T << " row " << i << " out " << r;
            if (i == 0 && T == 40) {
              tiles.push_back(got);
            } else if (i == 0) {
              ASSERT_EQ(got, tiles[r]) << dtype_info(t).name << " T " << T << ": row 0 in batches of 40 and " << T;
            }
          } else {  // past one row tile: the matrix dequantized to bf16, cuBLAS
            const double err = std::fabs(got - exact) / scale;
            worst_bf16 = std::max(worst_bf16, err);
            ASSERT_LE(err, 1e-2) << dtype_info(t).name << " T " << T << " row " << i << " out " << r;
          }
        }
      }
    }
  }
  // two parts of different types (q in Q4_K, v in Q6_K: a Q4_K_M layer) with RoPE on q, and
  // gate, up through SwiGLU: the same bits as each matrix alone and the ops after it
  const int D = 64, H = 4, G = 2, E = 256, F = 512;
  auto matrix = [&](DType t, int rows, int cols, uint64_t stream, std::vector<uint8_t>& raw) {
    raw.resize(dtype_bytes(t, cols) * rows);
    for (int r = 0; r < rows; ++r) random_blocks(t, raw.data() + r * dtype_bytes(t, cols), cols / dtype_info(t).block_values, 0.035f, stream, r);
    std::unique_ptr<Buffer> b;
    const WeightMatrix m = gpu->prepare_weight(WeightMatrix{t, raw.data(), rows, cols, dtype_bytes(t, cols)}, Backend::WeightUse::kMatrix, b);
    keep.push_back(std::move(b));
    return m;
  };
  std::vector<uint8_t> rq, rv, rg, ru;
  const WeightMatrix wq = matrix(DType::Q4_K, H * D, E, 1, rq), wv = matrix(DType::Q6_K, G * D, E, 2, rv),
                     wg = matrix(DType::Q4_K, F, E, 3, rg), wu = matrix(DType::Q5_K, F, E, 4, ru);
  std::vector<float> inv(D / 2);
  for (int i = 0; i < D / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / D);
  const std::pair<int, RowMode> runs[] = {{1, RowMode::kChunk}, {3, RowMode::kChunk}, {40, RowMode::kChunk}, {40, RowMode::kIndependent}};
  for (const auto& [T, mode] : runs) {
    std::vector<float> x(static_cast<size_t>(T) * E);
    for (float& e : x) e = nd(rng);
    std::vector<int32_t> pos;
    for (int t = 0; t < T; ++t) pos.push_back(5 + 31 * t);
    const float* xd = static_cast<const float*>(up(x.data(), x.size() * 4));
    const RopeSpec rope{static_cast<const int32_t*>(up(pos.data(), pos.size() * 4)), static_cast<const float*>(up(inv.data(), inv.size() * 4)),
                        D, RopePairing::kHalves};
    keep.push_back(gpu->alloc(static_cast<size_t>(T) * (2 * H * D + 2 * G * D + 4 * F) * 4));
    float* oq = keep.back()->as<float>();
    float *ov = oq + T * H * D, *oq2 = ov + T * G * D, *ov2 = oq2 + T * H * D, *og = ov2 + T * G * D, *ou = og + T * F,
          *og2 = ou + T * F, *ou2 = og2 + T * F;
    const MatmulPart parts[2] = {{oq, &wq, nullptr, &rope}, {ov, &wv, nullptr, nullptr}};
    gpu->matmuls(parts, 2, xd, T, Activations::kInt8, mode);
    gpu->matmul_swiglu(og, ou, xd, wg, wu, T, Activations::kInt8, mode);
    // each matrix alone: a prompt chunk's product, or a decode batch's (gemm_rows_q past 16 rows)
    auto alone = [&](float* o, const WeightMatrix& w) {
      if (mode == RowMode::kIndependent) gpu->matmul_rows(o, xd, w, T, nullptr, Activations::kInt8);
      else gpu->matmul(o, xd, w, T, nullptr, Activations::kInt8);
    };
    alone(oq2, wq);
    gpu->rope(oq2, rope.pos, T, H, D, rope.inv_freq, RopePairing::kHalves);
    alone(ov2, wv);
    alone(og2, wg);
    alone(ou2, wu);
    gpu->silu_mul(og2, ou2, static_cast<int64_t>(T) * F);
    const char* how = mode == RowMode::kChunk ? "chunk" : "decode batch";
    EXPECT_EQ(down(oq, T * H * D), down(oq2, T * H * D)) << "q with RoPE, T " << T << ", " << how;
    EXPECT_EQ(down(ov, T * G * D), down(ov2, T * G * D)) << "v, T " << T << ", " << how;
    EXPECT_EQ(down(og, T * F), down(og2, T * F)) << "silu(gate) * up, T " << T << ", " << how;
  }
  std::printf("packed weights, 12 types: GEMV within %.3g of the CPU's integer products, decode batches on the tensor cores within %.3g "
              "and bf16 tiles within %.3g of the exact product\n",
              worst_gemv, worst_tc, worst_bf16);
}

// Whole models with native weights: the default model (Q4_1) and a dummy Llama in the Q4_K_M
// mix (Q4_K, Q6_K, and Q5_0 / Q8_0 where a row is not whole 256-blocks), Q8_0 and Q4_0 (output
// Q6_K, and Q8_0 on rows of 704), prompt and decode logits
// against the CPU's (8-bit decode activations, as the device's), within the bf16 mode's tolerance.
TEST_F(Cuda, NativeWeightModelsMatchTheCpu) {
  std::vector<Case> cases;
  // (the default model is fetched by scripts/setup: a GPU machine that cannot download it, or
  // take its 80 MB, runs the dummy presets only)
  if (std::ifstream(test::default_model()).good()) cases.push_back({"SmolLM2 Q4_1", Model::load(test::default_model())});
  else std::printf("no %s: the dummy presets only\n", test::default_model().c_str());
  for (const char* preset : {"Q4_K_M", "Q8_0", "Q4_0"}) {
    LoadOptions lo;
    lo.dummy_type = preset;
    cases.push_back({std::string("dummy ") + preset, Model::dummy(test::ref_dir() + "/../../bench/configs/small-llama.json", 1, lo)});
  }
  for (auto& c : cases) {
    SessionOptions cpu;
    cpu.threads = 2;
    cpu.prefill_chunk = 16;
    cpu.decode_activations = DecodeActivations::kInt8;
    SessionOptions gpu = cpu;
    gpu.device = Device::kCuda;
    const auto ids = prompt(*c.model, 40);
    const Logits a = run(*c.model, cpu, ids, 8), b = run(*c.model, gpu, ids, 8);
    gpu.device_weights = DeviceWeightFormat::kBf16;
    const Logits bf = run(*c.model, gpu, ids, 8);
    const int V = c.model->config().vocab_size;
    const Diff p = compare(a.prefill, b.prefill, V), d = compare(a.decode, b.decode, V), db = compare(a.decode, bf.decode, V);
    std::printf("%-14s native: prefill max err %.3g (scale %.3g, argmax agree %.2f), decode max err %.3g (bf16 weights: %.3g)\n",
                c.name.c_str(), p.max_abs, p.scale, p.argmax_agree, d.max_abs, db.max_abs);
    EXPECT_LE(p.max_abs, 0.05 * std::max(1.0, p.scale)) << c.name;
    // decode steps: the CPU's integer sums on the same 8-bit activations, over a cache whose rows
    // came from the prompt's bf16 tiles: no further from the CPU than bf16 weights are (random
    // weights have near ties: one of the 8 steps may pick another token, as with bf16 weights)
    EXPECT_LE(d.max_abs, std::max(1.5 * db.max_abs, 1e-3 * std::max(1.0, d.scale))) << c.name;
    EXPECT_GE(p.argmax_agree, 0.9) << c.name;
    EXPECT_GE(d.argmax_agree, 0.75) << c.name;
  }
}

// Decode batches on the tensor cores by gemm_rows (CudaOptions::BatchProducts::kMma): within bf16's rounding of the
// activations of the CPU's f32 products, and batch-invariant: every row's outputs are the same bits
// in a batch of 5 as in one of 130 (each output summed by one warp per column slice in the same
// order, the slices added in order), whatever n8 tiles a block takes (1, 2, 4, 8) and whether
// its weights' loads run 64 or 128 columns ahead.
TEST_F(Cuda, BatchedProductsOnTensorCoresAreBatchInvariant) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  CudaOptions o;
  o.batch = CudaOptions::BatchProducts::kMma;
  auto gpu = make_cuda_backend(o);
  o.gemm_rows_step = 64;
  auto gpu64 = make_cuda_backend(o);
  auto cpu = make_backend({Device::kCpu, 2, DeviceWeightFormat::kBf16, Activations::kF32});
  constexpr int kMax = 130;
  double worst = 0;
  int compared = 0;
  // column slices (gemm_rows_slices) 2, 1, 4, 8 and 1; 8200: the 128-row blocks, a partial last
  // one; 576 columns: two pieces of 256 and one of 64, steps of 64; 1536: six pieces, steps of 128
  for (auto [R, C] : {std::pair{96, 128}, {1000, 576}, {8200, 256}, {1024, 1024}, {17000, 1536}}) {
    std::vector<uint16_t> bits(static_cast<size_t>(R) * C);
    for (uint16_t& b : bits) b = f32_to_bf16(nd(rng) * 0.05f);
    const WeightMatrix host{DType::BF16, reinterpret_cast<const uint8_t*>(bits.data()), R, C, static_cast<size_t>(C) * 2};
    std::vector<float> x(static_cast<size_t>(kMax) * C), bias(R);
    for (float& e : x) e = nd(rng);
    for (float& e : bias) e = nd(rng);
    auto run = [&](Backend& b, int B) {
      std::unique_ptr<Buffer> kw, kx = b.alloc(x.size() * 4), kb = b.alloc(bias.size() * 4), ko = b.alloc(static_cast<size_t>(B) * R * 4);
      const WeightMatrix w = b.prepare_weight(host, Backend::WeightUse::kMatrix, kw);
      b.upload(kx->data(), x.data(), x.size() * 4);
      b.upload(kb->data(), bias.data(), bias.size() * 4);
      b.matmul_rows(ko->as<float>(), kx->as<float>(), w, B, kb->as<float>(), Activations::kF32);
      std::vector<float> out(static_cast<size_t>(B) * R);
      b.download(out.data(), ko->data(), out.size() * 4);
      return out;
    };
    const std::vector<float> full = run(*gpu, kMax), ref = run(*cpu, kMax);
    double scale = 0;
    for (float e : ref) scale = std::max(scale, double(std::fabs(e)));
    const double err = max_diff(full, ref) / scale;
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-2) << "R " << R << " C " << C;
    for (int B : {5, 8, 9, 17, 33, 64, 65}) {
      const std::vector<float> part = run(*gpu, B);
      EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin())) << "R " << R << " C " << C << ": a batch of " << B << " rows differs";
      ++compared;
    }
    for (int B : {17, 130}) {
      const std::vector<float> part = run(*gpu64, B);
      EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin())) << "R " << R << " C " << C << ": steps of 64, a batch of " << B << " rows differs";
      ++compared;
    }
  }
  std::printf("batched products on tensor cores: max error against the CPU %.3g of the scale; %d batches bit-equal to the rows of 130\n",
              worst, compared);
}

// A norm's rows, and SwiGLU's gate, go on to the tensor-core products in bf16 from the kernel that
// wrote them (cuda_backend.cu, bf16_rows_). Whatever changes the rows in between (a copy in, a
// kernel, another norm), a product reads them as they are then: the same bits as a product over a
// fresh copy of them, which converts them itself. Where nothing came between, the same bits too.
TEST_F(Cuda, ProductsReadTheirRowsAsTheyAreNow) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd;
  int cases = 0;
  for (auto batch : {CudaOptions::BatchProducts::kTuned, CudaOptions::BatchProducts::kMma}) {
    CudaOptions o;
    o.batch = batch;
    auto b = make_cuda_backend(o);
    constexpr int T = 64, C = 256, R = 320, F = 192;
    auto bits = [&](int rows, int cols) {
      std::vector<uint16_t> v(static_cast<size_t>(rows) * cols);
      for (uint16_t& e : v) e = f32_to_bf16(nd(rng) * 0.1f);
      return v;
    };
    const std::vector<uint16_t> wb = bits(R, C), gb = bits(F, C), ub = bits(F, C), db = bits(R, F);
    std::vector<std::unique_ptr<Buffer>> keep;
    const WeightMatrix w = b->prepare_weight({DType::BF16, reinterpret_cast<const uint8_t*>(wb.data()), R, C, size_t{C} * 2},
                                             Backend::WeightUse::kMatrix, keep.emplace_back());
    const WeightMatrix wd = b->prepare_weight({DType::BF16, reinterpret_cast<const uint8_t*>(db.data()), R, F, size_t{F} * 2},
                                              Backend::WeightUse::kMatrix, keep.emplace_back());
    const WeightMatrix gu_in[2] = {{DType::BF16, reinterpret_cast<const uint8_t*>(gb.data()), F, C, size_t{C} * 2},
                                   {DType::BF16, reinterpret_cast<const uint8_t*>(ub.data()), F, C, size_t{C} * 2}};
    WeightMatrix gu[2];
    b->prepare_weights(gu_in, 2, gu, keep);
    auto rows = [&](size_t n, float scale) {
      std::vector<float> v(n);
      for (float& e : v) e = nd(rng) * scale;
      return v;
    };
    const std::vector<float> x = rows(size_t{T} * C, 2.0f), y = rows(size_t{T} * C, 1.0f), other = rows(size_t{T} * C, 1.0f),
                             nw = rows(C, 0.1f), other_f = rows(size_t{T} * F, 1.0f);
    auto dev = [&](const std::vector<float>& h) {
      keep.push_back(b->alloc(h.size() * 4));
      b->upload(keep.back()->data(), h.data(), h.size() * 4);
      return keep.back()->as<float>();
    };
    float *bx = dev(x), *by = dev(y), *bn = dev(nw), *xn = dev(x), *fresh = dev(x), *out = dev(std::vector<float>(size_t{T} * R));
    float *gate = dev(other_f), *upo = dev(other_f);
    // out of the product over `in` (decode rows, or a prompt chunk's); then the same over a copy
    auto product = [&](const float* in, const WeightMatrix& m, bool chunk) {
      if (chunk) b->matmul(out, in, m, T, nullptr, Activations::kF32);
      else b->matmul_rows(out, in, m, T, nullptr, Activations::kF32);
      std::vector<float> h(size_t{T} * m.rows);
      b->download(h.data(), out, h.size() * 4);
      return h;
    };
    auto over_copy = [&](const float* in, const WeightMatrix& m, bool chunk) {
      b->copy(fresh, in, size_t{T} * m.cols * 4);
      return product(fresh, m, chunk);
    };
    for (bool chunk : {false, true}) {
      const std::string mode = std::string(batch == CudaOptions::BatchProducts::kMma ? "gemm_rows" : "tuned") + (chunk ? ", chunk" : ", rows");
      auto check = [&](const std::vector<float>& got, const float* in, const WeightMatrix& m, const char* what) {
        const std::vector<float> want = over_copy(in, m, chunk);
        EXPECT_TRUE(got == want) << mode << ": " << what;
        ++cases;
      };
      b->rmsnorm(xn, bx, bn, T, C, 1e-5f);
      check(product(xn, w, chunk), xn, w, "norm, then the product");
      b->rmsnorm(xn, bx, bn, T, C, 1e-5f);
      b->submit();
      check(product(xn, w, chunk), xn, w, "norm, the layer submitted, then the product");
      b->rmsnorm(xn, bx, bn, T, C, 1e-5f);
      b->upload(xn, other.data(), other.size() * 4);
      check(product(xn, w, chunk), xn, w, "norm, rows copied in, then the product");
      b->add_rmsnorm(xn, bx, by, bn, T, C, 1e-5f);
      b->add(xn, by, int64_t{T} * C);
      check(product(xn, w, chunk), xn, w, "norm, a kernel adding to the rows, then the product");
      b->rmsnorm(fresh, bx, bn, T, C, 1e-5f);  // another buffer's rows last
      b->rmsnorm(xn, by, bn, T, C, 1e-5f);
      b->copy(xn, fresh, size_t{T} * C * 4);
      check(product(xn, w, chunk), xn, w, "norm, the rows replaced by a copy, then the product");
      // SwiGLU's gate (joined gate and up) into the down product
      const RowMode rm = chunk ? RowMode::kChunk : RowMode::kIndependent;
      b->rmsnorm(xn, bx, bn, T, C, 1e-5f);
      b->matmul_swiglu(gate, upo, xn, gu[0], gu[1], T, Activations::kF32, rm);
      check(product(gate, wd, chunk), gate, wd, "the gate, then the down product");
      b->matmul_swiglu(gate, upo, xn, gu[0], gu[1], T, Activations::kF32, rm);
      b->upload(gate, other_f.data(), other_f.size() * 4);
      check(product(gate, wd, chunk), gate, wd, "the gate, rows copied in, then the down product");
    }
  }
  std::printf("products after norms and gates: %d cases equal to the product over a fresh copy of their rows\n", cases);
}

// RMSNorm and the residual add before it against the CPU, over rows that take the register kernel
// (E % 4 == 0, up to 16384) and rows that take the general one (odd E, E past 16384).
TEST_F(Cuda, NormsMatchTheCpu) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  auto cpu = make_backend({Device::kCpu, 2, DeviceWeightFormat::kBf16, Activations::kF32});
  auto gpu = make_backend({Device::kCuda, 2, DeviceWeightFormat::kBf16, Activations::kF32});
  int cases = 0;
  for (int E : {4, 6, 64, 576, 4096, 4100, 8192, 12288, 16384, 16388, 18000})
    for (int T : {1, 3}) {
      const size_t n = static_cast<size_t>(T) * E;
      std::vector<float> x(n), y(n), w(E);
      for (float& e : x) e = nd(rng) * 3.0f;
      for (float& e : y) e = nd(rng);
      for (float& e : w) e = 1.0f + 0.1f * nd(rng);
      std::vector<float> res[2][3];  // [device]: rmsnorm out, add_rmsnorm out, add_rmsnorm's x
      for (int dev = 0; dev < 2; ++dev) {
        Backend& b = dev == 0 ? *cpu : *gpu;
        auto bx = b.alloc(n * 4), by = b.alloc(n * 4), bw = b.alloc(E * 4), bo = b.alloc(n * 4);
        b.upload(bx->data(), x.data(), n * 4);
        b.upload(by->data(), y.data(), n * 4);
        b.upload(bw->data(), w.data(), E * 4);
        auto down = [&](const Buffer& buf) {
          std::vector<float> h(n);
          b.download(h.data(), buf.data(), n * 4);
          return h;
        };
        b.rmsnorm(bo->as<float>(), bx->as<float>(), bw->as<float>(), T, E, 1e-5f);
        res[dev][0] = down(*bo);
        b.add_rmsnorm(bo->as<float>(), bx->as<float>(), by->as<float>(), bw->as<float>(), T, E, 1e-5f);
        res[dev][1] = down(*bo);
        res[dev][2] = down(*bx);
      }
      for (int o = 0; o < 3; ++o) {
        double scale = 0;
        for (float e : res[0][o]) scale = std::max(scale, double(std::fabs(e)));
        EXPECT_LE(max_diff(res[1][o], res[0][o]) / scale, 1e-5) << "output " << o << " E " << E << " T " << T;
        ++cases;
      }
    }
  std::printf("norms: %d outputs within 1e-5 of the CPU (float sums of up to 18000 squares in another order)\n", cases);
}

// The prompt ids, then their first 12 tokens one step each, on the CPU (cpu) and the GPU (gpu):
// how many (layer, kv head) hold the same positions on both, of how many.
struct SameSurvivors {
  int same = 0, total = 0;
};
SameSurvivors same_survivors(const Model& m, const SessionOptions& cpu, const SessionOptions& gpu, const std::vector<int>& ids) {
  Session a(m, cpu), b(m, gpu);
  a.forward(ids);
  b.forward(ids);
  for (int i = 0; i < 12; ++i) {
    a.forward(std::span<const int>(&ids[i], 1));
    b.forward(std::span<const int>(&ids[i], 1));
  }
  SameSurvivors r;
  for (int l = 0; l < m.config().n_layers; ++l)
    for (int g = 0; g < m.config().n_kv_heads; ++g, ++r.total) r.same += a.kv_positions(l, g) == b.kv_positions(l, g);
  return r;
}

TEST_F(Cuda, PoliciesKeepTheSameSurvivors) {
  auto m = Model::load(test::tinystories());
  const auto ids = prompt(*m, 96);
  for (KvPolicy policy : {KvPolicy::kWindow, KvPolicy::kH2O, KvPolicy::kSnapKV, KvPolicy::kPyramidKV, KvPolicy::kSqueeze,
                          KvPolicy::kKvzip}) {
    SessionOptions cpu;
    cpu.threads = 2;
    cpu.prefill_chunk = 32;
    cpu.cache.dtype = KvDType::kF32;
    cpu.cache.policy = policy;
    cpu.cache.budget = 40;
    cpu.cache.snapkv_window = 8;
    SessionOptions gpu = cpu;
    gpu.device = Device::kCuda;
    gpu.device_weights = DeviceWeightFormat::kF32;
    const auto [same, total] = same_survivors(*m, cpu, gpu, ids);
    std::printf("%-10s survivor sets identical: %d of %d (layer, kv head)\n", kv_policy_name(policy), same, total);
    if (policy == KvPolicy::kWindow) {
      EXPECT_EQ(same, total);  // positions only: no mass involved
    } else {
      EXPECT_GE(same, total * 9 / 10) << kv_policy_name(policy);
    }
  }
}

// Sessions with Q8_0 KV rows, and with Q4_1 values beside Q8_0 keys, on the two backends (the
// exact mode: f32 weights, the rows converted to f32 for the prompt kernels), on dummy shapes of
// head dims 64 and 128 (every trained test model's head dim is below 64, which Q8_0 rows on the
// device need): the logits of a prompt in chunks and
// of decode steps within 2e-3 of their scale (seen on the H200: at most 2.7e-4; a key the two
// backends project a rounding apart may land one quantization step apart, a larger difference
// than f32 rows show), with Q4_1 values within 5e-3 (a step is 1/15 of a block's range there:
// seen on an H100 2.3e-3), and under h2o, squeeze and kvzip the survivors of nearly every (layer,
// kv head) the same (seen: all but one of 36 with Q4_1 values).
TEST_F(Cuda, Q8KvSessionsMatchTheCpu) {
  std::vector<std::unique_ptr<Model>> models;
  for (const char* shape : {"64", "128"}) {
    const std::string path = ::testing::TempDir() + "/squeezekv_q8_" + shape + ".json";
    {
      std::ofstream f(path);
      f << R"({"model_type": "llama", "hidden_size": )" << (std::string(shape) == "64" ? 512 : 1024)
        << R"(, "intermediate_size": 512, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
               "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
               "tie_word_embeddings": true})";
    }
    models.push_back(Model::dummy(path));
  }
  for (const auto& m : models)
    for (std::optional<KvDType> v_type : {std::optional<KvDType>(), std::optional<KvDType>(KvDType::kQ4_1)}) {
      const auto ids = prompt(*m, 96);
      SessionOptions cpu;
      cpu.threads = 2;
      cpu.prefill_chunk = 32;
      cpu.cache.dtype = KvDType::kQ8_0;
      cpu.cache.dtype_v = v_type;  // q4_1 values beside q8_0 keys: the decode kernel's own value path
      const char* rows = v_type ? "q8_0 keys, q4_1 values" : "q8_0 rows";
      SessionOptions gpu = cpu;
      gpu.device = Device::kCuda;
      gpu.device_weights = DeviceWeightFormat::kF32;
      const Logits a = run(*m, cpu, ids, 8), b = run(*m, gpu, ids, 8);
      const int V = m->config().vocab_size;
      const Diff p = compare(a.prefill, b.prefill, V), d = compare(a.decode, b.decode, V);
      std::printf("head dim %d, %s: prefill max err %.3g (scale %.3g), decode max err %.3g\n", m->config().head_dim, rows, p.max_abs,
                  p.scale, d.max_abs);
      const double tol = v_type ? 5e-3 : 2e-3;  // a value a rounding apart lands a 4-bit step apart (1/15 of its block's range)
      EXPECT_LE(p.max_abs, tol * std::max(1.0, p.scale)) << m->config().head_dim << " " << rows;
      EXPECT_LE(d.max_abs, tol * std::max(1.0, d.scale)) << m->config().head_dim << " " << rows;
      for (KvPolicy policy : {KvPolicy::kH2O, KvPolicy::kSqueeze, KvPolicy::kKvzip}) {
        SessionOptions c = cpu, g = gpu;
        c.cache.policy = g.cache.policy = policy;
        c.cache.budget = g.cache.budget = 40;
        const auto [same, total] = same_survivors(*m, c, g, ids);
        std::printf("head dim %d, %s, %-8s survivor sets identical: %d of %d (layer, kv head)\n", m->config().head_dim, rows,
                    kv_policy_name(policy), same, total);
        EXPECT_GE(same, total * 5 / 6) << kv_policy_name(policy) << " head dim " << m->config().head_dim << " " << rows;
      }
    }
  // what the device does not store is refused before any work, naming the flag
  auto refused = [&](KvDType k, std::optional<KvDType> v, const std::string& want) {
    SessionOptions so;
    so.device = Device::kCuda;
    so.cache.dtype = k, so.cache.dtype_v = v;
    try {
      Session s(*models[0], so);
      ADD_FAILURE() << want << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(KvDType::kQ4_0, std::nullopt, "--kv-type q4_0: the CUDA backend stores K and V as one type");
  refused(KvDType::kQ4_1, std::nullopt, "--kv-type q4_1: the CUDA backend stores K and V as one type");  // 4-bit keys
  refused(KvDType::kQ8_0, KvDType::kF16, "--kv-type-v f16: the CUDA backend stores K and V as one type");
  refused(KvDType::kQ8_0, KvDType::kQ4_0, "--kv-type-v q4_0: the CUDA backend stores K and V as one type");
}

// A decode step replays as one CUDA graph (the counts that grow live in device memory): the
// replayed steps must give exactly the logits of the same launches issued one by one, across the
// step where the key range gains a split (N passes 512), and for the policies that evict on the
// device every step (their eviction kernels are part of the replayed step).
// B sequences with different policies, budgets and contexts (so different key splits and both
// warp choices of the batched attention kernel), fed token by token (every step a decode step,
// with the mass and the evictions of h2o and squeeze; no prompt-mass atomics), once alone and once
// all together, on two dummy shapes: head dims 32 (4 query heads a kv head) and 128 (8).
struct BatchVsAlone {
  int differ = 0, rows = 0, first = -1;  // sequence steps whose logits are not the same bits
  double max_rel = 0, argmax_agree = 0;   // the largest difference over the logits' scale
  int64_t replays = 0;                    // the batch's steps replayed as one CUDA graph
};
BatchVsAlone batch_vs_alone(const Model& m, const SessionOptions& so, int B, int steps, bool evicting, KvDType kv = KvDType::kF16,
                            std::optional<KvDType> kv_v = std::nullopt) {
  auto config = [evicting, kv, kv_v](int i) {
    CacheConfig c;
    c.max_tokens = 400;
    c.dtype = kv;
    c.dtype_v = kv_v;
    switch (evicting ? i % 4 : i % 2) {
      case 0: c.max_tokens = 200 + 37 * (i % 7); break;  // full: 4 to 8 splits of its capacity
      case 1: c.policy = KvPolicy::kWindow, c.budget = 40 + i % 5; break;
      case 2: c.policy = KvPolicy::kH2O, c.budget = 48 + i % 3; break;
      default: c.policy = KvPolicy::kSqueeze, c.budget = 56, c.squeeze_metric = SqueezeMetric::kAttentionEntropy; break;
    }
    return c;
  };
  const int V = m.config().vocab_size;
  Engine lone(m, so, 1), batch(m, so, B);
  const int64_t replays0 = batch.device_graph_replays();
  std::vector<SequenceId> a, b;
  for (int i = 0; i < B; ++i) a.push_back(lone.add_sequence(config(i))), b.push_back(batch.add_sequence(config(i)));
  std::vector<int> tok(B);
  BatchVsAlone r;
  double scale = 0;
  int agree = 0;
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < B; ++i) tok[i] = 3 + (t * 31 + i * 17) % (V - 3);
    const auto y = batch.decode(b, tok);
    const std::vector<float> yb(y.begin(), y.end());
    for (int i = 0; i < B; ++i) {
      const auto x = lone.decode(std::span<const SequenceId>(&a[i], 1), std::span<const int>(&tok[i], 1));
      const float* z = yb.data() + static_cast<size_t>(i) * V;
      if (!std::equal(x.begin(), x.end(), z) && r.differ++ == 0) r.first = t * 1000 + i;
      for (int v = 0; v < V; ++v) r.max_rel = std::max(r.max_rel, double(std::fabs(x[v] - z[v]))), scale = std::max(scale, double(std::fabs(x[v])));
      agree += std::max_element(x.begin(), x.end()) - x.begin() == std::max_element(z, z + V) - z;
      ++r.rows;
    }
  }
  for (int i = 0; i < B; ++i) {
    const auto sa = lone.kv_stats(a[i]), sb = batch.kv_stats(b[i]);
    for (size_t l = 0; l < sa.size(); ++l) EXPECT_EQ(sa[l].tokens_kept, sb[l].tokens_kept) << "sequence " << i << " layer " << l;
  }
  r.max_rel /= std::max(1.0, scale);
  r.argmax_agree = double(agree) / r.rows;
  r.replays = batch.device_graph_replays() - replays0;
  std::printf("%s, batch %d%s: %d of %d sequence steps differ from the sequence alone (max %.3g of the scale, argmax agree %.3f); "
              "%lld of %d batch steps replayed as a graph\n",
              m.config().name.c_str(), B, so.batch_invariant ? ", batch-invariant" : "", r.differ, r.rows, r.max_rel, r.argmax_agree,
              static_cast<long long>(r.replays), steps);
  return r;
}
std::vector<std::unique_ptr<Model>> batch_models() {
  const std::string wide = ::testing::TempDir() + "/squeezekv_wide_llama.json";
  {
    std::ofstream f(wide);
    f << R"({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true})";
  }
  std::vector<std::unique_ptr<Model>> m;
  m.push_back(Model::dummy(test::ref_dir() + "/../../bench/configs/small-llama.json"));
  m.push_back(Model::dummy(wide));
  return m;
}

// With --batch-invariant a decode batch gives every sequence exactly what it gets alone, to the
// bit (the 4-row GEMV products, and one attention launch for the batch whose blocks each do
// their sequence's lone arithmetic): batches of 8 and 128, every policy kind; f16 rows, and Q8_0
// rows and Q4_1 values beside Q8_0 keys in a batch of 8.
TEST_F(Cuda, DecodeBatchIsBatchInvariant) {
  SessionOptions so;
  so.device = Device::kCuda;
  so.batch_invariant = true;
  const auto models = batch_models();
  for (const auto& m : models)
    for (int B : {8, 128}) {
      const BatchVsAlone r = batch_vs_alone(*m, so, B, B == 8 ? 160 : 90, true);
      EXPECT_EQ(r.differ, 0) << "batch " << B << ": first at step " << r.first / 1000 << ", sequence " << r.first % 1000;
    }
  // Q8_0 rows (head dim 128: the wide shape): the batch kernel reads the blocks as the lone one does
  const BatchVsAlone q = batch_vs_alone(*models[1], so, 8, 120, true, KvDType::kQ8_0);
  EXPECT_EQ(q.differ, 0) << "q8_0 batch 8: first at step " << q.first / 1000 << ", sequence " << q.first % 1000;
  const BatchVsAlone q4 = batch_vs_alone(*models[1], so, 8, 120, true, KvDType::kQ8_0, KvDType::kQ4_1);
  EXPECT_EQ(q4.differ, 0) << "q8_0 keys, q4_1 values, batch 8: first at step " << q4.first / 1000 << ", sequence " << q4.first % 1000;
}

// A decode step's evictions go out in one launch over a table in device memory, copied when
// its bytes change: a batch whose members change from step to step (sequences skipping steps and
// coming back, as a server's do) keeps every sequence's logits and survivors exactly as it has
// them alone (batch-invariant products), through steps that copy a new table and steps that
// replay one whose bytes are already there.
TEST_F(Cuda, DecodeBatchOfChangingMembersIsBatchInvariant) {
  SessionOptions so;
  so.device = Device::kCuda;
  so.batch_invariant = true;
  auto m = Model::dummy(test::ref_dir() + "/../../bench/configs/small-llama.json");
  const int B = 12, V = m->config().vocab_size;
  Engine lone(*m, so, 1), batch(*m, so, B);
  std::vector<SequenceId> a, b;
  for (int i = 0; i < B; ++i) {
    CacheConfig c;
    c.max_tokens = 400;
    c.policy = i % 2 ? KvPolicy::kH2O : KvPolicy::kSqueeze;
    c.budget = 40 + 3 * (i % 4);
    a.push_back(lone.add_sequence(c)), b.push_back(batch.add_sequence(c));
  }
  int differ = 0, rows = 0;
  for (int t = 0; t < 120; ++t) {
    // all twelve, then members that change with the step (a phase repeated for a few steps, so
    // that some steps find their table already on the device)
    std::vector<SequenceId> ids, alone;
    std::vector<int> tok;
    for (int i = 0; i < B; ++i) {
      if (t >= 40 && (i + t / 4) % 3 == 0) continue;
      ids.push_back(b[i]), alone.push_back(a[i]), tok.push_back(3 + (t * 31 + i * 17) % (V - 3));
    }
    const auto y = batch.decode(ids, tok);
    const std::vector<float> yb(y.begin(), y.end());
    for (size_t j = 0; j < ids.size(); ++j) {
      const auto x = lone.decode(std::span<const SequenceId>(&alone[j], 1), std::span<const int>(&tok[j], 1));
      differ += !std::equal(x.begin(), x.end(), yb.begin() + static_cast<std::ptrdiff_t>(j) * V);
      ++rows;
    }
  }
  EXPECT_EQ(differ, 0) << "of " << rows << " sequence steps";
  for (int i = 0; i < B; ++i) {
    const auto sa = lone.kv_stats(a[i]), sb = batch.kv_stats(b[i]);
    for (size_t l = 0; l < sa.size(); ++l) {
      EXPECT_EQ(sa[l].tokens_kept, sb[l].tokens_kept) << "sequence " << i << " layer " << l;
      EXPECT_LE(sb[l].tokens_kept, sb[l].budget) << "sequence " << i << " layer " << l;
    }
  }
}

// By default a batch of more than 4 sequences multiplies through cuBLAS (bf16 activations, its
// own summation order for each batch size): a sequence's logits in a batch stay within bf16's
// rounding of its lone ones (the tolerance of Bf16ModeWithinItsTolerance) and pick the same
// token on most steps; full and window caches (with h2o and squeeze a rounding difference of the
// mass may move a near-tie's survivor, after which the two runs hold different tokens). The
// cuBLAS products are recorded with the step's kernels, so the batch's steps replay as graphs
// (all but the two first of each launch list: the window caches start evicting at 5 budgets).
TEST_F(Cuda, DecodeBatchWithinItsTolerance) {
  SessionOptions so;
  so.device = Device::kCuda;
  for (const auto& m : batch_models())
    for (int B : {8, 64}) {
      const BatchVsAlone r = batch_vs_alone(*m, so, B, 60, false);
      EXPECT_LE(r.max_rel, 0.05) << "batch " << B;
      EXPECT_GE(r.argmax_agree, 0.9) << "batch " << B;
      EXPECT_GE(r.replays, 60 / 2) << "batch " << B;
    }
}

// By default a decode batch splits each sequence's keys by the batch (CudaOptions::
// batch_lone_splits off): 96 sequences of 1,100-1,385 keys on the wide shape (2 kv heads) take
// at most 8 x SMs / 192 splits each (5 on a 132-SM card) where alone they take 9-11. With the
// products fixed (gemm_rows, --batch-invariant) and the splits the only difference, the
// attention outputs differ in f32 rounding, which the next product's bf16 activations may round
// a bf16 step apart: the logits of the two batches stay within 5e-3 of their scale (the
// default batch's own tolerance is 0.05) and pick the same tokens but for near-ties.
TEST_F(Cuda, DecodeBatchSplitByTheBatchWithinRounding) {
  const auto models = batch_models();
  const Model& m = *models[1];
  const int B = 96, V = m.config().vocab_size, steps = 6;
  SessionOptions so;
  so.device = Device::kCuda;
  so.batch_invariant = true;  // the products' bits fixed; the splits set below
  std::vector<std::vector<float>> logits[2];
  for (int mode = 0; mode < 2; ++mode) {
    setenv("SQUEEZEKV_CUDA_BATCH_SPLITS", mode == 0 ? "lone" : "batch", 1);
    Engine e(m, so, B);
    unsetenv("SQUEEZEKV_CUDA_BATCH_SPLITS");
    std::vector<SequenceId> ids;
    for (int i = 0; i < B; ++i) {
      CacheConfig c;
      c.max_tokens = 1600;
      ids.push_back(e.add_sequence(c));
      const std::vector<int> p = prompt(m, 1100 + 3 * i);
      const int n = static_cast<int>(p.size()), chunk = e.prefill_chunk();
      for (int at = 0; at < n; at += chunk)
        e.prefill(ids.back(), std::span<const int>(p).subspan(at, std::min(chunk, n - at)), n);
    }
    std::vector<int> tok(B);
    for (int t = 0; t < steps; ++t) {
      for (int i = 0; i < B; ++i) tok[i] = 3 + (t * 31 + i * 17) % (V - 3);
      const auto y = e.decode(ids, tok);
      logits[mode].emplace_back(y.begin(), y.end());
    }
  }
  double worst = 0, scale = 0;
  int agree = 0, differ = 0;
  for (int t = 0; t < steps; ++t)
    for (int i = 0; i < B; ++i) {
      const float* a = logits[0][t].data() + static_cast<size_t>(i) * V;
      const float* b = logits[1][t].data() + static_cast<size_t>(i) * V;
      differ += !std::equal(a, a + V, b);
      for (int v = 0; v < V; ++v) worst = std::max(worst, double(std::fabs(a[v] - b[v]))), scale = std::max(scale, double(std::fabs(a[v])));
      agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
    }
  std::printf("batch of %d split by the batch: %d of %d sequence steps differ from the lone splits, max %.3g of the scale, argmax agree %d\n",
              B, differ, B * steps, worst / std::max(1.0, scale), agree);
  EXPECT_GT(differ, 0) << "the splits did not change: the test no longer covers the batch's splits";
  EXPECT_LE(worst, 5e-3 * std::max(1.0, scale));
  EXPECT_GE(agree, B * steps * 99 / 100);
}

TEST_F(Cuda, GraphReplayEqualsDirectLaunches) {
  auto m = Model::dummy(test::ref_dir() + "/../../bench/configs/small-llama.json");
  const auto ids = prompt(*m, 500);
  for (KvPolicy policy : {KvPolicy::kFull, KvPolicy::kWindow, KvPolicy::kH2O, KvPolicy::kSqueeze}) {
    SessionOptions on;
    on.device = Device::kCuda;
    on.device_weights = DeviceWeightFormat::kF32;
    on.prefill_chunk = 128;
    on.cache.max_tokens = 1024;
    on.cache.policy = policy;
    if (policy != KvPolicy::kFull) on.cache.budget = 200;
    SessionOptions off = on;
    off.cuda_graphs = false;
    Session a(*m, on), b(*m, off);
    setenv("SQUEEZEKV_CUDA_FUSE_KV", "0", 1);  // the decode step's KV row by its own kernel
    Session c(*m, on);
    unsetenv("SQUEEZEKV_CUDA_FUSE_KV");
    a.forward(ids);
    b.forward(ids);
    c.forward(ids);
    const int V = m->config().vocab_size;
    int differ = 0, differ_unfused = 0;
    for (int i = 0; i < 30; ++i) {
      const auto x = a.forward(std::span<const int>(&ids[i], 1));
      const std::vector<float> xa(x.begin(), x.end());
      const auto y = b.forward(std::span<const int>(&ids[i], 1));
      differ += !std::equal(xa.begin(), xa.end(), y.begin(), y.begin() + V);
      const auto z = c.forward(std::span<const int>(&ids[i], 1));
      differ_unfused += !std::equal(xa.begin(), xa.end(), z.begin(), z.begin() + V);
    }
    std::printf("%-6s graph replays %lld (off: %lld), steps whose logits differ: %d of 30\n", kv_policy_name(policy),
                static_cast<long long>(a.device_graph_replays()), static_cast<long long>(b.device_graph_replays()), differ);
    // 30 steps: the first two run directly and are captured, and so do the two after N passes
    // 512 (the keys gain a split: another grid, so another graph)
    EXPECT_GE(a.device_graph_replays(), 26) << kv_policy_name(policy);
    EXPECT_EQ(b.device_graph_replays(), 0);
    // h2o's and squeeze's prompt mass sums use float atomics (their order varies from run to
    // run), so only full and window are bit-exact; PoliciesKeepTheSameSurvivors checks the others
    if (policy == KvPolicy::kFull || policy == KvPolicy::kWindow) {
      EXPECT_EQ(differ, 0) << kv_policy_name(policy);
      EXPECT_EQ(differ_unfused, 0) << kv_policy_name(policy) << ": the KV row written by the attention kernel or by its own";
    }
  }
}

// Engine::copy_sequence on the device: the copy (made after the prompt, the original then
// removed) continues with exactly the original's logits, for caches that keep everything, evict on
// the device every step (h2o) and hold a squeeze schedule; the KV pool has a default size on a
// device (what was free after the weights, less the reserve) and counts the copies.
TEST_F(Cuda, CopiedSequenceContinuesBitForBit) {
  const auto m = Model::load(test::tinystories());
  const int V = m->config().vocab_size;
  SessionOptions so;
  so.device = Device::kCuda;
  so.prefill_chunk = 16;
  Engine engine(*m, so, 2);
  EXPECT_GT(engine.kv_pool().limit, 0);
  const std::vector<int> ids = prompt(*m, 40), next = prompt(*m, 12);
  for (KvPolicy policy : {KvPolicy::kFull, KvPolicy::kH2O, KvPolicy::kSqueeze}) {
    CacheConfig c;
    c.max_tokens = 128;
    c.policy = policy;
    c.budget = policy == KvPolicy::kFull ? 0 : 24;
    auto run = [&](bool copy) {
      SequenceId s = engine.add_sequence(c);
      for (int at = 0; at < 40; at += 16) engine.prefill(s, std::span<const int>(ids).subspan(at, std::min(16, 40 - at)), 40);
      if (copy) {
        const SequenceId t = engine.copy_sequence(s);
        const KvPoolUsage u = engine.kv_pool();
        EXPECT_EQ(u.sequences_budgeted + u.sequences_full, 2);
        EXPECT_LE(u.reserved, u.limit);
        engine.remove_sequence(s);
        s = t;
      }
      std::vector<float> out;
      for (int t : next) {
        const auto l = engine.decode(std::span<const SequenceId>(&s, 1), std::span<const int>(&t, 1));
        out.insert(out.end(), l.begin(), l.end());
      }
      engine.remove_sequence(s);
      return out;
    };
    const std::vector<float> want = run(false), got = run(true);
    ASSERT_EQ(got.size(), want.size());
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0) << kv_policy_name(policy) << ": " << differ << " of " << got.size() << " logits (" << next.size() << " x " << V << ")";
  }
  EXPECT_EQ(engine.kv_pool().reserved, 0);
}

// The Scheduler's prompt cache on the device: requests that start from a kept prefix (saved from
// device memory, restored into it) give the tokens a Scheduler that keeps nothing gives them.
TEST_F(Cuda, PromptCacheStartsFromKeptPrefixesAsCold) {
  const auto m = Model::load(test::tinystories());
  SessionOptions so;
  so.device = Device::kCuda;
  so.prefill_chunk = 16;
  const std::vector<int> doc = prompt(*m, 40);
  for (KvPolicy policy : {KvPolicy::kFull, KvPolicy::kH2O, KvPolicy::kSqueeze, KvPolicy::kKvzip}) {
    CacheConfig c;
    c.max_tokens = 128;
    c.policy = policy;
    c.budget = policy == KvPolicy::kFull ? 0 : 24;
    Engine warm_engine(*m, so, 2), cold_engine(*m, so, 2);
    Scheduler warm(warm_engine, SchedulerOptions{16 << 20}), cold(cold_engine);
    for (int q = 0; q < 3; ++q) {
      auto ask = [&](Scheduler& sched) {
        GenerationRequest r;
        r.prompt = doc;
        for (int t : prompt(*m, 4 + q)) r.prompt.push_back(t);
        r.cache_prefix = static_cast<int>(doc.size());
        r.options.max_tokens = 12;
        r.options.sampler.temperature = 0.0f;
        r.cache = c;
        GenerateResult out;
        r.on_done = [&out](const GenerateResult& res) { out = res; };
        sched.submit(std::move(r));
        while (sched.step()) {
        }
        return out;
      };
      const GenerateResult w = ask(warm), k = ask(cold);
      EXPECT_EQ(w.stop_reason, k.stop_reason) << kv_policy_name(policy) << " " << w.error;
      EXPECT_FALSE(w.tokens.empty());
      EXPECT_EQ(w.tokens, k.tokens) << kv_policy_name(policy) << " question " << q;
      EXPECT_EQ(w.cached_tokens, q == 0 ? 0 : static_cast<int>(doc.size())) << kv_policy_name(policy);
    }
    EXPECT_EQ(warm.prompt_cache().hits, 2) << kv_policy_name(policy);
    EXPECT_EQ(warm.prompt_cache().entries, 1) << kv_policy_name(policy);
    EXPECT_EQ(warm_engine.kv_pool().reserved, 0) << kv_policy_name(policy);  // an entry holds no device memory
  }
}

// Saved KV caches (docs/kv_file.md) on the device: a cache saved on CUDA and restored on CUDA
// continues bit for bit (every policy; f16 rows, q8_0 rows, q8_0 keys with q4_1 values); a file
// saved on the CPU continues on
// CUDA, and one saved on CUDA on the CPU, within the exact mode's CPU-against-CUDA tolerance of the
// run that did the prompt on that device itself (the full cache: the same rows on both).
TEST_F(Cuda, SavedCachesRestoreOnTheDeviceAndAcrossDevices) {
  const std::string path = ::testing::TempDir() + "/squeezekv_kv_file_64.json";
  {
    std::ofstream f(path);
    f << R"({"model_type": "llama", "hidden_size": 512, "intermediate_size": 512, "num_hidden_layers": 3,
             "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true})";
  }
  const auto m = Model::dummy(path);
  const int V = m->config().vocab_size;
  const std::vector<int> doc = prompt(*m, 90), next = prompt(*m, 6);
  auto continued = [&](Session& s) {
    std::vector<float> out;
    for (int t : next) {
      const auto l = s.forward(std::span<const int>(&t, 1));
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  SessionOptions cpu;
  cpu.threads = 2;
  cpu.prefill_chunk = 32;
  cpu.cache.max_tokens = 256;
  SessionOptions gpu = cpu;
  gpu.device = Device::kCuda;
  gpu.device_weights = DeviceWeightFormat::kF32;
  // f16 rows, q8_0 rows, q8_0 keys with q4_1 values
  const std::pair<KvDType, std::optional<KvDType>> row_types[] = {
      {KvDType::kF16, std::nullopt}, {KvDType::kQ8_0, std::nullopt}, {KvDType::kQ8_0, KvDType::kQ4_1}};
  for (const auto& [t, tv] : row_types)
    for (KvPolicy p : {KvPolicy::kFull, KvPolicy::kWindow, KvPolicy::kH2O, KvPolicy::kSnapKV, KvPolicy::kSqueeze, KvPolicy::kKvzip}) {
      SessionOptions g = gpu;
      g.cache.policy = p;
      g.cache.budget = p == KvPolicy::kFull ? 0 : 40;
      g.cache.dtype = t;
      g.cache.dtype_v = tv;
      Session a(*m, g);
      a.forward(doc);
      const std::vector<uint8_t> bytes = a.save_kv(doc);
      const std::vector<float> want = continued(a);
      Session b(*m, g);
      EXPECT_EQ(b.load_kv(bytes), doc);
      const std::vector<float> got = continued(b);
      EXPECT_TRUE(got == want) << kv_policy_name(p) << " " << kv_dtype_name(t) << (tv ? " with q4_1 values" : "")
                               << ": a restored device cache differs";
    }
  for (const auto& [t, tv] : row_types) {
    SessionOptions c = cpu, g = gpu;
    c.cache.dtype = g.cache.dtype = t;
    c.cache.dtype_v = g.cache.dtype_v = tv;
    Session on_cpu(*m, c), on_gpu(*m, g);
    on_cpu.forward(doc);
    on_gpu.forward(doc);
    const std::vector<uint8_t> from_cpu = on_cpu.save_kv(doc), from_gpu = on_gpu.save_kv(doc);
    const std::vector<float> cpu_own = continued(on_cpu), gpu_own = continued(on_gpu);
    Session gpu_from_cpu(*m, g), cpu_from_gpu(*m, c);
    gpu_from_cpu.load_kv(from_cpu);
    cpu_from_gpu.load_kv(from_gpu);
    const Diff dg = compare(gpu_own, continued(gpu_from_cpu), V), dc = compare(cpu_own, continued(cpu_from_gpu), V);
    std::printf("%s rows%s: CPU-saved on CUDA max err %.3g (scale %.3g), CUDA-saved on the CPU %.3g (scale %.3g)\n",
                kv_dtype_name(t), tv ? " with q4_1 values" : "", dg.max_abs, dg.scale, dc.max_abs, dc.scale);
    EXPECT_LE(dg.max_abs, 2e-3 * std::max(1.0, dg.scale)) << kv_dtype_name(t) << (tv ? " with q4_1 values" : "");
    EXPECT_LE(dc.max_abs, 2e-3 * std::max(1.0, dc.scale)) << kv_dtype_name(t) << (tv ? " with q4_1 values" : "");
  }
}

// A freed device buffer's block goes back to the backend's cache (no cudaFree, which would wait
// for the whole device) and the next buffer of the same rounded size takes it; the cached bytes
// count as free memory.
TEST_F(Cuda, FreedBlocksAreReused) {
  auto be = make_backend({Device::kCuda});
  const size_t bytes = (size_t{64} << 20) + 12345;
  void* first = nullptr;
  {
    auto a = be->alloc(bytes);
    first = a->data();
  }
  const Backend::MemoryInfo cached = be->memory();
  auto b = be->alloc(bytes - 1000);  // rounds to the same 2 MiB multiple
  EXPECT_EQ(b->data(), first);
  const Backend::MemoryInfo taken = be->memory();
  EXPECT_GE(cached.free - taken.free, static_cast<int64_t>(bytes) - (int64_t{4} << 20));
  // zeroed like a new buffer
  std::vector<unsigned char> host(4096, 1);
  be->download(host.data(), b->data(), host.size());
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](unsigned char x) { return x == 0; }));
}

}  // namespace
}  // namespace squeezekv
