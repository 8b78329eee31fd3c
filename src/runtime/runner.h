// The forward pass shared by Session (one sequence) and Engine (many): one backend, one copy of
// the device weights and scratch for one step's rows. A step runs the rows of one or more
// sequences ("segments") through every weight matrix once; each segment attends over its own
// caches. Letters: T rows in this step, E hidden, H query heads, G kv heads, D head dim, F ffn, V vocab.
// Thread safety: one thread at a time (the backend's threads run inside each op).
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "kv/layer_cache.h"
#include "squeezekv/model.h"
#include "squeezekv/session.h"

namespace squeezekv {

struct DeviceWeights;

// One sequence's state: its caches and position counter.
struct SequenceState {
  SequenceCache caches;
  int pos = 0;
  int max_tokens = 0;        // most tokens this sequence may see
  int64_t kv_bytes = 0;      // what its caches allocate (CachePlan::bytes), for --max-memory
  int64_t pool_bytes = 0;    // the part in the backend's memory (CachePlan::pool_bytes), for the KV pool
  std::vector<int> context;  // the input's token ids while a policy will score by repeating it (kvzip)
  CacheConfig config;        // what its caches were planned from (CachePlan::config)
};

// The most tokens a sequence with this cache config may see (the model's context when unset,
// capped at 16384).
int sequence_max_tokens(const ModelConfig& model, const CacheConfig& cache);

// Absolute positions one layer's kv head holds now, sorted ascending (Error naming a layer or head
// out of range).
std::vector<int32_t> held_positions(const SequenceState& seq, int layer, int kv_head);

// Throws Error "<op>: token id X outside the vocabulary [0, V)" for the first id out of range.
void check_token_ids(std::span<const int> tokens, int vocab_size, const char* op);

// What other live sequences' caches hold: SequenceState::kv_bytes and pool_bytes, summed.
struct KvHeld {
  int64_t bytes = 0, pool = 0;
};

// Rows [row, row + T) of a step belong to one sequence.
struct Segment {
  SequenceState* seq = nullptr;
  const int* tokens = nullptr;  // [T] host ids
  int T = 0;
  // Position where the caller's current input (e.g. a prompt given in chunks) ends; 0: with these
  // rows. Squeeze decides its schedule at the end of the prompt, kvzip scores the prompt then.
  int64_t input_end = 0;
};

class Runner {
 public:
  // options.cache is not used here (each sequence brings its own); max_rows: most rows of a step.
  // With options.max_memory the weights and the step's scratch must fit before any is allocated.
  Runner(const Model& model, const SessionOptions& options, int max_rows);
  ~Runner();

  // The plan of one sequence's caches on a runner with these options (the config checked, the one
  // time: Error naming the flag): the most tokens it may see, a step's rows, where K and V live.
  // A caller may make it before the runner exists, so a bad config costs no weight upload.
  static CachePlan plan_sequence(const ModelConfig& model, const CacheConfig& cache, const SessionOptions& options);
  // A sequence with the plan's caches (a plan of this runner's options). With --max-memory its
  // caches must fit beside the weights, the scratch and `other_kv_bytes` (what the caller's other
  // live sequences hold), checked before they are allocated.
  // Likewise its K and V must fit the KV pool (kv_pool()) beside `other.pool` bytes.
  SequenceState new_sequence(const CachePlan& plan, KvHeld other = {}) const;
  SequenceState new_sequence(const CacheConfig& cache, KvHeld other = {}) const {
    return new_sequence(plan_sequence(model_.config(), cache, opt_), other);
  }
  // A deep copy of src (a sequence of this runner): caches, coordinator, position and recorded
  // input, allocated and checked as a new sequence of its config. The copy continues exactly as
  // src would (the same logits, bit for bit, on the same backend).
  SequenceState copy_sequence(const SequenceState& src, KvHeld other = {}) const;
  // The bytes every sequence's K and V may take in the backend's memory (SessionOptions::kv_memory,
  // resolved once the weights are in); 0: no limit.
  int64_t kv_pool() const { return kv_pool_; }

