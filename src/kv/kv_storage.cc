#include "kv/kv_storage.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

#include "squeezekv/error.h"

namespace squeezekv {

namespace {
size_t elem_bytes(cpu::KvType t) { return t == cpu::KvType::kF16 ? 2 : 4; }
}  // namespace

KvStorage::KvStorage(int n_kv_heads, int head_dim, int capacity, cpu::KvType type)
    : G_(n_kv_heads), D_(head_dim), capacity_(capacity), type_(type) {
  const size_t rows = static_cast<size_t>(G_) * capacity_;
  k_.resize(rows * D_ * elem_bytes(type_));
  v_.resize(rows * D_ * elem_bytes(type_));
  pos_.resize(rows);
  mass_.resize(rows);
}

void KvStorage::append(const float* k, const float* v, const int32_t* pos, int T) {
  if (count_ + T > capacity_)
    throw Error("kv cache: " + std::to_string(count_ + T) + " rows exceed the layer's capacity of " +
                std::to_string(capacity_) + " (raise --ctx or use an eviction policy)");
  const size_t eb = elem_bytes(type_);
  for (int g = 0; g < G_; ++g) {
    for (int t = 0; t < T; ++t) {
      const size_t slot = static_cast<size_t>(g) * capacity_ + count_ + t;
      const float* ks = k + (static_cast<size_t>(t) * G_ + g) * D_;
      const float* vs = v + (static_cast<size_t>(t) * G_ + g) * D_;
      if (type_ == cpu::KvType::kF16) {
        cpu::f32_to_f16_row(reinterpret_cast<uint16_t*>(k_.data()) + slot * D_, ks, D_);
        cpu::f32_to_f16_row(reinterpret_cast<uint16_t*>(v_.data()) + slot * D_, vs, D_);
      } else {
        std::memcpy(k_.data() + slot * D_ * eb, ks, D_ * eb);
        std::memcpy(v_.data() + slot * D_ * eb, vs, D_ * eb);
      }
      pos_[slot] = pos[t];
      mass_[slot] = 0.0f;
    }
  }
  count_ += T;
  if (T > 0) newest_ = std::max(newest_, pos[T - 1]);
}

void KvStorage::compact(const int* keep, int n_keep) {
  assert(n_keep <= count_);
  const size_t row = static_cast<size_t>(D_) * elem_bytes(type_);
  for (int g = 0; g < G_; ++g) {
    const size_t base = static_cast<size_t>(g) * capacity_;
    const int* kg = keep + static_cast<size_t>(g) * n_keep;
    // Survivors at slots >= n_keep fill the holes left below n_keep: at most one row moves per
    // evicted row, instead of shifting everything behind the first hole. kg is ascending, so the
    // survivors below n_keep are a prefix of it.
    int below = 0;
    while (below < n_keep && kg[below] < n_keep) ++below;
    int src = below, hole = 0;
    for (int i = 0; i < below; ++i) {  // walk holes in [0, n_keep) in ascending order
      for (; hole < kg[i]; ++hole) move_row(base, kg[src++], hole, row);
      hole = kg[i] + 1;
    }
    for (; hole < n_keep; ++hole) move_row(base, kg[src++], hole, row);
    assert(src == n_keep);
  }
  count_ = n_keep;
}

void KvStorage::move_row(size_t base, int from, int to, size_t row_bytes) {
  std::memcpy(k_.data() + (base + to) * row_bytes, k_.data() + (base + from) * row_bytes, row_bytes);
  std::memcpy(v_.data() + (base + to) * row_bytes, v_.data() + (base + from) * row_bytes, row_bytes);
  pos_[base + to] = pos_[base + from];
  mass_[base + to] = mass_[base + from];
}

void KvStorage::set_capacity(int capacity) {
  assert(capacity >= count_);
  KvStorage next(G_, D_, capacity, type_);
  const size_t row = static_cast<size_t>(D_) * elem_bytes(type_);
  for (int g = 0; g < G_; ++g) {
    const size_t from = static_cast<size_t>(g) * capacity_, to = static_cast<size_t>(g) * capacity;
    std::memcpy(next.k_.data() + to * row, k_.data() + from * row, count_ * row);
    std::memcpy(next.v_.data() + to * row, v_.data() + from * row, count_ * row);
    std::memcpy(next.pos_.data() + to, pos_.data() + from, count_ * sizeof(int32_t));
    std::memcpy(next.mass_.data() + to, mass_.data() + from, count_ * sizeof(float));
  }
  next.count_ = count_;
  next.newest_ = newest_;
  *this = std::move(next);
}

void KvStorage::add_mass(const float* add) {
  for (int g = 0; g < G_; ++g) {
    float* m = mass_.data() + static_cast<size_t>(g) * capacity_;
    const float* a = add + static_cast<size_t>(g) * count_;
    for (int j = 0; j < count_; ++j) m[j] += a[j];
  }
}

cpu::KvView KvStorage::view() const {
  cpu::KvView v;
  v.type = type_;
  v.k = k_.data();
  v.v = v_.data();
  v.pos = pos_.data();
  v.count = count_;
  v.capacity = capacity_;
  v.n_kv_heads = G_;
  v.head_dim = D_;
  return v;
}

int64_t KvStorage::bytes_per_token() const {
  return static_cast<int64_t>(G_) * D_ * 2 * static_cast<int64_t>(elem_bytes(type_));
}

}  // namespace squeezekv
