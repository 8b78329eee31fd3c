// Malformed model inputs must give a clear FormatError/Error naming the input, never a crash.
// CI runs this suite under AddressSanitizer too.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/json_fields.h"
#include "model/gguf.h"
#include "squeezekv/error.h"
#include "squeezekv/model.h"
#include "squeezekv/tokenizer.h"
#include "test_paths.h"

namespace squeezekv {
namespace {

namespace fs = std::filesystem;

class Malformed : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("squeezekv_malformed_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }

  // Expects Model::load to throw squeezekv::Error whose message contains `needle`.
  void expect_error(const std::string& path, const std::string& needle, const LoadOptions& o = {}) {
    try {
      Model::load(path, o);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
    }
  }

  fs::path dir_;
};

// Minimal GGUF writer for crafted headers.
struct GgufWriter {
  std::string b;
  template <typename T>
  void put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
  }
  void header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b = "GGUF";
    put(version);
    put(n_tensors);
    put(n_kv);
  }
  void tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    str(name);
    put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put(d);
    put(type);
    put(offset);
  }
  void pad() {
    while (b.size() % 32) b += '\0';
  }
};

std::string read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_F(Malformed, MissingFile) { expect_error((dir_ / "nope.gguf").string(), "does not exist"); }

TEST_F(Malformed, TruncatedRealGguf) {
  const std::string real = read_all(test::default_model());
  ASSERT_GT(real.size(), 1000000u);
  for (size_t n : {size_t{5}, size_t{20}, size_t{64}, size_t{1000}, size_t{100000}, size_t{2000000}, real.size() - 1}) {
    const std::string p = write("trunc.gguf", real.substr(0, n));
    expect_error(p, "gguf");
  }
}

TEST_F(Malformed, BadMagicIsNotTakenForGguf) {
  std::string real = read_all(test::default_model()).substr(0, 4096);
  real[0] = 'X';
  // not GGUF, no tokenizer given: refused with a hint
  expect_error(write("bad.gguf", real), "neither a GGUF file");
  EXPECT_THROW(GgufFile(write("bad2.gguf", real)), FormatError);
}

TEST_F(Malformed, UnsupportedVersion) {
  GgufWriter w;
  w.header(99, 0, 0);
  expect_error(write("v.gguf", w.b), "unsupported version 99");
}

TEST_F(Malformed, AbsurdCounts) {
  GgufWriter w;
  w.header(3, uint64_t{1} << 60, 0);
  expect_error(write("c.gguf", w.b), "absurd tensor count");
  w.header(3, 0, uint64_t{1} << 62);
  expect_error(write("k.gguf", w.b), "absurd key-value count");
  w.header(3, 0, 1);
  w.str("key");
  w.put<uint32_t>(8);  // string
  w.put<uint64_t>(uint64_t{1} << 50);
  expect_error(write("s.gguf", w.b), "truncated");
}

TEST_F(Malformed, TensorOffsetPastEnd) {
  GgufWriter w;
  w.header(3, 1, 0);
  w.tensor("token_embd.weight", {64, 4}, 0, 1 << 20);
  w.pad();
  w.b += std::string(64 * 4 * 4, '\0');
  expect_error(write("o.gguf", w.b), "runs past the end of the file");
}

TEST_F(Malformed, AbsurdDimensions) {
  GgufWriter w;
  w.header(3, 1, 0);
  w.tensor("t", {uint64_t{1} << 50, uint64_t{1} << 50}, 0, 0);
  expect_error(write("d.gguf", w.b), "absurd dimension");
  w.header(3, 1, 0);
  w.tensor("t", {4, 4, 4, 4, 4}, 0, 0);
  expect_error(write("d5.gguf", w.b), "dimensions");
}

TEST_F(Malformed, UnknownTensorType) {
  GgufWriter w;
  w.header(3, 1, 0);
  w.tensor("t", {256}, 16, 0);  // IQ2_XXS: a real ggml type we do not support
  expect_error(write("iq2.gguf", w.b), "unsupported type IQ2_XXS");
  w.header(3, 1, 0);
  w.tensor("t", {256}, 1234, 0);
  expect_error(write("u.gguf", w.b), "unsupported type unknown (1234)");
}

TEST_F(Malformed, GgufWithoutModelMetadata) {
  GgufWriter w;
  w.header(3, 0, 1);
  w.str("general.architecture");
  w.put<uint32_t>(8);
  w.str("mamba");
  expect_error(write("a.gguf", w.b), "unsupported architecture 'mamba'");
}

