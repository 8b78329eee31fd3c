#pragma once
// T rows in groups of kM, then one group of the T % kM left: f.template operator()<M>(t) for each
// group of M rows starting at row t. The register-tile kernels (gemm_avx512.cc, gemm_bf16.cc,
// ops.cc) take their M as a template argument; this is their one row loop. Internal linkage: each
// file compiled for its own instruction set gets its own copy (a shared inline copy could be
// taken from an AVX-512 file into a path for CPUs without it). Include after <cstdint>, inside
// namespace squeezekv::cpu (or one of its namespaces).

namespace {

template <int M, class F>
__attribute__((always_inline)) inline void row_group_tail(int64_t left, int64_t t, F& f) {
  if constexpr (M > 0) {
    if (left == M) return f.template operator()<M>(t);
    row_group_tail<M - 1>(left, t, f);
  }
}

template <int kM, class F>
inline void for_row_groups(int64_t T, F&& f) {
  int64_t t = 0;
  for (; t + kM <= T; t += kM) f.template operator()<kM>(t);
  row_group_tail<kM - 1>(T - t, t, f);
}

}  // namespace
