// Fuzz target: saved KV caches (docs/kv_file.md) read back. The input is a cache file's bytes for a
// tiny random-weight model (2 layers, 1 kv head of 32, 300 tokens). Session::load_kv into a session
// with fixed settings, and Engine::load_sequence with the file's own settings (under a memory limit,
// so a header that asks for a huge context is refused, not allocated), must restore a cache that
// then decodes, or throw squeezekv::Error: never a crash, a sanitizer report or a runaway allocation.
// With SQUEEZEKV_FUZZ_WRITE_SEEDS=DIR set, the first call writes the seed corpus instead: caches
// saved by real sessions under several policies and row types.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "squeezekv/engine.h"
#include "squeezekv/error.h"
#include "squeezekv/session.h"

namespace {

using namespace squeezekv;

const char* kConfig = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
  "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 300, "max_position_embeddings": 256,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": true})";

const Model& model() {
  static const std::unique_ptr<Model> m = Model::dummy(fuzz::write_file("config.json", kConfig), 7);
  return *m;
}

SessionOptions options(const CacheConfig& c) {
  SessionOptions so;
  so.threads = 1;
  so.prefill_chunk = 16;
  so.max_memory = 64 << 20;
  so.cache = c;
  return so;
}

CacheConfig fixed() {
  CacheConfig c;
  c.policy = KvPolicy::kH2O;
  c.budget = 12;
  c.max_tokens = 64;
  return c;
}

std::vector<int> tokens(int n, int salt) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 11 + 3) % 300;
  return t;
}

void write_seeds(const std::string& dir) {
  struct Seed {
    const char* name;
    KvPolicy policy;
    KvDType k, v;
    int budget;
  };
  const Seed seeds[] = {{"h2o", KvPolicy::kH2O, KvDType::kF16, KvDType::kF16, 12},
                        {"full", KvPolicy::kFull, KvDType::kF16, KvDType::kF16, 0},
                        {"squeeze", KvPolicy::kSqueeze, KvDType::kF16, KvDType::kF16, 10},
                        {"kvzip_q8", KvPolicy::kKvzip, KvDType::kQ8_0, KvDType::kQ8_0, 10},
                        {"window_q4", KvPolicy::kWindow, KvDType::kQ4_0, KvDType::kQ4_1, 8},
                        {"pyramidkv", KvPolicy::kPyramidKV, KvDType::kF32, KvDType::kF32, 10}};
  for (const Seed& s : seeds) {
    CacheConfig c = fixed();
    c.policy = s.policy;
    c.budget = s.budget;
    c.dtype = s.k;
    c.dtype_v = s.v;
    if (s.policy == KvPolicy::kPyramidKV) c.snapkv_window = 4;
    Session session(model(), options(c));
    const std::vector<int> t = tokens(40, static_cast<int>(s.policy));
    session.forward(t);
    const std::vector<uint8_t> bytes = session.save_kv(t);
    std::ofstream(dir + "/" + s.name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool seeds_written = [] {
    if (const char* dir = std::getenv("SQUEEZEKV_FUZZ_WRITE_SEEDS")) {
      write_seeds(dir);
      std::exit(0);
    }
    return false;
  }();
  (void)seeds_written;
  const std::span<const uint8_t> bytes(data, size);
  try {
    Session s(model(), options(fixed()));
    const std::vector<int> covered = s.load_kv(bytes, "fuzz");
    if (covered.size() < 64) {
      const int next = 5;
      s.forward(std::span<const int>(&next, 1));  // a restored cache decodes
    }
  } catch (const Error&) {
  }
  try {
    SessionOptions so = options(fixed());
    Engine e(model(), so, 2);
    std::vector<int> covered;
    const SequenceId id = e.load_sequence(bytes, &covered, "fuzz");
    if (e.position(id) < e.max_tokens(id)) {
      const int next = 7;
      e.decode(std::span<const SequenceId>(&id, 1), std::span<const int>(&next, 1));
    }
  } catch (const Error&) {
  }
  return 0;
}
