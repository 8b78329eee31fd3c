// GGUF weight blocks as the CUDA integer products read them: one group of 32 values (core/quant.h's
// QuantGroup) as eight 32-bit words of four int8 each, ready for dp4a, with its two per-half
// scales and offsets. Plain C++ that nvcc compiles for the device and any compiler for the host,
// so the CPU suite tests every type's unpacking against core/quant.h's unpack_group
// (ops_test: CudaGroupUnpackingEqualsTheCore) and the device kernels run the same code.
// On the device a row's blocks are stored as planes of their fields (PlaneSpec below), so that
// every group's quants are whole 16-byte loads.
// Thread safety: pure functions.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/half.h"
#include "squeezekv/dtype.h"
#include "squeezekv/error.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define SQK_HD __host__ __device__ __forceinline__
#else
#define SQK_HD inline
#endif

namespace squeezekv::cuda {

// Values 4k .. 4k + 3 of the group in q[k] (byte i = value 4k + i, two's complement);
// value[i] = scale[i / 16] * q[i] + min[i / 16].
struct PackedGroup {
  int32_t q[8];
  float scale[2];
  float min[2];
};

namespace qg {

// A U at p, which is aligned to sizeof(U): one load on the device, memcpy on the host.
template <class U>
SQK_HD U load(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const U*>(p);
#else
  U v;
  std::memcpy(&v, p, sizeof(U));
  return v;
#endif
}
SQK_HD uint32_t u16(const uint8_t* p) { return load<uint16_t>(p); }
SQK_HD uint32_t u32_a4(const uint8_t* p) { return load<uint32_t>(p); }
// Four bytes in [0, 127] less c (c <= 32) each, without borrows between them: v + 128 - c stays
// within its byte, and the top bit's flip leaves v - c in two's complement.
SQK_HD uint32_t sub_bytes(uint32_t v, uint32_t c) { return ((v | 0x80808080u) - c * 0x01010101u) ^ 0x80808080u; }
// The low 4 bits of b as bit 4 of each byte (Q5_0/Q5_1's fifth bits).
SQK_HD uint32_t spread4(uint32_t b) { return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25); }
// IQ4's grid value of nibble n (core/quant.h kIq4Values, packed so that no table is needed)
SQK_HD uint32_t iq4(uint32_t n) {
  const uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;  // values 0..7, 8..15 as bytes
  return static_cast<uint32_t>(((n < 8 ? lo : hi) >> (8 * (n & 7))) & 0xFF);
}
SQK_HD uint32_t iq4_word(uint32_t nibbles) {  // four nibbles (bits 0-3 of each byte) -> four grid bytes
  return iq4(nibbles & 15) | (iq4((nibbles >> 8) & 15) << 8) | (iq4((nibbles >> 16) & 15) << 16) | (iq4(nibbles >> 24) << 24);
}
SQK_HD void same(PackedGroup& o, float s, float m) {
  o.scale[0] = o.scale[1] = s;
  o.min[0] = o.min[1] = m;
}
SQK_HD void sub_all(PackedGroup& o, uint32_t c) {
  for (int k = 0; k < 8; ++k) o.q[k] = static_cast<int32_t>(sub_bytes(static_cast<uint32_t>(o.q[k]), c));
}

}  // namespace qg

