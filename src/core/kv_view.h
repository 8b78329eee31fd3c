// One layer's retained keys and values as every backend's attention reads them. The memory
// belongs to the backend the cache was built on (host memory for the CPU); positions are host or
// device memory alike, next to the rows they describe.
#pragma once
#include <cstddef>
#include <cstdint>

namespace squeezekv {

// How one K or V row of D values is stored (core/kv_rows.h converts): f16 or f32 values, or
// blocks of 32 values along the head dim, each with its own scales, laid out as GGUF's Q8_0
// (f16 scale, 32 int8), Q4_0 (f16 scale, 32 nibbles, value (q - 8) * scale) and Q4_1 (f16 scale
// and minimum, 32 nibbles, value q * scale + minimum). A row is self-contained: moving its bytes
// moves its scales, so eviction's compaction needs nothing else.
enum class KvType : uint8_t { kF16, kF32, kQ8_0, kQ4_0, kQ4_1 };
inline bool kv_quantized(KvType t) { return t != KvType::kF16 && t != KvType::kF32; }
// Whether keys of this type are stored rotated (core/kv_rows.h kv_rotate, the queries rotated
// alike before they meet them): the 4-bit types, whose blocks an outlier channel would coarsen.
inline bool kv_rotates_keys(KvType t) { return t == KvType::kQ4_0 || t == KvType::kQ4_1; }
// Bytes of a value for f16/f32 (the device kernels' types; 0 for the block types).
inline size_t kv_type_bytes(KvType t) { return t == KvType::kF16 ? 2 : t == KvType::kF32 ? 4 : 0; }
// Bytes of one row of D values (D a multiple of 32 for the block types).
inline size_t kv_row_bytes(KvType t, int D) {
  switch (t) {
    case KvType::kF16: return static_cast<size_t>(D) * 2;
    case KvType::kF32: return static_cast<size_t>(D) * 4;
    case KvType::kQ8_0: return static_cast<size_t>(D) / 32 * 34;
    case KvType::kQ4_0: return static_cast<size_t>(D) / 32 * 18;
    case KvType::kQ4_1: return static_cast<size_t>(D) / 32 * 20;
  }
  return 0;
}

// The position of a dead slot (a head-adaptive layer's unused slot, or a row a cut view hides):
// later than any query, so every query's causal mask hides it.
constexpr int32_t kDeadPosition = 0x7fffffff;

// The row types of a layer's K and of its V (they may differ: keys are the harder half to quantize),
// and how many of the newest rows are also kept in f16 beside their quantized rows (the recent
// ring, --kv-recent-f16; KIVI's full-precision residual): attention reads a row whose position is
// among the ring's from the ring, so the tokens that draw most of the attention keep their
// precision. Only where K or V is quantized; 0: none.
struct KvTypes {
  KvType k = KvType::kF16, v = KvType::kF16;
  int recent_f16 = 0;
  KvTypes() = default;
  KvTypes(KvType both) : k(both), v(both) {}  // NOLINT: one type for both is the common case
  KvTypes(KvType k_, KvType v_, int recent = 0) : k(k_), v(v_), recent_f16(recent) {}
  bool operator==(const KvTypes& o) const { return k == o.k && v == o.v && recent_f16 == o.recent_f16; }  // C++17 here too (CUDA files)
  bool operator!=(const KvTypes& o) const { return !(*this == o); }
  // The ring's K and V halves (a half exists where that side is quantized).
  bool ring_k() const { return recent_f16 > 0 && kv_quantized(k); }
  bool ring_v() const { return recent_f16 > 0 && kv_quantized(v); }
};

// Read-only view of one layer's retained keys and values. No implicit padding: a device records
// its kernels' arguments byte for byte (a replayed step must find the same bytes).
struct KvView {
  const void* k = nullptr;         // [G][capacity] rows of kv_row_bytes(type, D)
  const void* v = nullptr;         // [G][capacity] rows of kv_row_bytes(v_type, D)
  const int32_t* pos = nullptr;    // [G][capacity] absolute positions (slots in no particular order)
  // The count in the backend's memory when the sequence stages it there (devices: a kernel reads
  // N from it, so the launches of a step do not change with N); null: count is all there is.
  const int32_t* count_dev = nullptr;
  int count = 0;                   // N rows held per head
  int capacity = 0;
  int n_kv_heads = 0;              // G
  int head_dim = 0;                // D
  KvType type = KvType::kF16;      // K's rows
  KvType v_type = KvType::kF16;    // V's rows
  uint8_t pad_[6] = {};
  // The recent ring (KvTypes::recent_f16): the f16 rows of the newest positions, position p at
  // index p % ring, as its quantized row's values before quantizing (keys rotated and offset as
  // theirs are). A held row at position p >= ring_from with ring_pos[p % ring] == p is read from
  // the ring (kv_ring_index); ring 0: none.
  const uint16_t* ring_k = nullptr;  // [G][ring][D] f16, or null (K not quantized)
  const uint16_t* ring_v = nullptr;  // [G][ring][D] f16, or null (V not quantized)
  const int32_t* ring_pos = nullptr; // [ring] the position each index holds (-1: none)
  int ring = 0;
  int32_t ring_from = 0;           // the oldest position the ring may hold: newest + 1 - ring
  size_t k_row_bytes() const { return kv_row_bytes(type, head_dim); }
  size_t v_row_bytes() const { return kv_row_bytes(v_type, head_dim); }
};
static_assert(sizeof(KvView) == 7 * sizeof(void*) + 6 * sizeof(int) + 8, "KvView: no implicit padding");

// The most rows a recent ring holds (KvTypes::recent_f16; --kv-recent-f16's limit).
constexpr int kMaxRingRows = 4096;

// The ring index of a held row at position p, or -1 where its quantized row is read.
inline int kv_ring_index(const KvView& kv, int32_t p) {
  if (kv.ring == 0 || p < kv.ring_from || p == kDeadPosition) return -1;
  const int i = p % kv.ring;
  return kv.ring_pos[i] == p ? i : -1;
}

}  // namespace squeezekv
