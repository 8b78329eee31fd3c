// `squeezekv serve` (server.h): OpenAI-style endpoints, SSE streaming, Prometheus metrics.
// Threads: cpp-httplib's pool runs the handlers (parse, validate, wait for text, write it); one
// engine thread owns the Scheduler. They meet in a Job (one per request, its own lock) and in
// the inbox (the server's lock).
#include "server/server.h"

#include "server/request.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "squeezekv/engine.h"
#include "squeezekv/error.h"
#include "squeezekv/generate.h"

namespace squeezekv::server {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

// A response body as text. Any byte that is not UTF-8 (a message that echoes a client's bytes)
// becomes U+FFFD instead of failing the reply.
std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message, const std::string& type, const std::string& param) {
  return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", nullptr}}}};
}

// One request between its HTTP thread and the engine thread.
struct Job {
  RequestKind kind = RequestKind::kChat;
  GenerationRequest request;  // moved into the Scheduler when admitted to it
  bool stream = false;
  bool include_usage = false;
  std::string id;  // "chatcmpl-N" / "cmpl-N"
  int64_t created = 0;
  int64_t scheduler_id = 0;
  std::atomic<bool> cancelled{false};  // the client went away
  // guarded by m
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::string> pieces;  // text not yet sent
  bool done = false;
  GenerateResult result;
};

const char* finish_reason(const std::string& stop_reason) {
  return stop_reason == "length" ? "length" : "stop";  // eos and stop strings are both "stop" in the API
}

// SIGINT and SIGTERM, blocked in the calling thread (and so in every thread it starts after
// this): one thread waits for them with sigwait. Called before the engine starts, because a device
// runtime (CUDA) starts threads of its own that would otherwise take the signal and die with it.
sigset_t stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away is seen as a failed write
  return sigs;
}

// How long a non-streamed request is answered as a whole (with its true status) before the
// response starts with keep-alive whitespace.
constexpr auto kPatience = std::chrono::seconds(2);

class Server {
 public:
  Server(const Model& model, const ServeOptions& o) : model_(model), opt_(o), engine_(model, o.session, o.parallel), sched_(engine_, SchedulerOptions{o.prompt_cache_bytes}) {
    limits_.model = &model;
    kv_pool_ = engine_.kv_pool();
    limits_.kv_defaults = o.session.cache;
    limits_.ctx = engine_.context_limit(o.session.cache);
    limits_.max_prompt = o.max_prompt_tokens > 0 ? o.max_prompt_tokens : limits_.ctx - 1;
    limits_.chat_format = detect_chat_format(model.chat_template());
    limits_.prompt_cache = o.prompt_cache_bytes > 0;
  }

  int run() {
    sigset_t sigs = stop_signals();

    httplib::Server http;
    // handlers for every running and queued request plus a few for health, metrics and refusals
    const int threads = opt_.parallel + opt_.queue + 4;
    http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    http.set_payload_max_length(16u << 20);
    // cpp-httplib listens with a backlog of 5 connections (CPPHTTPLIB_LISTEN_BACKLOG, compiled into
    // Debian's library): 64 clients that connect at once overflow it, and some are reset (seen on
    // the H200 machine with bench_server.py, 2026-12-02). Its listening socket, seen here as it is
    // made, is given a backlog for every handler thread once bound (Linux takes a second listen()
    // on a listening socket as a new backlog).
    int listen_fd = -1;
    http.set_socket_options([&listen_fd](socket_t sock) {
      httplib::default_socket_options(sock);
      listen_fd = sock;
    });
    routes(http);
    int port = opt_.port;
    if (port == 0) {
      port = http.bind_to_any_port(opt_.host);
      if (port < 0) throw Error("--host: cannot listen on " + opt_.host);
    } else if (!http.bind_to_port(opt_.host, port)) {
      throw Error("--port: cannot listen on " + opt_.host + ":" + std::to_string(port) + " (in use, or not allowed)");
    }
    if (listen_fd >= 0 && ::listen(listen_fd, std::max(threads, SOMAXCONN)) != 0)
      std::fprintf(stderr, "squeezekv serve: could not raise the listen backlog (%s); a burst of connections may be refused\n",
                   std::strerror(errno));
    std::thread engine([this] { engine_loop(); });
    std::thread stopper([&http, sigs] {
      int sig = 0;
      sigwait(&sigs, &sig);
      http.stop();
    });
    std::printf("squeezekv serve: listening on http://%s:%d (model %s, %s, --parallel %d, --queue %d)\n", opt_.host.c_str(), port,
                opt_.model_name.c_str(), engine_.device_description().c_str(), opt_.parallel, opt_.queue);
    std::fflush(stdout);
    http.listen_after_bind();
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    engine.join();
    pthread_kill(stopper.native_handle(), SIGTERM);  // a stop not caused by a signal releases the waiter
    stopper.join();
    return 0;
  }

