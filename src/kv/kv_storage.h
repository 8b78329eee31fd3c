// Storage of one layer's retained keys and values (DESIGN.md "The cache contract"):
// K and V as [G][slot][D] (f16 default, f32 option) in the backend's memory, and the policies'
// metadata on the host: per head per slot its absolute position (int32) and accumulated
// attention mass (f32). Every head uses slots [0, count()); each keeps its own set of positions.
// With head-adaptive budgets a head may hold fewer rows than count(): its other slots are dead
// (position kDeadPos, which every query's causal mask hides), so attention needs no per-head count.
// Slots are in no particular order once rows were evicted (eviction fills holes from the tail);
// the position of a slot identifies its token. New rows always go to the end.
// Allocated once per capacity; no allocation per step.
// Thread safety: none; owned by one sequence.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include <memory>

#include "backend/backend.h"
#include "core/kv_view.h"

namespace squeezekv {

struct Eviction;

// A storage's held rows and metadata in host memory, packed [G][count] (what a saved cache holds;
// KvStorage::image and restore).
struct KvStorageImage {
  int count = 0;
  int32_t newest = -1;
  std::vector<int> live;        // [G] rows held per head
  std::vector<uint8_t> k, v;    // [G][count] rows of the K and V types
  std::vector<int32_t> pos;     // [G][count] absolute positions (dead slots kDeadPos)
  std::vector<float> mass;      // [G][count]
  std::vector<float> k_offset;  // [G][D] for a kv_rotates_keys type, else empty
  std::vector<uint16_t> ring_k, ring_v;  // [G][ring][D] f16, the recent ring's halves (KvTypes::ring_k/ring_v), else empty
  std::vector<int32_t> ring_pos;         // [ring] (-1: none), empty without a ring
};

class KvStorage {
 public:
  // The position of a dead slot: later than any query, so attention masks it.
  static constexpr int32_t kDeadPos = kDeadPosition;

  // backend: where the arrays live (null: a CPU backend of this storage's own).
  KvStorage(int n_kv_heads, int head_dim, int capacity, KvTypes types, Backend* backend = nullptr);

  // Appends T rows: k, v [T][G*D] (rotated keys; the backend's memory), pos [T] absolute positions
  // (host memory; pos_dev: the same in the backend's memory, null when it is host-visible); mass
  // starts at 0. Throws Error when the rows do not fit the capacity. write_later: the rows join
  // the bookkeeping only, and the caller has the backend write them before anything reads them
  // (AttentionCall::write with arrays(): a decode batch's writes in its attention's launch).
  void append(const float* k, const float* v, const int32_t* pos, int T, const int32_t* pos_dev = nullptr, bool write_later = false);
  // The arrays in the backend's memory, as kv_write and the other row ops take them.
  const KvArrays& arrays() const { return arrays_; }

  // Drops, for every head g, the slots evict[g * n_evict + i] (ascending), moving at most one row
  // per evicted row (holes are filled from the top).
  void evict(const int* evict, int n_evict);
  // Drops head g's slots ev.slots[ev.offsets[g] .. ev.offsets[g + 1]) (ascending; dead slots too);
  // each head's kept rows move to its first slots, and heads left with fewer rows than the fullest
  // head get dead slots up to it.
  void evict(const Eviction& ev);

