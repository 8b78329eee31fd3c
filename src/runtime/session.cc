// Session: one sequence on its own Runner (runner.h holds the forward pass).
#include "squeezekv/session.h"

#include <algorithm>
#include <string>

#include "core/enum_table.h"
#include "runtime/kv_file.h"
#include "runtime/runner.h"
#include "squeezekv/error.h"

namespace squeezekv {

namespace {
const EnumName<DecodeActivations> kActivations[] = {{"f32", DecodeActivations::kF32}, {"int8", DecodeActivations::kInt8}};
}  // namespace

DecodeActivations parse_decode_activations(const std::string& s) { return parse_enum("--decode-activations", s, kActivations); }
const char* decode_activations_name(DecodeActivations a) { return enum_name(a, kActivations); }

struct Session::Impl {
  CachePlan plan;  // made first: a bad config is refused before the weights go to the device
  Runner runner;
  SequenceState seq;
  int chunk = 0;                // rows per step
  std::vector<float> logits;    // [n][V] when every row's logits are asked for
  EvictionTrace trace;          // trace_evictions's, which the caches point to

  Impl(const Model& m, const SessionOptions& o)
      : plan(Runner::plan_sequence(m.config(), o.cache, o)),
        runner(m, o, std::min(o.prefill_chunk, plan.max_tokens())),  // the runner checks the chunk
        seq(runner.new_sequence(plan)),
        chunk(runner.max_rows()) {}
};

Session::Session(const Model& model, const SessionOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}
Session::~Session() = default;

std::span<const float> Session::forward(std::span<const int> tokens, bool all_logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.runner.model().config();
  const int V = c.vocab_size;
  // the whole input first: a bad one runs no chunk
  const int n = static_cast<int>(std::min<size_t>(tokens.size(), INT32_MAX));
  m.runner.check({&m.seq, tokens.data(), n}, "forward");
  std::span<const float> last;
  if (all_logits) m.logits.resize(static_cast<size_t>(n) * V);
  const int64_t input_end = m.seq.pos + static_cast<int64_t>(n);
  for (int s = 0; s < n; s += m.chunk) {
    const int T = std::min(m.chunk, n - s);
    const Segment seg{&m.seq, tokens.data() + s, T, input_end};
    m.runner.step({&seg, 1}, "forward");
    if (all_logits) {
      const std::span<const float> l = m.runner.logits(0, T, false);
      std::copy(l.begin(), l.end(), m.logits.begin() + static_cast<size_t>(s) * V);
    } else if (s + T == n) {  // the last row only
      last = m.runner.logits(T - 1, 1, false);
    }
  }
  return all_logits ? std::span<const float>(m.logits) : last;
}

void Session::reset() {
  impl_->seq.pos = 0;
  impl_->seq.caches.reset();
  impl_->seq.context.clear();
}

int Session::position() const { return impl_->seq.pos; }
const Model& Session::model() const { return impl_->runner.model(); }
std::string Session::device_description() const { return impl_->runner.backend().describe(); }
double Session::device_copy_bandwidth() { return impl_->runner.backend().copy_bandwidth(); }
int64_t Session::device_graph_replays() const { return impl_->runner.backend().graph_replays(); }
int64_t Session::device_matrix_bytes() const { return impl_->runner.matrix_bytes(); }

std::vector<LayerStats> Session::kv_stats() const {
  std::vector<LayerStats> out;
  for (const LayerCache& c : impl_->seq.caches.layers) out.push_back(c.stats());
  return out;
}

std::vector<int32_t> Session::kv_positions(int layer, int kv_head) const { return held_positions(impl_->seq, layer, kv_head); }

void Session::trace_evictions(EvictionTrace trace) {
  impl_->trace = std::move(trace);
  impl_->seq.caches.set_trace(impl_->trace ? &impl_->trace : nullptr);
}

std::vector<uint8_t> Session::save_kv(std::span<const int> tokens) const {
  return serialize_sequence(impl_->runner.model(), impl_->seq, tokens);
}

std::vector<int> Session::load_kv(std::span<const uint8_t> bytes, const std::string& source) {
  Impl& m = *impl_;
  const SavedSequence saved = parse_saved_sequence(bytes, m.runner.model(), source);
  if (const std::string why = saved_settings_mismatch(saved, m.plan.config(), m.seq.max_tokens); !why.empty())
    throw Error("kv cache '" + source + "': " + why);
  // Restored into a new sequence of the same plan, which takes this one's place only once every
  // layer has taken its rows: a cache refused while its layers are restored (a row's position or
  // value, a policy's state) leaves the session as it was. For that moment both caches are held.
  SequenceState seq = m.runner.new_sequence(m.plan);
  restore_sequence(seq, saved);
  seq.caches.set_trace(m.trace ? &m.trace : nullptr);
  m.seq = std::move(seq);
  return saved.tokens;
}

void Session::save_kv_file(const std::string& path, std::span<const int> tokens) const { write_kv_file(path, save_kv(tokens)); }
std::vector<int> Session::load_kv_file(const std::string& path) { return load_kv(read_kv_file(path), path); }

const SqueezeCoordinator* Session::coordinator() const { return impl_->seq.caches.coordinator.get(); }

}  // namespace squeezekv
