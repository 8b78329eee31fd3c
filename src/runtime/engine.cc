// Engine (many sequences on one Runner) and Scheduler (requests over an Engine): engine.h.
#include "squeezekv/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "runtime/kv_file.h"
#include "runtime/prompt_cache.h"
#include "runtime/runner.h"
#include "squeezekv/error.h"

namespace squeezekv {

struct Engine::Impl {
  Runner runner;
  int max_batch = 0;
  SequenceId next_id = 1;
  std::map<SequenceId, std::unique_ptr<SequenceState>> seqs;
  std::vector<Segment> segments;  // [max_batch], reused
  std::vector<int> last_rows;     // a step's rows that give logits or picks, reused
  bool picks_pending = false;     // issue_decode ran; decode_picks has not

  Impl(const Model& m, const SessionOptions& o, int batch) : runner(m, o, rows(o, batch)), max_batch(batch) {}
  static int rows(const SessionOptions& o, int batch) {
    if (batch < 1) throw Error("engine: the batch must hold at least 1 sequence, got " + std::to_string(batch));
    return std::max(o.prefill_chunk, batch);  // the runner checks the chunk
  }
  // What the live sequences' caches hold, for --max-memory and the KV pool.
  KvHeld held() const {
    KvHeld h;
    for (const auto& [id, q] : seqs) h.bytes += q->kv_bytes, h.pool += q->pool_bytes;
    return h;
  }
  // One decode step of the listed sequences (checked: 1 to max_batch, one token each).
  void decode_step(std::span<const SequenceId> ids, std::span<const int> tokens);
  // Refuses a step while an issued decode's picks are still to be taken (they share the runner's
  // buffers).
  void check_no_pending() const {
    if (picks_pending) throw Error("engine: a step while the issued decode's tokens are not taken (decode_picks first)");
  }
  // One prefill step of the parts (checked); last_rows: each part's last row.
  void prefill_step(std::span<const PrefillPart> parts);
  // Refuses sampling settings that are not one per `what` (n of them) or out of range, naming them.
  void check_params(std::span<const SampleParams> params, size_t n, const char* what) const;
  SequenceState& get(SequenceId id) {
    auto it = seqs.find(id);
    if (it == seqs.end()) throw Error("engine: no sequence " + std::to_string(id));
    return *it->second;
  }
};

Engine::Engine(const Model& model, const SessionOptions& options, int max_batch)
    : impl_(std::make_unique<Impl>(model, options, max_batch)) {}
Engine::~Engine() = default;

SequenceId Engine::add_sequence(const CacheConfig& cache) {
  auto s = std::make_unique<SequenceState>(impl_->runner.new_sequence(cache, impl_->held()));
  const SequenceId id = impl_->next_id++;
  impl_->seqs.emplace(id, std::move(s));
  return id;
}

SequenceId Engine::copy_sequence(SequenceId id) {
  const SequenceState& src = impl_->get(id);
  auto s = std::make_unique<SequenceState>(impl_->runner.copy_sequence(src, impl_->held()));
  const SequenceId copy = impl_->next_id++;
  impl_->seqs.emplace(copy, std::move(s));
  return copy;
}

std::vector<uint8_t> Engine::save_sequence(SequenceId id, std::span<const int> tokens) const {
  return serialize_sequence(impl_->runner.model(), impl_->get(id), tokens);
}

SequenceId Engine::load_sequence(std::span<const uint8_t> bytes, std::vector<int>* tokens, const std::string& source) {
  const SavedSequence saved = parse_saved_sequence(bytes, impl_->runner.model(), source);
  auto s = std::make_unique<SequenceState>(impl_->runner.new_sequence(saved.cache, impl_->held()));
  if (const std::string why = saved_settings_mismatch(saved, s->config, s->max_tokens); !why.empty())
    throw Error("kv cache '" + source + "': " + why);  // (a --ctx beyond what this engine allows)
  restore_sequence(*s, saved);
  if (tokens != nullptr) *tokens = saved.tokens;
  const SequenceId id = impl_->next_id++;
  impl_->seqs.emplace(id, std::move(s));
  return id;
}

void Engine::remove_sequence(SequenceId id) { impl_->seqs.erase(id); }

std::span<const float> Engine::prefill(SequenceId id, std::span<const int> tokens, int prompt_end, bool all_logits) {
  impl_->check_no_pending();
  SequenceState& s = impl_->get(id);
  const int n = static_cast<int>(std::min(tokens.size(), static_cast<size_t>(INT32_MAX)));
  if (n > impl_->runner.prefill_chunk())
    throw Error("engine: prefill of " + std::to_string(n) + " tokens (expected 1 to the prefill chunk, " +
                std::to_string(impl_->runner.prefill_chunk()) + ")");
  const Segment seg{&s, tokens.data(), n, prompt_end};
  impl_->runner.step({&seg, 1}, "engine");
  return all_logits ? impl_->runner.logits(0, n, false) : impl_->runner.logits(n - 1, 1, false);
}

std::span<const float> Engine::prefill(std::span<const PrefillPart> parts) {
  impl_->prefill_step(parts);
  return impl_->runner.logits_of_rows(impl_->last_rows);
}

std::span<const int> Engine::prefill_sampled(std::span<const PrefillPart> parts, std::span<const SampleParams> params) {
  impl_->check_params(params, parts.size(), "parts");
  impl_->prefill_step(parts);
  return impl_->runner.picks_of_rows(impl_->last_rows, params);
}

void Engine::Impl::prefill_step(std::span<const PrefillPart> parts) {
  Impl& m = *this;
  m.check_no_pending();
  if (parts.empty()) throw Error("engine: prefill of no sequences");
  m.segments.clear();
  m.last_rows.clear();
  int rows = 0;
  for (const PrefillPart& p : parts) {
    const int n = static_cast<int>(std::min(p.tokens.size(), static_cast<size_t>(INT32_MAX)));
    if (n > m.runner.prefill_chunk())
      throw Error("engine: prefill of " + std::to_string(n) + " tokens for sequence " + std::to_string(p.id) +
                  " (expected 1 to the prefill chunk, " + std::to_string(m.runner.prefill_chunk()) + ")");
    m.segments.push_back({&m.get(p.id), p.tokens.data(), n, p.prompt_end});
    rows += n;
    m.last_rows.push_back(rows - 1);
  }
  m.runner.step(m.segments, "engine");  // the step's checks: each sequence once, the rows within max_rows
}

std::span<const float> Engine::decode(std::span<const SequenceId> ids, std::span<const int> tokens) {
  impl_->decode_step(ids, tokens);
  return impl_->runner.logits(0, static_cast<int>(ids.size()), true);
}

std::span<const int> Engine::decode_sampled(std::span<const SequenceId> ids, std::span<const int> tokens,
                                            std::span<const SampleParams> params) {
  issue_decode(ids, tokens, params);
  return decode_picks();
}

void Engine::issue_decode(std::span<const SequenceId> ids, std::span<const int> tokens, std::span<const SampleParams> params) {
  impl_->check_params(params, ids.size(), "sequences");
  impl_->decode_step(ids, tokens);
  std::vector<int>& rows = impl_->last_rows;
  rows.resize(ids.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(i);
  impl_->runner.issue_picks(rows, params);
  impl_->picks_pending = true;
}

std::span<const int> Engine::decode_picks() {
  if (!impl_->picks_pending) throw Error("engine: decode_picks with no decode issued (issue_decode)");
  impl_->picks_pending = false;
  return impl_->runner.picks();
}

void Engine::Impl::check_params(std::span<const SampleParams> params, size_t n, const char* what) const {
  if (params.size() != n)
    throw Error("engine: " + std::to_string(params.size()) + " sampling settings for " + std::to_string(n) + " " + what +
                " (expected one each)");
  for (const SampleParams& p : params)
    if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f) || !(p.top_p > 0.0f && p.top_p <= 1.0f) ||
        !(p.min_p >= 0.0f && p.min_p < 1.0f) || p.top_k < 0 || !(p.draw >= 0.0 && p.draw < 1.0))
      throw Error("engine: sampling settings (expected temperature >= 0, top_p in (0, 1], min_p in [0, 1), top_k >= 0, "
                  "draw in [0, 1); got " + std::to_string(p.temperature) + ", " + std::to_string(p.top_p) + ", " +
                  std::to_string(p.min_p) + ", " + std::to_string(p.top_k) + ", " + std::to_string(p.draw) + ")");
}

