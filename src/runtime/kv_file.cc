// Saved KV caches (kv_file.h; the format: docs/kv_file.md).
#include "runtime/kv_file.h"

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/json_fields.h"
#include "kv/policy.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

using json = nlohmann::json;
constexpr char kMagic[4] = {'S', 'Q', 'K', 'V'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kMaxHeader = 64ull << 20;  // the JSON header (about 1 KiB a layer)
constexpr int kMaxPolicyState = 16;           // numbers a policy saves (3 at most today)

std::string hex64(uint64_t x) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(x));
  return b;
}

template <class T>
void put(std::vector<uint8_t>& out, const T* p, size_t n) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n * sizeof(T));
}

// Reads the payload in order; the caller has checked that the sizes add up to what is there.
struct Cursor {
  std::span<const uint8_t> bytes;
  size_t at = 0;
  template <class T>
  void take(std::vector<T>& dst, size_t n) {
    dst.resize(n);
    if (n > 0) std::memcpy(dst.data(), bytes.data() + at, n * sizeof(T));
    at += n * sizeof(T);
  }
};

}  // namespace

std::vector<uint8_t> serialize_sequence(const Model& model, const SequenceState& seq, std::span<const int> tokens) {
  const ModelConfig& mc = model.config();
  if (seq.config.policy == KvPolicy::kCustom)
    throw Error("kv save: a cache of the custom policy cannot be saved (its scorer is code, not data)");
  if (static_cast<int64_t>(tokens.size()) != seq.pos)
    throw Error("kv save: the sequence has run " + std::to_string(seq.pos) + " tokens but " + std::to_string(tokens.size()) +
                " token ids were given");
  json h;
  h["format"] = "squeezekv kv cache";
  h["model"] = {{"arch", arch_name(mc.arch)}, {"n_layers", mc.n_layers}, {"n_kv_heads", mc.n_kv_heads},
                {"head_dim", mc.head_dim}, {"vocab_size", mc.vocab_size}, {"fingerprint", hex64(model.fingerprint())}};
  json cache = json::object();
  for (const KvOption& o : kv_options()) cache[o.key] = o.get(seq.config);
  h["cache"] = cache;
  h["ctx"] = seq.max_tokens;
  h["position"] = seq.pos;
  h["context"] = seq.context.size();
  if (const SqueezeCoordinator* c = seq.caches.coordinator.get()) {
    json reports = json::array();
    for (int l = 0; l < c->n_layers(); ++l) {
      const auto r = c->concentration(l);
      reports.push_back(r ? json(*r) : json(nullptr));
    }
    h["coordinator"] = {{"token_cap", c->token_cap()}, {"reports", reports}};
  }
  std::vector<LayerCache::Image> images;
  json layers = json::array();
  for (const LayerCache& lc : seq.caches.layers) {
    images.push_back(lc.image());
    const LayerCache::Image& im = images.back();
    layers.push_back({{"count", im.rows.count}, {"newest", im.rows.newest}, {"live", im.rows.live},
                      {"tokens_seen", im.tokens_seen}, {"last_step_rows", im.last_step_rows}, {"policy", im.policy}});
  }
  h["layers"] = layers;
  const std::string header = h.dump();
  std::vector<uint8_t> out;
  put(out, kMagic, 4);
  put(out, &kVersion, 1);
  const uint64_t hb = header.size();
  put(out, &hb, 1);
  put(out, header.data(), header.size());
  put(out, tokens.data(), tokens.size());
  put(out, seq.context.data(), seq.context.size());
  for (const LayerCache::Image& im : images) {
    put(out, im.rows.k.data(), im.rows.k.size());
    put(out, im.rows.v.data(), im.rows.v.size());
    put(out, im.rows.pos.data(), im.rows.pos.size());
    put(out, im.rows.mass.data(), im.rows.mass.size());
    put(out, im.rows.k_offset.data(), im.rows.k_offset.size());
    put(out, im.rows.ring_k.data(), im.rows.ring_k.size());
    put(out, im.rows.ring_v.data(), im.rows.ring_v.size());
    put(out, im.rows.ring_pos.data(), im.rows.ring_pos.size());
  }
  return out;
}