 private:
  // ---- engine thread ----------------------------------------------------------------------
  void engine_loop() {
    std::map<int64_t, std::shared_ptr<Job>> live;  // scheduler id -> job
    std::unique_lock lk(mu_);
    bool more = false;  // the last step left work (requests, or a decode step in flight to land)
    while (true) {
      wake_.wait_for(lk, std::chrono::milliseconds(200), [&] { return stopping_ || !inbox_.empty() || more; });
      if (stopping_) break;
      std::deque<std::shared_ptr<Job>> fresh;
      fresh.swap(inbox_);
      lk.unlock();
      for (auto& job : fresh) {
        Job* j = job.get();
        j->request.on_text = [j](std::string_view s) {
          if (j->stream) {  // a non-streamed answer takes the whole text from the result
            {
              std::lock_guard g(j->m);
              j->pieces.emplace_back(s);
            }
            j->cv.notify_all();
          }
          return !j->cancelled.load();
        };
        auto on_done = [this, j](const GenerateResult& r) {
          {
            std::lock_guard g(j->m);
            j->result = r;
            j->done = true;
          }
          j->cv.notify_all();
          record_done(r);
        };
        j->request.on_done = on_done;
        try {
          j->scheduler_id = sched_.submit(std::move(j->request));
          live[j->scheduler_id] = job;
        } catch (const std::exception& e) {  // validated by the handler already; this is a last guard
          GenerateResult r;
          r.stop_reason = "error";
          r.error = e.what();
          on_done(r);
        }
      }
      for (auto it = live.begin(); it != live.end();) {
        if (it->second->cancelled) sched_.cancel(it->first);
        bool done;
        {
          std::lock_guard g(it->second->m);
          done = it->second->done;
        }
        it = done ? live.erase(it) : std::next(it);
      }
      try {
        more = sched_.step();  // request-level failures end their request inside; this guards the rest
      } catch (const std::exception& e) {
        std::fprintf(stderr, "squeezekv serve: engine step failed: %s; the running requests are cancelled\n", e.what());
        for (auto& [id, job] : live) sched_.cancel(id);
        more = true;  // the cancellations take effect at the next step
      }
      const KvUsage kv = sched_.kv_usage();
      const KvPoolUsage pool = engine_.kv_pool();
      lk.lock();
      kv_pool_ = pool;
      running_ = sched_.running();
      kv_bytes_ = kv.held;
      kv_full_bytes_ = kv.full;
      kv_bytes_peak_ = std::max(kv_bytes_peak_, kv.held);
      times_ = sched_.times();
      prompt_cache_ = sched_.prompt_cache();
    }
    // shutting down: every request still open ends now
    for (auto& [id, job] : live) sched_.cancel(id);
    lk.unlock();
    while (sched_.step()) {
    }
  }

  void record_done(const GenerateResult& r) {
    std::lock_guard lk(mu_);
    --in_flight_;
    prompt_tokens_ += r.prompt_tokens;
    generated_tokens_ += static_cast<int64_t>(r.tokens.size());
    const auto now = clock_type::now();
    recent_.push_back({now, static_cast<int64_t>(r.tokens.size()), r.generate_seconds});
    while (!recent_.empty() && now - recent_.front().at > std::chrono::seconds(60)) recent_.pop_front();
  }