void Engine::Impl::decode_step(std::span<const SequenceId> ids, std::span<const int> tokens) {
  Impl& m = *this;
  m.check_no_pending();
  const int n = static_cast<int>(ids.size());
  if (n < 1 || n > m.max_batch || tokens.size() != ids.size())
    throw Error("engine: decode of " + std::to_string(n) + " sequences with " + std::to_string(tokens.size()) +
                " tokens (expected 1 to " + std::to_string(m.max_batch) + ", one token each)");
  m.segments.clear();
  for (int i = 0; i < n; ++i) m.segments.push_back({&m.get(ids[i]), &tokens[i], 1});
  m.runner.step(m.segments, "engine");
}

int Engine::position(SequenceId id) const { return impl_->get(id).pos; }
int Engine::max_tokens(SequenceId id) const { return impl_->get(id).max_tokens; }
int Engine::context_limit(const CacheConfig& cache) const { return sequence_max_tokens(impl_->runner.model().config(), cache); }
std::vector<LayerStats> Engine::kv_stats(SequenceId id) const {
  std::vector<LayerStats> out;
  for (const LayerCache& c : impl_->get(id).caches.layers) out.push_back(c.stats());
  return out;
}
std::vector<int32_t> Engine::kv_positions(SequenceId id, int layer, int kv_head) const {
  return held_positions(impl_->get(id), layer, kv_head);
}
int Engine::sequences() const { return static_cast<int>(impl_->seqs.size()); }
KvPoolUsage Engine::kv_pool() const {
  KvPoolUsage u;
  u.limit = impl_->runner.kv_pool();
  u.reserved = impl_->held().pool;
  for (const auto& [id, q] : impl_->seqs) ++(q->config.policy == KvPolicy::kFull ? u.sequences_full : u.sequences_budgeted);
  return u;
}
int Engine::max_batch() const { return impl_->max_batch; }
int Engine::prefill_chunk() const { return impl_->runner.prefill_chunk(); }
bool Engine::batch_invariant() const { return impl_->runner.batch_invariant(); }
int64_t Engine::device_graph_replays() const { return impl_->runner.backend().graph_replays(); }
const Model& Engine::model() const { return impl_->runner.model(); }
std::string Engine::device_description() const { return impl_->runner.backend().describe(); }

