// One layer's cache (layer_cache.h): rows appended, viewed, cut and compacted by its policy.
#include "kv/layer_cache.h"

#include <algorithm>
#include <cassert>

#include <string>

#include "squeezekv/error.h"

namespace squeezekv {

LayerCache::LayerCache(int layer, int n_kv_heads, int head_dim, KvTypes types,
                       std::unique_ptr<EvictionPolicy> policy, int max_step_rows, int max_tokens, Backend* backend)
    : layer_(layer),
      policy_(std::move(policy)),
      max_step_rows_(max_step_rows),
      max_tokens_(max_tokens),
      storage_(n_kv_heads, head_dim, capacity_for(), types, backend) {
  evict_.slots.reserve(static_cast<size_t>(n_kv_heads) * storage_.capacity());
}

int LayerCache::capacity_for(const EvictionPolicy& policy, int max_step_rows, int max_tokens) {
  const int64_t want = static_cast<int64_t>(policy.max_head_rows()) + max_step_rows;
  const int scratch = policy.scoring() != nullptr ? policy.scoring()->scratch_rows(max_step_rows) : 0;
  return static_cast<int>(std::min<int64_t>(want, static_cast<int64_t>(max_tokens) + scratch));
}

void LayerCache::append(const float* k, const float* v, const int32_t* pos, int T, const int32_t* pos_dev, bool write_later) {
  storage_.append(k, v, pos, T, pos_dev, write_later);
  tokens_seen_ += T;
  last_step_rows_ = T;
}

void LayerCache::end_step() {
  // on a device, where the policy's rule is the mass rule: it runs where the mass lives, with no
  // copy to the host (docs/DESIGN.md, "Eviction runs where the mass lives"); a decode step one row
  // over the budget by the one-row kernel that all layers of a step share
  if (!storage_.host_visible()) {
    const int budget = policy_->budget(), n = storage_.count();
    const bool one = last_step_rows_ == 1 && n == budget + 1;
    if (const auto rule = policy_->mass_rule(); rule && (rule->any_step || one)) {
      if (one && storage_.capacity() == capacity_for()) storage_.evict_one_on_backend(budget, rule->sinks, rule->recent);
      else if (n > budget) storage_.evict_top_on_backend(budget, rule->sinks, rule->recent);
      fit_capacity();
      check_held();
      return;
    }
  }
  compact();
  check_held();
}

void LayerCache::fit_capacity() {
  const int cap = capacity_for();
  if (cap != storage_.capacity() && cap >= storage_.count()) storage_.set_capacity(cap);
}

void LayerCache::check_held() const {
  // builds with assertions (the sanitizer build of the test suite among them): the rows actually
  // held after a step against the policy's promise for now, budget() (which is what a layer may
  // hold while a schedule or a scoring pass is pending too), in all and per kv head
  [[maybe_unused]] const int64_t G = storage_.n_kv_heads();
  assert(storage_.live_total() <= G * policy_->budget());
  for ([[maybe_unused]] int g = 0; g < G; ++g) assert(storage_.live(g) <= policy_->max_head_rows());
}

void LayerCache::compact() {
  // (a policy reads the host metadata through positions()/mass(), which copy from a device only
  // what it changed, and only when read)
  if (policy_->select(storage_, last_step_rows_, evict_)) {
    if (trace_ != nullptr && *trace_) {
      EvictionEvent e = traced_rows();
      storage_.evict(evict_);
      mark_survivors(e);
      (*trace_)(e);
    } else {
      storage_.evict(evict_);
    }
  }
  fit_capacity();
}

EvictionEvent LayerCache::traced_rows() const {
  EvictionEvent e;
  e.layer = layer_;
  e.tokens_seen = tokens_seen_;
  const int G = storage_.n_kv_heads();
  e.positions.resize(G);
  e.scores.resize(G);
  e.kept.resize(G);
  for (int g = 0; g < G; ++g) {
    const int32_t* pos = storage_.positions(g);
    const float* mass = storage_.mass(g);
    for (int j = 0; j < storage_.count(); ++j)
      if (pos[j] != KvStorage::kDeadPos) {
        e.positions[g].push_back(pos[j]);
        e.scores[g].push_back(mass[j]);
      }
  }
  return e;
}

void LayerCache::mark_survivors(EvictionEvent& e) const {
  for (int g = 0; g < storage_.n_kv_heads(); ++g) {
    std::vector<int32_t> held(storage_.positions(g), storage_.positions(g) + storage_.count());
    std::sort(held.begin(), held.end());
    e.kept[g].resize(e.positions[g].size());
    for (size_t i = 0; i < e.positions[g].size(); ++i) e.kept[g][i] = std::binary_search(held.begin(), held.end(), e.positions[g][i]) ? 1 : 0;
  }
}

void LayerCache::end_scoring() {
  if (ScoringPass* p = policy_->scoring()) p->end_scoring(storage_);
}

void LayerCache::compact_scored() {
  compact();
  check_held();
}

void LayerCache::reset() {
  storage_.clear();
  policy_->reset();
  tokens_seen_ = 0;
  last_step_rows_ = 0;
}

void LayerCache::copy_from(const LayerCache& src, SqueezeCoordinator* coordinator) {
  assert(src.layer_ == layer_ && src.max_step_rows_ == max_step_rows_ && src.max_tokens_ == max_tokens_);
  policy_ = src.policy_->clone(coordinator);
  storage_.copy_from(src.storage_);
  tokens_seen_ = src.tokens_seen_;
  last_step_rows_ = src.last_step_rows_;
}

LayerCache::Image LayerCache::image() const {
  if (const char* why = policy_->unsaveable()) throw Error("kv save: layer " + std::to_string(layer_) + ": " + why);
  return {tokens_seen_, last_step_rows_, policy_->state(), storage_.image()};
}

void LayerCache::restore(const Image& im, int32_t position_limit) {
  const std::string where = "kv restore: layer " + std::to_string(layer_) + ": ";
  // (last_step_rows may exceed this sequence's chunk: the saver's may have been longer)
  if (im.tokens_seen < 0 || im.tokens_seen > max_tokens_ || im.last_step_rows < 0 || im.last_step_rows > max_tokens_)
    throw Error(where + "its counters are outside the sequence's limits");
  if (!policy_->set_state(im.policy)) throw Error(where + "the policy's state does not fit this policy");
  // the storage laid out for the restored budget (a squeeze schedule, pyramidkv's taper), empty
  storage_.clear();
  fit_capacity();
  storage_.restore(im.rows, position_limit);  // (refuses more rows than the capacity the budget sized)
  tokens_seen_ = im.tokens_seen;
  last_step_rows_ = im.last_step_rows;
}

LayerStats LayerCache::stats() const {
  LayerStats s;
  s.layer = layer_;
  s.tokens_seen = tokens_seen_;
  const int64_t G = storage_.n_kv_heads();
  s.tokens_kept = static_cast<int>((storage_.live_total() + G - 1) / G);  // per kv head (the mean, when heads differ)
  s.budget = policy_->budget();
  s.capacity = storage_.capacity();
  s.concentration = policy_->concentration();
  s.kept_bytes = storage_.live_total() * storage_.bytes_per_token() / G;
  if (const int ring = storage_.types().recent_f16; ring > 0)  // the f16 copies of the newest rows (--kv-recent-f16)
    s.kept_bytes += std::min<int64_t>(ring, tokens_seen_) * (storage_.ring_bytes() / ring);
  s.full_bytes = tokens_seen_ * static_cast<int64_t>(storage_.n_kv_heads()) * storage_.head_dim() * 2 * 2;
  return s;
}

std::optional<KvView> LayerCache::cut_view(int64_t input_end) {
  const ConcentrationMeter* m = policy_->meter();
  if (m == nullptr || m->metric() != SqueezeMetric::kEvictionError) return std::nullopt;
  const EvictionCut& c = m->cut();
  const int budget = c.scaled_budget(tokens_seen_, input_end);
  if (!storage_.host_visible() && !c.head_adaptive) {  // chosen where the mass lives: nothing read back
    if (storage_.count() <= budget) return std::nullopt;
    return storage_.view_cut_on_backend(budget, c.sinks, c.recent_for(budget));
  }
  if (!select_by_score(storage_, c.head_adaptive, budget, c.sinks, c.recent_for(budget), storage_.mass(0),
                       static_cast<size_t>(storage_.capacity()), cut_evict_))
    return std::nullopt;
  return storage_.view_without(cut_evict_);
}

void LayerCache::before_compaction(int64_t input_end) {
  // mass_coverage reads the accumulated mass when it reports (a copy only on a device)
  if (const ConcentrationMeter* m = policy_->meter(); m != nullptr && m->metric() == SqueezeMetric::kMassCoverage)
    storage_.sync_to_host();
  policy_->before_compaction(storage_, {last_step_rows_, tokens_seen_, input_end});
}

}  // namespace squeezekv
