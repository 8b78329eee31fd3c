#include "kv/layer_cache.h"

#include "squeezekv/error.h"
#include "squeezekv/model_config.h"

namespace squeezekv {

LayerCache::LayerCache(int layer, KvStorage storage, std::unique_ptr<EvictionPolicy> policy)
    : layer_(layer), storage_(std::move(storage)), policy_(std::move(policy)) {
  keep_.reserve(static_cast<size_t>(storage_.n_kv_heads()) * storage_.capacity());
}

void LayerCache::append(const float* k, const float* v, const int32_t* pos, int T) {
  storage_.append(k, v, pos, T);
  tokens_seen_ += T;
}

void LayerCache::end_step() {
  const int n = policy_->select(storage_, keep_);
  if (n < storage_.count()) storage_.compact(keep_.data(), n);
}

void LayerCache::reset() {
  storage_.clear();
  tokens_seen_ = 0;
}

LayerStats LayerCache::stats() const {
  LayerStats s;
  s.layer = layer_;
  s.tokens_seen = tokens_seen_;
  s.tokens_kept = storage_.count();
  s.budget = policy_->budget(storage_);
  s.kept_bytes = static_cast<int64_t>(storage_.count()) * storage_.bytes_per_token();
  s.full_bytes = tokens_seen_ * static_cast<int64_t>(storage_.n_kv_heads()) * storage_.head_dim() * 2 * 2;
  return s;
}

std::unique_ptr<EvictionPolicy> make_policy(const CacheConfig& cfg, int /*layer*/) {
  switch (cfg.policy) {
    case KvPolicy::kFull:
      return std::make_unique<FullPolicy>();
  }
  throw Error("kv cache: unknown policy");
}

std::vector<LayerCache> build_caches(const ModelConfig& model, const CacheConfig& cfg) {
  const int capacity = cfg.max_tokens > 0 ? cfg.max_tokens : model.context_length;
  const cpu::KvType t = cfg.dtype == KvDType::kF16 ? cpu::KvType::kF16 : cpu::KvType::kF32;
  std::vector<LayerCache> caches;
  caches.reserve(static_cast<size_t>(model.n_layers));
  for (int l = 0; l < model.n_layers; ++l)
    caches.emplace_back(l, KvStorage(model.n_kv_heads, model.head_dim, capacity, t), make_policy(cfg, l));
  return caches;
}

KvPolicy parse_kv_policy(const std::string& name) {
  if (name == "full") return KvPolicy::kFull;
  throw Error("--kv-policy: unknown policy '" + name + "' (expected full)");
}

KvDType parse_kv_dtype(const std::string& name) {
  if (name == "f16") return KvDType::kF16;
  if (name == "f32") return KvDType::kF32;
  throw Error("--kv-type: unknown type '" + name + "' (expected f16 or f32)");
}

}  // namespace squeezekv