// How the device stores a row of block type T: its blocks' fields as planes, one after another
// (the file's bytes, rearranged; the same size), each plane's elements at their own natural
// alignment, so that a group's quants are one or two 16-byte loads and lanes that take
// consecutive groups read consecutive bytes. (As stored in GGUF, blocks of 18, 22, 34, 110 and 210
// bytes leave their quants 2 bytes aligned: 16 two-byte loads a group.) Planes are ordered
// largest element first; a row starts 16-byte aligned (rows are padded to 16 bytes on the device).
struct PlaneSpec {
  int n;          // planes
  int src[4];     // each plane's field: its byte offset within a block as stored
  int size[4];    // and its bytes a block
  int prefix[4];  // bytes a block before the plane: it starts at row + nb * prefix
};
constexpr PlaneSpec make_planes(int n, const int (&src)[4], const int (&size)[4]) {
  PlaneSpec p{n, {src[0], src[1], src[2], src[3]}, {size[0], size[1], size[2], size[3]}, {0, 0, 0, 0}};
  for (int i = 1; i < n; ++i) p.prefix[i] = p.prefix[i - 1] + p.size[i - 1];
  return p;
}
constexpr PlaneSpec plane_spec(DType t) {
  switch (t) {
    case DType::Q8_0: return make_planes(2, {2, 0, 0, 0}, {32, 2, 0, 0});                      // qs, d
    case DType::Q4_0: case DType::IQ4_NL: return make_planes(2, {2, 0, 0, 0}, {16, 2, 0, 0});  // qs, d
    case DType::Q4_1: return make_planes(2, {4, 0, 0, 0}, {16, 4, 0, 0});                      // qs, d m
    case DType::Q5_0: return make_planes(3, {6, 2, 0, 0}, {16, 4, 2, 0});                      // qs, qh, d
    case DType::Q5_1: return make_planes(3, {8, 4, 0, 0}, {16, 4, 4, 0});                      // qs, qh, d m
    case DType::Q2_K: return make_planes(3, {16, 0, 80, 0}, {64, 16, 4, 0});                   // qs, scales, d dmin
    case DType::Q3_K: return make_planes(4, {32, 0, 96, 108}, {64, 32, 12, 2});                // qs, hmask, scales, d
    case DType::Q4_K: return make_planes(2, {16, 0, 0, 0}, {128, 16, 0, 0});                   // qs, d dmin scales
    case DType::Q5_K: return make_planes(3, {48, 16, 0, 0}, {128, 32, 16, 0});                 // qs, qh, d dmin scales
    case DType::Q6_K: return make_planes(4, {0, 128, 192, 208}, {128, 64, 16, 2});             // ql, qh, scales, d
    case DType::IQ4_XS: return make_planes(2, {8, 0, 0, 0}, {128, 8, 0, 0});                   // qs, d scales
    default: return make_planes(0, {0, 0, 0, 0}, {0, 0, 0, 0});
  }
}

// A block type's sizes as compile-time members, which device code may read (a constexpr host
// function it may not call).
template <DType T>
struct PackedTraits {
  static constexpr int kGroups = kDTypeInfo[static_cast<int>(T)].block_values / 32;  // groups of 32 a block
  // whether the values carry an offset (PackedGroup::min not always 0; core/quant.h's dtype_has_min)
  static constexpr bool kHasMin = T == DType::Q4_1 || T == DType::Q5_1 || T == DType::Q2_K || T == DType::Q4_K || T == DType::Q5_K;
  static constexpr PlaneSpec kPlanes = plane_spec(T);
  static constexpr int kP1 = kPlanes.prefix[1], kP2 = kPlanes.prefix[2], kP3 = kPlanes.prefix[3];  // plane 0 starts the row
};

// dst <- the nb blocks of type t at src, as planes (PlaneSpec); host code (the upload).
inline void to_planes(DType t, const uint8_t* src, uint8_t* dst, int64_t nb) {
  const PlaneSpec p = plane_spec(t);
  const int bytes = dtype_info(t).block_bytes;
  for (int i = 0; i < p.n; ++i) {
    uint8_t* plane = dst + nb * p.prefix[i];
    for (int64_t b = 0; b < nb; ++b) std::memcpy(plane + b * p.size[i], src + b * bytes + p.src[i], static_cast<size_t>(p.size[i]));
  }
}

namespace qg {
struct Words4 {
  uint32_t w[4];
};
SQK_HD Words4 u128(const uint8_t* p) {  // 16-byte aligned
  Words4 r;
#if defined(__CUDA_ARCH__)
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
#else
  std::memcpy(r.w, p, 16);
#endif
  return r;
}
// 32 bytes (16-byte aligned) as eight words
SQK_HD void u256(const uint8_t* p, uint32_t (&w)[8]) {
  const Words4 a = u128(p), b = u128(p + 16);
  for (int k = 0; k < 4; ++k) w[k] = a.w[k], w[k + 4] = b.w[k];
}
SQK_HD uint32_t byte_of(uint64_t v, int i) { return static_cast<uint32_t>(v >> (8 * i)) & 0xFF; }
SQK_HD uint64_t lo64(const Words4& v) { return v.w[0] | (static_cast<uint64_t>(v.w[1]) << 32); }
SQK_HD uint64_t hi64(const Words4& v) { return v.w[2] | (static_cast<uint64_t>(v.w[3]) << 32); }
// byte i (0..15) of 16 held as two 64-bit halves, without indexing registers at run time
SQK_HD uint32_t byte16(uint64_t lo, uint64_t hi, int i) { return i < 8 ? byte_of(lo, i) : byte_of(hi, i - 8); }
SQK_HD float f16_bits(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
#else
  return f16_to_f32(static_cast<uint16_t>(h));
#endif
}
SQK_HD float f16(const uint8_t* p) { return f16_bits(u16(p)); }
}  // namespace qg

