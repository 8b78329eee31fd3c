// A loaded model: hyper-parameters, tokenizer, chat template and weights (const once loaded, so one
// model serves many sequences). Loads GGUF files, Hugging Face directories (config.json +
// safetensors + tokenizer.json) and llama2.c checkpoints (with a tok*.bin tokenizer).
// Thread safety: immutable after load; share freely across sessions.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "squeezekv/model_config.h"
#include "squeezekv/tokenizer.h"

namespace squeezekv {

struct ModelWeights;  // src/model/weights.h

struct LoadOptions {
  std::string tokenizer_path;  // llama2.c checkpoints only: the tok*.bin file
  int64_t max_memory = 0;      // --max-memory: the weights must fit in these bytes (0: no limit)
  // Model::dummy only (--dummy-type): BF16, or a quantized preset with the tensor-type mix that
  // llama.cpp's quantizer writes for it: Q8_0, Q6_K, Q5_K_M, Q4_K_M, Q5_1, Q5_0, Q4_1, Q4_0
  // (output.weight Q6_K except in Q8_0; the _M presets' attn_v and ffn_down Q6_K on the first and
  // last eighth of the layers and every third between)
  std::string dummy_type = "BF16";
};

class Model {
 public:
  // Picks the format from the path: a directory is Hugging Face, a file starting with "GGUF" is
  // GGUF, anything else is a llama2.c checkpoint (needs options.tokenizer_path).
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& options = {});
  // Random weights of the shape a Hugging Face config.json describes (for speed runs where the
  // real weights cannot go), BF16 or options.dummy_type; the weights depend on the seed only. Its
  // tokenizer knows bytes.
  // options.max_memory is checked before anything is allocated.
  static std::unique_ptr<Model> dummy(const std::string& config_json, uint64_t seed = 1, const LoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& chat_template() const { return chat_template_; }
  const ModelWeights& weights() const { return *weights_; }
  // The matrices' storage: total bytes read by one decode step (every matrix once; the embedding
  // row is not counted unless the output head shares it) and bytes per stored type, largest first.
  struct WeightSummary {
    int64_t matrix_bytes = 0;
    int64_t total_bytes = 0;  // every matrix and the embedding table, each once (what the model holds)
    std::vector<std::pair<std::string, int64_t>> bytes_by_type;
  };
  WeightSummary weight_summary() const;
  // What identifies these weights in a saved KV cache (docs/kv_file.md): a 64-bit FNV-1a hash of
  // the hyper-parameters, every norm vector, the tokenizer's tokens and samples of the embedding
  // table's bytes (its type, first and last 4 KiB): the same for every load of one file, whatever
  // the device or decode arithmetic, different for another model, fine-tune or quantization.
  uint64_t fingerprint() const { return fingerprint_; }

  Model(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, std::string chat_template,
        std::unique_ptr<ModelWeights> weights);

 private:
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string chat_template_;
  std::unique_ptr<ModelWeights> weights_;
  uint64_t fingerprint_ = 0;
};

}  // namespace squeezekv
