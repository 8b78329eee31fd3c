// Device names and the choice of backend: the one file that knows every backend of the build.
#include "backend/backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_topology.h"
#include "core/enum_table.h"
#include "squeezekv/error.h"
#if SQUEEZEKV_CUDA
#include <dlfcn.h>

#include <mutex>

#include "backend/cuda/cuda_backend.h"
#endif

namespace squeezekv {

namespace {
const EnumName<Device> kDevices[] = {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}};
}  // namespace

namespace {
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : mem_(bytes, 0) { data_ = mem_.data(), bytes_ = bytes; }

 private:
  std::vector<unsigned char> mem_;
};
}  // namespace

std::unique_ptr<Buffer> Backend::alloc_host(size_t bytes) { return std::make_unique<HostBuffer>(bytes); }

int64_t device_alloc_bytes(int64_t bytes) {
  const int64_t unit = bytes >= (int64_t{1} << 20) ? int64_t{2} << 20 : 512;
  return (std::max<int64_t>(bytes, 16) + unit - 1) / unit * unit;
}

void Backend::prepare_weights(const WeightMatrix* in, int n, WeightMatrix* out, std::vector<std::unique_ptr<Buffer>>& keep) {
  for (int i = 0; i < n; ++i) {
    std::unique_ptr<Buffer> hold;
    out[i] = prepare_weight(in[i], WeightUse::kMatrix, hold);
    if (hold) keep.push_back(std::move(hold));
  }
}

Backend::MemoryInfo Backend::memory() const {
  const int64_t page = sysconf(_SC_PAGESIZE);
  return {static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * page, static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * page};
}

Device parse_device(const std::string& name) { return parse_enum("--device", name, kDevices); }
const char* device_name(Device d) { return enum_name(d, kDevices); }
namespace {
const EnumName<DeviceWeightFormat> kWeightFormats[] = {
    {"native", DeviceWeightFormat::kNative}, {"bf16", DeviceWeightFormat::kBf16}, {"f32", DeviceWeightFormat::kF32}};
}  // namespace
DeviceWeightFormat parse_device_weights(const std::string& s) { return parse_enum("--device-weights", s, kWeightFormats); }
const char* device_weights_name(DeviceWeightFormat f) { return enum_name(f, kWeightFormats); }

int default_cpu_threads() { return cpu::default_threads(); }
std::string cpu_kernels() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  std::string s;
  for (auto [on, name] : {std::pair{f.avx512f, "avx512"}, {f.avx512vnni, "vnni"}, {f.avx512bf16, "bf16"}, {f.amx_bf16, "amx-bf16"},
                          {f.avx512f && !f.half_rows, "f32-half-rows"}})
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
  if (f.avx512f && f.half_rows && f.half_rows_ahead > 0) s += " half-rows-ahead-" + std::to_string(f.half_rows_ahead);
  return s.empty() ? "avx2" : s;
}
double host_copy_bandwidth(int threads) { return cpu::copy_bandwidth(threads); }
double host_read_bandwidth(int threads) { return cpu::read_bandwidth(threads); }

bool device_available(Device d) {
#if SQUEEZEKV_CUDA
  return d == Device::kCpu || d == Device::kCuda;
#else
  return d == Device::kCpu;
#endif
}