// Group g (values 32g .. 32g + 31) of blocks of type T stored as planes whose first elements
// (block 0's fields) are at P0 .. P3 (PlaneSpec's order; unused planes ignored): the same
// integers, scales and offsets as core/quant.h's unpack_group of the stored block (layouts there).
// A device row (unpack_planar below) or a copy of some of its blocks' planes (gemm_rows_q.cu's
// stages in shared memory), each plane keeping its alignment modulo 16.
template <DType T>
SQK_HD void unpack_planes(const uint8_t* P0, const uint8_t* P1, const uint8_t* P2, const uint8_t* P3, int g, PackedGroup& o) {
  using namespace qg;
  using Tr = PackedTraits<T>;
  const int64_t b = g / Tr::kGroups;
  const int j = g % Tr::kGroups;
  uint32_t w[8];
  if constexpr (T == DType::Q8_0) {
    u256(P0 + 32 * b, w);
    for (int k = 0; k < 8; ++k) o.q[k] = static_cast<int32_t>(w[k]);
    same(o, f16(P1 + 2 * b), 0.0f);
  } else if constexpr (T == DType::Q4_0 || T == DType::IQ4_NL || T == DType::Q4_1 || T == DType::Q5_0 || T == DType::Q5_1) {
    const Words4 v = u128(P0 + 16 * b);
    uint32_t qh = 0;
    if constexpr (T == DType::Q5_0 || T == DType::Q5_1) qh = u32_a4(P1 + 4 * b);
    for (int k = 0; k < 4; ++k) {
      uint32_t lo = v.w[k] & 0x0F0F0F0Fu, hi = (v.w[k] >> 4) & 0x0F0F0F0Fu;
      if constexpr (T == DType::Q5_0 || T == DType::Q5_1) lo |= spread4(qh >> (4 * k)), hi |= spread4(qh >> (16 + 4 * k));
      if constexpr (T == DType::IQ4_NL) lo = iq4_word(lo), hi = iq4_word(hi);
      o.q[k] = static_cast<int32_t>(lo);
      o.q[k + 4] = static_cast<int32_t>(hi);
    }
    if constexpr (T == DType::Q4_0) sub_all(o, 8);
    if constexpr (T == DType::Q5_0) sub_all(o, 16);
    if constexpr (T == DType::Q4_1) {
      same(o, f16(P1 + 4 * b), f16(P1 + 4 * b + 2));
    } else if constexpr (T == DType::Q5_1) {
      same(o, f16(P2 + 4 * b), f16(P2 + 4 * b + 2));
    } else if constexpr (T == DType::Q5_0) {
      same(o, f16(P2 + 2 * b), 0.0f);
    } else {
      same(o, f16(P1 + 2 * b), 0.0f);
    }
  } else if constexpr (T == DType::Q2_K || T == DType::Q3_K) {
    const int n = j / 4, s = 2 * (j % 4);
    u256(P0 + 64 * b + 32 * n, w);
    for (int k = 0; k < 8; ++k) o.q[k] = static_cast<int32_t>((w[k] >> s) & 0x03030303u);
    if constexpr (T == DType::Q2_K) {
      const Words4 sc = u128(P1 + 16 * b);
      const uint32_t dd = u32_a4(P2 + 4 * b);
      const float d = f16_bits(dd & 0xFFFF), dmin = f16_bits(dd >> 16);
      for (int h = 0; h < 2; ++h) {
        const uint32_t v = byte16(lo64(sc), hi64(sc), 2 * j + h);
        o.scale[h] = d * static_cast<float>(v & 0x0F);
        o.min[h] = -(dmin * static_cast<float>(v >> 4));
      }
    } else {
      // the high bit (bit j of hmask[l]) clear means -4: q = (low | 4 * bit) - 4
      uint32_t hm[8];
      u256(P1 + 32 * b, hm);
      for (int k = 0; k < 8; ++k) {
        const uint32_t hb = (hm[k] >> j) & 0x01010101u;
        o.q[k] = static_cast<int32_t>(sub_bytes(static_cast<uint32_t>(o.q[k]) | (hb << 2), 4));
      }
      const uint8_t* sp = P2 + 12 * b;
      const uint64_t lo = u32_a4(sp) | (static_cast<uint64_t>(u32_a4(sp + 4)) << 32);
      const uint64_t hi = u32_a4(sp + 8);
      const float d = f16(P3 + 2 * b);
      for (int h = 0; h < 2; ++h) {
        const int k = 2 * j + h;
        const int l4 = k < 8 ? static_cast<int>(byte_of(lo, k) & 0x0F) : static_cast<int>(byte_of(lo, k - 8) >> 4);
        const int h2 = static_cast<int>((byte_of(hi, k & 3) >> (2 * (k >> 2))) & 3);
        o.scale[h] = d * static_cast<float>((l4 | (h2 << 4)) - 32);
        o.min[h] = 0.0f;
      }
    }
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    const int shift = 4 * (j % 2);
    u256(P0 + 128 * b + 32 * (j / 2), w);
    uint32_t qh[8];
    if constexpr (T == DType::Q5_K) u256(P1 + 32 * b, qh);
    for (int k = 0; k < 8; ++k) {
      uint32_t v = (w[k] >> shift) & 0x0F0F0F0Fu;
      if constexpr (T == DType::Q5_K) v |= ((qh[k] >> j) & 0x01010101u) << 4;
      o.q[k] = static_cast<int32_t>(v);
    }
    // d, dmin, then the 12 bytes of 6-bit scales and mins (core/quant.h k4_scale_min)
    const Words4 head = u128((T == DType::Q4_K ? P1 : P2) + 16 * b);
    const uint64_t lo = lo64(head), hi = hi64(head);
    auto s = [&](int i) { return byte16(lo, hi, 4 + i); };  // scales byte i
    int sc, m;
    if (j < 4) {
      sc = static_cast<int>(s(j) & 63);
      m = static_cast<int>(s(j + 4) & 63);
    } else {
      sc = static_cast<int>((s(j + 4) & 0x0F) | ((s(j - 4) >> 6) << 4));
      m = static_cast<int>((s(j + 4) >> 4) | ((s(j) >> 6) << 4));
    }
    same(o, f16_bits(head.w[0] & 0xFFFF) * static_cast<float>(sc), -(f16_bits(head.w[0] >> 16) * static_cast<float>(m)));
  } else if constexpr (T == DType::Q6_K) {
    const int n = j / 4, jj = j % 4, shift = 4 * (jj / 2);
    uint32_t qh[8];
    u256(P0 + 128 * b + 64 * n + 32 * (jj % 2), w);
    u256(P1 + 64 * b + 32 * n, qh);
    for (int k = 0; k < 8; ++k) {
      const uint32_t v = ((w[k] >> shift) & 0x0F0F0F0Fu) | (((qh[k] >> (2 * jj)) & 0x03030303u) << 4);
      o.q[k] = static_cast<int32_t>(sub_bytes(v, 32));
    }
    const Words4 sc = u128(P2 + 16 * b);
    const float d = f16(P3 + 2 * b);
    for (int h = 0; h < 2; ++h) o.scale[h] = d * static_cast<float>(static_cast<int8_t>(byte16(lo64(sc), hi64(sc), 2 * j + h)));
    o.min[0] = o.min[1] = 0.0f;
  } else if constexpr (T == DType::IQ4_XS) {
    const Words4 v = u128(P0 + 128 * b + 16 * j);
    for (int k = 0; k < 4; ++k) {
      o.q[k] = static_cast<int32_t>(iq4_word(v.w[k] & 0x0F0F0F0Fu));
      o.q[k + 4] = static_cast<int32_t>(iq4_word((v.w[k] >> 4) & 0x0F0F0F0Fu));
    }
    // d (f16), scales_h (u16: 2 bits a group), scales_l[4] (4 bits a group)
    const uint32_t h0 = u32_a4(P1 + 8 * b), h1 = u32_a4(P1 + 8 * b + 4);
    const int lo = static_cast<int>((h1 >> (8 * (j / 2) + 4 * (j % 2))) & 0x0F);
    const int hi = static_cast<int>(((h0 >> 16) >> (2 * j)) & 3);
    same(o, f16_bits(h0 & 0xFFFF) * static_cast<float>((lo | (hi << 4)) - 32), 0.0f);
  } else {
    static_assert(T == DType::Q8_0, "unpack_planes: not a block type");
  }
}

