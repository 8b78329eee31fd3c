// Compressed prompt prefixes kept for reuse (GenerationRequest::cache_prefix): each entry is a
// saved sequence (docs/kv_file.md) of one prefix of token ids under one set of cache settings,
// held in the host's memory under a byte limit, least recently used first out.
// A compressed cache is a function of where its prompt ended (kvzip scored, squeeze split its
// budget, h2o evicted there), so an entry made at the end of a shorter prefix cannot stand for a
// longer one: compressing policies match exactly (find). A full cache holds every row whatever
// its chunks were, so it may start from the longest kept prefix of its own (find_longest).
// Thread safety: one thread at a time (the Scheduler's).
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "squeezekv/engine.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

// What names an entry's settings: every KV option's value and the sequence's context; nullopt for
// settings whose caches are never saved (the custom policy's scorer is code).
std::optional<std::string> prompt_cache_settings(const CacheConfig& c, int max_tokens);

class PromptCache {
 public:
  explicit PromptCache(int64_t limit_bytes) : limit_(limit_bytes) {}

  // The saved bytes of `prefix` under `settings`, or null; a hit becomes the most recently used.
  const std::vector<uint8_t>* find(const std::string& settings, std::span<const int> prefix);
  // The longest entry under `settings` whose ids begin `prefix` (itself included): its bytes and
  // its length in tokens, or {null, 0}; a hit becomes the most recently used. A scan over the
  // entries: they are few (the limit over an entry's bytes) and each test is one comparison.
  std::pair<const std::vector<uint8_t>*, int> find_longest(const std::string& settings, std::span<const int> prefix);
  bool contains(const std::string& settings, std::span<const int> prefix) const;
  // Keeps `bytes` for (settings, prefix), dropping the least recently used entries until the
  // cache fits its limit. False, keeping nothing, when the entry alone exceeds the limit; an entry
  // already held is kept (and becomes the most recent).
  bool put(const std::string& settings, std::span<const int> prefix, std::vector<uint8_t> bytes);
  void erase(const std::string& settings, std::span<const int> prefix);

  int64_t limit() const { return limit_; }
  int64_t bytes() const { return bytes_; }
  int64_t entries() const { return static_cast<int64_t>(lru_.size()); }
  int64_t evicted() const { return evicted_; }

 private:
  struct Entry {
    std::string key;  // settings, then the prefix's ids as bytes
    std::vector<uint8_t> bytes;
    int64_t size() const { return static_cast<int64_t>(key.size() + bytes.size()); }
  };
  static std::string key_of(const std::string& settings, std::span<const int> prefix);

  int64_t limit_;
  int64_t bytes_ = 0;
  int64_t evicted_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string_view, std::list<Entry>::iterator> index_;  // keys: the entries' own (list nodes stay put)
};

}  // namespace squeezekv