#if SQUEEZEKV_CUDA
namespace {
// The CUDA backend's factory, from libsqueezekv_cuda.so in this library's own directory (or the
// loader's search path), loaded at the first --device cuda and kept (CMakeLists.txt says why it
// is a library of its own).
using MakeCudaBackend = Backend* (*)(const CudaOptions&);
MakeCudaBackend cuda_factory() {
  static std::mutex mu;
  static MakeCudaBackend make = nullptr;
  std::lock_guard lock(mu);
  if (make != nullptr) return make;
  std::string path = "libsqueezekv_cuda.so";
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&cuda_factory), &self) != 0 && self.dli_fname != nullptr) {
    const std::string lib = self.dli_fname;
    if (const size_t slash = lib.find_last_of('/'); slash != std::string::npos) path = lib.substr(0, slash + 1) + path;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr)
    throw Error("--device cuda: cannot load the CUDA backend (" + std::string(dlerror()) +
                "); it needs libsqueezekv_cuda.so beside libsqueezekv.so, and the CUDA runtime and cuBLAS of the toolkit it was built with");
  make = reinterpret_cast<MakeCudaBackend>(dlsym(h, "squeezekv_make_cuda_backend"));
  if (make == nullptr) throw Error("--device cuda: " + path + " has no squeezekv_make_cuda_backend (a library of another build?)");
  return make;
}
}  // namespace
#endif