// ---------------------------------------------------------------------------------------------

struct Scheduler::Impl {
  using clock = std::chrono::steady_clock;
  struct Request {
    int64_t id = 0;
    GenerationRequest r;
    std::unique_ptr<Generation> gen;
    SequenceId seq = -1;
    size_t prefilled = 0;  // prompt tokens run so far
    int next_token = -1;   // the token the next decode step runs
    bool cancelled = false;
    // the decode step in flight holds a row of it (stepping); the step before's token for it is
    // waiting to be taken (taking: pick). Either keeps it in running, even once it has finished.
    bool stepping = false, taking = false;
    int pick = -1;
    std::string cache_key;  // its prefix's settings in the prompt cache ("" when none is kept)
    int cached = 0;          // prompt tokens it took from a kept prefix
    clock::time_point admitted, prompt_done;
  };
  Engine& engine;
  int64_t next_id = 1;
  std::deque<std::unique_ptr<Request>> waiting;
  std::vector<std::unique_ptr<Request>> running;  // in admission order
  std::vector<SequenceId> ids;                    // one decode step's sequences, reused
  std::vector<int> tokens;
  std::vector<Request*> batch;                    // a step's requests, in its order
  std::vector<SampleParams> params;               // a step's sampling settings and draws
  std::vector<Engine::PrefillPart> parts;         // a prefill step's chunks, reused
  std::vector<Request*> ended;                    // a prefill step's requests whose prompt ended
  std::vector<int> ended_picks;                   // [ended] their first tokens
  std::vector<Request*> flight;                   // the issued decode step's requests, in its order
  std::vector<Request*> taking;                   // the step before's requests whose tokens are taken this step
  SchedulerTimes times;
  std::unique_ptr<PromptCache> cache;  // null: no prompt cache
  PromptCacheStats cache_stats;
  static double since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