SavedSequence parse_saved_sequence(std::span<const uint8_t> bytes, const Model& model, const std::string& source) {
  const std::string where = "kv cache '" + source + "': ";
  auto bad = [&](const std::string& m) -> void { throw FormatError(where + m); };
  if (bytes.size() < 16 || std::memcmp(bytes.data(), kMagic, 4) != 0) bad("not a squeezekv KV cache (no SQKV magic)");
  uint32_t version = 0;
  uint64_t hb = 0;
  std::memcpy(&version, bytes.data() + 4, 4);
  std::memcpy(&hb, bytes.data() + 8, 8);
  if (version != kVersion) bad("format version " + std::to_string(version) + " (this build reads " + std::to_string(kVersion) + ")");
  if (hb > kMaxHeader || hb > bytes.size() - 16) bad("its header of " + std::to_string(hb) + " bytes runs past the end");
  json h;
  try {
    h = json::parse(bytes.begin() + 16, bytes.begin() + 16 + static_cast<ptrdiff_t>(hb));
  } catch (const json::exception& e) {
    bad(std::string("its header is not JSON: ") + e.what());
  }
  if (!h.is_object()) bad("its header is not a JSON object");
  const JsonFields top(h, where, [](const std::string&, const std::string& m) { throw FormatError(m); });

  // the model it was made for
  const ModelConfig& mc = model.config();
  const JsonFields m = top.at("model", where + "model.");
  const std::string arch = m.required_text("arch");
  const int L = m.required_integer("n_layers", 1, 1 << 16), G = m.required_integer("n_kv_heads", 1, 1 << 16),
            D = m.required_integer("head_dim", 1, 1 << 16), V = m.required_integer("vocab_size", 1, INT32_MAX);
  if (arch != arch_name(mc.arch) || L != mc.n_layers || G != mc.n_kv_heads || D != mc.head_dim || V != mc.vocab_size)
    throw Error(where + "it was saved for another model (" + arch + ", " + std::to_string(L) + " layers, " + std::to_string(G) +
                " kv heads of " + std::to_string(D) + ", vocabulary " + std::to_string(V) + "), not this one (" + arch_name(mc.arch) +
                ", " + std::to_string(mc.n_layers) + " layers, " + std::to_string(mc.n_kv_heads) + " kv heads of " +
                std::to_string(mc.head_dim) + ", vocabulary " + std::to_string(mc.vocab_size) + ")");
  if (m.required_text("fingerprint") != hex64(model.fingerprint()))
    throw Error(where + "it was saved for other weights of this shape (fingerprint " + m.required_text("fingerprint") +
                ", this model's " + hex64(model.fingerprint()) + ")");

  // the settings that shaped it
  SavedSequence s;
  const JsonFields cache = top.at("cache", where + "cache.");
  const CacheConfig defaults;
  for (const KvOption& o : kv_options()) {
    if (o.may_be_absent && !cache.has(o.key)) continue;  // written before the setting existed: its default
    const std::string v = cache.required_text(o.key);
    // (a default's text need not parse back: recent -1; nor need K and V's joint type, "q4_0/q4_1",
    // which type_k and type_v carry one by one)
    if (v == o.get(defaults) || (std::string(o.key) == "type" && v.find('/') != std::string::npos)) continue;
    try {
      o.set(s.cache, v);
    } catch (const Error& e) {
      bad(std::string("cache.") + o.key + ": " + e.what());
    }
  }
  const int ctx = top.required_integer("ctx", 1, 1 << 24);
  s.cache.max_tokens = ctx;
  if (s.cache.policy == KvPolicy::kCustom) bad("cache.policy: custom caches are never saved");
  try {
    validate(s.cache);
  } catch (const Error& e) {
    bad(std::string("cache: ") + e.what());
  }
  const int pos = top.required_integer("position", 0, ctx);
  const int n_context = top.required_integer("context", 0, ctx);

  if (const json* c = top.get("coordinator")) {
    if (!has_coordinator(s.cache)) bad("coordinator: only a squeeze cache (or --kv-layer-alloc squeeze) has one");
    s.has_coordinator = true;
    const JsonFields cf(*c, where + "coordinator.", [](const std::string&, const std::string& msg) { throw FormatError(msg); });
    s.token_cap = cf.int64("token_cap", 0, 0, ctx);
    const json* r = cf.get("reports");
    if (r == nullptr || !r->is_array() || static_cast<int>(r->size()) != L) cf.fail("reports", std::to_string(L) + " numbers or nulls");
    for (const json& x : *r) {
      if (x.is_null()) s.reports.push_back(std::numeric_limits<double>::quiet_NaN());
      else if (x.is_number() && std::isfinite(x.get<double>())) s.reports.push_back(x.get<double>());
      else cf.fail("reports", "finite numbers or nulls");
    }
  } else if (has_coordinator(s.cache)) {
    bad("coordinator: a squeeze cache (or --kv-layer-alloc squeeze) needs its coordinator's state");
  }

  // every layer's counts, then the payload's size against what is there, before any allocation
  const json* lj = top.get("layers");
  if (lj == nullptr || !lj->is_array() || static_cast<int>(lj->size()) != L) bad("layers: expected " + std::to_string(L) + " layers");
  const KvTypes types = kv_types(s.cache);
  const uint64_t row = kv_row_bytes(types.k, D), vrow = kv_row_bytes(types.v, D);
  // the recent ring's f16 rows [G][ring][D] (a half where that side is quantized) and positions [ring]
  const uint64_t ring_rows = types.ring_k() || types.ring_v() ? static_cast<uint64_t>(types.recent_f16) : 0,
                 ring_half = static_cast<uint64_t>(G) * ring_rows * D;
  uint64_t need = (static_cast<uint64_t>(pos) + n_context) * sizeof(int32_t);
  std::vector<std::array<int, 2>> counts;  // count, has offset
  for (int l = 0; l < L; ++l) {
    const std::string lw = where + "layers[" + std::to_string(l) + "].";
    const JsonFields f((*lj)[l], lw, [](const std::string&, const std::string& msg) { throw FormatError(msg); });
    if (!(*lj)[l].is_object()) bad("layers[" + std::to_string(l) + "]: expected an object");
    LayerCache::Image im;
    im.rows.count = f.required_integer("count", 0, ctx + (1 << 16));
    im.rows.newest = static_cast<int32_t>(f.int64("newest", -1, -1, ctx));
    im.tokens_seen = f.int64("tokens_seen", 0, 0, int64_t{1} << 40);
    im.last_step_rows = f.integer("last_step_rows", 0, 0, 1 << 24);
    const json* live = f.get("live");
    if (live == nullptr || !live->is_array() || static_cast<int>(live->size()) != G) f.fail("live", std::to_string(G) + " counts");
    for (const json& x : *live) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > im.rows.count) f.fail("live", "counts within count");
      im.rows.live.push_back(static_cast<int>(x.get<int64_t>()));
    }
    const json* ps = f.get("policy");
    if (ps == nullptr || !ps->is_array() || ps->size() > kMaxPolicyState) f.fail("policy", "a list of at most 16 numbers");
    for (const json& x : *ps) {
      if (!x.is_number() || !std::isfinite(x.get<double>())) f.fail("policy", "finite numbers");
      im.policy.push_back(x.get<double>());
    }
    const uint64_t n = static_cast<uint64_t>(G) * im.rows.count;
    need += n * (row + vrow + sizeof(int32_t) + sizeof(float)) + (kv_rotates_keys(types.k) ? static_cast<uint64_t>(G) * D * sizeof(float) : 0) +
            ring_half * ((types.ring_k() ? 1 : 0) + (types.ring_v() ? 1 : 0)) * sizeof(uint16_t) + ring_rows * sizeof(int32_t);
    s.layers.push_back(std::move(im));
  }
  const uint64_t have = bytes.size() - 16 - hb;
  if (need != have)
    bad("its data holds " + std::to_string(have) + " bytes where its header describes " + std::to_string(need) +
        " (truncated or damaged)");

  Cursor cur{bytes, static_cast<size_t>(16 + hb)};
  cur.take(s.tokens, static_cast<size_t>(pos));
  cur.take(s.context, static_cast<size_t>(n_context));
  for (size_t i = 0; i < s.tokens.size() + s.context.size(); ++i) {
    const int id = i < s.tokens.size() ? s.tokens[i] : s.context[i - s.tokens.size()];
    if (id < 0 || id >= mc.vocab_size) bad("token id " + std::to_string(id) + " outside the vocabulary");
  }
  for (LayerCache::Image& im : s.layers) {
    const size_t n = static_cast<size_t>(G) * im.rows.count;
    cur.take(im.rows.k, n * row);
    cur.take(im.rows.v, n * vrow);
    cur.take(im.rows.pos, n);
    cur.take(im.rows.mass, n);
    cur.take(im.rows.k_offset, kv_rotates_keys(types.k) ? static_cast<size_t>(G) * D : 0);
    cur.take(im.rows.ring_k, types.ring_k() ? static_cast<size_t>(ring_half) : 0);
    cur.take(im.rows.ring_v, types.ring_v() ? static_cast<size_t>(ring_half) : 0);
    cur.take(im.rows.ring_pos, static_cast<size_t>(ring_rows));
  }
  return s;
}

