// Fuzz target: the `eval sweep` config (tools/eval/sweep.cc plan_sweep) on any bytes, without
// touching the files it names. It must end in a plan whose every run passed the checks, or an
// Error naming the field; any other exception (a JSON library error escaping, say) or a sanitizer
// report is a finding.
#include <cstdint>
#include <string_view>

#include "eval/eval.h"
#include "squeezekv/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  try {
    const squeezekv::eval::SweepPlan plan = squeezekv::eval::plan_sweep(in, "fuzz.json", false);
    for (const auto& r : plan.runs)
      if (r.ctx < 2 || r.key.empty() || (r.cache.policy != squeezekv::KvPolicy::kFull && r.cache.budget < 1)) __builtin_trap();
  } catch (const squeezekv::Error&) {
  }
  return 0;
}
