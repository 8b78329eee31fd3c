// One row's pick under temperature, top-k, min-p and top-p from a uniform draw: the sampler's
// definition, shared by the host's Sampler (runtime), the CPU backend's sample_rows and, as the
// reference its tests compare with, the CUDA kernel (backend/cuda/sample.cu).
//
// The definition, for logits l[V] and a draw u in [0, 1):
//   temperature <= 0: the argmax (core/argmax.h), u unused. Otherwise
//   top-k (0 < k < V): the tokens of the k largest logits, ties to the lower id; otherwise every token;
//   q = exp(l / temperature - max(l / temperature)) (f32, the division first: 1 at the maximum);
//   min-p (> 0): of those, q >= min_p;
//   top-p (< 1): of what is left, the shortest prefix in the order (q descending, id ascending)
//     whose mass reaches top_p of the mass left; its last member is the cut (tau, id_tau): a token
//     stays when q > tau, or q == tau and id <= id_tau;
//   the pick: r = u x (the kept mass); the kept tokens walked in id order, the first whose running
//     sum of q reaches r (the last kept one when rounding leaves r beyond the sum).
// Sums are f64. Two implementations that sum in another order (or round exp differently) agree
// except where r or the top-p target falls within rounding of a boundary; cuda_test counts such
// cases and checks each against this file's cut.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "squeezekv/sampling.h"

namespace squeezekv {

// Where a row's cuts fell (tests explain a disagreement with it).
struct SampleCut {
  bool top_k = false;    // the k-th largest logit and the last id kept at it
  float l_k = 0.0f;
  int id_k = -1;
  bool cut = false;      // min-p or top-p: tau (min-p alone: min_p, id_tau = V)
  float tau = 0.0f;
  int id_tau = -1;
  double kept_mass = 0.0;
  double r = 0.0;        // the draw times kept_mass
  // token id with logit l and probability q: left by top-k, then by min-p and top-p
  bool in_top_k(float l, int id) const { return !top_k || l > l_k || (l == l_k && id <= id_k); }
  bool in_q_cut(float q, int id) const { return !cut || q > tau || (q == tau && id <= id_tau); }
  bool kept(float l, float q, int id) const { return in_top_k(l, id) && in_q_cut(q, id); }
};

// Buffers one thread reuses across rows.
struct SampleScratch {
  std::vector<std::pair<float, int>> cand;  // [V] (logit, then q; id)
  std::vector<double> bucket_mass;          // top-p without top-k: mass by q's leading bits
  std::vector<std::pair<float, int>> edge;  // the bucket where the top-p mass is reached
};

// The pick for logits[V] (V >= 1); cut, when given, receives where the cuts fell.
int sample_row(std::span<const float> logits, const SampleParams& p, SampleScratch& s, SampleCut* cut = nullptr);

}  // namespace squeezekv