  Impl(Engine& e, const SchedulerOptions& o) : engine(e) {
    if (o.prompt_cache_bytes < 0)
      throw Error("scheduler: prompt cache of " + std::to_string(o.prompt_cache_bytes) + " bytes (expected 0 or more)");
    if (o.prompt_cache_bytes > 0) cache = std::make_unique<PromptCache>(o.prompt_cache_bytes);
  }

  std::span<const int> prefix_of(const Request& q) const { return std::span<const int>(q.r.prompt).first(static_cast<size_t>(q.r.cache_prefix)); }
  // A new sequence for q: a copy of its prefix's compressed cache where the prompt cache keeps it
  // (q then starts after the prefix), else an empty one; a full cache starts from the longest
  // kept prefix of its own (a conversation's turn before), the rest of the prefix then runs.
  // MemoryLimitError as add_sequence.
  SequenceId start_sequence(Request& q) {
    if (q.r.cache_prefix > 0 && cache) {
      if (const auto key = prompt_cache_settings(q.r.cache, engine.context_limit(q.r.cache))) {
        q.cache_key = *key;
        const auto [bytes, n] = q.r.cache.policy == KvPolicy::kFull
                                    ? cache->find_longest(q.cache_key, prefix_of(q))
                                    : std::pair{cache->find(q.cache_key, prefix_of(q)), q.r.cache_prefix};
        if (bytes != nullptr) {
          SequenceId id = -1;
          try {
            id = engine.load_sequence(*bytes, nullptr, "prompt cache");
          } catch (const MemoryLimitError&) {
            throw;
          } catch (const Error&) {  // (bytes this engine saved: not expected) run the prefix instead
            cache->erase(q.cache_key, prefix_of(q).first(static_cast<size_t>(n)));
          }
          if (id >= 0) {
            q.cached = n;
            q.prefilled = static_cast<size_t>(n);
            q.gen->result().cached_tokens = n;
            ++cache_stats.hits;
            cache_stats.tokens_saved += n;
            return id;
          }
        }
      }
    }
    const SequenceId id = engine.add_sequence(q.r.cache);
    if (!q.cache_key.empty()) ++cache_stats.misses;
    return id;
  }
  // After a prefill step: q's prefix has just run (it was not kept whole): its cache is kept.
  void keep_prefix(Request& q) {
    if (q.cache_key.empty() || q.cached == q.r.cache_prefix || q.prefilled != static_cast<size_t>(q.r.cache_prefix) || q.seq < 0) return;
    if (cache->contains(q.cache_key, prefix_of(q))) return;  // another request kept it meanwhile
    try {
      cache->put(q.cache_key, prefix_of(q), engine.save_sequence(q.seq, prefix_of(q)));
    } catch (const Error&) {  // a state that cannot be saved: the request goes on, nothing is kept
    }
  }

