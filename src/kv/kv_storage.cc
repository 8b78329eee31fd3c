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

void KvStorage::evict(const int* evict, int n_evict) {
  assert(n_evict <= count_);
  const size_t row = static_cast<size_t>(D_) * elem_bytes(type_);
  const int new_count = count_ - n_evict;
  for (int g = 0; g < G_; ++g) {
    const size_t base = static_cast<size_t>(g) * capacity_;
    const int* e = evict + static_cast<size_t>(g) * n_evict;
    // holes below new_count take the surviving rows from the top of [new_count, count): one
    // move per hole, so a decode step that evicts one row moves at most one row
    int src = count_ - 1, top = n_evict - 1;
    for (int i = 0; i < n_evict && e[i] < new_count; ++i) {
      for (; top >= 0 && e[top] == src; --top) --src;  // skip rows that are evicted themselves
      assert(src >= new_count);
      move_row(base, src--, e[i], row);
    }
  }
  count_ = new_count;
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
