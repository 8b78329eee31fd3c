// The CUDA backend's stream: every kernel launch is recorded here and issued in order, a repeated
// launch list (a decode step) as one CUDA graph; and the device memory that belongs to it.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace squeezekv::cuda {

template <class T>
struct Same {
  using type = T;
};

// The kernel launches of one stream, and library calls that issue work on it (cuBLAS products:
// call()). Launches are recorded until the host next needs the device (a download, a waiting
// copy, a free), then issued: directly, or, when the same launches with the same arguments, byte
// for byte, came before, as one launch of the CUDA graph captured from them.
// A decode step repeats its launches exactly once the counts that grow with every token are read
// from device memory (KvView::count_dev), so from its third step on a whole step is one graph
// launch instead of ~14 launches a layer (docs/DESIGN.md "A decode step replays as one CUDA graph"). A graph
// replays only the bytes it was captured from, so a replay does exactly what the launches it
// stands for would do. Thread safety: one host thread at a time (the backend's).
class Launcher {
 public:
  // pdl: each launch may begin while the previous kernel finishes (the kernels' pdl_enter()).
  Launcher(bool graphs, bool pdl);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  cudaStream_t stream() const { return stream_; }

  // Records fn<<<grid, block, smem>>>(args...); the arguments are copied now.
  template <class... P>
  void launch(void (*fn)(P...), dim3 grid, dim3 block, size_t smem, typename Same<P>::type... args) {
    static_assert(sizeof...(P) <= kMaxArgs, "Launcher: too many kernel arguments");
    Rec r{reinterpret_cast<const void*>(fn), grid, block, static_cast<unsigned>(smem), static_cast<uint32_t>(arg_off_.size()),
          static_cast<uint32_t>(sizeof...(P)), nullptr};
    put(&r.fn, sizeof(r.fn), 8);
    put(&r.grid, sizeof(dim3), 4);
    put(&r.block, sizeof(dim3), 4);
    put(&r.smem, sizeof(unsigned), 4);
    (arg_off_.push_back(put(&args, sizeof(P), alignof(P))), ...);
    recs_.push_back(r);
    ++serial_;
  }

  // Records fn(&args, stream): a library call that issues its own work on the stream (a cuBLAS
  // product), run when the launches are issued and, inside a captured graph, captured with them.
  // The arguments' bytes (all of them, padding zeroed by the caller) are part of the record, as
  // a kernel's are.
  using HostCall = void (*)(const void* args, cudaStream_t stream);
  template <class A>
  void call(HostCall fn, const A& args) {
    static_assert(std::is_trivially_copyable_v<A>, "Launcher::call: arguments are copied as bytes");
    Rec r{nullptr, dim3(0), dim3(0), 0, static_cast<uint32_t>(arg_off_.size()), 1, fn};
    put(&fn, sizeof(fn), 8);
    arg_off_.push_back(put(&args, sizeof(A), alignof(A)));
    recs_.push_back(r);
    ++serial_;
  }

  // The launch recorded last, taken back if it was recorded by launch_tagged(tag, ...) and nothing
  // came after it: its work is then the caller's to do (a later kernel does it on the way).
  template <class... P>
  void launch_tagged(const void* tag, void (*fn)(P...), dim3 grid, dim3 block, size_t smem, typename Same<P>::type... args) {
    const Undo u{recs_.size(), arg_off_.size(), sig_.size()};
    launch(fn, grid, block, smem, args...);
    tag_ = tag, undo_ = u;
  }
  bool take_back(const void* tag) {
    if (tag_ != tag || recs_.size() != undo_.recs + 1) return false;
    recs_.resize(undo_.recs), arg_off_.resize(undo_.args), sig_.resize(undo_.sig);
    tag_ = nullptr;
    return true;
  }

