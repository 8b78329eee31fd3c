// The CPU backend's default thread count from the machine's core topology, and the memory's copy
// and read bandwidths (cpu_topology.h).
#include "backend/cpu/cpu_topology.h"

#include <emmintrin.h>
#include <xmmintrin.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

namespace squeezekv::cpu {
namespace {

// The integer in a one-line sysfs file, or -1.
long read_id(const std::string& path) {
  std::ifstream f(path);
  long v = -1;
  if (!(f >> v)) return -1;
  return v;
}

}  // namespace

int count_physical_cores(const std::vector<int>& cpus, const std::string& sysfs_cpu_dir) {
  std::set<std::pair<long, long>> cores;
  int unknown = 0;
  for (int c : cpus) {
    const std::string dir = sysfs_cpu_dir + "/cpu" + std::to_string(c) + "/topology/";
    const long package = read_id(dir + "physical_package_id"), core = read_id(dir + "core_id");
    if (package < 0 || core < 0) {
      ++unknown;
      continue;
    }
    cores.insert({package, core});
  }
  const int n = static_cast<int>(cores.size()) + unknown;
  return n > 0 ? n : 1;
}

std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) {
    const unsigned n = std::thread::hardware_concurrency();
    for (unsigned c = 0; c < (n > 0 ? n : 1); ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

int default_threads() {
  static const int n = count_physical_cores(usable_cpus(), "/sys/devices/system/cpu");
  return n;
}

namespace {

// The median seconds of pass(i) for i = 1..5, after an untimed pass(0) (the bandwidths' timing).
template <class F>
double median_pass_seconds(F&& pass) {
  std::vector<double> s;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pass(i);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) s.push_back(dt);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace

double copy_bandwidth(int threads) {
  constexpr size_t kBytes = size_t{512} << 20;
  std::vector<uint8_t> a(kBytes, 1), b(kBytes, 0);  // touched: the pages exist before timing
  const int n_threads = threads > 0 ? threads : default_threads();
  const double sec = median_pass_seconds([&](int i) {
#pragma omp parallel num_threads(n_threads)
    {
      const size_t n = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t lo = kBytes * t / n, hi = kBytes * (t + 1) / n;
      std::memcpy(b.data() + lo, a.data() + lo, hi - lo);
    }
    a[static_cast<size_t>(i)] = b[kBytes - 1 - static_cast<size_t>(i)];  // each copy's result is read
  });
  return 2.0 * static_cast<double>(kBytes) / sec;
}

double read_bandwidth(int threads) {
  constexpr size_t kBytes = size_t{1} << 30;
  std::vector<uint8_t> a(kBytes, 1);  // touched: the pages exist before timing
  const int n_threads = threads > 0 ? threads : default_threads();
  uint64_t seen = 0;
  const double sec = median_pass_seconds([&](int i) {
    uint64_t x = 0;
#pragma omp parallel num_threads(n_threads) reduction(^ : x)
    {
      // this thread's slice in whole 64-byte lines, four 16-byte loads a line (SSE2: every x86-64),
      // folded by XOR into four independent registers so the loads, not a chain, set the pace; the
      // line 4 KiB ahead prefetched, as the decode kernels prefetch their weights (one core's
      // hardware prefetcher alone keeps too few lines in flight: 32 against 38 GB/s on an EPYC)
      const size_t n = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t lo = kBytes / 64 * t / n * 64, hi = kBytes / 64 * (t + 1) / n * 64;
      constexpr size_t kAhead = 4096;
      __m128i x0 = _mm_setzero_si128(), x1 = x0, x2 = x0, x3 = x0;
      for (size_t o = lo; o < hi; o += 64) {
        if (o + kAhead < hi) _mm_prefetch(reinterpret_cast<const char*>(a.data() + o + kAhead), _MM_HINT_T0);
        const __m128i* p = reinterpret_cast<const __m128i*>(a.data() + o);
        x0 = _mm_xor_si128(x0, _mm_load_si128(p));
        x1 = _mm_xor_si128(x1, _mm_load_si128(p + 1));
        x2 = _mm_xor_si128(x2, _mm_load_si128(p + 2));
        x3 = _mm_xor_si128(x3, _mm_load_si128(p + 3));
      }
      const __m128i y = _mm_xor_si128(_mm_xor_si128(x0, x1), _mm_xor_si128(x2, x3));
      x ^= static_cast<uint64_t>(_mm_cvtsi128_si64(y)) ^ static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(y, y)));
    }
    seen ^= x;
    a[static_cast<size_t>(i) * 4096] = static_cast<uint8_t>(seen);  // each read's result is used
  });
  return static_cast<double>(kBytes) / sec;
}

}  // namespace squeezekv::cpu
