// GGUF v2/v3 reader over a memory map (spec: ggml's docs/gguf.md). Every count, length, dimension
// and offset is checked against the file before use, so a malformed file is an error, not a crash.
// Thread safety: immutable after construction.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "squeezekv/dtype.h"

namespace squeezekv {

struct GgufValue {
  enum class Kind { kInt, kFloat, kBool, kString, kArray } kind = Kind::kInt;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<std::string> strings;  // array of strings
  std::vector<double> numbers;       // array of numbers (ints, floats or bools)
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // ne[0] first: the contiguous dimension
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // throws FormatError naming the path and the fault

  const std::string& path() const { return file_->path(); }
  const GgufValue* find(const std::string& key) const;
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_float(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;
  const GgufTensor* tensor(const std::string& name) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> by_name_;
};

// True when the file starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

}  // namespace squeezekv
