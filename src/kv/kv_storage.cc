#include "kv/kv_storage.h"

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
}

void KvStorage::compact(const int* keep, int n_keep) {
  assert(n_keep <= count_);
  const size_t row = static_cast<size_t>(D_) * elem_bytes(type_);
  for (int g = 0; g < G_; ++g) {
    const size_t base = static_cast<size_t>(g) * capacity_;
    const int* kg = keep + static_cast<size_t>(g) * n_keep;
    for (int i = 0; i < n_keep; ++i) {
      const int src = kg[i];
      assert(src >= i && src < count_ && (i == 0 || kg[i - 1] < src));
      if (src == i) continue;  // ascending keep list: a row only ever moves down
      std::memmove(k_.data() + (base + i) * row, k_.data() + (base + src) * row, row);
      std::memmove(v_.data() + (base + i) * row, v_.data() + (base + src) * row, row);
      pos_[base + i] = pos_[base + src];
      mass_[base + i] = mass_[base + src];
    }
  }
  count_ = n_keep;
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
