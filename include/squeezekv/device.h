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

}  // namespace squeezekv
