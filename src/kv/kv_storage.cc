#include "kv/kv_storage.h"

#include <algorithm>
#include <cmath>
#include <cassert>
#include <cstring>
#include <string>

#include "core/kv_rows.h"
#include "kv/select.h"
#include "squeezekv/error.h"

namespace squeezekv {

KvStorage::KvStorage(int n_kv_heads, int head_dim, int capacity, KvTypes types, Backend* backend)
    : G_(n_kv_heads), D_(head_dim), capacity_(capacity), types_(types),
      own_backend_(backend == nullptr ? make_cpu_backend(1) : nullptr),
      backend_(backend == nullptr ? own_backend_.get() : backend) {
  if (kv_rotates_keys(types_.k)) k_offset_ = backend_->alloc(static_cast<size_t>(G_) * D_ * sizeof(float));
  if (const RingLayout r = ring_bytes_for(G_, D_, types_); r.bytes > 0) ring_ = backend_->alloc(r.bytes);
  allocate();
  reset_ring();
  live_.assign(static_cast<size_t>(G_), 0);
}

KvStorage::RingLayout KvStorage::ring_bytes_for(int n_kv_heads, int head_dim, KvTypes types) {
  RingLayout r;
  if (!types.ring_k() && !types.ring_v()) return r;
  auto part = [](size_t bytes) { return (bytes + kSlabAlign - 1) / kSlabAlign * kSlabAlign; };
  const size_t half = static_cast<size_t>(n_kv_heads) * types.recent_f16 * head_dim * sizeof(uint16_t);
  r.v = types.ring_k() ? part(half) : 0;
  r.pos = r.v + (types.ring_v() ? part(half) : 0);
  r.rows = (types.ring_k() ? half : 0) + (types.ring_v() ? half : 0);
  r.bytes = r.pos + part(static_cast<size_t>(types.recent_f16) * sizeof(int32_t));
  return r;
}

void KvStorage::reset_ring() {
  if (!ring_) return;
  const std::vector<int32_t> none(static_cast<size_t>(types_.recent_f16), -1);
  backend_->upload(arrays_.ring_pos, none.data(), none.size() * sizeof(int32_t));
}

KvStorage::Slab KvStorage::slab(int n_kv_heads, int head_dim, int capacity, KvTypes types) {
  const size_t rows = static_cast<size_t>(n_kv_heads) * capacity;
  auto part = [](size_t bytes) { return (bytes + kSlabAlign - 1) / kSlabAlign * kSlabAlign; };
  Slab s;
  s.v = part(rows * kv_row_bytes(types.k, head_dim));
  s.pos = s.v + part(rows * kv_row_bytes(types.v, head_dim));
  s.mass = s.pos + part(rows * sizeof(int32_t));
  s.bytes = s.mass + part(rows * sizeof(float));
  return s;
}

void KvStorage::allocate() {
  const size_t rows = static_cast<size_t>(G_) * capacity_;
  const Slab at = slab(G_, D_, capacity_, types_);
  slab_ = backend_->alloc(at.bytes);
  unsigned char* base = slab_->as<unsigned char>();
  arrays_ = {base, base + at.v, reinterpret_cast<int32_t*>(base + at.pos), reinterpret_cast<float*>(base + at.mass), types_.k, G_, D_,
             capacity_, count_dev_, types_.v, k_offset_ ? k_offset_->as<float>() : nullptr};
  if (ring_) {
    const RingLayout r = ring_bytes_for(G_, D_, types_);
    unsigned char* rb = ring_->as<unsigned char>();
    arrays_.ring_k = types_.ring_k() ? reinterpret_cast<uint16_t*>(rb) : nullptr;
    arrays_.ring_v = types_.ring_v() ? reinterpret_cast<uint16_t*>(rb + r.v) : nullptr;
    arrays_.ring_pos = reinterpret_cast<int32_t*>(rb + r.pos);
    arrays_.ring = types_.recent_f16;
  }
  if (backend_->host_visible()) {
    pos_host_ = arrays_.pos;
    mass_host_ = arrays_.mass;
  } else {
    pos_mirror_.assign(rows, 0);
    mass_mirror_.assign(rows, 0.0f);
    pos_host_ = pos_mirror_.data();
    mass_host_ = mass_mirror_.data();
  }
  move_from_.reserve(rows);
  move_to_.reserve(rows);
}

void KvStorage::append(const float* k, const float* v, const int32_t* pos, int T, const int32_t* pos_dev, bool write_later) {
  if (count_ + T > capacity_)
    throw Error("kv cache: " + std::to_string(count_ + T) + " rows exceed the layer's capacity of " +
                std::to_string(capacity_) + " (raise --ctx or use an eviction policy)");
  if (pos_dev == nullptr && !backend_->host_visible())
    throw Error("kv cache: append on a device needs the positions in device memory (pos_dev)");
  if (!write_later) backend_->kv_write(arrays_, count_, k, v, pos_dev != nullptr ? pos_dev : pos, T);
  if (!backend_->host_visible()) {
    mass_stale_ = true;  // attention adds to the mass next
    for (int g = 0; g < G_; ++g)
      for (int t = 0; t < T; ++t) {
        const size_t slot = static_cast<size_t>(g) * capacity_ + count_ + t;
        pos_host_[slot] = pos[t];
        mass_host_[slot] = 0.0f;
      }
  }
  count_ += T;
  for (int& x : live_) x += T;
  if (T > 0) {
    newest_ = std::max(newest_, pos[T - 1]);
    last_appended_ = pos[T - 1];
    newest_dev_ = pos_dev != nullptr ? pos_dev + T - 1 : nullptr;
  }
}

void KvStorage::truncate(const Mark& m) {
  assert(m.count <= count_);
  for (int& x : live_) x -= count_ - m.count;  // the dropped rows are the newest, held by every head
  count_ = m.count;
  newest_ = m.newest;
  newest_dev_ = nullptr;
}

KvView KvStorage::view_without(const Eviction& ev) {
  const size_t rows = static_cast<size_t>(G_) * capacity_;
  cut_pos_host_.resize(rows);
  for (int g = 0; g < G_; ++g) {
    int32_t* dst = cut_pos_host_.data() + static_cast<size_t>(g) * capacity_;
    std::copy_n(positions(g), count_, dst);
    for (int i = ev.offsets[g]; i < ev.offsets[g + 1]; ++i) dst[ev.slots[static_cast<size_t>(i)]] = kDeadPos;
  }
  if (!cut_pos_ || cut_pos_->bytes() < rows * sizeof(int32_t)) cut_pos_ = backend_->alloc(rows * sizeof(int32_t));
  backend_->upload(cut_pos_->data(), cut_pos_host_.data(), rows * sizeof(int32_t));
  KvView v = view();
  v.pos = cut_pos_->as<int32_t>();
  return v;
}

void KvStorage::clear_mass() {
  const std::vector<float> zero(static_cast<size_t>(G_) * capacity_, 0.0f);
  backend_->upload(arrays_.mass, zero.data(), zero.size() * sizeof(float));
  if (!backend_->host_visible()) std::fill(mass_mirror_.begin(), mass_mirror_.end(), 0.0f);
  mass_stale_ = false;
}

void KvStorage::sync_to_host() const {
  if (backend_->host_visible()) return;
  const size_t rows = static_cast<size_t>(G_) * capacity_;
  if (mass_stale_) backend_->download(mass_host_, arrays_.mass, rows * sizeof(float));
  if (pos_stale_) backend_->download(pos_host_, arrays_.pos, rows * sizeof(int32_t));
  pos_stale_ = mass_stale_ = false;
}

void KvStorage::evict_one_on_backend(int budget, int sinks, int recent) {
  assert(count_ == budget + 1);
  const EvictableRange range = evictable_range(budget, sinks, recent, newest_);  // the host rule's
  // the newest position where the device has it, when the last row appended is the newest
  const int32_t* newest_dev = last_appended_ == newest_ ? newest_dev_ : nullptr;
  backend_->kv_evict_one(arrays_, count_, range.keep_below, range.keep_from, newest_dev, newest_ - range.keep_from + 1);
  --count_;
  for (int& x : live_) --x;
  if (!backend_->host_visible()) pos_stale_ = mass_stale_ = true;
}

void KvStorage::evict_top_on_backend(int budget, int sinks, int recent) {
  assert(count_ > budget && live_total() == static_cast<int64_t>(count_) * G_);
  const EvictableRange range = evictable_range(budget, sinks, recent, newest_);
  backend_->kv_evict_top(arrays_, count_, count_ - budget, range.keep_below, range.keep_from);
  count_ = budget;
  for (int& x : live_) x = budget;
  if (!backend_->host_visible()) pos_stale_ = mass_stale_ = true;
}

KvView KvStorage::view_cut_on_backend(int budget, int sinks, int recent) {
  assert(count_ > budget && live_total() == static_cast<int64_t>(count_) * G_);
  const size_t rows = static_cast<size_t>(G_) * capacity_;
  if (!cut_pos_ || cut_pos_->bytes() < rows * sizeof(int32_t)) cut_pos_ = backend_->alloc(rows * sizeof(int32_t));
  const EvictableRange range = evictable_range(budget, sinks, recent, newest_);
  backend_->kv_evict_top(arrays_, count_, count_ - budget, range.keep_below, range.keep_from, cut_pos_->as<int32_t>());
  KvView v = view();
  v.pos = cut_pos_->as<int32_t>();
  return v;
}

void KvStorage::evict(const int* evict, int n_evict) {
  Eviction ev;
  ev.slots.assign(evict, evict + static_cast<size_t>(G_) * n_evict);
  ev.set_uniform(G_, n_evict);
  this->evict(ev);
}

void KvStorage::evict(const Eviction& ev) {
  sync_to_host();  // the host mirror moves with the rows: current first (a copy only where stale)
  // prepare: per head, holes below its new count take the surviving rows from the top of
  // [new count, count): one move per hole, so a decode step that evicts one row per head moves at
  // most one row each
  move_from_.clear();
  move_to_.clear();
  int new_extent = 0;
  for (int g = 0; g < G_; ++g) {
    const int n_evict = ev.offsets[g + 1] - ev.offsets[g];
    assert(n_evict <= count_);
    const int new_count = count_ - n_evict;
    new_extent = std::max(new_extent, new_count);
    const int base = g * capacity_;
    const int* e = ev.slots.data() + ev.offsets[g];
    int src = count_ - 1, top = n_evict - 1;
    for (int i = 0; i < n_evict && e[i] < new_count; ++i) {
      for (; top >= 0 && e[top] == src; --top) --src;  // skip rows that are evicted themselves
      assert(src >= new_count);
      move_from_.push_back(base + src--);
      move_to_.push_back(base + e[i]);
    }
  }
  // apply: the backend's arrays in one call, and the host mirror when there is one
  backend_->kv_move(arrays_, move_from_.data(), move_to_.data(), static_cast<int>(move_from_.size()));
  if (!backend_->host_visible()) {
    for (size_t i = 0; i < move_from_.size(); ++i) {
      pos_host_[move_to_[i]] = pos_host_[move_from_[i]];
      mass_host_[move_to_[i]] = mass_host_[move_from_[i]];
    }
  }
  // heads holding fewer rows than the fullest one: their slots above their rows are dead (an
  // eviction drops every dead slot it is given, so what a head keeps is what it holds)
  for (int g = 0; g < G_; ++g) {
    const int kept = count_ - (ev.offsets[g + 1] - ev.offsets[g]);
    int32_t* p = pos_host_ + static_cast<size_t>(g) * capacity_;
    std::fill(p + kept, p + new_extent, kDeadPos);
    if (!backend_->host_visible() && kept < new_extent)
      backend_->upload(arrays_.pos + static_cast<size_t>(g) * capacity_ + kept, p + kept,
                       static_cast<size_t>(new_extent - kept) * sizeof(int32_t));
    live_[g] = kept;
  }
  count_ = new_extent;
}

void KvStorage::copy_rows_from(const KvArrays& from, const int32_t* pos_host, const float* mass_host, int n) {
  const size_t G = static_cast<size_t>(G_), rows = static_cast<size_t>(n), src_cap = static_cast<size_t>(from.capacity),
               cap = static_cast<size_t>(capacity_);
  const size_t row = kv_row_bytes(types_.k, D_), vrow = kv_row_bytes(types_.v, D_);
  backend_->copy_rows(arrays_.k, cap * row, from.k, src_cap * row, rows * row, G);
  backend_->copy_rows(arrays_.v, cap * vrow, from.v, src_cap * vrow, rows * vrow, G);
  backend_->copy_rows(arrays_.pos, cap * sizeof(int32_t), from.pos, src_cap * sizeof(int32_t), rows * sizeof(int32_t), G);
  backend_->copy_rows(arrays_.mass, cap * sizeof(float), from.mass, src_cap * sizeof(float), rows * sizeof(float), G);
  if (!backend_->host_visible())
    for (size_t g = 0; g < G; ++g) {
      std::copy_n(pos_host + g * src_cap, rows, pos_host_ + g * cap);
      std::copy_n(mass_host + g * src_cap, rows, mass_host_ + g * cap);
    }
}

void KvStorage::set_capacity(int capacity) {
  assert(capacity >= count_);
  // the held rows of every head moved into arrays laid out for the new capacity, within the
  // backend's memory (a device's rows never travel through the host)
  sync_to_host();
  const KvArrays old = arrays_;
  const std::unique_ptr<Buffer> old_slab = std::move(slab_);  // alive until copied
  const std::vector<int32_t> pos_mirror = std::move(pos_mirror_);
  const std::vector<float> mass_mirror = std::move(mass_mirror_);
  capacity_ = capacity;
  allocate();
  copy_rows_from(old, pos_mirror.data(), mass_mirror.data(), count_);
}

void KvStorage::copy_from(const KvStorage& src) {
  assert(src.G_ == G_ && src.D_ == D_ && src.types_ == types_);
  if (src.backend_ != backend_) throw Error("kv cache: a copy must live on the source's backend");
  src.sync_to_host();
  if (capacity_ != src.capacity_) {
    capacity_ = src.capacity_;
    allocate();
  }
  copy_rows_from(src.arrays_, src.pos_host_, src.mass_host_, src.count_);
  if (k_offset_) backend_->copy(k_offset_->data(), src.k_offset_->data(), static_cast<size_t>(G_) * D_ * sizeof(float));
  if (ring_) backend_->copy(ring_->data(), src.ring_->data(), ring_bytes_for(G_, D_, types_).bytes);
  pos_stale_ = mass_stale_ = false;
  count_ = src.count_;
  live_ = src.live_;
  newest_ = src.newest_;
  last_appended_ = src.last_appended_;
  newest_dev_ = nullptr;  // the source's step pointer means nothing here
}

KvView KvStorage::view() const {
  KvView v;
  v.type = types_.k;
  v.v_type = types_.v;
  v.k = arrays_.k;
  v.v = arrays_.v;
  v.pos = arrays_.pos;
  v.count_dev = count_dev_;
  v.count = count_;
  v.capacity = capacity_;
  v.n_kv_heads = G_;
  v.head_dim = D_;
  if (ring_) {
    v.ring_k = arrays_.ring_k;
    v.ring_v = arrays_.ring_v;
    v.ring_pos = arrays_.ring_pos;
    v.ring = arrays_.ring;
    v.ring_from = newest_ + 1 - arrays_.ring;
  }
  return v;
}

int64_t KvStorage::bytes_for(int n_kv_heads, int head_dim, int capacity, KvTypes types, bool host_mirror) {
  const int64_t rows = static_cast<int64_t>(n_kv_heads) * capacity;
  return static_cast<int64_t>(slab(n_kv_heads, head_dim, capacity, types).bytes + ring_bytes_for(n_kv_heads, head_dim, types).bytes) +
         (host_mirror ? 8 * rows : 0);
}

KvStorageImage KvStorage::image() const {
  sync_to_host();
  KvStorageImage im;
  const size_t G = static_cast<size_t>(G_), n = static_cast<size_t>(count_), cap = static_cast<size_t>(capacity_);
  const size_t row = kv_row_bytes(types_.k, D_), vrow = kv_row_bytes(types_.v, D_);
  im.count = count_;
  im.newest = newest_;
  im.live = live_;
  im.k.resize(G * n * row);
  im.v.resize(G * n * vrow);
  im.pos.resize(G * n);
  im.mass.resize(G * n);
  for (size_t g = 0; g < G; ++g) {
    backend_->download(im.k.data() + g * n * row, static_cast<const uint8_t*>(arrays_.k) + g * cap * row, n * row);
    backend_->download(im.v.data() + g * n * vrow, static_cast<const uint8_t*>(arrays_.v) + g * cap * vrow, n * vrow);
    std::copy_n(pos_host_ + g * cap, n, im.pos.data() + g * n);
    std::copy_n(mass_host_ + g * cap, n, im.mass.data() + g * n);
  }
  if (k_offset_) {
    im.k_offset.resize(G * D_);
    backend_->download(im.k_offset.data(), k_offset_->data(), im.k_offset.size() * sizeof(float));
  }
  if (ring_) {
    const size_t half = G * static_cast<size_t>(arrays_.ring) * D_;
    if (arrays_.ring_k) im.ring_k.resize(half), backend_->download(im.ring_k.data(), arrays_.ring_k, half * sizeof(uint16_t));
    if (arrays_.ring_v) im.ring_v.resize(half), backend_->download(im.ring_v.data(), arrays_.ring_v, half * sizeof(uint16_t));
    im.ring_pos.resize(static_cast<size_t>(arrays_.ring));
    backend_->download(im.ring_pos.data(), arrays_.ring_pos, im.ring_pos.size() * sizeof(int32_t));
  }
  return im;
}

void KvStorage::restore(const KvStorageImage& im, int32_t position_limit) {
  const size_t G = static_cast<size_t>(G_), n = static_cast<size_t>(im.count), cap = static_cast<size_t>(capacity_);
  const size_t row = kv_row_bytes(types_.k, D_), vrow = kv_row_bytes(types_.v, D_);
  auto fail = [](const std::string& m) { throw Error("kv restore: " + m); };
  if (im.count < 0 || im.count > capacity_)
    fail(std::to_string(im.count) + " rows do not fit the layer's capacity of " + std::to_string(capacity_));
  if (im.live.size() != G || im.k.size() != G * n * row || im.v.size() != G * n * vrow || im.pos.size() != G * n ||
      im.mass.size() != G * n || im.k_offset.size() != (k_offset_ ? G * D_ : 0))
    fail("the rows' sizes do not match the layer's shape and row types");
  const size_t ring = static_cast<size_t>(arrays_.ring), half = G * ring * D_;
  if (im.ring_k.size() != (arrays_.ring_k ? half : 0) || im.ring_v.size() != (arrays_.ring_v ? half : 0) || im.ring_pos.size() != ring)
    fail("the recent f16 rows' sizes do not match --kv-recent-f16 " + std::to_string(ring));
  for (size_t i = 0; i < ring; ++i) {
    const int32_t p = im.ring_pos[i];
    if (p != -1 && (p < 0 || p >= position_limit || static_cast<size_t>(p) % ring != i))
      fail("the recent f16 rows' index " + std::to_string(i) + " holds position " + std::to_string(p) + ", not one of its own");
  }
  if (!kv_rows_finite(KvType::kF16, im.ring_k.data(), im.ring_k.size() / std::max<size_t>(D_, 1), D_) ||
      !kv_rows_finite(KvType::kF16, im.ring_v.data(), im.ring_v.size() / std::max<size_t>(D_, 1), D_))
    fail("a recent f16 row holds a value that is not finite");
  int32_t newest = -1;
  std::vector<int32_t> sorted(n);
  for (size_t g = 0; g < G; ++g) {
    int live = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t p = im.pos[g * n + i];
      if (p == kDeadPos) continue;
      if (p < 0 || p >= position_limit)
        fail("kv head " + std::to_string(g) + " holds position " + std::to_string(p) + ", outside [0, " + std::to_string(position_limit) + ")");
      if (!std::isfinite(im.mass[g * n + i])) fail("kv head " + std::to_string(g) + " has a mass that is not finite");
      sorted[live++] = p;
      newest = std::max(newest, p);
    }
    std::sort(sorted.begin(), sorted.begin() + live);
    if (std::adjacent_find(sorted.begin(), sorted.begin() + live) != sorted.begin() + live)
      fail("kv head " + std::to_string(g) + " holds a position twice");
    if (im.live[g] != live) fail("kv head " + std::to_string(g) + "'s live count disagrees with its positions");
  }
  if (im.newest < newest || im.newest >= position_limit) fail("the newest position is not the newest held");
  for (float x : im.k_offset)  // (means of keys: far below f16's range; larger ones overflow a new key's rotation)
    if (!(std::fabs(x) <= 65504.0f)) fail("the key offsets are not finite numbers within f16's range");
  // every stored value finite (a damaged scale or half would turn attention, and then the mass the
  // policies sort by, into NaN): read from the bits, not dequantized (tens of MB a restore)
  if (!kv_rows_finite(types_.k, im.k.data(), G * n, D_)) fail("a key row holds a value that is not finite");
  if (!kv_rows_finite(types_.v, im.v.data(), G * n, D_)) fail("a value row holds a value that is not finite");
  for (size_t g = 0; g < G; ++g) {
    backend_->upload(static_cast<uint8_t*>(arrays_.k) + g * cap * row, im.k.data() + g * n * row, n * row);
    backend_->upload(static_cast<uint8_t*>(arrays_.v) + g * cap * vrow, im.v.data() + g * n * vrow, n * vrow);
    std::copy_n(im.pos.data() + g * n, n, pos_host_ + g * cap);
    std::copy_n(im.mass.data() + g * n, n, mass_host_ + g * cap);
  }
  if (!backend_->host_visible()) {
    backend_->upload(arrays_.pos, pos_host_, G * cap * sizeof(int32_t));
    backend_->upload(arrays_.mass, mass_host_, G * cap * sizeof(float));
  }
  if (k_offset_) backend_->upload(k_offset_->data(), im.k_offset.data(), im.k_offset.size() * sizeof(float));
  if (arrays_.ring_k) backend_->upload(arrays_.ring_k, im.ring_k.data(), im.ring_k.size() * sizeof(uint16_t));
  if (arrays_.ring_v) backend_->upload(arrays_.ring_v, im.ring_v.data(), im.ring_v.size() * sizeof(uint16_t));
  if (ring_) backend_->upload(arrays_.ring_pos, im.ring_pos.data(), im.ring_pos.size() * sizeof(int32_t));
  pos_stale_ = mass_stale_ = false;
  count_ = im.count;
  live_ = im.live;
  newest_ = last_appended_ = im.newest;
  newest_dev_ = nullptr;
}

void KvStorage::read_keys(float* keys) const {
  if (kv_rotates_keys(types_.k))
    throw Error("kv keys: 4-bit keys (--kv-type q4_0, q4_1) are stored rotated; reading them needs f16, f32 or q8_0 rows");
  const size_t row = kv_row_bytes(types_.k, D_);
  std::vector<uint8_t> staged;
  const uint8_t* base = static_cast<const uint8_t*>(arrays_.k);
  for (int g = 0; g < G_; ++g) {
    const uint8_t* src = base + static_cast<size_t>(g) * capacity_ * row;
    if (!backend_->host_visible()) {
      staged.resize(static_cast<size_t>(count_) * row);
      backend_->download(staged.data(), src, staged.size());
      src = staged.data();
    }
    for (int i = 0; i < count_; ++i)
      kv_dequantize_row(types_.k, src + static_cast<size_t>(i) * row, keys + (static_cast<size_t>(g) * count_ + i) * D_, D_);
  }
}

int64_t KvStorage::bytes_per_token() const {
  return static_cast<int64_t>(G_) * static_cast<int64_t>(kv_row_bytes(types_.k, D_) + kv_row_bytes(types_.v, D_));
}

}  // namespace squeezekv
