// Saved KV caches (docs/kv_file.md): one sequence's caches, its position and the token ids it has
// run, as bytes (a file's contents). A saved sequence restored into a fresh sequence of the same
// model and cache config continues exactly as the original would have (the same logits on the
// same backend). Reading checks every size and count against the bytes before it allocates.
// Thread safety: pure functions over the sequence given.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/runner.h"
#include "squeezekv/model.h"

namespace squeezekv {

// What a saved cache holds, read and checked (parse_saved_sequence).
struct SavedSequence {
  CacheConfig cache;          // the settings that shaped it (max_tokens set: the sequence's --ctx)
  std::vector<int> tokens;    // the ids it has run, position() of them
  std::vector<int> context;   // the input kvzip still keeps to score (SequenceState::context)
  bool has_coordinator = false;
  int64_t token_cap = 0;                       // the coordinator's (0: none)
  std::vector<double> reports;                 // [L] the coordinator's reports (NaN: none yet)
  std::vector<LayerCache::Image> layers;       // [L]
};

// The bytes of `seq` (a sequence of a runner of `model`), which has run `tokens` (seq.pos of them).
// Error when a policy's state cannot be saved now (a squeeze schedule or kvzip's scoring pending)
// or for the custom policy (its scorer is code, not data).
std::vector<uint8_t> serialize_sequence(const Model& model, const SequenceState& seq, std::span<const int> tokens);

// Reads saved bytes for `model`. FormatError naming `source` for bytes that are not a saved cache
// of this format (magic, version, sizes, counts, a header field out of range); Error when they were
// saved for another model (its shape or fingerprint).
SavedSequence parse_saved_sequence(std::span<const uint8_t> bytes, const Model& model, const std::string& source);

// Where the run's cache settings differ from the saved ones: "" when they agree, else a message
// naming the first flag that differs ("--kv-budget: the cache was saved with 128, this run asks 64").
std::string saved_settings_mismatch(const SavedSequence& saved, const CacheConfig& run, int run_max_tokens);

// Restores a saved sequence into `seq`, a fresh sequence planned from saved.cache on this runner's
// backend: the coordinator's schedule, then every layer (each checked: Error naming the layer).
void restore_sequence(SequenceState& seq, const SavedSequence& saved);

// Whole files: read (Error naming the path when it cannot be read) and written (atomically: a
// temporary file renamed over the path).
std::vector<uint8_t> read_kv_file(const std::string& path);
void write_kv_file(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace squeezekv
