#include "model/gguf.h"

#include <cstring>
#include <fstream>
#include <limits>

#include "squeezekv/error.h"

namespace squeezekv {
namespace {

constexpr uint64_t kMaxCount = uint64_t{1} << 24;  // keys, tensors or array items: far above real files

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path) : p_(data), end_(data + size), path_(path) {}

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    return s;
  }
  void skip(uint64_t n, const char* what) {
    need(n, what);
    p_ += n;
  }
  size_t offset(const uint8_t* base) const { return static_cast<size_t>(p_ - base); }
  [[noreturn]] void fail(const std::string& msg) const { throw FormatError("gguf: " + path_ + ": " + msg); }

 private:
  void need(uint64_t n, const char* what) const {
    if (n > static_cast<uint64_t>(end_ - p_)) fail(std::string("truncated file while reading ") + what);
  }
  const uint8_t* p_;
  const uint8_t* end_;
  const std::string& path_;
};

enum : uint32_t {
  kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64,
};

double read_number(Cursor& c, uint32_t type, bool* ok) {
  *ok = true;
  switch (type) {
    case kU8: return c.read<uint8_t>("value");
    case kI8: return c.read<int8_t>("value");
    case kU16: return c.read<uint16_t>("value");
    case kI16: return c.read<int16_t>("value");
    case kU32: return c.read<uint32_t>("value");
    case kI32: return c.read<int32_t>("value");
    case kF32: return c.read<float>("value");
    case kBool: return c.read<uint8_t>("value") != 0;
    case kU64: return static_cast<double>(c.read<uint64_t>("value"));
    case kI64: return static_cast<double>(c.read<int64_t>("value"));
    case kF64: return c.read<double>("value");
    default: *ok = false; return 0;
  }
}

GgufValue read_value(Cursor& c, uint32_t type, const std::string& key) {
  GgufValue v;
  if (type == kString) {
    v.kind = GgufValue::Kind::kString;
    v.s = c.string("string value");
    return v;
  }
  if (type == kArray) {
    v.kind = GgufValue::Kind::kArray;
    const uint32_t et = c.read<uint32_t>("array type");
    const uint64_t n = c.read<uint64_t>("array length");
    if (n > kMaxCount) c.fail("array '" + key + "' has absurd length " + std::to_string(n));
    if (et == kString) {
      v.strings.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) v.strings.push_back(c.string("string array item"));
    } else {
      v.numbers.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) {
        bool ok;
        v.numbers.push_back(read_number(c, et, &ok));
        if (!ok) c.fail("array '" + key + "' has unsupported item type " + std::to_string(et));
      }
    }
    return v;
  }
  if (type == kU64 || type == kI64) {  // read 64-bit integers exactly
    v.kind = GgufValue::Kind::kInt;
    v.i = type == kI64 ? c.read<int64_t>("value") : static_cast<int64_t>(c.read<uint64_t>("value"));
    v.f = static_cast<double>(v.i);
    return v;
  }
  bool ok;
  const double x = read_number(c, type, &ok);
  if (!ok) c.fail("key '" + key + "' has unknown value type " + std::to_string(type));
  if (type == kF32 || type == kF64) {
    v.kind = GgufValue::Kind::kFloat;
    v.f = x;
  } else if (type == kBool) {
    v.kind = GgufValue::Kind::kBool;
    v.i = x != 0;
  } else {
    v.kind = GgufValue::Kind::kInt;
    v.i = static_cast<int64_t>(x);  // at most 32 bits: exact in a double
  }
  v.f = x;
  return v;
}

std::optional<DType> ggml_type(uint32_t t) {
  switch (t) {
    case 0: return DType::F32;
    case 1: return DType::F16;
    case 2: return DType::Q4_0;
    case 3: return DType::Q4_1;
    case 6: return DType::Q5_0;
    case 7: return DType::Q5_1;
    case 8: return DType::Q8_0;
    case 10: return DType::Q2_K;
    case 11: return DType::Q3_K;
    case 12: return DType::Q4_K;
    case 13: return DType::Q5_K;
    case 14: return DType::Q6_K;
    case 20: return DType::IQ4_NL;
    case 23: return DType::IQ4_XS;
    case 30: return DType::BF16;
    default: return std::nullopt;
  }
}

