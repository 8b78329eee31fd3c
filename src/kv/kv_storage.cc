#include "kv/kv_storage.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

#include "squeezekv/error.h"

namespace squeezekv {

KvStorage::KvStorage(int n_kv_heads, int head_dim, int capacity, KvType type, Backend* backend)
    : G_(n_kv_heads), D_(head_dim), capacity_(capacity), type_(type),
      own_backend_(backend == nullptr ? make_cpu_backend(1) : nullptr),
      backend_(backend == nullptr ? own_backend_.get() : backend) {
  const size_t rows = static_cast<size_t>(G_) * capacity_;
  k_ = backend_->alloc(rows * D_ * kv_type_bytes(type_));
  v_ = backend_->alloc(rows * D_ * kv_type_bytes(type_));
  pos_.resize(rows);
  mass_.resize(rows);
  move_from_.reserve(rows);
  move_to_.reserve(rows);
}

void KvStorage::append(const float* k, const float* v, const int32_t* pos, int T) {
  if (count_ + T > capacity_)
    throw Error("kv cache: " + std::to_string(count_ + T) + " rows exceed the layer's capacity of " +
                std::to_string(capacity_) + " (raise --ctx or use an eviction policy)");
  backend_->kv_write(k_->data(), v_->data(), type_, G_, D_, capacity_, count_, k, v, T);
  for (int g = 0; g < G_; ++g) {
    for (int t = 0; t < T; ++t) {
      const size_t slot = static_cast<size_t>(g) * capacity_ + count_ + t;
      pos_[slot] = pos[t];
      mass_[slot] = 0.0f;
    }
  }
  count_ += T;
  if (T > 0) newest_ = std::max(newest_, pos[T - 1]);
}

void KvStorage::evict(const int* evict, int n_evict) {
  assert(n_evict <= count_);
  const int new_count = count_ - n_evict;
  // prepare: holes below new_count take the surviving rows from the top of [new_count, count):
  // one move per hole, so a decode step that evicts one row per head moves at most one row each
  move_from_.clear();
  move_to_.clear();
  for (int g = 0; g < G_; ++g) {
    const int base = g * capacity_;
    const int* e = evict + static_cast<size_t>(g) * n_evict;
    int src = count_ - 1, top = n_evict - 1;
    for (int i = 0; i < n_evict && e[i] < new_count; ++i) {
      for (; top >= 0 && e[top] == src; --top) --src;  // skip rows that are evicted themselves
      assert(src >= new_count);
      move_from_.push_back(base + src--);
      move_to_.push_back(base + e[i]);
    }
  }
  // apply: the rows in the backend's memory in one call, the metadata here
  const size_t row = static_cast<size_t>(D_) * kv_type_bytes(type_);
  backend_->kv_move(k_->data(), v_->data(), row, move_from_.data(), move_to_.data(), static_cast<int>(move_from_.size()));
  for (size_t i = 0; i < move_from_.size(); ++i) {
    pos_[move_to_[i]] = pos_[move_from_[i]];
    mass_[move_to_[i]] = mass_[move_from_[i]];
  }
  count_ = new_count;
}

void KvStorage::set_capacity(int capacity) {
  assert(capacity >= count_);
  KvStorage next(G_, D_, capacity, type_, backend_);
  // rows [0, count) of every head, moved to the new layout within the backend's memory
  const size_t row = static_cast<size_t>(D_) * kv_type_bytes(type_);
  std::vector<uint8_t> host(static_cast<size_t>(count_) * row);
  for (int g = 0; g < G_; ++g) {
    const size_t from = static_cast<size_t>(g) * capacity_, to = static_cast<size_t>(g) * capacity;
    for (Buffer* b : {k_.get(), v_.get()}) {
      Buffer* nb = b == k_.get() ? next.k_.get() : next.v_.get();
      backend_->download(host.data(), b->as<uint8_t>() + from * row, host.size());
      backend_->upload(nb->as<uint8_t>() + to * row, host.data(), host.size());
    }
    std::memcpy(next.pos_.data() + to, pos_.data() + from, count_ * sizeof(int32_t));
    std::memcpy(next.mass_.data() + to, mass_.data() + from, count_ * sizeof(float));
  }
  next.count_ = count_;
  next.newest_ = newest_;
  next.own_backend_ = std::move(own_backend_);  // keep the backend the buffers came from
  *this = std::move(next);
}

KvView KvStorage::view() const {
  KvView v;
  v.type = type_;
  v.k = k_->data();
  v.v = v_->data();
  v.pos = pos_.data();
  v.count = count_;
  v.capacity = capacity_;
  v.n_kv_heads = G_;
  v.head_dim = D_;
  return v;
}

int64_t KvStorage::bytes_per_token() const {
  return static_cast<int64_t>(G_) * D_ * 2 * static_cast<int64_t>(kv_type_bytes(type_));
}

}  // namespace squeezekv
