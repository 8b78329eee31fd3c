// One sequence running through a model: its KV caches, position counter and scratch buffers,
// all allocated once at construction. Prefill runs the prompt as batched matrix work in chunks;
// decode runs one token per step.
// Thread safety: a Session is used by one thread at a time (it uses OpenMP inside); many
// sessions may share one Model.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "squeezekv/device.h"
#include "squeezekv/kv_cache.h"
#include "squeezekv/model.h"

namespace squeezekv {

// Arithmetic of decode steps (one or two tokens), where matrix-vector products dominate.
enum class DecodeActivations : uint8_t {
  kF32,   // f32 activations: the reference arithmetic (evaluations use it)
  kInt8,  // activations rounded to 8 bits per block of 32 for quantized weights (every block type), integer
          // dot products (as llama.cpp does): faster decode; on SmolLM2 the next-token
          // distributions stay within KL 0.03 of kF32 and perplexity rises 0.3%
};
// "f32" | "int8"; throws Error naming the flag and the accepted values otherwise.
DecodeActivations parse_decode_activations(const std::string& s);
const char* decode_activations_name(DecodeActivations a);  // "f32" | "int8"

struct SessionOptions {
  Device device = Device::kCpu;
  int threads = 0;            // CPU threads (0: one per physical core this process may use)
  DeviceWeightFormat device_weights = DeviceWeightFormat::kNative;  // --device-weights (--device cuda)
  bool cuda_graphs = true;    // --device cuda: a repeated step (decode) replayed as one CUDA graph
  // --batch-invariant (--device cuda): a sequence decoded in a batch gets the bits it gets alone
  // (the products in 4-row GEMV launches); off: cuBLAS for batches of more than 4, within bf16's
  // rounding of them. The CPU is always batch-invariant.
  bool batch_invariant = false;
  // --max-memory: the bytes the run may hold (weights as stored, a step's activations, every
  // sequence's KV cache at the capacity it allocates); checked before allocating; 0: no limit
  int64_t max_memory = 0;
  // --kv-memory: the bytes every sequence's K and V arrays together may take in the backend's
  // memory (the KV pool: a sequence is admitted only when its caches fit beside the others'; a
  // budgeted sequence takes fixed slabs of budget + one prefill chunk rows per layer, a full-cache
  // one its whole --ctx). 0: on a device, what is free once the weights and a step's activations
  // are in, less a reserve (the larger of 1 GiB and 5% of the device) for the library workspaces
  // and a squeeze schedule's re-layout; on the CPU no limit beyond --max-memory.
  // kv_memory_fraction in (0, 1]: that share of the memory free then, instead of a size.
  int64_t kv_memory = 0;
  double kv_memory_fraction = 0.0;
  int prefill_chunk = 512;    // rows per prefill step
  DecodeActivations decode_activations = DecodeActivations::kF32;
  CacheConfig cache;
};

class Session {
 public:
  Session(const Model& model, const SessionOptions& options);
  ~Session();

  // Runs tokens at positions [position(), position() + n). Returns the logits of the last token
  // [V], or of every token [n][V] when all_logits is true. Throws Error on a bad token id or
  // when the context is full.
  std::span<const float> forward(std::span<const int> tokens, bool all_logits = false);

  void reset();
  int position() const;
  const Model& model() const;
  // The device the session runs on and its settings ("cpu, 2 threads").
  std::string device_description() const;
  // The device's copy bandwidth in bytes/s (read + written; on the CPU by the threads it runs on),
  // measured at the first call, and the bytes of matrices one decode step reads from its memory.
  double device_copy_bandwidth();
  int64_t device_matrix_bytes() const;
  // Steps (or other repeated launch lists) the device replayed as one CUDA graph; 0 on the CPU.
  int64_t device_graph_replays() const;
  std::vector<LayerStats> kv_stats() const;
  // Absolute positions one layer's kv head holds now, sorted ascending.
  std::vector<int32_t> kv_positions(int layer, int kv_head) const;
  // Shows `trace` every compaction of any layer that drops rows, from now on (kv_cache.h's
  // EvictionEvent: what each head held, its scores, what survived); an empty function stops it.
  // A diagnostic: each traced compaction copies the layer's metadata to the host.
  void trace_evictions(EvictionTrace trace);
  // A saved KV cache (docs/kv_file.md): the sequence's caches, position and the token ids it has
  // run (`tokens`, position() of them, which the caller kept), as bytes. Error when a policy is
  // between phases (a squeeze schedule or kvzip's scoring pending: save once the prompt has run)
  // or for the custom policy.
  std::vector<uint8_t> save_kv(std::span<const int> tokens) const;
  // Replaces the sequence with a saved one (from save_kv of a session of this model with this
  // session's cache settings and --ctx) and returns the token ids it covers; it then continues
  // exactly as the saved one would have on the same device. FormatError naming `source` for bytes
  // that are not a saved cache; Error for another model or settings that differ (naming the flag),
  // before the sequence is touched.
  std::vector<int> load_kv(std::span<const uint8_t> bytes, const std::string& source = "bytes");
  // The same through a file (written whole: a temporary file renamed over the path); Error naming
  // the path when it cannot be written or read.
  void save_kv_file(const std::string& path, std::span<const int> tokens) const;
  std::vector<int> load_kv_file(const std::string& path);
  // The squeeze coordinator of this sequence (null for other policies).
  const SqueezeCoordinator* coordinator() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace squeezekv