  void clear() {
    count_ = 0;
    newest_ = -1;
    newest_dev_ = nullptr;
    live_.assign(static_cast<size_t>(G_), 0);
    reset_ring();
  }
  // The rows held now, to drop the rows appended after it (a scoring pass's own rows).
  struct Mark {
    int count = 0;
    int32_t newest = -1;
  };
  Mark mark() const { return {count_, newest_}; }
  // Drops every row appended since m (they are the newest: appends go to the end).
  void truncate(const Mark& m);
  // Sets every held row's accumulated mass to 0 (a scoring pass starts afresh).
  void clear_mass();
  // Re-lays the arrays for a new capacity (>= count), keeping the held rows. A deep copy: called
  // once per schedule change, never per step.
  void set_capacity(int capacity);
  // Makes this storage a deep copy of src (same heads, head dim and row types; the capacity
  // follows src's): its held rows, their positions and mass, and the key offset, copied within
  // the backend's memory.
  // The count binding (bind_device_count) stays this storage's own.
  void copy_from(const KvStorage& src);
  KvView view() const;
  // The held rows less the slots `ev` names (per head): a view whose evicted slots carry kDeadPos,
  // so attention over it is attention over the others alone. The positions are copied into a
  // scratch array of the backend's memory (valid until the next call); K and V are the held ones.
  // For a metric read while a schedule is pending, never in decode.
  KvView view_without(const Eviction& ev);
  int count() const { return count_; }
  // Rows head g holds (count() less its dead slots), and all heads together.
  int live(int g) const { return live_[g]; }
  int64_t live_total() const {
    int64_t n = 0;
    for (int x : live_) n += x;
    return n;
  }
  int capacity() const { return capacity_; }
  int n_kv_heads() const { return G_; }
  int head_dim() const { return D_; }
  KvTypes types() const { return types_; }
  // Position of the newest row ever appended (-1 before the first).
  int32_t newest_position() const { return newest_; }
  // The policies' metadata, host memory: positions [G][capacity] and accumulated mass. On a device
  // the first read after the device changed them copies them over (so a policy that never reads
  // the mass, or a step that evicts on the device, costs no copy).
  const int32_t* positions(int g) const {
    if (pos_stale_) sync_to_host();
    return pos_host_ + static_cast<size_t>(g) * capacity_;
  }
  const float* mass(int g) const {
    if (mass_stale_) sync_to_host();
    return mass_host_ + static_cast<size_t>(g) * capacity_;
  }
  // Accumulated attention mass, [G][capacity] in the backend's memory; attention adds to it.
  float* mass_accumulator() { return arrays_.mass; }
  // Brings the backend's mass and positions to the host metadata where the device changed them
  // since the last sync (attention adds mass after every append; a device-side eviction moves
  // rows): a copy only then, and never when the backend's memory is host-visible. Const: the
  // metadata mirrors what the backend holds.
  void sync_to_host() const;
  // A decode step's eviction run by the backend where the mass lives (Backend::kv_evict_one):
  // one row per head goes, chosen as select_sinks_recent_top(budget, sinks, recent) would;
  // count must be budget + 1. The host metadata is stale until sync_to_host().
  void evict_one_on_backend(int budget, int sinks, int recent);
  // A step's eviction of any number of rows run by the backend where the mass lives
  // (Backend::kv_evict_top): every head keeps `budget` rows, chosen as
  // select_sinks_recent_top(budget, sinks, recent) would, moved as evict() moves them; count must
  // exceed budget and no slot be dead. The host metadata is stale until sync_to_host().
  void evict_top_on_backend(int budget, int sinks, int recent);
  // view_without(the slots select_sinks_recent_top(budget, sinks, recent) would evict), chosen by
  // the backend (Backend::kv_evict_top into a scratch array of positions; valid until the next
  // call): nothing is read back. count must exceed budget and no slot be dead.
  KvView view_cut_on_backend(int budget, int sinks, int recent);
  bool host_visible() const { return backend_->host_visible(); }
  // On a device: where the sequence stages this storage's count for each step (one int32 of the
  // backend's memory holding count() + the step's rows; SequenceCache::stage_step). view() and
  // append() hand it to the backend, whose kernels then read N there, so the launches of one
  // decode step equal the next one's and a device can replay them (CUDA graphs).
  void bind_device_count(const int32_t* count_dev) {
    count_dev_ = count_dev;
    arrays_.count_dev = count_dev;
  }
  // A deep copy of the held rows into host memory (from a device's first).
  KvStorageImage image() const;
  // Replaces the held rows with an image of a storage of this shape and these row types. The image
  // is checked first (Error naming what does not fit: sizes, more rows than the capacity, per head
  // positions that repeat or lie at or beyond `position_limit`, live counts that disagree with the
  // dead slots, mass or row values that are not finite), so a damaged file cannot leave rows a
  // later step trips on.
  void restore(const KvStorageImage& im, int32_t position_limit);
  // The held keys as f32, keys [G][count()][D] (after RoPE, as attention meets them): a deep copy
  // (from a device's memory first). Throws Error for the 4-bit types, whose keys are stored rotated.
  void read_keys(float* keys) const;
  // Bytes held per retained token across all heads (K and V).
  int64_t bytes_per_token() const;
  // Bytes of the recent ring's f16 rows (KvTypes::recent_f16), held whole beside the rows; 0 without one.
  int64_t ring_bytes() const { return ring_bytes_for(G_, D_, types_).rows; }
  // Bytes a storage of this shape allocates: its slab of K, V, positions and mass (and a device's
  // host mirror of the last two).
  static int64_t bytes_for(int n_kv_heads, int head_dim, int capacity, KvTypes types, bool host_mirror);