  void finish(Request& q, const std::string& reason, const std::string& error = {}, bool request_error = false) {
    q.gen->finish(reason);
    GenerateResult& res = q.gen->result();
    if (reason == "error") {
      res.stop_reason = "error";
      res.error = error;
      res.request_error = request_error;
    }
    const auto now = clock::now();
    if (q.prefilled < q.r.prompt.size()) q.prompt_done = now;
    res.prompt_seconds = std::chrono::duration<double>(q.prompt_done - q.admitted).count();
    res.generate_seconds = std::chrono::duration<double>(now - q.prompt_done).count();
    if (q.seq >= 0) engine.remove_sequence(q.seq);
    q.seq = -1;
    if (q.r.on_done) q.r.on_done(res);
  }
  // Removes finished requests from running (their on_done has run) that no step holds.
  void sweep() {
    running.erase(std::remove_if(running.begin(), running.end(), [](const auto& q) { return q->seq < 0 && !q->stepping && !q->taking; }),
                  running.end());
  }
  // The tokens of the decode step in flight, each for its request's taking (a request that
  // finished meanwhile drops its row's); then nothing is in flight.
  void land() {
    if (flight.empty()) return;
    const auto t0 = clock::now();
    try {
      const std::span<const int> picked = engine.decode_picks();
      for (size_t i = 0; i < flight.size(); ++i) {
        Request& q = *flight[i];
        q.stepping = false;
        if (q.seq < 0) continue;
        q.pick = picked[i], q.taking = true;
        taking.push_back(&q);
      }
    } catch (const std::exception& e) {
      for (Request* q : flight) {
        q->stepping = false;
        if (q->seq >= 0) finish(*q, "error", e.what());
      }
    }
    times.decode_seconds += since(t0);
    flight.clear();
  }
  // Each request in rows takes its token picks[i] (picked where the logits are:
  // Engine::prefill_sampled, Engine::decode_sampled), in order; finishes the request when its
  // generation ends.
  void accept_all(std::span<Request* const> rows, std::span<const int> picks_in) {
    for (size_t i = 0; i < rows.size(); ++i) {
      Request& q = *rows[i];
      q.next_token = q.gen->accept(picks_in[i]);
      if (q.next_token < 0) finish(q, q.gen->result().stop_reason);
      else if (engine.position(q.seq) + 1 > engine.max_tokens(q.seq)) finish(q, "length");  // the context is full
    }
  }
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& options) : impl_(std::make_unique<Impl>(engine, options)) {}
Scheduler::~Scheduler() {
  if (!impl_->flight.empty()) {  // the engine's issued step is taken, so it can step again
    try {
      impl_->engine.decode_picks();
    } catch (...) {
    }
  }
}

int64_t Scheduler::submit(GenerationRequest request) {
  Impl& m = *impl_;
  validate(request.cache);
  auto q = std::make_unique<Impl::Request>();
  q->gen = std::make_unique<Generation>(m.engine.model().tokenizer(), request.prompt, request.options, request.on_text);
  check_token_ids(request.prompt, m.engine.model().config().vocab_size, "prompt");
  if (request.cache_prefix < 0 || (request.cache_prefix > 0 && static_cast<size_t>(request.cache_prefix) >= request.prompt.size()))
    throw Error("cache_prefix: expected 0 (none) or fewer tokens than the prompt's " + std::to_string(request.prompt.size()) + ", got " +
                std::to_string(request.cache_prefix));
  q->id = m.next_id++;
  q->r = std::move(request);
  m.waiting.push_back(std::move(q));
  return m.waiting.back()->id;
}

void Scheduler::cancel(int64_t id) {
  for (auto& q : impl_->waiting)
    if (q->id == id) q->cancelled = true;
  for (auto& q : impl_->running)
    if (q->id == id) q->cancelled = true;
}

