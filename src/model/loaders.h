// Format loaders: each reads config, tokenizer and weights of one file format into a Model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "squeezekv/model.h"

namespace squeezekv {

std::unique_ptr<Model> load_gguf(const std::string& path);
std::unique_ptr<Model> load_hf_dir(const std::string& dir);
std::unique_ptr<Model> load_llama2c(const std::string& path, const std::string& tokenizer_path);

// Random weights of the shape config.json describes (dummy.cc), BF16 or a quantized preset
// (type: --dummy-type, llama.cpp's preset names; an unknown one throws naming the flag); the same
// for every seed.
// Refused before any allocation when they would take more than max_memory bytes (0: no limit)
// or most of this machine's memory.
std::unique_ptr<Model> make_dummy_model(const std::string& config_path, uint64_t seed, int64_t max_memory = 0,
                                        const std::string& type = "BF16");
// The bytes a dummy model of this shape and preset allocates (norms and biases BF16).
int64_t dummy_weight_bytes(const ModelConfig& c, bool tied, const std::string& type = "BF16");
// Sizes for messages: "812.5 KiB", "15317.0 MiB".
std::string mib(int64_t bytes);

// A Hugging Face config.json file as a ModelConfig (tied: whether the output shares the embedding).
ModelConfig read_hf_config(const std::string& config_path, bool* tied);

// Checks a config a loader produced: positive sizes, heads divisible by kv heads, sane bounds.
void validate_config(const ModelConfig& cfg, const std::string& source);

}  // namespace squeezekv
