// One layer's KV cache: storage + eviction policy. The forward pass appends the step's rows, runs
// attention over view(), reports the mass when wants_mass() (and the squeeze metric while one is
// pending), and calls end_step() once every layer has run; end_step prepares the eviction set and
// applies it in one pass.
// Thread safety: none; owned by one sequence.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "kv/kv_storage.h"
#include "kv/policy.h"
#include "squeezekv/kv_cache.h"
#include "squeezekv/squeeze_coordinator.h"

namespace squeezekv {

class LayerCache {
 public:
  // max_step_rows: most rows one step appends (the prefill chunk); max_tokens: most rows ever;
  // backend: where K and V live (null: the CPU).
  LayerCache(int layer, int n_kv_heads, int head_dim, KvTypes types, std::unique_ptr<EvictionPolicy> policy,
             int max_step_rows, int max_tokens, Backend* backend = nullptr);
  // Rows per head the storage needs: the policy's most per head + one step (at most what the
  // sequence can hold, plus the policy's scratch rows).
  static int capacity_for(const EvictionPolicy& policy, int max_step_rows, int max_tokens);

  // k, v [T][G*D] (the backend's memory); pos [T] host, pos_dev the same in the backend's memory
  // write_later: see KvStorage::append.
  void append(const float* k, const float* v, const int32_t* pos, int T, const int32_t* pos_dev = nullptr, bool write_later = false);
  KvView view() const { return storage_.view(); }
  bool wants_mass() const { return policy_->needs_mass(); }
  int mass_rows() const { return policy_->mass_rows(); }
  // Where attention adds the mass each retained key receives: [G][capacity].
  float* mass_accumulator() { return storage_.mass_accumulator(); }
  // The squeeze metric's meter while it wants inputs (null otherwise).
  ConcentrationMeter* meter() { return policy_->meter(); }
  // What the forward pass shows this layer's rows to (kv/observer.h; null: no one watches).
  LayerObserver* observer() { return policy_->meter(); }
  // eviction_error (the meter's cut): the view attention would see if the layer kept only what the
  // h2o rule keeps now (after this step's attention added its mass) at the cut's budget scaled to
  // the rows seen so far (EvictionCut::scaled_budget; input_end: where the caller's input ends);
  // nullopt when the rule would evict nothing or no cut is wanted.
  std::optional<KvView> cut_view(int64_t input_end);
  // The end of a step, for every layer of the sequence before any compacts (SequenceCache::end_step).
  void before_compaction(int64_t input_end);
  // Evicts what the policy names; then sizes the storage for the next step (changes only when the
  // policy's budget changes, i.e. once when a squeeze schedule is fixed).
  void end_step();

  // A scoring pass (kvzip): its rows attend like any others but are dropped after the layer ran.
  bool wants_scoring() const { return policy_->scoring() != nullptr && policy_->scoring()->wants_scoring(); }
  bool records_context() const { return policy_->scoring() != nullptr && policy_->scoring()->records_context(); }
  void begin_scoring() { storage_.clear_mass(); }
  struct Mark {
    KvStorage::Mark rows;
    int64_t tokens_seen = 0;
    int last_step_rows = 0;
  };
  Mark mark() const { return {storage_.mark(), tokens_seen_, last_step_rows_}; }
  // Drops the rows appended since m, as if they had never come.
  void drop_since(const Mark& m) {
    storage_.truncate(m.rows);
    tokens_seen_ = m.tokens_seen;
    last_step_rows_ = m.last_step_rows;
  }
  // Ends the pass: the policy hears it (SequenceCache::end_scoring), then, once every layer has,
  // compact_scored() evicts by the scores it gathered.
  void end_scoring();
  void compact_scored();
  void reset();
  // Makes this layer a deep copy of src (a layer of the same plan): its rows, its policy's state
  // (a coordinated policy now reports to `coordinator`) and its counters.
  void copy_from(const LayerCache& src, SqueezeCoordinator* coordinator);
  // For a saved cache: the counters, the policy's state and the rows (Error when the policy's
  // state cannot be saved now); restore() takes them back into a layer of the same plan, after the
  // sequence's coordinator (if any) has its schedule again, checking them first.
  struct Image {
    int64_t tokens_seen = 0;
    int last_step_rows = 0;
    std::vector<double> policy;
    KvStorageImage rows;
  };
  Image image() const;
  void restore(const Image& im, int32_t position_limit);
  LayerStats stats() const;
  const KvStorage& storage() const { return storage_; }
  void bind_device_count(const int32_t* count_dev) { storage_.bind_device_count(count_dev); }
  int budget() const { return policy_->budget(); }
  // Every compaction that drops rows is shown to `trace` first (null: none; a diagnostic: it
  // copies the layer's metadata to the host at each one).
  void set_trace(const EvictionTrace* trace) { trace_ = trace; }