// Group g of a device row of type T (planes, PlaneSpec) that holds nb blocks and starts at `row`.
template <DType T>
SQK_HD void unpack_planar(const uint8_t* row, int64_t nb, int g, PackedGroup& o) {
  using Tr = PackedTraits<T>;
  unpack_planes<T>(row, row + nb * Tr::kP1, row + nb * Tr::kP2, row + nb * Tr::kP3, g, o);
}

// ---- stages: a row's blocks over 256 columns, copied to shared memory ------------------------
// gemm_rows_q.cu streams each weight row in stages of kStageCols columns (one K-quant superblock,
// eight 32-value blocks): of every plane, the 16-byte pieces that hold the stage's blocks, copied
// whole into a slot of their own (a plane whose stage bytes are not whole aligned pieces takes the
// pieces around them: a slot one piece larger). unpack_planes then reads the copy as it reads the
// row: each plane's first stage element at slot + (its offset in the row modulo 16).
constexpr int kStageCols = 256;
struct StageSlots {
  int bytes[4];  // a stage's bytes of each plane
  int off[5];    // each plane's slot within a row's copy; off[n]: the copy's bytes
};
constexpr StageSlots stage_slots(const PlaneSpec& p, int blocks) {
  StageSlots s{{0, 0, 0, 0}, {0, 0, 0, 0, 0}};
  for (int i = 0; i < p.n; ++i) {
    s.bytes[i] = blocks * p.size[i];
    const bool whole = s.bytes[i] % 16 == 0 && p.prefix[i] % 16 == 0;
    s.off[i + 1] = s.off[i] + (s.bytes[i] + 15) / 16 * 16 + (whole ? 0 : 16);
  }
  for (int i = p.n + 1; i < 5; ++i) s.off[i] = s.off[p.n];
  return s;
}
template <DType T>
struct StageTraits {
  static constexpr int kBlocks = kStageCols / (32 * PackedTraits<T>::kGroups);  // blocks a stage
  static constexpr StageSlots kSlots = stage_slots(PackedTraits<T>::kPlanes, kBlocks);
  static constexpr int kRowBytes = kSlots.off[4];  // a row's copy of one stage
};
// Where a plane's bytes of stage s begin in a row of nb blocks (from the row's start, which is
// 16-byte aligned), for the plane's PlaneSpec::prefix and StageSlots::bytes: the copy takes the
// pieces from ws = (start & ~15), (start - ws + bytes + 15) / 16 of them.
SQK_HD int64_t stage_start(int64_t nb, int prefix, int bytes, int64_t s) { return nb * prefix + s * bytes; }

// Whether the device keeps type t in its blocks and multiplies it with these groups: every GGUF
// block type squeezekv reads.
constexpr bool packed_type(DType t) { return dtype_info(t).block_values >= 32; }

// f(std::integral_constant<DType, t>{}) for a packed type t (host code: the launches' choice of
// kernel); an Error naming the type otherwise.
template <class F>
void dispatch_packed(DType t, F&& f) {
  switch (t) {
#define SQK_TYPE(X) \
  case DType::X: return f(std::integral_constant<DType, DType::X>{});
    SQK_TYPE(Q8_0) SQK_TYPE(Q4_0) SQK_TYPE(Q4_1) SQK_TYPE(Q5_0) SQK_TYPE(Q5_1) SQK_TYPE(Q2_K) SQK_TYPE(Q3_K)
    SQK_TYPE(Q4_K) SQK_TYPE(Q5_K) SQK_TYPE(Q6_K) SQK_TYPE(IQ4_NL) SQK_TYPE(IQ4_XS)
#undef SQK_TYPE
    default: throw Error(std::string("cuda: no packed product for weights of type ") + std::string(dtype_info(t).name));
  }
}

}  // namespace squeezekv::cuda
