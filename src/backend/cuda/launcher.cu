// Launcher, DeviceBuffer and PinnedBuffer (launcher.h): recording, graph capture and replay, take-back.
#include "backend/cuda/launcher.h"

#include <algorithm>

#include "backend/cuda/common.cuh"

namespace squeezekv::cuda {

Launcher::Launcher(bool graphs, bool pdl) : graphs_on_(graphs), pdl_(pdl) {
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

Launcher::~Launcher() {
  try {
    flush();
  } catch (...) {  // the device is failing; nothing left to report to
  }
  for (Graph& g : graphs_) cudaGraphExecDestroy(g.exec);
  cudaStreamDestroy(stream_);
}

void Launcher::flush() {
  ++serial_;
  if (recs_.empty()) return;
  struct Clear {
    Launcher* l;
    ~Clear() { l->recs_.clear(), l->arg_off_.clear(), l->sig_.clear(), l->tag_ = nullptr; }
  } clear{this};
  if (on_flush) on_flush();
  if (!graphs_on_ || recs_.size() < kMinGraphLaunches) return issue();
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the record's 8-byte words (the tail zero-padded)
  sig_.resize((sig_.size() + 7) / 8 * 8, 0);
  for (size_t i = 0; i < sig_.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, sig_.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (Graph& g : graphs_)
    if (g.hash == h && g.sig == sig_) {
      g.used = ++clock_;
      ++replays_;
      return check(cudaGraphLaunch(g.exec, stream_), "cudaGraphLaunch");
    }
  // a first sighting runs directly; the second is captured (one-off launch lists cost no capture)
  if (std::find(seen_.begin(), seen_.end(), h) == seen_.end()) {
    seen_[seen_next_++ % seen_.size()] = h;
    return issue();
  }
  capture(h);
}

void Launcher::issue() {
  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  for (const Rec& r : recs_) {
    if (r.host != nullptr) {
      r.host(sig_.data() + arg_off_[r.first_arg], stream_);
      continue;
    }
    void* args[kMaxArgs];
    for (uint32_t i = 0; i < r.n_args; ++i) args[i] = sig_.data() + arg_off_[r.first_arg + i];
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = r.grid, cfg.blockDim = r.block, cfg.dynamicSmemBytes = r.smem, cfg.stream = stream_;
    cfg.attrs = pdl_ ? pdl : nullptr, cfg.numAttrs = pdl_ ? 1 : 0;
    check(cudaLaunchKernelExC(&cfg, r.fn, args), "kernel launch");
  }
}

void Launcher::capture(uint64_t h) {
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    issue();
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  if (graphs_.size() == kMaxGraphs) {  // the least recently used goes
    auto lru = std::min_element(graphs_.begin(), graphs_.end(), [](const Graph& a, const Graph& b) { return a.used < b.used; });
    cudaGraphExecDestroy(lru->exec);
    graphs_.erase(lru);
  }
  graphs_.push_back({h, sig_, exec, ++clock_});
  check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
}

BlockCache::~BlockCache() { release(); }

size_t BlockCache::rounded(size_t bytes) { return static_cast<size_t>(device_alloc_bytes(static_cast<int64_t>(bytes))); }

void* BlockCache::take(size_t bytes) {
  const size_t size = rounded(bytes);
  if (auto it = free_.find(size); it != free_.end()) {
    void* p = it->second;
    free_.erase(it);
    cached_ -= static_cast<int64_t>(size);
    held_ += static_cast<int64_t>(size), ++held_blocks_;
    return p;
  }
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) {
    (void)cudaGetLastError();  // the failed call's error, cleared before the retry
    release();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    if (cudaMalloc(&p, size) != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error("cudaMalloc: out of device memory (" + std::to_string(size >> 20) + " MiB asked, " + std::to_string(free >> 20) +
                  " MiB free of " + std::to_string(total >> 20) + "; squeezekv's buffers hold " + std::to_string(held_ >> 20) + " MiB in " +
                  std::to_string(held_blocks_) + ")");
    }
  }
  held_ += static_cast<int64_t>(size), ++held_blocks_;
  return p;
}

void BlockCache::give(void* p, size_t bytes) {
  const size_t size = rounded(bytes);
  free_.emplace(size, p);
  cached_ += static_cast<int64_t>(size);
  held_ -= static_cast<int64_t>(size), --held_blocks_;
}

void BlockCache::release() {
  for (auto& [size, p] : free_) cudaFree(p);
  free_.clear();
  cached_ = 0;
}

DeviceBuffer::DeviceBuffer(size_t bytes, std::shared_ptr<Launcher> launcher, std::shared_ptr<BlockCache> blocks)
    : launcher_(std::move(launcher)), blocks_(std::move(blocks)) {
  bytes_ = bytes;
  data_ = blocks_->take(bytes);
  check(cudaMemsetAsync(data_, 0, std::max<size_t>(bytes, 16), launcher_->stream()), "cudaMemset");
}

DeviceBuffer::~DeviceBuffer() {
  try {
    if (launcher_->on_free) launcher_->on_free(data_, bytes_);
    launcher_->flush();  // launches that still use this memory are issued before anything else may take it
  } catch (...) {
  }
  blocks_->give(data_, bytes_);
}

PinnedBuffer::PinnedBuffer(size_t bytes) {
  bytes_ = bytes;
  check(cudaMallocHost(&data_, std::max<size_t>(bytes, 16)), "cudaMallocHost");
  std::memset(data_, 0, std::max<size_t>(bytes, 16));
}

PinnedBuffer::~PinnedBuffer() { cudaFreeHost(data_); }

}  // namespace squeezekv::cuda