// Hugging Face directory: copy TinyStories and break one file at a time.
class MalformedHf : public Malformed {
 protected:
  std::string copy_tinystories() {
    const fs::path d = dir_ / "ts";
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(test::tinystories())) fs::copy_file(e.path(), d / e.path().filename());
    return d.string();
  }
};

TEST_F(MalformedHf, BrokenConfigJson) {
  const std::string d = copy_tinystories();
  write("ts/config.json", "{\"model_type\": \"llama\", ");
  expect_error(d, "not valid JSON");
}

TEST_F(MalformedHf, UnsupportedModelType) {
  const std::string d = copy_tinystories();
  write("ts/config.json", R"({"model_type": "gpt_neox"})");
  expect_error(d, "unsupported model_type 'gpt_neox'");
}

TEST_F(MalformedHf, BrokenTokenizerJson) {
  const std::string d = copy_tinystories();
  write("ts/tokenizer.json", "[1, 2");
  expect_error(d, "tokenizer.json");
}

TEST_F(MalformedHf, SafetensorsHeaderPastEnd) {
  const std::string d = copy_tinystories();
  std::string st(8, '\0');
  const uint64_t n = 1 << 30;
  std::memcpy(st.data(), &n, 8);
  write("ts/model.safetensors", st + "{}");
  expect_error(d, "runs past the end");
}

TEST_F(MalformedHf, SafetensorsOffsetsOutsideFile) {
  const std::string d = copy_tinystories();
  const std::string hdr = R"({"lm_head.weight": {"dtype": "F32", "shape": [2048, 128], "data_offsets": [0, 1048576]}})";
  std::string st(8, '\0');
  const uint64_t n = hdr.size();
  std::memcpy(st.data(), &n, 8);
  write("ts/model.safetensors", st + hdr + std::string(100, '\0'));
  expect_error(d, "do not fit");
}

// Found by fuzz_hf: numbers that do not fit the type they are read as (a float of 2.4e45 read
// as an int was undefined behaviour) are refused naming the file.
TEST_F(MalformedHf, NumbersOutOfRange) {
  const std::string base = R"({"model_type": "llama", "num_hidden_layers": 2, "intermediate_size": 64,
      "num_attention_heads": 4, "vocab_size": 2048, "max_position_embeddings": 512, )";
  const std::string d = copy_tinystories();
  for (const std::string& field : {std::string(R"("hidden_size": 2.42222e+45})"), std::string(R"("hidden_size": 1e300})"),
                                   std::string(R"("hidden_size": 99999999999999999999})"),
                                   std::string(R"("hidden_size": 64, "rms_norm_eps": 1e300})"),
                                   std::string(R"("hidden_size": 64, "num_key_value_heads": -1e40})")}) {
    write("ts/config.json", base + field);
    expect_error(d, "config.json");
  }
  const std::string hdr = R"({"lm_head.weight": {"dtype": "F32", "shape": [1e30, 128], "data_offsets": [0, 8]}})";
  std::string st(8, '\0');
  const uint64_t n = hdr.size();
  std::memcpy(st.data(), &n, 8);
  write("ts/config.json", base + R"("hidden_size": 64})");
  write("ts/model.safetensors", st + hdr + std::string(8, '\0'));
  expect_error(d, "model.safetensors");
}

TEST_F(MalformedHf, MissingWeights) {
  const std::string d = copy_tinystories();
  fs::remove(fs::path(d) / "model.safetensors");
  expect_error(d, "no model.safetensors");
}

TEST_F(Malformed, Llama2cTruncatedAndAbsurd) {
  const std::string real = read_all(test::stories260k());
  LoadOptions o{test::tok512()};
  expect_error(write("t.bin", real.substr(0, 10)), "truncated", o);
  expect_error(write("t2.bin", real.substr(0, real.size() / 2)), "the header implies", o);
  std::string absurd = real.substr(0, 4096);
  const int32_t big = 1 << 30;
  std::memcpy(absurd.data(), &big, 4);
  expect_error(write("t3.bin", absurd), "out of range", o);
  const std::string tok = read_all(test::tok512());
  expect_error(test::stories260k(), "truncated", LoadOptions{write("tok.bin", tok.substr(0, 100))});
}

