// Compressed prompt prefixes kept for reuse (prompt_cache.h).
#include "runtime/prompt_cache.h"

#include <cstring>

namespace squeezekv {

std::optional<std::string> prompt_cache_settings(const CacheConfig& c, int max_tokens) {
  if (c.policy == KvPolicy::kCustom) return std::nullopt;
  std::string s;
  for (const KvOption& o : kv_options()) s += std::string(o.key) + "=" + o.get(c) + ";";
  return s + "ctx=" + std::to_string(max_tokens) + ";";
}

std::string PromptCache::key_of(const std::string& settings, std::span<const int> prefix) {
  std::string k = settings;
  k.push_back('\0');
  const size_t at = k.size();
  k.resize(at + prefix.size_bytes());
  if (!prefix.empty()) std::memcpy(k.data() + at, prefix.data(), prefix.size_bytes());
  return k;
}

const std::vector<uint8_t>* PromptCache::find(const std::string& settings, std::span<const int> prefix) {
  const auto it = index_.find(key_of(settings, prefix));
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &it->second->bytes;
}

std::pair<const std::vector<uint8_t>*, int> PromptCache::find_longest(const std::string& settings, std::span<const int> prefix) {
  const std::string key = key_of(settings, prefix);
  const size_t head = settings.size() + 1;  // (settings never hold '\0': a key that begins `key` has these settings)
  auto best = lru_.end();
  for (auto it = lru_.begin(); it != lru_.end(); ++it)
    if (it->key.size() <= key.size() && (best == lru_.end() || it->key.size() > best->key.size()) &&
        std::string_view(key).starts_with(it->key))
      best = it;
  if (best == lru_.end()) return {nullptr, 0};
  lru_.splice(lru_.begin(), lru_, best);
  return {&best->bytes, static_cast<int>((best->key.size() - head) / sizeof(int))};
}

bool PromptCache::contains(const std::string& settings, std::span<const int> prefix) const {
  return index_.count(key_of(settings, prefix)) > 0;
}

bool PromptCache::put(const std::string& settings, std::span<const int> prefix, std::vector<uint8_t> bytes) {
  std::string key = key_of(settings, prefix);
  if (const auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return true;
  }
  const int64_t size = static_cast<int64_t>(key.size() + bytes.size());
  if (size > limit_) return false;
  while (bytes_ + size > limit_) {
    bytes_ -= lru_.back().size();
    index_.erase(std::string_view(lru_.back().key));  // before its key's storage goes
    lru_.pop_back();
    ++evicted_;
  }
  lru_.push_front(Entry{std::move(key), std::move(bytes)});
  index_.emplace(std::string_view(lru_.front().key), lru_.begin());
  bytes_ += size;
  return true;
}

void PromptCache::erase(const std::string& settings, std::span<const int> prefix) {
  const auto it = index_.find(key_of(settings, prefix));
  if (it == index_.end()) return;
  bytes_ -= it->second->size();
  const auto node = it->second;
  index_.erase(it);  // before its key's storage goes
  lru_.erase(node);
}

}  // namespace squeezekv