  // Refuses a segment that cannot run, before any work (Error starting with op): no rows, token
  // ids outside the vocabulary, more tokens than the sequence may see, an input end beyond them.
  // The one check of a step's input: step() runs it on every segment; Session runs it on a whole
  // input before its first chunk.
  void check(const Segment& s, const char* op) const;
  // One step over the segments' rows (at most max_rows in all; each segment checked, a sequence
  // at most once). When every segment is one row
  // (a decode batch), each row gets exactly a lone sequence's arithmetic (RowMode::kIndependent).
  // Then every layer cache ends the step (policies evict); a sequence whose policy now wants its
  // input scored (kvzip) runs that pass before step returns. Leaves the final hidden states
  // (after the output norm) for logits().
  void step(std::span<const Segment> segments, const char* op = "step");
  // Logits [n][V] of rows [first_row, first_row + n) of the last step, in host memory;
  // independent_rows: the rows belong to different sequences (a decode batch).
  std::span<const float> logits(int first_row, int n, bool independent_rows);
  // Logits [n][V] of the listed rows of the last step (rows of different sequences, each with a
  // lone row's arithmetic, as logits(row, 1, false) gives it): the rows gathered, one product.
  std::span<const float> logits_of_rows(std::span<const int> rows);
  // The tokens of the listed rows of the last step (rows of different sequences) under
  // params[n]: logits_of_rows(rows)'s picks, taken in the backend (Backend::sample_rows), so only
  // n ids come back instead of n x V logits.
  std::span<const int> picks_of_rows(std::span<const int> rows, std::span<const SampleParams> params);
  // picks_of_rows in two halves: issue_picks gives the backend the products and the picks and
  // queues their copy to the host, returning at once; picks() waits for them. Between the two the
  // host may work while the device runs (no other step or pick of this runner).
  void issue_picks(std::span<const int> rows, std::span<const SampleParams> params);
  std::span<const int> picks();

  const Model& model() const { return model_; }
  Backend& backend() { return *backend_; }
  const Backend& backend() const { return *backend_; }
  int max_rows() const { return max_rows_; }
  int prefill_chunk() const { return chunk_; }
  bool batch_invariant() const { return opt_.batch_invariant; }
  int64_t matrix_bytes() const;
  // Bytes of the activations one step of max_rows rows uses (allocated once per Runner).
  static int64_t scratch_bytes(const ModelConfig& c, int max_rows);

 private:
  // kScore: the rows only score the cached keys (attention mass reduced by max) and leave the
  // caches as they were; no step ends.
  enum class Pass : uint8_t { kStep, kScore };
  void forward(std::span<const Segment> segments, Pass pass);
  // KVzip's reconstruction pass over seq.context (kvzip.cc says what it scores).
  void score_context(SequenceState& seq);
  // The output head over h [n][E] (the backend's memory): logits [n][V] in the backend's memory
  // (logits_dev_); logits_to_host copies the first n rows of them to host memory.
  const float* head(const float* h, int n, bool independent_rows);
  // The listed rows of the last step's final hidden states, one after another: where they are
  // when they are consecutive, else gathered into rows_gathered_.
  const float* gather_rows(std::span<const int> rows);
  std::span<const float> logits_to_host(int n);
  // Row first_row of the last step's final hidden states (xn_).
  const float* step_rows(int first_row) const;
  // kv_pool() from the options and, when they give no size, from the memory the backend has free.
  int64_t resolve_kv_pool() const;

  const Model& model_;
  SessionOptions opt_;
  int64_t base_bytes_ = 0;  // weights + scratch, for --max-memory
  int64_t kv_pool_ = 0;     // see kv_pool()
  int max_rows_ = 0;
  int chunk_ = 0;
  Activations act_ = Activations::kF32;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<DeviceWeights> dw_;
  // activations in the backend's memory, sized for max_rows rows
  std::unique_ptr<Buffer> x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_;  // [T][E] x2, [T][H*D], [T][G*D] x2, [T][H*D], [T][E], [T][F] x2
  std::unique_ptr<Buffer> x_in_;                                        // [T][E] layer input (for an observer that asks)
  std::unique_ptr<Buffer> rows_pos_;                                    // [T] positions of the step's rows
  std::unique_ptr<Buffer> logits_dev_;                                  // [n][V]
  std::unique_ptr<Buffer> picks_dev_;                                   // [max_rows] picks_of_rows' ids
  std::unique_ptr<Buffer> params_dev_;                                  // [max_rows] their SampleParams
  std::unique_ptr<Buffer> picks_host_;                                  // [max_rows] their copy (alloc_host)
  int picks_n_ = 0;                                                     // issue_picks' rows
  std::unique_ptr<Buffer> xn_keep_;                                     // [T][E] a step's output while a scoring pass runs
  std::vector<int> repeat_prefix_;                                      // the reconstruction instruction's tokens
  // host side
  std::vector<int32_t> rows_pos_host_;  // [T]
  std::vector<int32_t> rows_tok_;       // [T]
  ObserverScratch scratch_;                                             // the observers' copies (squeeze metric inputs)
  std::vector<LayerObserver*> observers_;                               // [segments] this layer's, or null
  std::vector<LayerRows> rows_;                                         // [segments] what the observers are shown
  std::vector<AttentionProbe> probes_;                                  // [segments]
  std::vector<LayerCache::Mark> marks_;                                  // [segments] rows held before this layer's append
  std::vector<AttentionCall> calls_;                                    // [segments]
  std::unique_ptr<Buffer> rows_gathered_;  // [n][E] logits_of_rows' rows
  std::unique_ptr<Buffer> logits_host_;  // [n][V] f32, the backend's fastest host memory
};

}  // namespace squeezekv