std::unique_ptr<Backend> make_backend(const BackendOptions& o) {
  cpu::check_cpu_cap();  // a host's kernels serve every device's CPU side
  if (o.device == Device::kCpu) return make_cpu_backend(o.threads, o.decode == Activations::kInt8);
#if SQUEEZEKV_CUDA
  CudaOptions co;
  co.f32_weights = o.device_weights == DeviceWeightFormat::kF32;
  co.native_weights = o.device_weights == DeviceWeightFormat::kNative;
  co.graphs = o.cuda_graphs;
  // for measurements: SQUEEZEKV_CUDA_PDL=0 launches every kernel after the previous one has finished,
  // SQUEEZEKV_CUDA_MMA=0 leaves prompt attention to the CUDA-core kernel, SQUEEZEKV_CUDA_MMA_DECODE=0
  // decode attention, SQUEEZEKV_CUDA_FUSE_KV=0 writes a decode step's KV row with its own kernel, SQUEEZEKV_CUDA_DEFER_MASS=0 adds a decode
  // step's mass right after its attention, SQUEEZEKV_CUDA_MMA_MASS=0 sums a prompt chunk's mass on
  // the CUDA cores, SQUEEZEKV_CUDA_BATCH_ATTN=0 runs a decode batch's attention one sequence
  // after another, SQUEEZEKV_CUDA_LAYER_SUBMIT=0 issues a step's launches together at its end,
  // SQUEEZEKV_CUDA_JOIN=0 multiplies q, k, v (gate, up) one matrix at a time, SQUEEZEKV_CUDA_QMMA=0
  // multiplies a decode batch over packed weights as a prompt chunk (dequantized to bf16, cuBLAS),
  // SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS=N makes a decode split take N keys at least (default 128),
  // SQUEEZEKV_CUDA_DECODE_BLOCKS=N splits a sequence's decode attention into up to N blocks an SM (0, the default: the kernel's own),
  // SQUEEZEKV_CUDA_ROWS_STEP=64|128 sets gemm_rows.h's step, SQUEEZEKV_CUDA_ATTN_BF16=0 converts a
  // prompt chunk's or a decode batch's attention output to bf16 in its own launch
  auto off = [](const char* name) {
    const char* e = std::getenv(name);
    return e != nullptr && std::string(e) == "0";
  };
  co.pdl = !off("SQUEEZEKV_CUDA_PDL");
  co.mma_attention = !off("SQUEEZEKV_CUDA_MMA");
  co.mma_decode = !off("SQUEEZEKV_CUDA_MMA_DECODE");
  co.fuse_kv_write = !off("SQUEEZEKV_CUDA_FUSE_KV");
  co.defer_mass = !off("SQUEEZEKV_CUDA_DEFER_MASS");
  co.mma_mass = !off("SQUEEZEKV_CUDA_MMA_MASS");
  co.batch_attention = !off("SQUEEZEKV_CUDA_BATCH_ATTN");
  co.layer_submit = !off("SQUEEZEKV_CUDA_LAYER_SUBMIT");
  co.join_products = !off("SQUEEZEKV_CUDA_JOIN");
  co.attn_bf16_out = !off("SQUEEZEKV_CUDA_ATTN_BF16");
  co.packed_mma = !off("SQUEEZEKV_CUDA_QMMA");
  if (const char* e = std::getenv("SQUEEZEKV_CUDA_QGEMV_ROWS")) {  // the packed GEMV's most rows, for measurements
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || v < 0 || v > 1024) throw Error(std::string("SQUEEZEKV_CUDA_QGEMV_ROWS: expected 0 to 1024, got '") + e + "'");
    co.packed_gemv_rows = static_cast<int>(v);
  }
  auto count = [](const char* name, int lo, int hi, int& v) {  // SQUEEZEKV_CUDA_LT_ALGOS, _RUNS: the products' timing, for measurements
    if (const char* e = std::getenv(name)) {
      char* end = nullptr;
      const long n = std::strtol(e, &end, 10);
      if (end == e || *end != '\0' || n < lo || n > hi)
        throw Error(std::string(name) + ": expected " + std::to_string(lo) + " to " + std::to_string(hi) + ", got '" + e + "'");
      v = static_cast<int>(n);
    }
  };
  count("SQUEEZEKV_CUDA_LT_ALGOS", 1, 256, co.lt_algos);
  count("SQUEEZEKV_CUDA_LT_RUNS", 1, 50, co.lt_runs);
  count("SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS", 32, 4096, co.decode_split_keys);  // for measurements
  count("SQUEEZEKV_CUDA_DECODE_BLOCKS", 0, 16, co.decode_blocks_per_sm);     // for measurements
  count("SQUEEZEKV_CUDA_ROWS_STEP", 64, 128, co.gemm_rows_step);  // for measurements
  if (co.gemm_rows_step != 64 && co.gemm_rows_step != 128)
    throw Error("SQUEEZEKV_CUDA_ROWS_STEP: expected 64 or 128, got " + std::to_string(co.gemm_rows_step));
  if (co.decode_split_keys % 32 != 0)
    throw Error("SQUEEZEKV_CUDA_DECODE_SPLIT_KEYS: expected a multiple of 32 (whole key tiles), got " + std::to_string(co.decode_split_keys));
  // a decode batch's products (CudaOptions::BatchProducts): cuBLASLt's fastest for each shape,
  // or with --batch-invariant gemm_rows for every decode row, a lone sequence's too;
  // SQUEEZEKV_CUDA_BATCH=tuned|blas|gemv|mma chooses one for measurements
  co.batch = o.batch_invariant ? CudaOptions::BatchProducts::kMma : CudaOptions::BatchProducts::kTuned;
  co.batch_lone_splits = o.batch_invariant;
  if (const char* e = std::getenv("SQUEEZEKV_CUDA_BATCH_SPLITS")) {  // lone|batch, for measurements
    const std::string v = e;
    if (v == "lone" || v == "batch") co.batch_lone_splits = v == "lone";
    else throw Error("SQUEEZEKV_CUDA_BATCH_SPLITS: expected lone or batch, got '" + v + "'");
  }
  if (const char* e = std::getenv("SQUEEZEKV_CUDA_BATCH")) {
    const std::string v = e;
    if (v == "tuned") co.batch = CudaOptions::BatchProducts::kTuned;
    else if (v == "blas") co.batch = CudaOptions::BatchProducts::kBlas;
    else if (v == "gemv") co.batch = CudaOptions::BatchProducts::kGemv;
    else if (v == "mma") co.batch = CudaOptions::BatchProducts::kMma;
    else throw Error("SQUEEZEKV_CUDA_BATCH: expected tuned, blas, gemv or mma, got '" + v + "'");
  }
  return std::unique_ptr<Backend>(cuda_factory()(co));
#else
  throw Error("--device cuda: this build of squeezekv has no CUDA backend (configure with -DSQUEEZEKV_CUDA=ON "
              "on a machine with the CUDA toolkit)");
#endif
}

}  // namespace squeezekv
