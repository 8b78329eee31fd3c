// The weights of one Llama-family model, in their stored formats (mapped file or owned buffers).
// Shapes: E hidden, H*D query width, G*D kv width, F ffn width, V vocab.
#pragma once
#include <any>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/weight.h"
#include "squeezekv/model_config.h"

namespace squeezekv {

struct LayerWeights {
  std::vector<float> attn_norm;  // [E]
  WeightMatrix wq;               // [H*D][E]
  WeightMatrix wk;               // [G*D][E]
  WeightMatrix wv;               // [G*D][E]
  WeightMatrix wo;               // [E][H*D]
  std::vector<float> bq, bk, bv; // [H*D], [G*D], [G*D]  (qwen2 only)
  std::vector<float> ffn_norm;   // [E]
  WeightMatrix w_gate;           // [F][E]
  WeightMatrix w_up;             // [F][E]
  WeightMatrix w_down;           // [E][F]
};

struct ModelWeights {
  WeightMatrix tok_embd;             // [V][E]
  std::vector<float> out_norm;       // [E]
  WeightMatrix output;               // [V][E]  (the embedding when tied)
  std::vector<float> inv_freq;       // [D/2] RoPE inverse frequencies, scaling applied
  std::vector<LayerWeights> layers;  // [L]
  std::vector<std::shared_ptr<void>> keep_alive;  // mapped files and owned buffers behind the views
};

// A tensor as a format loader found it; shape in PyTorch order ([rows, cols] for a matrix).
struct TensorRef {
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  std::vector<int64_t> shape;
  size_t bytes = 0;
  bool file_backed = false;  // data is in a read-only file mapping
};

// Looks a tensor up by its GGUF name ("blk.3.attn_q.weight"); nullopt when absent.
using TensorLookup = std::function<std::optional<TensorRef>(const std::string& gguf_name)>;

// Builds and validates all weights of `cfg` from `lookup` (shapes checked, norms converted to f32).
// `rope_freq_factors`: optional per-frequency divisors (GGUF rope_freqs.weight).
std::unique_ptr<ModelWeights> build_weights(const ModelConfig& cfg, const TensorLookup& lookup,
                                            const std::string& source);

// Inverse RoPE frequencies for the config (llama3 scaling applied when configured).
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

}  // namespace squeezekv
