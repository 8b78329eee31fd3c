// One evaluation run as a JSON record: what `squeezekv eval ppl|retrieval --json` writes and what
// a sweep appends (one record a line). One writer, so the same run gives the same fields
// whichever wrote it: task, policy, settings, metric and value, the task's own fields, the cost.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "eval/eval.h"
#include "squeezekv/session.h"

namespace squeezekv::eval {

// The run's settings: task (a label; "ppl" or a retrieval task's name by default), policy (a
// label; the KV policy's name by default), the KV policy, budget, context, threads, prefill chunk.
nlohmann::json run_settings(const std::string& task, const std::string& policy, const SessionOptions& so, int ctx);
// settings + metric "ppl", value, prefix, windows, window_ppl, tokens, and the cost.
nlohmann::json ppl_record(nlohmann::json settings, const PplOptions& o, const PplResult& r);
// settings + metric "accuracy", value, question_aware, by_depth, n_samples, n_correct, the cost;
// with_samples: every sample with its token ids (so a peer can run exactly these prompts).
nlohmann::json retrieval_record(nlohmann::json settings, const RetrievalOptions& o, const RetrievalResult& r, bool with_samples);
// Writes the record as one line: appended, or the file replaced. Error naming what (the flag).
void write_record(const std::string& path, const nlohmann::json& record, bool append, const std::string& what);

}  // namespace squeezekv::eval
