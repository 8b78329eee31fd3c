// Format loaders: each reads config, tokenizer and weights of one file format into a Model.
#pragma once
#include <memory>
#include <string>

#include "squeezekv/model.h"

namespace squeezekv {

std::unique_ptr<Model> load_gguf(const std::string& path);
std::unique_ptr<Model> load_hf_dir(const std::string& dir);
std::unique_ptr<Model> load_llama2c(const std::string& path, const std::string& tokenizer_path);

// Checks a config a loader produced: positive sizes, heads divisible by kv heads, sane bounds.
void validate_config(const ModelConfig& cfg, const std::string& source);

}  // namespace squeezekv
