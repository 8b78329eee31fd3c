// What a GPU decode step would pay to run the policies' selection (docs/DESIGN.md, "A decode
// step's eviction runs where the mass lives"), measured on the device for a Llama-3.1-8B-shaped
// cache (32 layers x 8 kv heads, capacity = budget + chunk):
//   A. the mass of every layer copied to pinned host memory in one copy, plus the stream sync;
//   B. an empty kernel plus a sync (the floor of any host round trip);
//   C. selection on the device: per (layer, kv head) one block finds the unprotected row with the
//      least mass (h2o's decode eviction: sinks and the recent window by position are kept), and
//      moves the last row (K, V, position, mass) into its hole.
// Build: nvcc -O3 -arch=sm_90 bench/cuda/mass_roundtrip.cu -o mass_roundtrip
// Usage: mass_roundtrip [layers=32] [kv_heads=8] [head_dim=128] [capacity=2560] [iters=500]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__global__ void empty_kernel() {}

// grid: one block per (layer, head); mass, pos [L*G][cap]; k, v [L*G][cap][D] half.
__global__ void evict_one(float* mass, int* pos, __half* k, __half* v, int cap, int count, int D, int sinks,
                          int newest, int recent) {
  const int lh = blockIdx.x;
  float* m = mass + static_cast<size_t>(lh) * cap;
  int* p = pos + static_cast<size_t>(lh) * cap;
  float best = 3.0e38f;
  int arg = -1;
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    const bool keep = p[j] < sinks || p[j] > newest - recent;
    if (!keep && (m[j] < best || (m[j] == best && j < arg))) best = m[j], arg = j;
  }
  __shared__ float sb[256];
  __shared__ int sa[256];
  sb[threadIdx.x] = best;
  sa[threadIdx.x] = arg;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ob = sb[threadIdx.x + s];
      const int oa = sa[threadIdx.x + s];
      if (oa >= 0 && (sa[threadIdx.x] < 0 || ob < sb[threadIdx.x] || (ob == sb[threadIdx.x] && oa < sa[threadIdx.x])))
        sb[threadIdx.x] = ob, sa[threadIdx.x] = oa;
    }
    __syncthreads();
  }
  const int victim = sa[0], last = count - 1;
  if (victim < 0 || victim == last) return;
  const size_t base = static_cast<size_t>(lh) * cap;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    k[(base + victim) * D + d] = k[(base + last) * D + d];
    v[(base + victim) * D + d] = v[(base + last) * D + d];
  }
  if (threadIdx.x == 0) m[victim] = m[last], p[victim] = p[last];
}

int main(int argc, char** argv) {
  const int L = argc > 1 ? std::atoi(argv[1]) : 32;
  const int G = argc > 2 ? std::atoi(argv[2]) : 8;
  const int D = argc > 3 ? std::atoi(argv[3]) : 128;
  const int cap = argc > 4 ? std::atoi(argv[4]) : 2560;
  const int iters = argc > 5 ? std::atoi(argv[5]) : 500;
  const size_t rows = static_cast<size_t>(L) * G * cap;
  float *mass, *host;
  int* pos;
  __half *k, *v;
  CHECK(cudaMalloc(&mass, rows * 4));
  CHECK(cudaMalloc(&pos, rows * 4));
  CHECK(cudaMalloc(&k, rows * D * 2));
  CHECK(cudaMalloc(&v, rows * D * 2));
  CHECK(cudaMallocHost(&host, rows * 4));
  std::vector<float> m0(rows);
  std::vector<int> p0(rows);
  for (size_t i = 0; i < rows; ++i) m0[i] = static_cast<float>((i * 2654435761u) % 1000003) / 1000003.0f, p0[i] = static_cast<int>(i % cap);
  CHECK(cudaMemcpy(mass, m0.data(), rows * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(pos, p0.data(), rows * 4, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; layers=%d kv_heads=%d head_dim=%d capacity=%d (mass %.2f MB); %d iterations, medians\n",
              prop.name, L, G, D, cap, rows * 4 / 1e6, iters);
  auto median_us = [&](auto&& body) {
    std::vector<double> t;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < iters + 10; ++i) {
      CHECK(cudaEventRecord(a, st));
      body();
      CHECK(cudaEventRecord(b, st));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 10) t.push_back(ms * 1000.0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  // wall-clock timing for the host round trips (events cannot see the host side of a sync)
  auto wall_us = [&](auto&& body) {
    std::vector<double> t;
    for (int i = 0; i < iters + 10; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      body();
      CHECK(cudaStreamSynchronize(st));
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 10) t.push_back(us);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double copy = wall_us([&] { CHECK(cudaMemcpyAsync(host, mass, rows * 4, cudaMemcpyDeviceToHost, st)); });
  const double sync = wall_us([&] { empty_kernel<<<1, 1, 0, st>>>(); });
  const double sel = median_us([&] { evict_one<<<L * G, 256, 0, st>>>(mass, pos, k, v, cap, cap, D, 4, cap - 1, 1024); });
  std::printf("A. mass to host in one copy + sync: %.1f us\n", copy);
  std::printf("B. empty kernel + sync:             %.1f us\n", sync);
  std::printf("C. selection + compaction on device: %.1f us (one kernel, no host round trip)\n", sel);
  return 0;
}