 private:
  // A layer's four arrays as one allocation (one block of the backend's memory, so a device rounds
  // one size up to its allocation granularity, not four), each part at a multiple of kSlabAlign:
  // K at 0, then V, positions and mass at these offsets; bytes in all.
  static constexpr size_t kSlabAlign = 256;
  struct Slab {
    size_t v, pos, mass, bytes;
  };
  static Slab slab(int n_kv_heads, int head_dim, int capacity, KvTypes types);
  // The recent ring's one allocation: K's half at 0, V's at v, the positions at pos; rows: the
  // two halves' bytes; bytes in all (0: no ring).
  struct RingLayout {
    size_t v = 0, pos = 0, rows = 0, bytes = 0;
  };
  static RingLayout ring_bytes_for(int n_kv_heads, int head_dim, KvTypes types);
  void reset_ring();  // every ring index empty (-1)
  void allocate();
  // Rows [0, n) of every head from `from` (arrays of this shape laid out for from.capacity, in the
  // backend's memory; pos_host, mass_host: their host mirrors [G][from.capacity], read where that
  // memory is not host-visible) into this storage's arrays: one strided copy an array.
  void copy_rows_from(const KvArrays& from, const int32_t* pos_host, const float* mass_host, int n);
  int G_, D_, capacity_;
  KvTypes types_;
  std::unique_ptr<Backend> own_backend_;  // when none was given
  Backend* backend_;
  int count_ = 0;
  const int32_t* count_dev_ = nullptr;  // see bind_device_count
  // the last row appended: its position, and where the backend holds it (valid within the step)
  int32_t last_appended_ = -1;
  const int32_t* newest_dev_ = nullptr;
  int32_t newest_ = -1;
  std::vector<int> live_;  // [G] rows held per head
  std::unique_ptr<Buffer> slab_;                 // the backend's arrays (KvArrays), one allocation (Slab)
  std::unique_ptr<Buffer> k_offset_;             // [G][D] (KvArrays::k_offset), kept across set_capacity
  std::unique_ptr<Buffer> ring_;                 // the recent ring (RingLayout), kept across set_capacity
  KvArrays arrays_;
  mutable std::vector<int32_t> pos_mirror_;  // host metadata when the backend's memory is not host-visible
  mutable std::vector<float> mass_mirror_;
  mutable bool pos_stale_ = false;           // positions moved on the backend since the last sync
  mutable bool mass_stale_ = false;          // mass added or moved on the backend since the last sync
  int32_t* pos_host_ = nullptr;      // [G][capacity]: the backend's array or the mirror
  float* mass_host_ = nullptr;
  std::vector<int> move_from_, move_to_;  // compaction moves, [G * capacity] at most, reused
  std::unique_ptr<Buffer> cut_pos_;       // view_without's positions [G][capacity]
  std::vector<int32_t> cut_pos_host_;
};

}  // namespace squeezekv
