// Many sequences on one model and one device, for servers and batch jobs. An Engine holds the
// device weights once and steps sequences that each have their own KV caches (and, for squeeze,
// their own coordinator); a decode step runs one row of every listed sequence through each
// weight matrix once, with exactly the arithmetic each sequence gets alone (RowMode::kIndependent),
// so a sequence's tokens do not depend on what else shares the batch (on CUDA with
// --batch-invariant; its default multiplies a batch of more than 4 through cuBLAS, each sequence's
// logits within bf16's rounding of its lone ones). A Scheduler on top admits
// generation requests, prefills their prompts in chunks between decode steps, and
// streams their text through callbacks that can stop them.
// Thread safety: an Engine and its Scheduler are used by one thread at a time.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "squeezekv/generate.h"
#include "squeezekv/sampling.h"
#include "squeezekv/session.h"

namespace squeezekv {

using SequenceId = int64_t;

struct KvUsage {
  int64_t held = 0;  // bytes of K and V held
  int64_t full = 0;  // f16 bytes of the same tokens without eviction
};

// The KV pool (SessionOptions::kv_memory): what the sequences' K and V arrays may take in the
// backend's memory (a GPU's by default; the CPU's only with --kv-memory) and what they take now.
struct KvPoolUsage {
  int64_t limit = 0;           // bytes (0: no limit)
  int64_t reserved = 0;        // bytes the live sequences' caches allocate
  int sequences_budgeted = 0;  // sequences held to a budget: fixed slabs of budget + one chunk rows
  int sequences_full = 0;      // full-cache sequences: their whole --ctx reserved
};

class Engine {
 public:
  // options: device, threads, prefill chunk and decode arithmetic for every sequence (options.cache
  // is not used: each sequence brings its own). max_batch: most sequences in one decode step.
  Engine(const Model& model, const SessionOptions& options, int max_batch);
  ~Engine();

  // A new sequence with its own caches (cache validated first: Error naming the flag).
  SequenceId add_sequence(const CacheConfig& cache);
  void remove_sequence(SequenceId id);
  // A new sequence that is a deep copy of `id` (its caches, squeeze schedule, position): it
  // continues exactly as `id` would, bit for bit, and counts against --max-memory and the KV
  // memory like any new sequence (MemoryLimitError when it does not fit). For a prompt shared by
  // many sequences (and for the bench, which fills B sequences to a depth with one prefill).
  SequenceId copy_sequence(SequenceId id);
  // A saved KV cache of a sequence that has run `tokens` (docs/kv_file.md; Session::save_kv).
  std::vector<uint8_t> save_sequence(SequenceId id, std::span<const int> tokens) const;
  // A new sequence restored from saved bytes, with the cache settings they were saved with
  // (checked, and counted against --max-memory and the KV pool, as add_sequence); `tokens`, when
  // given, receives the ids it covers. It continues exactly as the saved sequence would have on
  // the same device. FormatError / Error as Session::load_kv.
  SequenceId load_sequence(std::span<const uint8_t> bytes, std::vector<int>* tokens = nullptr, const std::string& source = "bytes");

  // Runs up to prefill_chunk() prompt tokens of one sequence; returns the logits [V] of its last row
  // (all_logits: of every row, [n][V], as Session::forward gives them).
  // prompt_end: the position where the whole prompt ends, when it is given in chunks (0: with
  // these tokens): squeeze decides its schedule and kvzip scores the prompt there.
  std::span<const float> prefill(SequenceId id, std::span<const int> tokens, int prompt_end = 0, bool all_logits = false);
  // Several sequences' prompt chunks as one step (each sequence once, each part 1 to
  // prefill_chunk() tokens, at most max(prefill_chunk(), max_batch) tokens in all): the weights are
  // read once for all of them. Returns the logits [n][V] of each part's last row, in the order
  // given. Each part attends over its own cache and evicts as it would alone; its rows go through
  // the products beside the others': bit for bit what it gets alone where the products sum each
  // row as a one-row product does (the CPU's 8-bit activations over 8-row tiles and the block
  // types: the default), within rounding elsewhere (f32 activations, BF16 matrices, a GPU's
  // tensor cores), as a prompt's own chunking is.
  struct PrefillPart {
    SequenceId id = -1;
    std::span<const int> tokens;
    int prompt_end = 0;
  };
  std::span<const float> prefill(std::span<const PrefillPart> parts);
  // prefill(parts) and the token each part's last row picks under params[i] (one per part, as
  // decode_sampled): only the ids come back (a part whose prompt goes on may take any settings
  // and ignore its pick).
  std::span<const int> prefill_sampled(std::span<const PrefillPart> parts, std::span<const SampleParams> params);
  // One token for each listed sequence (at most max_batch, each once); returns logits [n][V] in
  // the order given.
  std::span<const float> decode(std::span<const SequenceId> ids, std::span<const int> tokens);
  // decode() and each sequence's next token picked where the logits are, under params[i]
  // (src/core/sample.h's pick of the logits decode() would return; temperature 0: the first
  // largest): a GPU sends back n ids, not n x V floats. Sampler::next_params gives a sequence's
  // settings and draw.
  std::span<const int> decode_sampled(std::span<const SequenceId> ids, std::span<const int> tokens,
                                      std::span<const SampleParams> params);
  // decode_sampled in two halves: issue_decode does every part of the step the host does (the
  // caches, the policies, the positions) and gives the device its work and the picks' copy back,
  // returning without waiting for it; decode_picks waits and returns the tokens. Between the two
  // the caller may work on the host while the device runs (a server streams the step before's
  // tokens) and add or remove sequences (a removed sequence's row is computed and its token
  // dropped); any other step refuses (Error) until the tokens are taken.
  void issue_decode(std::span<const SequenceId> ids, std::span<const int> tokens, std::span<const SampleParams> params);
  std::span<const int> decode_picks();