  // ---- HTTP threads -----------------------------------------------------------------------
  void routes(httplib::Server& http) {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (opt_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");
      if (auth != "Bearer " + opt_.api_key) {
        reply_error(res, HttpError(401, auth.empty() ? "missing API key (send the header Authorization: Bearer KEY)" : "wrong API key",
                                   "authentication_error"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, RequestKind::kChat); });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, RequestKind::kCompletion); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      reply(res, 200, {{"object", "list"},
                       {"data", json::array({{{"id", opt_.model_name}, {"object", "model"}, {"created", started_}, {"owned_by", "squeezekv"}}})}});
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) { reply(res, 200, {{"status", "ok"}}); });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      count_status(200);
      res.set_content(metrics(), "text/plain; version=0.0.4");
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (res.status == 404) reply_error(res, HttpError(404, "no route " + req.method + " " + req.path, "not_found_error"));
      else if (res.body.empty()) reply_error(res, HttpError(res.status, "request refused (HTTP " + std::to_string(res.status) + ")"));
    });
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      reply_error(res, HttpError(500, what, "server_error"));
    });
  }

  void count_status(int status) {
    std::lock_guard lk(mu_);
    ++requests_by_status_[status];
  }
  void reply(httplib::Response& res, int status, const json& body) {
    count_status(status);
    res.status = status;
    res.set_content(json_text(body), "application/json");
  }
  void reply_error(httplib::Response& res, const HttpError& e) {
    if (e.status == 503) res.set_header("Retry-After", "1");
    reply(res, e.status, error_body(e.what(), e.type, e.param));
  }

  // A request that failed in the engine: 400 when the request itself cannot run as asked (a cache
  // the KV memory could never hold), else 500.
  static const char* error_type(const GenerateResult& r) { return r.request_error ? "invalid_request_error" : "server_error"; }
  static HttpError run_error(const GenerateResult& r) { return HttpError(r.request_error ? 400 : 500, r.error, error_type(r)); }

  void handle(const httplib::Request& req, httplib::Response& res, RequestKind kind) {
    std::shared_ptr<Job> job;
    try {
      job = parse(req, kind);
      admit(job);
    } catch (const HttpError& e) {
      return reply_error(res, e);
    } catch (const std::exception& e) {  // an Error from the library's validation names the field
      return reply_error(res, HttpError(400, e.what()));
    }
    if (job->stream) return stream(res, job);
    {
      std::unique_lock lk(job->m);
      if (job->cv.wait_for(lk, kPatience, [&] { return job->done; })) {
        const GenerateResult& r = job->result;
        if (r.stop_reason == "error") return reply_error(res, run_error(r));
        return reply(res, 200, completion(*job, r));
      }
    }
    // A long answer: the response starts now with a space (JSON allows leading whitespace) and
    // another every second, so a client that went away is seen by a failed write and its
    // sequence freed, as for a stream.
    count_status(200);
    res.status = 200;
    res.set_chunked_content_provider(
        "application/json",
        [this, job](size_t, httplib::DataSink& sink) {
          GenerateResult r;
          {
            std::unique_lock lk(job->m);
            if (!job->cv.wait_for(lk, std::chrono::seconds(1), [&] { return job->done; })) {
              lk.unlock();
              return sink.write(" ", 1) ? true : cancel(job);
            }
            r = job->result;
          }
          const std::string body = r.stop_reason == "error" ? json_text(error_body(r.error, error_type(r), "")) : json_text(completion(*job, r));
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        },
        [this, job](bool success) {
          if (!success) cancel(job);
        });
  }

  // The non-streamed answer.
  json completion(const Job& job, const GenerateResult& r) const {
    json choice = {{"index", 0}, {"finish_reason", finish_reason(r.stop_reason)}, {"logprobs", nullptr}};
    if (job.kind == RequestKind::kChat) choice["message"] = {{"role", "assistant"}, {"content", r.text}};
    else choice["text"] = r.text;
    return {{"id", job.id},
            {"object", job.kind == RequestKind::kChat ? "chat.completion" : "text_completion"},
            {"created", job.created},
            {"model", opt_.model_name},
            {"choices", json::array({choice})},
            {"usage", usage(r)}};
  }

  static json usage(const GenerateResult& r) {
    const int64_t n = static_cast<int64_t>(r.tokens.size());
    return {{"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", n},
            {"total_tokens", r.prompt_tokens + n},
            {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
  }

  // Request JSON -> a validated job (HttpError or Error naming the field otherwise).
  std::shared_ptr<Job> parse(const httplib::Request& req, RequestKind kind) {
    ParsedRequest p = parse_request(req.body, kind, limits_);
    auto job = std::make_shared<Job>();
    job->kind = kind;
    job->request = std::move(p.request);
    job->stream = p.stream;
    job->include_usage = p.include_usage;
    const int64_t n = next_id_.fetch_add(1);
    job->id = std::string(kind == RequestKind::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(n);
    job->created = static_cast<int64_t>(std::time(nullptr));
    return job;
  }

  // Into the inbox, or 503 when the queue is full.
  void admit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard lk(mu_);
      // every request accepted and not yet finished holds a slot or a queue place (counted here,
      // not from the engine's last published state, which lags by a step)
      if (in_flight_ >= opt_.parallel + opt_.queue)
        throw HttpError(503, "server busy: " + std::to_string(in_flight_) + " requests running or queued (--parallel " +
                                 std::to_string(opt_.parallel) + ", --queue " + std::to_string(opt_.queue) + "); retry later",
                        "server_busy");
      ++in_flight_;
      inbox_.push_back(job);
    }
    wake_.notify_all();
  }

  // Server-sent events: one chunk per piece of text, a last chunk with the finish reason, usage
  // when asked, then [DONE]. A failed write means the client left: the request is cancelled.
  void stream(httplib::Response& res, const std::shared_ptr<Job>& job) {
    count_status(200);
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    auto started = std::make_shared<bool>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, started](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& j) {
            const std::string ev = "data: " + json_text(j) + "\n\n";
            return sink.write(ev.data(), ev.size());
          };
          const bool chat = job->kind == RequestKind::kChat;
          auto chunk = [&](const json& delta_or_text, const json& finish) {
            json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
            if (chat) choice["delta"] = delta_or_text;
            else choice["text"] = delta_or_text;
            json c = {{"id", job->id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", job->created},
                      {"model", opt_.model_name}, {"choices", json::array({choice})}};
            if (job->include_usage) c["usage"] = nullptr;
            return c;
          };
          if (!*started) {
            *started = true;
            if (chat && !send(chunk({{"role", "assistant"}, {"content", ""}}, nullptr))) return cancel(job);
          }
          std::deque<std::string> pieces;
          bool done;
          GenerateResult result;
          {
            std::unique_lock lk(job->m);
            job->cv.wait_for(lk, std::chrono::milliseconds(250), [&] { return job->done || !job->pieces.empty(); });
            pieces.swap(job->pieces);
            done = job->done;
            if (done) result = job->result;
          }
          for (const std::string& p : pieces)
            if (!send(chunk(chat ? json{{"content", p}} : json(p), nullptr))) return cancel(job);
          if (!done) return true;
          if (result.stop_reason == "error") {
            send(error_body(result.error, error_type(result), ""));
          } else {
            send(chunk(chat ? json::object() : json(""), finish_reason(result.stop_reason)));
            if (job->include_usage) {
              json u = chunk(json::object(), nullptr);
              u["choices"] = json::array();
              u["usage"] = usage(result);
              send(u);
            }
          }
          const std::string end = "data: [DONE]\n\n";
          sink.write(end.data(), end.size());
          sink.done();
          return true;
        },
        [this, job](bool success) {
          if (!success) cancel(job);
        });
  }

  bool cancel(const std::shared_ptr<Job>& job) {
    job->cancelled = true;
    wake_.notify_all();
    return false;
  }

  std::string metrics() {
    std::lock_guard lk(mu_);
    std::string m;
    auto line = [&m](const std::string& name, const std::string& help, const char* type, const std::string& body) {
      m += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + body;
    };
    std::string by_status;
    for (const auto& [status, n] : requests_by_status_)
      by_status += "squeezekv_requests_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
    if (by_status.empty()) by_status = "squeezekv_requests_total{status=\"200\"} 0\n";
    line("squeezekv_requests_total", "HTTP requests answered, by status", "counter", by_status);
    line("squeezekv_prompt_tokens_total", "prompt tokens of finished requests", "counter", "squeezekv_prompt_tokens_total " + std::to_string(prompt_tokens_) + "\n");
    line("squeezekv_generated_tokens_total", "tokens generated by finished requests", "counter",
         "squeezekv_generated_tokens_total " + std::to_string(generated_tokens_) + "\n");
    // generation rate over the last minute: tokens of the requests that finished in it over the
    // wall time they span
    double rate = 0.0;
    if (!recent_.empty()) {
      int64_t n = 0;
      for (const auto& r : recent_) n += r.tokens;
      const auto first_start = recent_.front().at - std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(recent_.front().seconds));
      const double span = std::chrono::duration<double>(recent_.back().at - first_start).count();
      rate = span > 0 ? static_cast<double>(n) / span : 0.0;
    }
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f", rate);
    line("squeezekv_generation_tokens_per_second", "generated tokens per second over the requests finished in the last minute", "gauge",
         std::string("squeezekv_generation_tokens_per_second ") + buf + "\n");
    line("squeezekv_sequences_active", "requests decoding or in their prompt", "gauge", "squeezekv_sequences_active " + std::to_string(running_) + "\n");
    line("squeezekv_sequences_queued", "requests waiting for a sequence slot", "gauge",
         "squeezekv_sequences_queued " + std::to_string(std::max(0, in_flight_ - running_)) + "\n");
    line("squeezekv_kv_bytes", "bytes of K and V held now by all sequences", "gauge", "squeezekv_kv_bytes " + std::to_string(kv_bytes_) + "\n");
    line("squeezekv_kv_bytes_peak", "most bytes of K and V held after any step since the start", "gauge",
         "squeezekv_kv_bytes_peak " + std::to_string(kv_bytes_peak_) + "\n");
    line("squeezekv_kv_full_bytes", "f16 bytes the same sequences' tokens would take without eviction", "gauge",
         "squeezekv_kv_full_bytes " + std::to_string(kv_full_bytes_) + "\n");
    line("squeezekv_kv_pool_bytes", "the KV pool (--kv-memory): bytes all sequences' K and V may take (0: no limit)", "gauge",
         "squeezekv_kv_pool_bytes " + std::to_string(kv_pool_.limit) + "\n");
    line("squeezekv_kv_pool_used_bytes", "bytes of the KV pool the live sequences' caches take (their allocated slabs)", "gauge",
         "squeezekv_kv_pool_used_bytes " + std::to_string(kv_pool_.reserved) + "\n");
    line("squeezekv_kv_pool_sequences", "live sequences in the KV pool, by kind (budgeted: fixed slabs; full: the whole context)",
         "gauge",
         "squeezekv_kv_pool_sequences{kind=\"budgeted\"} " + std::to_string(kv_pool_.sequences_budgeted) +
             "\nsqueezekv_kv_pool_sequences{kind=\"full\"} " + std::to_string(kv_pool_.sequences_full) + "\n");
    const PromptCacheStats& pc = prompt_cache_;
    line("squeezekv_prompt_cache_bytes", "bytes of compressed prompt prefixes kept for reuse (--prompt-cache)", "gauge",
         "squeezekv_prompt_cache_bytes " + std::to_string(pc.bytes) + "\n");
    line("squeezekv_prompt_cache_limit_bytes", "the prompt cache's byte limit (--prompt-cache; 0: none kept)", "gauge",
         "squeezekv_prompt_cache_limit_bytes " + std::to_string(pc.limit) + "\n");
    line("squeezekv_prompt_cache_entries", "prompt prefixes kept", "gauge", "squeezekv_prompt_cache_entries " + std::to_string(pc.entries) + "\n");
    line("squeezekv_prompt_cache_requests_total", "requests with a cache prefix, by whether they started from a kept one", "counter",
         "squeezekv_prompt_cache_requests_total{result=\"hit\"} " + std::to_string(pc.hits) +
             "\nsqueezekv_prompt_cache_requests_total{result=\"miss\"} " + std::to_string(pc.misses) + "\n");
    line("squeezekv_prompt_cache_evictions_total", "kept prefixes dropped for newer ones (least recently used first)", "counter",
         "squeezekv_prompt_cache_evictions_total " + std::to_string(pc.evicted) + "\n");
    line("squeezekv_prompt_cache_tokens_saved_total", "prompt tokens the hits did not run", "counter",
         "squeezekv_prompt_cache_tokens_saved_total " + std::to_string(pc.tokens_saved) + "\n");
    const SchedulerTimes& t = times_;
    auto num = [](double x) {
      char b[32];
      std::snprintf(b, sizeof b, "%.6f", x);
      return std::string(b);
    };
    line("squeezekv_engine_steps_total", "scheduler steps that ran a prefill or a decode", "counter",
         "squeezekv_engine_steps_total " + std::to_string(t.steps) + "\n");
    line("squeezekv_engine_seconds_total",
         "wall seconds of the engine thread's steps: in prefill and decode calls (the device's work and the logits' copy), "
         "and the rest of the steps (sampling, text, callbacks, admission)",
         "counter",
         "squeezekv_engine_seconds_total{part=\"prefill\"} " + num(t.prefill_seconds) + "\nsqueezekv_engine_seconds_total{part=\"decode\"} " +
             num(t.decode_seconds) + "\nsqueezekv_engine_seconds_total{part=\"rest\"} " +
             num(std::max(0.0, t.step_seconds - t.prefill_seconds - t.decode_seconds)) + "\n");
    line("squeezekv_engine_calls_total", "engine calls, by kind", "counter",
         "squeezekv_engine_calls_total{kind=\"prefill\"} " + std::to_string(t.prefill_calls) +
             "\nsqueezekv_engine_calls_total{kind=\"decode\"} " + std::to_string(t.decode_calls) + "\n");
    line("squeezekv_engine_rows_total", "rows the engine ran: prompt tokens prefilled, decode rows", "counter",
         "squeezekv_engine_rows_total{kind=\"prefill\"} " + std::to_string(t.prefill_tokens) +
             "\nsqueezekv_engine_rows_total{kind=\"decode\"} " + std::to_string(t.decode_rows) + "\n");
    return m;
  }

  const Model& model_;
  ServeOptions opt_;
  Engine engine_;
  Scheduler sched_;  // the engine thread's only
  RequestLimits limits_;  // what a request is checked against
  int64_t started_ = static_cast<int64_t>(std::time(nullptr));
  std::atomic<int64_t> next_id_{1};
  // guarded by mu_
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> inbox_;
  bool stopping_ = false;
  int running_ = 0;                // the engine's running requests after its last step
  KvPoolUsage kv_pool_;            // the engine's KV pool after its last step
  int in_flight_ = 0;              // requests accepted and not finished (running, queued or in the inbox)
  int64_t kv_bytes_ = 0, kv_full_bytes_ = 0, kv_bytes_peak_ = 0;
  SchedulerTimes times_;  // the engine thread's, as of its last step
  PromptCacheStats prompt_cache_;  // the Scheduler's, as of its last step
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  std::map<int, int64_t> requests_by_status_;
  struct Finished {
    clock_type::time_point at;
    int64_t tokens;
    double seconds;
  };
  std::deque<Finished> recent_;
};

}  // namespace

int serve(const Model& model, const ServeOptions& o) {
  if (o.parallel < 1 || o.parallel > 256) throw Error("--parallel: expected 1 to 256 sequences, got " + std::to_string(o.parallel));
  if (o.queue < 0 || o.queue > 4096) throw Error("--queue: expected 0 to 4096 waiting requests, got " + std::to_string(o.queue));
  if (o.port < 0 || o.port > 65535) throw Error("--port: expected 0 to 65535, got " + std::to_string(o.port));
  if (o.max_prompt_tokens < 0) throw Error("--max-prompt-tokens: must be >= 0, got " + std::to_string(o.max_prompt_tokens));
  validate(o.session.cache);
  stop_signals();  // before the engine (and a device runtime's threads) start
  Server s(model, o);
  return s.run();
}

}  // namespace squeezekv::server
