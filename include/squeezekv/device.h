// Where a session runs.
#pragma once
#include <cstdint>
#include <string>

namespace squeezekv {

enum class Device : uint8_t { kCpu, kCuda };
// "cpu" | "cuda"; throws Error naming --device otherwise.
Device parse_device(const std::string& name);
const char* device_name(Device d);
// Whether this build has the device's backend.
bool device_available(Device d);
// The CPU threads a session runs when it asks for none (threads = 0): one per physical core this
// process may run on (its affinity mask), SMT siblings counted once.
int default_cpu_threads();
// The CPU kernels' instruction sets beyond the AVX2 baseline that this process runs (chosen at run
// time, capped by SQUEEZEKV_CPU), space-separated: "avx512 vnni bf16 amx-bf16"; "avx2" when none.
std::string cpu_kernels();
// Read + written bytes/s of a 512 MiB copy by `threads` CPU threads (0: the default count),
// measured now (about a second; 1 GiB of buffers, which count in the peak RSS).
double host_copy_bandwidth(int threads);
// Bytes/s that `threads` CPU threads (0: the default count) read from a 1 GiB buffer, nothing
// written: what bounds a CPU decode step, which reads every weight once (about half a second; the
// buffer counts in the peak RSS).
double host_read_bandwidth(int threads);

// How a device (--device cuda) holds the weight matrices.
enum class DeviceWeightFormat : uint8_t {
  kNative,  // quantized types in their GGUF blocks (the file's bytes), multiplied as they are:
            // decode rows by integer products against 8-bit activations (llama.cpp's), prompt
            // chunks and large batches through each matrix dequantized to bf16 on the way to the
            // tensor cores; BF16, F16 and F32 matrices as kBf16. The default.
  kBf16,    // every matrix dequantized to bf16 at load (2 bytes a weight)
  kF32,     // every matrix in f32: the exact test mode
};
// "native" | "bf16" | "f32"; throws Error naming --device-weights and the accepted values otherwise.
DeviceWeightFormat parse_device_weights(const std::string& s);
const char* device_weights_name(DeviceWeightFormat f);

}  // namespace squeezekv
