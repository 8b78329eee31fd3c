// Counter-based random streams for data that must be the same on every machine and thread count
// (dummy weights, random blocks, benchmark inputs): splitmix64 (Steele, Lea and Flood 2014) over a
// state started from a seed and a stream number.
// Thread safety: pure functions; a state belongs to its caller.
#pragma once
#include <cstdint>

namespace squeezekv {

// The next 64 random bits of state s.
inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The state that starts stream `stream` of `seed` (each row of a dummy tensor its own stream).
inline uint64_t stream_state(uint64_t seed, uint64_t stream) {
  return seed * 0x632BE59BD9B4E019ULL + stream * 0x9E3779B97F4A7C15ULL + 1;
}

}  // namespace squeezekv
