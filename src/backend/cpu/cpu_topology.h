// How many threads the CPU backend runs when none is asked for: one per physical core this
// process may run on (its affinity mask: taskset, a container's cpuset), a core's SMT siblings
// counted once, as llama.cpp's default does: the matrix kernels keep a core's vector units busy
// from one thread, and a second hardware thread on the same core only splits them (and its
// share of the memory bandwidth). Read from Linux's sysfs topology; where that is missing, every
// CPU of the mask counts.
// Thread safety: default_threads() computes once (a function-local static); the others are pure.
#pragma once
#include <string>
#include <vector>

namespace squeezekv::cpu {

// Distinct (physical_package_id, core_id) pairs among `cpus` (CPU numbers), read from
// <sysfs_cpu_dir>/cpuN/topology/; a CPU whose files are missing or unreadable counts as a core
// of its own. At least 1.
int count_physical_cores(const std::vector<int>& cpus, const std::string& sysfs_cpu_dir);

// The CPUs this process may run on (sched_getaffinity), or 0 .. hardware_concurrency - 1.
std::vector<int> usable_cpus();

// count_physical_cores(usable_cpus(), "/sys/devices/system/cpu"), computed once.
int default_threads();

}  // namespace squeezekv::cpu
