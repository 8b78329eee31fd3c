// Hyper-parameters of a loaded model, apart from runtime settings.
#pragma once
#include <cstdint>
#include <string>

namespace squeezekv {

enum class Arch : uint8_t { kLlama, kQwen2 };

struct RopeScaling {  // llama3-style frequency scaling; factor 0 = none
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_context = 8192;
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string name;      // file or directory the model came from
  int n_layers = 0;      // L
  int dim = 0;           // E: hidden size
  int n_heads = 0;       // H
  int n_kv_heads = 0;    // G
  int head_dim = 0;      // D
  int ffn_dim = 0;       // F
  int vocab_size = 0;    // V
  int context_length = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool rope_adjacent_pairs = false;  // true: (2i, 2i+1) pairs (GGUF llama, llama2.c); false: halves
  RopeScaling rope_scaling;
  bool qkv_bias = false;

  // f16 bytes of K and V for one token across all layers (no eviction).
  int64_t kv_bytes_per_token_f16() const {
    return static_cast<int64_t>(n_layers) * 2 * n_kv_heads * head_dim * 2;
  }
};

const char* arch_name(Arch a);

}  // namespace squeezekv
