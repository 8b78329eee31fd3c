// Loads a model through the installed public API and prints a greedy continuation.
#include <cstdio>

#include <squeezekv/generate.h>
#include <squeezekv/model.h>
#include <squeezekv/session.h>

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  auto model = squeezekv::Model::load(argv[1], {argv[2]});
  squeezekv::Session session(*model, {});
  squeezekv::GenerateOptions go;
  go.max_tokens = 12;
  go.sampler.temperature = 0.0f;
  const auto prompt = model->tokenizer().encode("Once upon a time", true);
  const auto r = squeezekv::generate(session, prompt, go);
  std::printf("%s\n", r.text.c_str());
  return r.tokens.empty() ? 1 : 0;
}