 private:
  int capacity_for() const { return capacity_for(*policy_, max_step_rows_, max_tokens_); }
  void compact();
  EvictionEvent traced_rows() const;           // the rows held before a compaction (trace_)
  void mark_survivors(EvictionEvent& e) const;  // after it: which of them are still held
  void fit_capacity();  // the storage sized for the next step (set_capacity when the budget changed)
  void check_held() const;  // a debug assertion: the rows held after a step within the policy's promise
  int layer_;
  std::unique_ptr<EvictionPolicy> policy_;
  int max_step_rows_, max_tokens_;
  KvStorage storage_;
  Eviction evict_;  // reused every step
  const EvictionTrace* trace_ = nullptr;
  Eviction cut_evict_;  // cut_view's slots
  int64_t tokens_seen_ = 0;
  int last_step_rows_ = 0;
};

// The caches of one sequence: one per layer and, for squeeze, the coordinator they share.
struct SequenceCache {
  std::vector<LayerCache> layers;
  std::unique_ptr<SqueezeCoordinator> coordinator;
  // On a device (CacheBuilder binds them): every layer's count for the step about to run, [L] in
  // the backend's memory, staged in one copy per step (KvStorage::bind_device_count).
  Backend* backend = nullptr;
  std::unique_ptr<Buffer> counts_dev;  // [L] int32
  std::vector<int32_t> counts_host;    // [L]
  // squeeze's eviction_error on a device: every layer's two sums at a step's end (end_step)
  std::unique_ptr<Buffer> cut_sums_dev;  // [L][2] double
  std::vector<double> cut_sums_host;     // [L][2]
  // Before a step that appends T rows to every layer: each layer's count once they are in.
  void stage_step(int T);
  void reset();
  // Makes these caches a deep copy of src (built from the same plan on the same backend): the
  // coordinator's reports and schedule, then every layer (Engine::copy_sequence).
  void copy_from(const SequenceCache& src);
  // Ends a step of every layer: first each policy hears the step (squeeze reports to the
  // coordinator), then each layer compacts. input_end: the tokens seen when the caller's
  // current input ends.
  void end_step(int64_t input_end);
  // Ends a scoring pass (ScoringPass): every layer's policy hears it (a coordinated kvzip layer
  // reports), then every layer compacts.
  void end_scoring();
  bool wants_scoring() const;
  bool records_context() const;
  // Shows every layer's compactions that drop rows to trace (null: none); trace must outlive the
  // caches or be unset.
  void set_trace(const EvictionTrace* trace);
};

struct ModelConfig;

// The storage's row types for the config's (--kv-type, --kv-type-k, --kv-type-v).
KvType kv_type_of(KvDType d);
inline KvTypes kv_types(const CacheConfig& c) { return {kv_type_of(c.dtype), kv_type_of(kv_v_dtype(c)), c.recent_f16}; }

// A sequence's cache config checked once (CacheBuilder::plan is the only way to make one), with
// what it resolves to: the most rows the sequence may see, the most a step appends, and the bytes
// its caches allocate (before a schedule re-splits them: a squeeze schedule keeps the total).
class CachePlan {
 public:
  const CacheConfig& config() const { return cfg_; }
  int max_tokens() const { return max_tokens_; }
  int max_step_rows() const { return max_step_rows_; }
  int64_t bytes() const { return bytes_; }
  // The part of bytes() in the backend's memory (K, V, positions and mass): what the KV pool holds;
  // on a device each layer's slab as its allocator takes it (device_alloc_bytes).
  int64_t pool_bytes() const { return pool_bytes_; }

 private:
  friend class CacheBuilder;
  CachePlan() = default;
  CacheConfig cfg_;
  int max_tokens_ = 0, max_step_rows_ = 0;
  int64_t bytes_ = 0, pool_bytes_ = 0;
};

class CacheBuilder {
 public:
  // Validates cfg (Error naming the flag) and plans one sequence's caches without allocating
  // them. max_step_rows: the most rows a step appends (the prefill chunk); host_mirror: K and V
  // live on a device (the bytes count the host copies of the metadata).
  static CachePlan plan(const ModelConfig& model, const CacheConfig& cfg, int max_step_rows, bool host_mirror);
  // The caches the plan describes, K and V in the backend's memory (null: the CPU).
  static SequenceCache build(const ModelConfig& model, const CachePlan& plan, Backend* backend = nullptr);
  // plan, then build.
  static SequenceCache for_model(const ModelConfig& model, const CacheConfig& cfg, int max_step_rows, Backend* backend = nullptr);
};

}  // namespace squeezekv