  // Issues what was recorded (in order, on the stream; does not wait for the device).
  void flush();
  // Counts every launch and call recorded and every flush (the backend's copies into device
  // memory follow a flush): equal at two moments, nothing was recorded or copied between them.
  uint64_t serial() const { return serial_; }
  // Graph launches so far (tests check that a decode loop replays).
  int64_t replays() const { return replays_; }
  // Called by a buffer about to be freed (its bytes): the backend drops work it still owes there.
  std::function<void(const void*, size_t)> on_free;
  // Called by flush before it issues what was recorded: the backend queues the copies of the
  // tables in device memory that the recorded launches read (stream order puts them first).
  // It may queue work on the stream directly; it must not record or flush.
  std::function<void()> on_flush;

 private:
  static constexpr size_t kMinGraphLaunches = 6;  // a decode layer of one sequence is about 8
  // a step issued layer by layer (Backend::submit) is a list per layer: room for a 126-layer
  // model's, and for a few batch compositions of a smaller one
  static constexpr size_t kMaxGraphs = 128;
  static constexpr size_t kMaxArgs = 24;
  struct Rec {
    const void* fn;  // the kernel, or null for a call
    dim3 grid, block;
    unsigned smem;
    uint32_t first_arg, n_args;
    HostCall host;   // a call's function
  };
  struct Graph {
    uint64_t hash;
    std::vector<unsigned char> sig;
    cudaGraphExec_t exec;
    uint64_t used;
  };

  // Appends n bytes at the next multiple of align (the gap stays zero); returns their offset.
  uint32_t put(const void* p, size_t n, size_t align) {
    const size_t off = (sig_.size() + align - 1) / align * align;
    sig_.resize(off + n, 0);
    std::memcpy(sig_.data() + off, p, n);
    return static_cast<uint32_t>(off);
  }
  void issue();
  void capture(uint64_t h);

  struct Undo {
    size_t recs, args, sig;
  };
  const void* tag_ = nullptr;  // launch_tagged's, while its launch is the last recorded
  Undo undo_{};
  bool graphs_on_, pdl_;
  cudaStream_t stream_ = nullptr;
  std::vector<Rec> recs_;
  std::vector<uint32_t> arg_off_;   // offsets of every recorded argument in sig_
  std::vector<unsigned char> sig_;  // the launches: function, sizes, argument bytes
  std::vector<Graph> graphs_;
  std::array<uint64_t, 256> seen_{};  // hashes of recent launch lists (a step's layers' among them)
  size_t seen_next_ = 0;
  uint64_t clock_ = 0;
  uint64_t serial_ = 0;
  int64_t replays_ = 0;
};

// Device memory blocks kept for reuse. cudaFree waits for the whole device, so a request that
// ends in a server would stall every running stream when its KV slabs go back: a freed block
// returns here instead, and the next allocation of the same rounded size (the next request's
// slabs of the same plan) takes it, with no call into the driver. The one stream orders a block's
// last use before its next owner's first (the launcher's work is issued before a buffer goes).
// When cudaMalloc fails, the cached blocks are freed and it is tried once more.
// Thread safety: the backend's one host thread.
class BlockCache {
 public:
  BlockCache() = default;
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache();
  // The size a request of `bytes` takes (device_alloc_bytes): a multiple of 512 bytes, or of 2 MiB
  // from 1 MiB up (the driver's own granularity for large blocks, so the rounding costs no memory there).
  static size_t rounded(size_t bytes);
  void* take(size_t bytes);           // a block of rounded(bytes)
  void give(void* p, size_t bytes);   // p from take(bytes)
  int64_t cached_bytes() const { return cached_; }
  void release();                     // frees every cached block

 private:
  std::unordered_multimap<size_t, void*> free_;  // rounded size -> block
  int64_t cached_ = 0;
  int64_t held_ = 0, held_blocks_ = 0;  // taken and not given back (the out-of-memory message says so)
};

// Device memory on the launcher's stream, from its block cache. Zeroed; the launcher's pending
// work is issued before the memory goes back.
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(size_t bytes, std::shared_ptr<Launcher> launcher, std::shared_ptr<BlockCache> blocks);
  ~DeviceBuffer() override;

 private:
  std::shared_ptr<Launcher> launcher_;
  std::shared_ptr<BlockCache> blocks_;
};

// Page-locked host memory (the device copies it at full speed, and asynchronously). Zeroed.
class PinnedBuffer final : public Buffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer() override;
};

}  // namespace squeezekv::cuda