const char* ggml_type_name(uint32_t t) {
  static const char* kNames[] = {"F32",  "F16",  "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1",
                                 "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",
                                 "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
                                 "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16"};
  return t < sizeof(kNames) / sizeof(kNames[0]) ? kNames[t] : "unknown";
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  return f.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

GgufFile::GgufFile(const std::string& path) {
  try {
    file_ = std::make_unique<MappedFile>(path);
  } catch (const Error& e) {
    throw FormatError(std::string("gguf: ") + e.what());
  }
  const uint8_t* base = file_->data();
  const size_t size = file_->size();
  const std::string& p = file_->path();
  Cursor c(base, size, p);
  if (size < 4 || std::memcmp(base, "GGUF", 4) != 0) c.fail("bad magic (expected 'GGUF')");
  c.skip(4, "magic");
  const uint32_t version = c.read<uint32_t>("version");
  if (version != 2 && version != 3) c.fail("unsupported version " + std::to_string(version) + " (expected 2 or 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("key-value count");
  if (n_tensors > kMaxCount) c.fail("absurd tensor count " + std::to_string(n_tensors));
  if (n_kv > kMaxCount) c.fail("absurd key-value count " + std::to_string(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("key");
    const uint32_t type = c.read<uint32_t>("value type");
    kv_[key] = read_value(c, type, key);
  }
  uint64_t alignment = 32;
  if (auto a = get_int("general.alignment")) {
    if (*a <= 0 || (*a & (*a - 1)) != 0) c.fail("general.alignment " + std::to_string(*a) + " is not a power of two");
    alignment = static_cast<uint64_t>(*a);
  }
  struct Raw {
    uint64_t offset;
  };
  std::vector<Raw> raw;
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("tensor name");
    const uint32_t n_dims = c.read<uint32_t>("tensor n_dims");
    if (n_dims == 0 || n_dims > 4) c.fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (expected 1 to 4)");
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>("tensor dims");
      if (dim == 0 || dim > (uint64_t{1} << 40) || n_el > (uint64_t{1} << 42) / dim)
        c.fail("tensor '" + t.name + "' has absurd dimension " + std::to_string(dim));
      n_el *= dim;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    const uint32_t type = c.read<uint32_t>("tensor type");
    const auto dt = ggml_type(type);
    if (!dt)
      c.fail("tensor '" + t.name + "' has unsupported type " + ggml_type_name(type) + " (" + std::to_string(type) +
             "); supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS");
    t.type = *dt;
    const int bv = dtype_info(t.type).block_values;
    if (t.dims[0] % bv != 0)
      c.fail("tensor '" + t.name + "' row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
             std::string(dtype_info(t.type).name) + " block size " + std::to_string(bv));
    t.bytes = dtype_bytes(t.type, static_cast<int64_t>(n_el));
    raw.push_back({c.read<uint64_t>("tensor offset")});
    tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (c.offset(base) + alignment - 1) / alignment * alignment;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensor& t = tensors_[i];
    const uint64_t off = raw[i].offset;
    if (off % alignment != 0) c.fail("tensor '" + t.name + "' offset " + std::to_string(off) + " is not aligned");
    if (data_start > size || off > size - data_start || t.bytes > size - data_start - off)
      c.fail("tensor '" + t.name + "' data (offset " + std::to_string(off) + ", " + std::to_string(t.bytes) +
             " bytes) runs past the end of the file (" + std::to_string(size) + " bytes)");
    t.data = base + data_start + off;
    if (!by_name_.emplace(t.name, i).second) c.fail("duplicate tensor name '" + t.name + "'");
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::optional<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->kind != GgufValue::Kind::kInt && v->kind != GgufValue::Kind::kBool)
    throw FormatError("gguf: " + path() + ": key '" + key + "' is not an integer");
  return v->i;
}

std::optional<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->kind == GgufValue::Kind::kString || v->kind == GgufValue::Kind::kArray)
    throw FormatError("gguf: " + path() + ": key '" + key + "' is not a number");
  return v->f;
}

std::optional<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->kind != GgufValue::Kind::kString) throw FormatError("gguf: " + path() + ": key '" + key + "' is not a string");
  return v->s;
}

std::optional<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->kind != GgufValue::Kind::kBool && v->kind != GgufValue::Kind::kInt)
    throw FormatError("gguf: " + path() + ": key '" + key + "' is not a bool");
  return v->i != 0;
}

const GgufTensor* GgufFile::tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace squeezekv
