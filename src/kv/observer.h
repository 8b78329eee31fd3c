// What a layer's forward pass shows the cache that watches it (gemma.cpp's observer idea): the
// runner calls the hooks of a layer's observer, when the layer has one, at fixed points of the
// recipe, and the observer reads what it needs there. So a policy's extra inputs (squeeze's
// metrics: the keys, the attention entropy, the residual stream, the output under a cut) live with
// the policy, and the forward pass stays one op per line.
// Letters: T rows of this sequence in the step, E hidden, H query heads, G kv heads, D head dim.
// Thread safety: none; called by the one thread that runs the sequence's step.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace squeezekv {

class LayerCache;

// Scratch the runner lends every observer of a step (one set per runner, not per layer): host
// copies of backend memory and one device buffer.
struct ObserverScratch {
  std::vector<float> a, b;
  std::unique_ptr<Buffer> dev;
  // n floats of backend memory in host memory (a or b), copied down.
  const float* host(Backend& backend, std::vector<float>& to, const float* src, size_t n) {
    if (to.size() < n) to.resize(n);
    backend.download(to.data(), src, n * sizeof(float));
    return to.data();
  }
  float* device(Backend& backend, size_t n) {
    if (!dev || dev->bytes() < n * sizeof(float)) dev = backend.alloc(n * sizeof(float));
    return dev->as<float>();
  }
};

// One sequence's rows of the step at one layer. Pointers are the backend's memory.
struct LayerRows {
  Backend* backend = nullptr;
  ObserverScratch* scratch = nullptr;
  int T = 0, E = 0, H = 0, G = 0, D = 0;
  const float* q = nullptr;          // [T][H*D] rotated queries
  const float* k = nullptr;          // [T][G*D] rotated keys, as the cache stores them
  const int32_t* q_pos = nullptr;    // [T] positions
  const float* att = nullptr;        // [T][H*D] the attention output (from after_attention on)
  int64_t input_end = 0;             // where the caller's current input ends (Segment::input_end)
};

class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  // Whether after_block needs the layer's input: the runner then keeps a copy of it.
  virtual bool wants_layer_input() const { return false; }
  // After q, k and v, before the rows join the cache.
  virtual void before_attention(const LayerRows&) {}
  // What the layer's attention must also report (the probe's optional fields).
  virtual void ask(AttentionProbe&) {}
  // After attention over the layer's cache (probe: what it reported).
  virtual void after_attention(const LayerRows&, const AttentionProbe&, LayerCache&) {}
  // After the residual add of the attention block: x_in, x [T][E] the layer's input and
  // x + attn(norm(x)).
  virtual void after_block(const LayerRows&, const float* /*x_in*/, const float* /*x*/) {}
};

}  // namespace squeezekv