// Every input a fuzz target crashed on (tests/fuzz/regressions/<target>/, docs/ROBUSTNESS.md):
// a GGUF loads or is refused; any bytes tokenize without throwing, to ids that decode back to
// the same bytes (byte-level BPE keeps invalid UTF-8 as byte tokens) unless a character the
// vocabulary lacks became the unk (control) token.
TEST(FuzzRegressions, EveryFoundInputIsHandled) {
  const fs::path root = fs::path(test::ref_dir()) / ".." / "fuzz" / "regressions";
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  int n = 0;
  for (const auto& e : fs::directory_iterator(root / "gguf")) {
    try {
      Model::load(e.path().string());
    } catch (const Error&) {
    }
    ++n;
  }
  // Hugging Face directories: config.json, tokenizer.json and model.safetensors cut at the separator
  const std::string sep = "\n#--file--#\n";
  for (const auto& e : fs::directory_iterator(root / "hf")) {
    const std::string in = read(e.path());
    const fs::path dir = fs::temp_directory_path() / ("squeezekv-regression-hf-" + std::to_string(n));
    fs::remove_all(dir);
    fs::create_directories(dir);
    size_t at = 0;
    for (const char* name : {"config.json", "tokenizer.json", "model.safetensors"}) {
      if (at > in.size()) break;
      const size_t end = std::min(in.find(sep, at), in.size());
      std::ofstream(dir / name, std::ios::binary) << in.substr(at, end - at);
      at = end + sep.size();
    }
    try {
      Model::load(dir.string());
    } catch (const Error&) {
    }
    fs::remove_all(dir);
    ++n;
  }
  auto m = Model::load(test::default_model());
  const Tokenizer& tok = m->tokenizer();
  for (const auto& e : fs::directory_iterator(root / "tokenizer")) {
    const std::string s = read(e.path());
    std::vector<int> ids;
    ASSERT_NO_THROW(ids = tok.encode(s, false, false)) << e.path();
    bool unk = false;
    for (int id : ids) {
      ASSERT_TRUE(id >= 0 && id < tok.vocab_size()) << e.path();
      unk = unk || tok.is_control(id);
    }
    if (!unk) {
      EXPECT_EQ(tok.decode(ids), s) << e.path();
    }
    ++n;
  }
  EXPECT_GE(n, 5);
}

// The one checked JSON reader behind config.json, requests and sweep configs: each wrong value is
// the caller's exception with the field and what was expected; values that fit are read exactly.
TEST(JsonFields, ReadsWhatFitsAndNamesWhatDoesNot) {
  const auto j = nlohmann::json::parse(
      R"({"i": 7, "f": 4096.0, "big": 18446744073709551615, "frac": 1.5, "huge": 1e40, "null": null, "s": "x",)"
      R"( "b": true, "list": [1, 2.0, 3], "o": {"k": 2}})");
  struct Bad : std::runtime_error {
    std::string key;
    Bad(const std::string& k, const std::string& m) : std::runtime_error(m), key(k) {}
  };
  const JsonFields f(j, "where: ", [](const std::string& k, const std::string& m) { throw Bad(k, m); });
  EXPECT_EQ(f.integer("i", 0), 7);
  EXPECT_EQ(f.integer("f", 0), 4096);             // Python's 4096.0
  EXPECT_EQ(f.integer("null", 5), 5);             // null is absent
  EXPECT_EQ(f.integer("missing", 6), 6);
  EXPECT_EQ(f.integers("list", 0, 9), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(f.at("o", "o.").integer("k", 0), 2);
  EXPECT_EQ(f.text("s", ""), "x");
  EXPECT_TRUE(f.boolean("b", false));
  EXPECT_FLOAT_EQ(f.real("frac", 0.0f), 1.5f);
  auto message = [](auto&& read) -> std::string {
    try {
      read();
    } catch (const Bad& e) {
      return e.key + " | " + e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([&] { f.integer("big", 0); }), "big | where: big: expected an integer in [-2147483648, 2147483647], got 18446744073709551615");
  EXPECT_EQ(message([&] { f.integer("frac", 0); }), "frac | where: frac: expected an integer in [-2147483648, 2147483647], got 1.5");
  EXPECT_EQ(message([&] { f.int64("i", 0, 8); }), "i | where: i: expected an integer >= 8, got 7");
  EXPECT_EQ(message([&] { f.real("huge", 0.0f); }), "huge | where: huge: expected a number in [-3.40282e+38, 3.40282e+38], got 1e+40");
  EXPECT_EQ(message([&] { f.required_text("missing"); }), "missing | where: missing: expected a string, got nothing");
  EXPECT_EQ(message([&] { f.boolean("s", false); }), "s | where: s: expected true or false, got \"x\"");
  EXPECT_EQ(message([&] { f.at("s", "s."); }), "s | where: s: expected an object, got \"x\"");
  // bytes that are not UTF-8 are quoted as U+FFFD (the message itself stays valid UTF-8)
  nlohmann::json bad = nlohmann::json::object();
  bad["v"] = std::string("a\xff");
  EXPECT_EQ(JsonFields::quote(bad["v"]), "\"a\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace squeezekv