  int position(SequenceId id) const;
  int max_tokens(SequenceId id) const;  // the most tokens the sequence may see (its --ctx)
  // The most tokens a sequence with this cache config may see: cache.max_tokens, or the model's
  // context capped at 16384 when unset.
  int context_limit(const CacheConfig& cache) const;
  std::vector<LayerStats> kv_stats(SequenceId id) const;
  // Absolute positions one layer's kv head of the sequence holds now, sorted ascending.
  std::vector<int32_t> kv_positions(SequenceId id, int layer, int kv_head) const;
  int sequences() const;
  KvPoolUsage kv_pool() const;
  int max_batch() const;
  int prefill_chunk() const;
  // SessionOptions::batch_invariant: every sequence's bits are those it gets alone, so a Scheduler
  // prefills one sequence's chunk a step (joined prompt chunks are within rounding of their lone
  // ones on a GPU's tensor cores and over BF16 matrices or f32 activations: prefill(parts)).
  bool batch_invariant() const;
  const Model& model() const;
  std::string device_description() const;
  // Steps (or other repeated launch lists) the device replayed as one CUDA graph; 0 on the CPU.
  int64_t device_graph_replays() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct GenerationRequest {
  std::vector<int> prompt;  // token ids (not empty)
  // The first cache_prefix prompt tokens are a prefix other requests share (a document, a long
  // system prompt; 0: none, else fewer than the prompt's). They run as a prompt of their own, so
  // the cache is compressed where they end (kvzip scores them, squeeze splits its budget there),
  // and the rest of the prompt runs after them. With a prompt cache (SchedulerOptions), the
  // compressed prefix is kept and a later request with the same prefix and cache settings starts
  // from a copy of it: its tokens are what it would get without the copy. A full cache (no
  // eviction) starts from the longest kept prefix of its own prefix (a conversation's turn
  // before) and runs the rest of it: within the rounding of a prompt's chunking, as its chunks
  // differ from a cold run's (the CPU's release build gives the same tokens in engine_test).
  int cache_prefix = 0;
  GenerateOptions options;
  CacheConfig cache;
  // Text as it is produced (whole UTF-8 characters); returning false stops the request, and its
  // sequence is freed at once.
  std::function<bool(std::string_view)> on_text;
  // Called once when the request ends, however it ends (stop_reason "error" with result.error
  // when it failed).
  std::function<void(const GenerateResult&)> on_done;
};

// Where a Scheduler's steps spent their time since it was made (wall seconds on the calling thread):
// the engine's prefill and decode calls (the device's work and its picks of the tokens) and
// everything else in step() (detokenizing and the callbacks, admission, bookkeeping).
struct SchedulerTimes {
  int64_t steps = 0;                      // step() calls that ran a prefill or a decode
  int64_t prefill_calls = 0, prefill_tokens = 0;
  int64_t decode_calls = 0, decode_rows = 0;
  double prefill_seconds = 0, decode_seconds = 0, step_seconds = 0;  // step_seconds: whole steps, the two others included
};

struct SchedulerOptions {
  // Bytes of compressed prompt prefixes (GenerationRequest::cache_prefix) kept for reuse, as saved
  // caches (docs/kv_file.md) in the host's memory, least recently used first out; 0: none kept.
  int64_t prompt_cache_bytes = 0;
};

// The prompt cache's contents and what it saved since the Scheduler was made.
struct PromptCacheStats {
  int64_t limit = 0, bytes = 0, entries = 0;
  int64_t hits = 0;          // requests that started from a kept prefix (a full cache: from part of its own)
  int64_t misses = 0;        // requests with a prefix that was not kept (run, then kept if it fits)
  int64_t evicted = 0;       // entries dropped for newer ones
  int64_t tokens_saved = 0;  // prompt tokens the hits did not run
};

class Scheduler {
 public:
  explicit Scheduler(Engine& engine, const SchedulerOptions& options = {});
  ~Scheduler();

  // Queues a request (its options validated first: Error naming the field); returns its id.
  int64_t submit(GenerationRequest request);
  // Stops a request at the next step (on_done gets stop_reason "cancelled"); unknown ids are ignored.
  void cancel(int64_t id);
  // One round: requests waiting for a free sequence slot are admitted (first come, first
  // served); admitted requests still in their prompt run prefill chunks, oldest first, up to one
  // chunk's worth of tokens in all (each request's chunks as it gets them alone); then every
  // request that is generating runs one decode step together. Returns whether work remains.
  bool step();

  int running() const;  // admitted requests (in their prompt or generating)
  int waiting() const;  // queued for a slot
  // Bytes of K and V held now by every running request, and the f16 bytes the same tokens
  // would take without eviction (one pass over the requests' caches).
  KvUsage kv_usage() const;
  SchedulerTimes times() const;
  PromptCacheStats prompt_cache() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace squeezekv