bool Scheduler::step() {
  Impl& m = *impl_;
  const auto step_start = Impl::clock::now();
  const int64_t calls_before = m.times.prefill_calls + m.times.decode_calls;
  // The decode step issued by the last call comes first: its tokens are taken below, after the
  // next decode step is issued, so the device runs that step while the host streams them.
  m.taking.clear();
  m.land();
  // stops asked for since the last step (a request with a token to take takes it first, below)
  for (auto& q : m.running)
    if (q->cancelled && !q->taking && q->seq >= 0) m.finish(*q, "cancelled");
  m.sweep();
  for (auto it = m.waiting.begin(); it != m.waiting.end();) {
    if ((*it)->cancelled) {
      (*it)->admitted = (*it)->prompt_done = Impl::clock::now();
      m.finish(**it, "cancelled");
      it = m.waiting.erase(it);
    } else {
      ++it;
    }
  }
  // admission, first come first served
  while (static_cast<int>(m.running.size()) < m.engine.max_batch() && !m.waiting.empty()) {
    std::unique_ptr<Impl::Request> q = std::move(m.waiting.front());
    m.waiting.pop_front();
    q->admitted = Impl::clock::now();
    try {
      try {
        q->seq = m.start_sequence(*q);
      } catch (const MemoryLimitError& e) {
        // it would fit once running sequences finish: it waits at the head of the queue
        if (!e.alone() && !m.running.empty()) {
          m.waiting.push_front(std::move(q));
          break;
        }
        throw;
      }
      if (static_cast<int>(q->r.prompt.size()) >= m.engine.max_tokens(q->seq))
        throw Error("prompt: " + std::to_string(q->r.prompt.size()) + " tokens leave no room to generate in a context of " +
                    std::to_string(m.engine.max_tokens(q->seq)));
    } catch (const std::exception& e) {  // what the request asks for cannot be had
      m.finish(*q, "error", e.what(), true);
      continue;
    }
    m.running.push_back(std::move(q));
  }
  // Prompt chunks between two decode steps, oldest request first, up to one chunk's worth of
  // tokens in all (the stall a running stream sees is at most one chunk, as with one request),
  // run as one step (the weights read once for all of them): requests that arrive together start
  // decoding together. A request's chunks are those it gets alone (min(rest, chunk)), so its
  // attention and eviction are the same; a chunk that does not fit in what is left of this step's
  // tokens waits for the next step. A request's cache_prefix runs as a prompt that ends there,
  // then the rest as a prompt of its own. Under --batch-invariant one request's chunk a step: its
  // rows then go through the products alone, as generate's do (joined, they are within rounding of
  // that on a GPU's tensor cores).
  size_t tokens_left = static_cast<size_t>(m.engine.prefill_chunk());
  m.parts.clear();
  m.batch.clear();
  for (auto& q : m.running) {
    if (q->prefilled >= q->r.prompt.size()) continue;
    const size_t split = static_cast<size_t>(q->r.cache_prefix);
    const size_t end = q->prefilled < split ? split : q->r.prompt.size();
    const size_t T = std::min(end - q->prefilled, static_cast<size_t>(m.engine.prefill_chunk()));
    if (T > tokens_left) break;
    tokens_left -= T;
    m.parts.push_back({q->seq, std::span<const int>(q->r.prompt).subspan(q->prefilled, T), static_cast<int>(end)});
    m.batch.push_back(q.get());
    if (m.engine.batch_invariant()) break;
  }
  if (!m.parts.empty()) {
    try {
      // a part that ends its prompt picks its first token where the logits are (its settings and
      // draw); the others' picks are not used
      m.params.clear();
      for (size_t i = 0; i < m.batch.size(); ++i)
        m.params.push_back(m.batch[i]->prefilled + m.parts[i].tokens.size() == m.batch[i]->r.prompt.size() ? m.batch[i]->gen->next_params()
                                                                                                          : SampleParams{});
      const auto t0 = Impl::clock::now();
      const std::span<const int> picked = m.engine.prefill_sampled(m.parts, m.params);
      m.times.prefill_seconds += Impl::since(t0);
      ++m.times.prefill_calls;
      for (const auto& p : m.parts) m.times.prefill_tokens += static_cast<int64_t>(p.tokens.size());
      m.ended.clear();
      m.ended_picks.clear();
      for (size_t i = 0; i < m.batch.size(); ++i) {
        Impl::Request& q = *m.batch[i];
        q.prefilled += m.parts[i].tokens.size();
        m.keep_prefix(q);
        if (q.prefilled == q.r.prompt.size()) {  // the prompt's last chunk: its first token
          q.prompt_done = Impl::clock::now();
          m.ended.push_back(&q);
          m.ended_picks.push_back(picked[i]);
        }
      }
      m.accept_all(m.ended, m.ended_picks);
    } catch (const std::exception& e) {
      for (Impl::Request* q : m.batch)
        if (q->seq >= 0) m.finish(*q, "error", e.what());
    }
  }
  m.sweep();
  // One decode step for every request that is generating: those that took their token in a
  // prompt step run it; those of the step before run the token it picked for them unless that
  // token certainly ends them (an end-of-generation token, their last allowed, a full context);
  // a stop string it completes ends them once it is taken below, and their row in this step is
  // dropped when it lands.
  m.ids.clear();
  m.tokens.clear();
  m.batch.clear();
  for (auto& q : m.running) {
    if (q->seq < 0 || q->cancelled) continue;
    int token;
    if (q->taking) {
      if (q->gen->ends_with(q->pick) || m.engine.position(q->seq) + 1 > m.engine.max_tokens(q->seq)) continue;
      token = q->pick;
    } else if (q->prefilled == q->r.prompt.size() && q->next_token >= 0) {
      token = q->next_token;
    } else {
      continue;
    }
    m.ids.push_back(q->seq);
    m.tokens.push_back(token);
    m.batch.push_back(q.get());
  }
  if (!m.batch.empty()) {
    try {
      // the batch's tokens picked where the logits are (no n x V copy, no host sampling)
      m.params.clear();
      for (Impl::Request* q : m.batch) m.params.push_back(q->gen->next_params());
      const auto t0 = Impl::clock::now();
      m.engine.issue_decode(m.ids, m.tokens, m.params);
      m.times.decode_seconds += Impl::since(t0);
      ++m.times.decode_calls;
      m.times.decode_rows += static_cast<int64_t>(m.ids.size());
      for (Impl::Request* q : m.batch) q->stepping = true;
      m.flight = m.batch;
    } catch (const std::exception& e) {
      for (Impl::Request* q : m.batch)
        if (q->seq >= 0) m.finish(*q, "error", e.what());
    }
  }
  // the step before's tokens taken (text, stop strings, callbacks) while the device runs this one
  for (Impl::Request* q : m.taking) {
    q->taking = false;
    if (q->seq < 0) continue;  // ended meanwhile (an error)
    q->next_token = q->gen->accept(q->pick);
    if (q->next_token < 0) m.finish(*q, q->gen->result().stop_reason);
    else if (q->cancelled) m.finish(*q, "cancelled");
    else if (!q->stepping) m.finish(*q, "length");  // left out above: its context is full
  }
  m.taking.clear();
  m.sweep();
  if (m.times.prefill_calls + m.times.decode_calls > calls_before) {
    ++m.times.steps;
    m.times.step_seconds += Impl::since(step_start);
  }
  return !m.running.empty() || !m.waiting.empty() || !m.flight.empty();
}

SchedulerTimes Scheduler::times() const { return impl_->times; }

PromptCacheStats Scheduler::prompt_cache() const {
  PromptCacheStats s = impl_->cache_stats;
  if (const PromptCache* c = impl_->cache.get()) {
    s.limit = c->limit();
    s.bytes = c->bytes();
    s.entries = c->entries();
    s.evicted = c->evicted();
  }
  return s;
}

int Scheduler::running() const {  // (a finished request the step in flight still holds is not running)
  return static_cast<int>(std::count_if(impl_->running.begin(), impl_->running.end(), [](const auto& q) { return q->seq >= 0; }));
}
int Scheduler::waiting() const { return static_cast<int>(impl_->waiting.size()); }

KvUsage Scheduler::kv_usage() const {
  KvUsage u;
  for (const auto& q : impl_->running)
    if (q->seq >= 0)
      for (const LayerStats& s : impl_->engine.kv_stats(q->seq)) {
        u.held += s.kept_bytes;
        u.full += s.full_bytes;
      }
  return u;
}

}  // namespace squeezekv