std::string saved_settings_mismatch(const SavedSequence& saved, const CacheConfig& run, int run_max_tokens) {
  for (const KvOption& o : kv_options()) {
    const std::string a = o.get(saved.cache), b = o.get(run);
    if (a != b) return std::string(o.flag) + ": the cache was saved with " + a + ", this run asks " + b;
  }
  if (saved.cache.max_tokens != run_max_tokens)
    return "--ctx: the cache was saved with " + std::to_string(saved.cache.max_tokens) + ", this run asks " + std::to_string(run_max_tokens);
  return "";
}

void restore_sequence(SequenceState& seq, const SavedSequence& saved) {
  if (seq.caches.layers.size() != saved.layers.size() || saved.has_coordinator != (seq.caches.coordinator != nullptr))
    throw Error("kv restore: the sequence was not planned from the saved cache's settings");
  seq.caches.reset();
  seq.pos = static_cast<int>(saved.tokens.size());
  seq.context = saved.context;
  if (SqueezeCoordinator* c = seq.caches.coordinator.get()) {
    c->reset();
    if (saved.token_cap > 0) c->set_token_cap(saved.token_cap);
    for (size_t l = 0; l < saved.reports.size(); ++l)
      if (!std::isnan(saved.reports[l])) c->report_concentration(static_cast<int>(l), saved.reports[l]);
  }
  for (size_t l = 0; l < saved.layers.size(); ++l) seq.caches.layers[l].restore(saved.layers[l], seq.pos);
}

std::vector<uint8_t> read_kv_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("kv cache '" + path + "': cannot be read");
  in.seekg(0, std::ios::end);
  const std::streamoff n = in.tellg();
  if (n < 0) throw Error("kv cache '" + path + "': cannot be read");
  in.seekg(0);
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  if (n > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), n)) throw Error("kv cache '" + path + "': cannot be read");
  return bytes;
}

void write_kv_file(const std::string& path, std::span<const uint8_t> bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
      throw Error("kv cache '" + path + "': cannot be written");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error("kv cache '" + path + "': cannot be written");
  }
}

}  // namespace squeezekv
