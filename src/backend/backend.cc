// Device names and the choice of backend: the one file that knows every backend of the build.
#include "backend/backend.h"

#include "squeezekv/error.h"

namespace squeezekv {

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  throw Error("--device: unknown device '" + name + "' (expected cpu or cuda)");
}

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

bool device_available(Device d) { return d == Device::kCpu; }

std::unique_ptr<Backend> make_backend(Device device, int threads) {
  if (device == Device::kCpu) return make_cpu_backend(threads);
  throw Error("--device cuda: this build of squeezekv has no CUDA backend (configure with -DSQUEEZEKV_CUDA=ON "
              "on a machine with the CUDA toolkit)");
}

}  // namespace squeezekv
