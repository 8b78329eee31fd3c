// The machine the CPU backend runs on. How many threads it runs when none is asked for: one per
// physical core this process may run on (its affinity mask: taskset, a container's cpuset), a
// core's SMT siblings counted once, as llama.cpp's default does: the matrix kernels keep a core's
// vector units busy from one thread, and a second hardware thread on the same core only splits
// them (and its share of the memory bandwidth). Read from Linux's sysfs topology; where that is
// missing, every CPU of the mask counts. And the memory's bandwidths: a copy's, and a read
// stream's, which bounds a decode step (every weight read once a token, nothing written back):
// the bench's roofline on the CPU.
// Thread safety: default_threads() computes once (a function-local static); copy_bandwidth and
// read_bandwidth run OpenMP threads of their own; the others are pure.
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

// Read + written bytes/s of a copy by `threads` OpenMP threads (0: default_threads()), each
// copying its slice of 512 MiB (past the last-level cache of the CPUs people run this on; a
// 16-core Xeon has 300 MiB): the median of 5 timed copies after one untimed, about a second.
// Its 1 GiB of buffers counts in the process's peak RSS: callers that report one read it first.
double copy_bandwidth(int threads);

// Bytes/s read by `threads` OpenMP threads (0: default_threads()), each streaming its slice of one
// 1 GiB buffer once (16-byte loads, each line prefetched 4 KiB ahead, nothing stored): the
// median of 5 timed passes after one untimed, well under a second. A copy's figure can understate
// what reads alone reach (on a 16-core Xeon a decode step read its weights at up to 1.5x the
// copy's read + written bytes/s, 2026-12-06: its stores cost more than their count), so this one
// bounds a decode step. Its buffer counts in the process's peak RSS like the copy's.
double read_bandwidth(int threads);

}  // namespace squeezekv::cpu
