// CPU kernels against independent references: dequantization against gguf-py (tests/ref/quant.*),
// fast paths against the scalar reference over sweeps of odd sizes, attention (and its H2O mass)
// against a double-precision textbook implementation, f16 conversion exhaustively, the sampler.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <numeric>
#include <algorithm>
#include <limits>
#include <set>
#include <map>
#include <cstring>

#include "squeezekv/error.h"

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_topology.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/tile8.h"
#include "backend/cuda/quant_groups.h"
#include "core/kv_rows.h"
#include "core/quant.h"
#include "core/sample.h"
#include "core/half.h"
#include "squeezekv/generate.h"
#include "test_paths.h"

namespace squeezekv {
namespace {

// Byte offsets of the f16 fields (scales and mins) in a block of type t (core/quant.h layouts).
std::vector<int> f16_fields(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q5_0: case DType::IQ4_NL: case DType::IQ4_XS: return {0};
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: return {0, 2};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::Q6_K: return {208};
    default: return {};
  }
}

const std::vector<DType> kBlockTypes = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                        DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                        DType::IQ4_NL, DType::IQ4_XS};

TEST(Quant, DequantizeMatchesGgufPy) {
  std::ifstream js(test::ref_dir() + "/quant.json");
  ASSERT_TRUE(js.good());
  const auto meta = nlohmann::json::parse(js);
  std::ifstream bin(test::ref_dir() + "/quant.bin", std::ios::binary);
  std::vector<char> blob((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
  std::map<std::string, DType> types = {{"F16", DType::F16}, {"BF16", DType::BF16}};
  for (DType t : kBlockTypes) types[std::string(dtype_info(t).name)] = t;
  std::map<std::string, int> random_cases, real_cases;
  for (const auto& m : meta) {
    (m.value("source", "random") == "random" ? random_cases : real_cases)[m["type"]]++;
    const DType t = types.at(m["type"]);
    const int n = m["n"];
    const size_t raw_off = m["raw_offset"], val_off = m["val_offset"];
    ASSERT_EQ(dtype_bytes(t, n), static_cast<size_t>(m["raw_bytes"]));
    std::vector<float> out(n), want(n);
    std::memcpy(want.data(), blob.data() + val_off, n * 4);
    dequantize_row(t, reinterpret_cast<const uint8_t*>(blob.data() + raw_off), out.data(), n);
    for (int i = 0; i < n; ++i)
      ASSERT_NEAR(out[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i]))) << m["type"] << " value " << i;
  }
  // every block type on random blocks, and on rows of a real tensor that llama.cpp's quantizer wrote
  for (const auto& [name, t] : types) {
    EXPECT_EQ(random_cases[name], 1) << name;
    if (dtype_info(t).block_values > 1) {
      EXPECT_EQ(real_cases[name], 1) << name << ": no real tensor in quant.json";
    }
  }
}

// The CUDA kernels' layout and group unpacking (backend/cuda/quant_groups.h, plain C++ compiled here for the
// host) gives every block type's integers, scales and offsets exactly as core/quant.h does, from a
// whole row and from the stages gemm_rows_q.cu copies.
template <DType T>
void check_packed(const uint8_t* row, int groups) {
  constexpr int kGroups = dtype_info(T).block_values / 32;
  const int64_t nb = groups / kGroups;
  // the device's layout (planes of the blocks' fields), 16-byte aligned as on the device
  std::vector<uint64_t> planes((nb * dtype_info(T).block_bytes + 15) / 16 * 2);
  auto* planar = reinterpret_cast<uint8_t*>(planes.data());
  cuda::to_planes(T, row, planar, nb);
  for (int g = 0; g < groups; ++g) {
    QuantGroup want;
    unpack_group(T, row + static_cast<size_t>(g / kGroups) * dtype_info(T).block_bytes, g % kGroups, want);
    cuda::PackedGroup got;
    cuda::unpack_planar<T>(planar, nb, g, got);
    int8_t q[32];
    std::memcpy(q, got.q, 32);
    for (int i = 0; i < 32; ++i) ASSERT_EQ(q[i], want.q[i]) << dtype_info(T).name << " group " << g << " value " << i;
    auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; };
    for (int h = 0; h < 2; ++h) {
      ASSERT_TRUE(same(got.scale[h], want.scale[h])) << dtype_info(T).name << " group " << g;
      ASSERT_TRUE(same(got.min[h], want.min[h])) << dtype_info(T).name << " group " << g;
    }
  }
  // gemm_rows_q's stages: each plane's pieces around a stage's blocks copied into their slots,
  // unpacked from the copy, give the row's groups bit for bit
  using St = cuda::StageTraits<T>;
  constexpr cuda::PlaneSpec P = cuda::PackedTraits<T>::kPlanes;
  ASSERT_EQ(groups * 32 % cuda::kStageCols, 0) << "whole stages";
  std::vector<uint64_t> slots(St::kRowBytes / 8);
  auto* copy = reinterpret_cast<uint8_t*>(slots.data());
  for (int64_t s = 0; s < groups * 32 / cuda::kStageCols; ++s) {
    std::memset(copy, 0xA5, St::kRowBytes);
    const uint8_t* at[4] = {copy, copy, copy, copy};
    for (int i = 0; i < P.n; ++i) {
      const int64_t start = cuda::stage_start(nb, P.prefix[i], St::kSlots.bytes[i], s), ws = start & ~int64_t{15};
      const int64_t pieces = (start - ws + St::kSlots.bytes[i] + 15) / 16;
      ASSERT_LE(St::kSlots.off[i] + 16 * pieces, St::kSlots.off[i + 1]) << dtype_info(T).name << " plane " << i << " stage " << s;
      ASSERT_LE(ws + 16 * pieces, static_cast<int64_t>(planes.size() * 8)) << dtype_info(T).name << " plane " << i << " stage " << s;
      std::memcpy(copy + St::kSlots.off[i], planar + ws, static_cast<size_t>(16 * pieces));
      at[i] = copy + St::kSlots.off[i] + (start - ws);
    }
    for (int j = 0; j < cuda::kStageCols / 32; ++j) {
      cuda::PackedGroup want, got;
      cuda::unpack_planar<T>(planar, nb, static_cast<int>(s * cuda::kStageCols / 32 + j), want);
      cuda::unpack_planes<T>(at[0], at[1], at[2], at[3], j, got);
      ASSERT_EQ(std::memcmp(&want, &got, sizeof(got)), 0) << dtype_info(T).name << " stage " << s << " group " << j;
    }
  }
}

TEST(Quant, CudaGroupUnpackingEqualsTheCore) {
  for (DType t : kBlockTypes) {
    for (uint64_t seed : {1, 2, 3}) {
      const int blocks = 768 / dtype_info(t).block_values;  // 3 stages of gemm_rows_q (an odd number of 256-blocks)
      std::vector<uint8_t> raw(static_cast<size_t>(blocks) * dtype_info(t).block_bytes);
      random_blocks(t, raw.data(), blocks, 0.035f, seed, 0);
      if (seed == 3)  // every byte patterned, the f16 fields too (infinities and NaN alike)
        for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 131 + 7);
      const int groups = blocks * dtype_info(t).block_values / 32;
      switch (t) {
#define SQK_CASE(X) \
  case DType::X: check_packed<DType::X>(raw.data(), groups); break;
        SQK_CASE(Q8_0) SQK_CASE(Q4_0) SQK_CASE(Q4_1) SQK_CASE(Q5_0) SQK_CASE(Q5_1) SQK_CASE(Q2_K) SQK_CASE(Q3_K)
        SQK_CASE(Q4_K) SQK_CASE(Q5_K) SQK_CASE(Q6_K) SQK_CASE(IQ4_NL) SQK_CASE(IQ4_XS)
#undef SQK_CASE
        default: FAIL() << "no case for " << dtype_info(t).name;
      }
    }
  }
}

// Random blocks (dummy weights) are the same bytes for the same seed and stream, differ across
// streams, and dequantize to finite values within about the asked range.
TEST(Quant, RandomBlocksAreDeterministicAndBounded) {
  for (DType t : kBlockTypes) {
    const int blocks = 16, n = blocks * dtype_info(t).block_values;
    std::vector<uint8_t> a(static_cast<size_t>(blocks) * dtype_info(t).block_bytes), b(a.size()), c(a.size());
    random_blocks(t, a.data(), blocks, 0.035f, 7, 3);
    random_blocks(t, b.data(), blocks, 0.035f, 7, 3);
    random_blocks(t, c.data(), blocks, 0.035f, 7, 4);
    EXPECT_EQ(a, b) << dtype_info(t).name;
    EXPECT_NE(a, c) << dtype_info(t).name;
    std::vector<float> v(n);
    dequantize_row(t, a.data(), v.data(), n);
    double amax = 0, sq = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << dtype_info(t).name;
      amax = std::max(amax, double(std::fabs(x)));
      sq += double(x) * x;
    }
    EXPECT_LE(amax, 2.5 * 0.035) << dtype_info(t).name;
    EXPECT_GE(std::sqrt(sq / n), 0.002) << dtype_info(t).name;  // not all zero
  }
}

TEST(Half, RoundTripsEveryHalfAndMatchesHardwareRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << h;
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::vector<float> xs(4096);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = i % 3 == 0 ? u(rng) : u(rng) * 1e-6f;
  std::vector<uint16_t> fast(xs.size());
  cpu::f32_to_f16_row(fast.data(), xs.data(), static_cast<int64_t>(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(fast[i], f32_to_f16(xs[i])) << xs[i];
}

// Random blocks of type t with sane f16 scales.
std::vector<uint8_t> random_rows(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const DTypeInfo& info = dtype_info(t);
  std::vector<uint8_t> data(dtype_bytes(t, rows * cols));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f), val(-1.0f, 1.0f);
  auto put = [&](size_t at, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(data.data() + at, &h, 2);
  };
  const size_t nb = data.size() / info.block_bytes;
  for (size_t b = 0; b < nb; ++b) {
    const size_t o = b * info.block_bytes;
    switch (t) {
      case DType::F32: {
        const float v = val(rng);
        std::memcpy(data.data() + o, &v, 4);
        break;
      }
      case DType::F16: put(o, val(rng)); break;
      case DType::BF16: {
        const float v = val(rng);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(data.data() + o, &h, 2);
        break;
      }
      default:  // block types: sane f16 scales wherever the layout has them
        for (const int at : f16_fields(t)) put(o + at, scale(rng));
        break;
    }
  }
  return data;
}

TEST(Matmul, FastPathMatchesScalarReferenceOverSizes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<DType> types = {DType::F32, DType::F16, DType::BF16};
  types.insert(types.end(), kBlockTypes.begin(), kBlockTypes.end());
  for (DType t : types) {
    const int bv = dtype_info(t).block_values;
    for (int64_t C : {int64_t{bv}, int64_t{2 * bv}, t == DType::F32 ? int64_t{37} : int64_t{3 * bv}}) {
      for (int64_t R : {1, 17, 40, 48}) {
        for (int64_t T : {1, 3, 7, 9, 12, 17}) {  // 3, 9: the 4x3 kernel; 7: a tail; 12, 17: 6x16 tiles (+5)
          auto data = random_rows(t, R, C, rng);
          WeightMatrix w{t, data.data(), R, C, dtype_bytes(t, C)};
          std::vector<float> x(T * C), bias(R), fast(T * R), ref(T * R);
          for (auto& v : x) v = nd(rng);
          for (auto& v : bias) v = nd(rng);
          cpu::matmul(fast.data(), x.data(), w, T, bias.data());
          cpu::ref::matmul(ref.data(), x.data(), w, T, bias.data());
          // f32 summation error scales with the sum of |terms|, not with the (cancelling) result
          std::vector<float> row(C);
          for (int64_t r = 0; r < R; ++r) {
            dequantize_row(t, w.row(r), row.data(), C);
            for (int64_t tt = 0; tt < T; ++tt) {
              double mag = std::fabs(bias[r]);
              for (int64_t c = 0; c < C; ++c) mag += std::fabs(double(row[c]) * x[tt * C + c]);
              ASSERT_NEAR(fast[tt * R + r], ref[tt * R + r], 1e-6 * (1.0 + mag))
                  << dtype_info(t).name << " R=" << R << " C=" << C << " T=" << T;
            }
          }
        }
      }
    }
  }
}

// The decode path (one token, fused dequantize-and-dot) gives exactly dequantize_row + dot.
TEST(Matmul, DecodePathIsBitIdenticalToDequantizeThenDot) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<DType> types = kBlockTypes;
  types.push_back(DType::F16);
  types.push_back(DType::BF16);
  for (DType t : types) {
    const int64_t R = 33, C = dtype_info(t).block_values > 1 ? 512 : 517;  // 517: a tail past the vector loop
    auto data = random_rows(t, R, C, rng);
    WeightMatrix w{t, data.data(), R, C, dtype_bytes(t, C)};
    std::vector<float> x(C), out(R), row(C);
    for (auto& v : x) v = nd(rng);
    cpu::matmul(out.data(), x.data(), w, 1);
    for (int64_t r = 0; r < R; ++r) {
      dequantize_row(t, w.row(r), row.data(), C);
      ASSERT_EQ(out[r], cpu::dot(row.data(), x.data(), C)) << dtype_info(t).name << " row " << r;
    }
  }
}

// 8-bit activations: each product may differ from the exact one only by the rounding of the
// activations, |w . (x - x8)| <= sum over blocks of sum|w| * (max|x| of the block / 254), and the
// weight type without an integer path (F16) gives the exact products, summed in 16 lanes on
// AVX-512 CPUs (avx512::dot_rows_f16) where f32 arithmetic sums in 8: within f32 summation's
// rounding of the f32 result (equal to it where the CPU runs AVX2 only).
TEST(Matmul, Int8ActivationsWithinTheirRoundingBound) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  std::vector<DType> types = kBlockTypes;
  types.push_back(DType::F16);
  for (DType t : types) {
    for (int64_t T : {1, 2}) {
      const int64_t R = 37, C = 768;
      auto data = random_rows(t, R, C, rng);
      WeightMatrix w{t, data.data(), R, C, dtype_bytes(t, C)};
      std::vector<float> x(T * C), bias(R), fast(T * R), exact(T * R), row(C);
      for (auto& v : x) v = nd(rng) * (1.0f + 5.0f * (rng() % 7 == 0));  // some outliers
      for (auto& v : bias) v = nd(rng);
      cpu::matmul(fast.data(), x.data(), w, T, bias.data(), cpu::Activations::kInt8);
      cpu::matmul(exact.data(), x.data(), w, T, bias.data(), cpu::Activations::kF32);
      const bool integer_path = t != DType::F16;
      double worst_share = 0.0;
      for (int64_t r = 0; r < R; ++r) {
        dequantize_row(t, w.row(r), row.data(), C);
        for (int64_t tt = 0; tt < T; ++tt) {
          const float* xt = x.data() + tt * C;
          double bound = 0.0, mag = std::fabs(bias[r]);
          for (int64_t b = 0; b < C / 32; ++b) {
            double amax = 0.0, wsum = 0.0;
            for (int i = 0; i < 32; ++i) {
              amax = std::max(amax, double(std::fabs(xt[b * 32 + i])));
              wsum += std::fabs(row[b * 32 + i]);
              mag += std::fabs(double(row[b * 32 + i]) * xt[b * 32 + i]);
            }
            bound += wsum * amax / 254.0;
          }
          const double err = std::fabs(double(fast[tt * R + r]) - exact[tt * R + r]);
          if (!integer_path) {
            ASSERT_NEAR(fast[tt * R + r], exact[tt * R + r], 1e-6 * (1.0 + mag)) << dtype_info(t).name;
            continue;
          }
          ASSERT_LE(err, bound + 1e-5 * (1.0 + mag)) << dtype_info(t).name << " row " << r << " T=" << T;
          worst_share = std::max(worst_share, err / bound);
        }
      }
      // the bound is not vacuous: rounding does move the products
      if (integer_path) {
        EXPECT_GT(worst_share, 0.01) << dtype_info(t).name;
      }
    }
  }
}

// The SIMD integer products equal the scalar reference (the same integers and scales, summed in
// double) up to f32 accumulation, for every block type; the SIMD activation rounding equals the
// scalar one exactly.
TEST(Matmul, Int8DotMatchesScalarReferenceForEveryBlockType) {
  std::mt19937 rng(33);
  std::normal_distribution<float> nd;
  for (DType t : kBlockTypes) {
    const int64_t R = 19, C = 1024;
    auto data = random_rows(t, R, C, rng);
    WeightMatrix w{t, data.data(), R, C, dtype_bytes(t, C)};
    std::vector<float> x(C), row(C);
    for (auto& v : x) v = nd(rng);
    std::vector<cpu::Q8Block> fast(C / 32), slow(C / 32);
    cpu::quantize_q8(fast.data(), x.data(), C);
    cpu::ref::quantize_q8(slow.data(), x.data(), C);
    for (int64_t b = 0; b < C / 32; ++b) {
      ASSERT_EQ(fast[b].d, slow[b].d);
      ASSERT_EQ(fast[b].s[0], slow[b].s[0]);
      ASSERT_EQ(fast[b].s[1], slow[b].s[1]);
      ASSERT_EQ(0, std::memcmp(fast[b].q, slow[b].q, 32));
    }
    for (int64_t r = 0; r < R; ++r) {
      dequantize_row(t, w.row(r), row.data(), C);
      double mag = 0.0;
      for (int64_t c = 0; c < C; ++c) mag += std::fabs(double(row[c]) * x[c]);
      const float got = cpu::dot_q8(t, w.row(r), fast.data(), C), want = cpu::ref::dot_q8(t, w.row(r), slow.data(), C);
      ASSERT_NEAR(got, want, 2e-6 * (1.0 + mag)) << dtype_info(t).name << " row " << r;
    }
  }
}

// The prompt path's SIMD dequantization stays within one rounding of the exact one, every type.
// 8-row tiles (the int8 layout of Q4_0/Q4_1/Q8_0/IQ4_NL): the layout loses nothing, the SIMD
// products equal their scalar statement bit for bit and stay within the activations' rounding of
// the exact products, every pair's result is the same whatever shares its tile, and matmul over
// tiles equals matmul over rows where the arithmetic is the same (prompt chunks in f32), and int8
// over tiles equals one-row products whatever the chunk (two tiles a pass where they pair up).
TEST(Tile8, LayoutRoundTripsAndProductsKeepOneOrder) {
  std::mt19937 rng(47);
  std::normal_distribution<float> nd;
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL}) {
    for (int64_t C : {32, 96, 576}) {
      const int64_t R = 24;
      auto data = random_rows(t, R, C, rng);
      const WeightMatrix w{t, data.data(), R, C, dtype_bytes(t, C)};
      ASSERT_TRUE(cpu::can_tile8(w));
      std::vector<uint8_t> tiled_bytes(cpu::tile8_bytes(w));
      ASSERT_EQ(tiled_bytes.size(), static_cast<size_t>(R) * w.row_bytes);  // the same size as the rows
      const WeightMatrix tw = cpu::make_tile8(w, tiled_bytes.data());
      std::vector<float> got(8 * C), want(C);
      for (int64_t tile = 0; tile < R / 8; ++tile) {
        for (bool fast : {false, true}) {
          cpu::dequantize_tile8(t, cpu::tile8_at(tw, tile), C, got.data(), fast);
          for (int r = 0; r < 8; ++r) {
            if (fast) cpu::dequantize_row_fast(t, w.row(8 * tile + r), want.data(), C);
            else dequantize_row(t, w.row(8 * tile + r), want.data(), C);
            ASSERT_EQ(0, std::memcmp(got.data() + r * C, want.data(), C * sizeof(float))) << dtype_info(t).name << " C=" << C;
          }
        }
      }
      // products: n activation rows at once vs the scalar statement, vs one row at a time, vs exact
      // every width of a pass (AVX-512: 8, then one pass of the rest), and several passes
      for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 15, 16, 17, 33, 40}) {
        std::vector<float> x(n * C), simd(n * 8), scalar(n * 8), one(8), row(C);
        for (auto& v : x) v = nd(rng) * (1.0f + 4.0f * (rng() % 9 == 0));
        std::vector<cpu::Q8Block> xq(n * (C / 32));
        for (int i = 0; i < n; ++i) cpu::quantize_q8(xq.data() + i * (C / 32), x.data() + i * C, C);
        for (int64_t tile = 0; tile < R / 8; ++tile) {
          const uint8_t* tp = cpu::tile8_at(tw, tile);
          cpu::dot_q8_tile8(t, tp, xq.data(), C / 32, n, C, simd.data(), 8);
          cpu::ref::dot_q8_tile8(t, tp, xq.data(), C / 32, n, C, scalar.data(), 8);
          ASSERT_EQ(0, std::memcmp(simd.data(), scalar.data(), simd.size() * sizeof(float))) << dtype_info(t).name << " n=" << n;
          if (tile + 1 < R / 8) {  // this tile with the next in one pass: each half as its own tile's
            std::vector<float> pair(n * 16), next(n * 8);
            cpu::dot_q8_tile8x2(t, tp, cpu::tile8_at(tw, tile + 1), xq.data(), C / 32, n, C, pair.data(), 16);
            cpu::ref::dot_q8_tile8(t, cpu::tile8_at(tw, tile + 1), xq.data(), C / 32, n, C, next.data(), 8);
            for (int i = 0; i < n; ++i) {
              ASSERT_EQ(0, std::memcmp(pair.data() + i * 16, scalar.data() + i * 8, 8 * sizeof(float))) << dtype_info(t).name << " pair n=" << n;
              ASSERT_EQ(0, std::memcmp(pair.data() + i * 16 + 8, next.data() + i * 8, 8 * sizeof(float))) << dtype_info(t).name << " pair n=" << n;
            }
          }
          for (int i = 0; i < n; ++i) {
            cpu::dot_q8_tile8(t, tp, xq.data() + i * (C / 32), C / 32, 1, C, one.data(), 8);
            ASSERT_EQ(0, std::memcmp(one.data(), simd.data() + i * 8, 8 * sizeof(float))) << "row " << i << " of " << n;
            for (int r = 0; r < 8; ++r) {
              const float exact = cpu::ref::dot_q8(t, w.row(8 * tile + r), xq.data() + i * (C / 32), C);
              dequantize_row(t, w.row(8 * tile + r), row.data(), C);
              double mag = 0.0;
              for (int64_t c = 0; c < C; ++c) mag += std::fabs(double(row[c]) * x[i * C + c]);
              ASSERT_NEAR(one[r], exact, 2e-6 * (1.0 + mag)) << dtype_info(t).name;
            }
          }
        }
      }
      // matmul over tiles: prompt chunks (dequantized) bit-identical to rows; int8 decode within
      // the rounding bound of the f32 product (checked above per pair) and independent of T
      for (int64_t T : {1, 3, 7, 20}) {
        std::vector<float> x(T * C), bias(R), a(T * R), b(T * R);
        for (auto& v : x) v = nd(rng);
        for (auto& v : bias) v = nd(rng);
        cpu::matmul(a.data(), x.data(), tw, T, bias.data(), cpu::Activations::kF32);
        cpu::matmul(b.data(), x.data(), w, T, bias.data(), cpu::Activations::kF32);
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << dtype_info(t).name << " T=" << T;
        // int8 over tiles (decode rows, and prompt chunks: 8-bit activations there too) row by row
        // equal to one-row products: a row's result does not depend on the rows beside it
        for (cpu::RowMode mode : {cpu::RowMode::kIndependent, cpu::RowMode::kChunk}) {
          cpu::matmul(a.data(), x.data(), tw, T, bias.data(), cpu::Activations::kInt8, mode);
          for (int64_t tt = 0; tt < T; ++tt) {
            cpu::matmul(b.data(), x.data() + tt * C, tw, 1, bias.data(), cpu::Activations::kInt8);
            ASSERT_EQ(0, std::memcmp(a.data() + tt * R, b.data(), R * sizeof(float))) << "row " << tt << " of " << T;
          }
        }
      }
    }
  }
}

// Group tiles (prompt chunks over rows of every block type, 8-bit activations): the SIMD products
// (256-bit 8 rows a pass, 512-bit 16 rows a pass) equal their scalar statement bit for bit, stay
// within the activations' rounding of the exact products, and a row's result does not depend on
// the rows beside it (the chunk it came in, the pass it took).
TEST(Group16, ProductsKeepOneOrderAndTheRoundingBound) {
  if (!cpu::has_group16(DType::Q4_K)) GTEST_SKIP() << "a build without the AVX2 unpacking";
  std::mt19937 rng(53);
  std::normal_distribution<float> nd;
  for (DType t : kBlockTypes) {
    const int64_t C = dtype_info(t).block_values == 256 ? 512 : 96, R = 24;  // 16 rows, then 8
    auto data = random_rows(t, R, C, rng);
    const WeightMatrix w{t, data.data(), R, C, dtype_bytes(t, C)};
    std::vector<uint8_t> g(static_cast<size_t>(C / 32) * cpu::kGroupBytes);
    std::vector<float> row(C);
    for (int n : {1, 3, 4, 5, 8, 9, 13}) {
      std::vector<float> x(n * C), simd(n * 16), scalar(n * 16), one(16);
      for (auto& v : x) v = nd(rng) * (1.0f + 4.0f * (rng() % 9 == 0));
      std::vector<cpu::Q8Block> xq(n * (C / 32));
      for (int i = 0; i < n; ++i) cpu::quantize_q8(xq.data() + i * (C / 32), x.data() + i * C, C);
      for (int64_t r0 = 0; r0 < R; r0 += 16) {
        const int rows = static_cast<int>(std::min<int64_t>(16, R - r0));
        const cpu::GroupKind kind = cpu::make_group16(t, w.row(r0), w.row_bytes, rows, C, g.data());
        cpu::dot_q8_group16(kind, g.data(), rows, xq.data(), C / 32, n, C, simd.data(), 16);
        cpu::ref::dot_q8_group16(kind, g.data(), rows, xq.data(), C / 32, n, C, scalar.data(), 16);
        for (int i = 0; i < n; ++i) {
          ASSERT_EQ(0, std::memcmp(simd.data() + i * 16, scalar.data() + i * 16, rows * sizeof(float)))
              << dtype_info(t).name << " n=" << n << " rows=" << rows;
          cpu::dot_q8_group16(kind, g.data(), rows, xq.data() + i * (C / 32), C / 32, 1, C, one.data(), 16);
          ASSERT_EQ(0, std::memcmp(one.data(), simd.data() + i * 16, rows * sizeof(float))) << "row " << i << " of " << n;
          for (int r = 0; r < rows; ++r) {
            const float exact = cpu::ref::dot_q8(t, w.row(r0 + r), xq.data() + i * (C / 32), C);
            dequantize_row(t, w.row(r0 + r), row.data(), C);
            double mag = 0.0;
            for (int64_t c = 0; c < C; ++c) mag += std::fabs(double(row[c]) * x[i * C + c]);
            ASSERT_NEAR(simd[i * 16 + r], exact, 2e-6 * (1.0 + mag)) << dtype_info(t).name << " row " << r0 + r;
          }
        }
      }
    }
    // through matmul: a prompt chunk's rows equal the same rows in a longer chunk
    std::vector<float> x(20 * C), a(20 * R), b(7 * R);
    for (auto& v : x) v = nd(rng);
    cpu::matmul(a.data(), x.data(), w, 20, nullptr, cpu::Activations::kInt8, cpu::RowMode::kChunk);
    cpu::matmul(b.data(), x.data(), w, 7, nullptr, cpu::Activations::kInt8, cpu::RowMode::kChunk);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), b.size() * sizeof(float))) << dtype_info(t).name;
  }
}

// A prompt chunk whose blocks of weight rows are fewer than four jobs a thread also splits its
// input rows into runs (ops.cc, for many cores): every row summed exactly as in the unsplit chunk.
// 256 rows make 8 or 16 blocks: one thread takes the chunk whole, eight split 250 rows into two
// runs; every type, rows and 8-row tiles, 8-bit and f32 activations, a bias, the bits compared.
TEST(Matmul, PromptChunkSplitIntoRunsForThreadsKeepsTheBits) {
  std::mt19937 rng(71);
  std::normal_distribution<float> nd;
  std::vector<DType> types = {DType::F32, DType::F16, DType::BF16};
  types.insert(types.end(), kBlockTypes.begin(), kBlockTypes.end());
  const int saved = omp_get_max_threads();
  const int64_t C = 256, R = 256, T = 250;
  std::vector<float> x(T * C), bias(R), one(T * R), many(T * R);
  for (auto& v : x) v = nd(rng);
  for (auto& v : bias) v = nd(rng);
  for (DType t : types) {
    auto data = random_rows(t, R, C, rng);
    const WeightMatrix w{t, data.data(), R, C, dtype_bytes(t, C)};
    std::vector<uint8_t> tiled_bytes;
    std::vector<WeightMatrix> layouts = {w};
    if (cpu::can_tile8(w)) {
      tiled_bytes.resize(cpu::tile8_bytes(w));
      layouts.push_back(cpu::make_tile8(w, tiled_bytes.data()));
    }
    for (const WeightMatrix& m : layouts)
      for (cpu::Activations act : {cpu::Activations::kInt8, cpu::Activations::kF32}) {
        omp_set_num_threads(1);
        cpu::matmul(one.data(), x.data(), m, T, bias.data(), act, cpu::RowMode::kChunk);
        omp_set_num_threads(8);
        cpu::matmul(many.data(), x.data(), m, T, bias.data(), act, cpu::RowMode::kChunk);
        ASSERT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)))
            << dtype_info(t).name << (m.layout == WeightLayout::kTiles8 ? " tiles" : " rows") << " act " << static_cast<int>(act);
      }
  }
  omp_set_num_threads(saved);
}

// The exact product of one 16-bit weight row (F16 or BF16) with x in double, and sum |w x|.
struct ExactDot {
  double sum = 0.0, mag = 0.0;
};
ExactDot exact_half_dot(DType t, const uint16_t* w, const float* x, int64_t C) {
  ExactDot d;
  for (int64_t c = 0; c < C; ++c) {
    const double p = double(t == DType::F16 ? f16_to_f32(w[c]) : bf16_to_f32(w[c])) * x[c];
    d.sum += p, d.mag += std::fabs(p);
  }
  return d;
}

// BF16 weights' prompt chunks with 8-bit-mode activations: on CPUs with AVX-512 BF16 the
// activations are rounded to bf16 and the pairs multiplied by vdpbf16ps, on CPUs with AMX every
// row by tdpbf16ps where the pairs fill whole tiles (SQUEEZEKV_CPU=avx512: vdpbf16ps; elsewhere,
// or with SQUEEZEKV_CPU=avx2, the exact f32 path runs); either way every output stays within
// bf16's rounding of the activations (2^-8 of sum |w x|) of the exact product, a block of 32
// rows and the tail rows after it, tiles of 32 and 16 tokens and the tokens after them (AMX), 16
// column pairs and more, an odd number of column pairs, and a bias.
TEST(Matmul, Bf16PromptChunksWithinTheActivationRounding) {
  std::mt19937 rng(59);
  std::normal_distribution<float> nd;
  for (auto [C, T] : {std::pair<int64_t, int64_t>{96, 20}, {50, 20}, {64, 50}, {160, 71}}) {
    const int64_t R = 40;
    std::vector<uint16_t> wb(static_cast<size_t>(R * C));
    for (auto& v : wb) v = f32_to_bf16(nd(rng));
    const WeightMatrix w{DType::BF16, reinterpret_cast<const uint8_t*>(wb.data()), R, C, static_cast<size_t>(C) * 2};
    std::vector<float> x(T * C), bias(R), out(T * R);
    for (auto& v : x) v = nd(rng);
    for (auto& v : bias) v = nd(rng);
    cpu::matmul(out.data(), x.data(), w, T, bias.data(), cpu::Activations::kInt8, cpu::RowMode::kChunk);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < R; ++r) {
        const ExactDot d = exact_half_dot(DType::BF16, wb.data() + r * C, x.data() + t * C, C);
        const double exact = bias[r] + d.sum;
        ASSERT_NEAR(out[t * R + r], exact, std::ldexp(d.mag, -8) + 1e-5 * (1.0 + std::fabs(exact))) << "C " << C << " t " << t << " r " << r;
      }
  }
}

// Decode rows over 16-bit weight rows of type t (R 37: rows past a block of 16) with 8-bit-mode
// activations and a bias, for each C and 1, 2 and 5 rows: a batch's rows (RowMode::kIndependent)
// each equal to the same row alone bit for bit, and every output within bound(exact, sum |w x|,
// bias) of the exact product.
template <class Bound>
void check_half_decode_rows(DType t, uint32_t seed, std::initializer_list<int64_t> columns, Bound bound) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (int64_t C : columns) {
    const int64_t R = 37;
    std::vector<uint16_t> wh(static_cast<size_t>(R * C));
    for (auto& v : wh) v = t == DType::F16 ? f32_to_f16(nd(rng)) : f32_to_bf16(nd(rng));
    const WeightMatrix w{t, reinterpret_cast<const uint8_t*>(wh.data()), R, C, static_cast<size_t>(C) * 2};
    for (int64_t T : {1, 2, 5}) {
      std::vector<float> x(T * C), bias(R), out(T * R), alone(R);
      for (auto& v : x) v = nd(rng);
      for (auto& v : bias) v = nd(rng);
      cpu::matmul(out.data(), x.data(), w, T, bias.data(), cpu::Activations::kInt8, cpu::RowMode::kIndependent);
      for (int64_t tt = 0; tt < T; ++tt) {
        cpu::matmul(alone.data(), x.data() + tt * C, w, 1, bias.data(), cpu::Activations::kInt8);
        ASSERT_EQ(0, std::memcmp(alone.data(), out.data() + tt * R, R * sizeof(float))) << "C " << C << " row " << tt << " of " << T;
        for (int64_t r = 0; r < R; ++r) {
          const ExactDot d = exact_half_dot(t, wh.data() + r * C, x.data() + tt * C, C);
          const double exact = bias[r] + d.sum;
          ASSERT_NEAR(out[tt * R + r], exact, bound(exact, d.mag, bias[r])) << "C " << C << " t " << tt << " r " << r;
        }
      }
    }
  }
}

// BF16 weights' decode rows with 8-bit-mode activations: on CPUs with AVX-512 BF16 the row is
// rounded to bf16 and each weight row's pairs, as stored, multiplied by vdpbf16ps (elsewhere, or
// with SQUEEZEKV_CPU=avx2, the exact f32 dot runs): every output within bf16's rounding of the
// activations of the exact product and each batch row equal to its lone row, over 16 column pairs
// a step and fewer, an odd number of pairs (the masked tail).
TEST(Matmul, Bf16DecodeRowsWithinTheActivationRoundingAndAlone) {
  check_half_decode_rows(DType::BF16, 61, {576, 130, 64, 2}, [](double exact, double mag, float) {
    return std::ldexp(mag, -8) + 1e-5 * (1.0 + std::fabs(exact));
  });
}

// F16 weights' decode rows with 8-bit-mode activations: on AVX-512 CPUs each weight row, as
// stored, widened exactly and multiplied in 16 lanes (elsewhere, with SQUEEZEKV_CPU=avx2 or f32
// arithmetic, the f32 dot's 8 lanes): every output within f32 summation's rounding of the exact
// product and each batch row equal to its lone row, over 64 columns a step, 16 and the columns
// past them.
TEST(Matmul, F16DecodeRowsExactProductsAndAlone) {
  check_half_decode_rows(DType::F16, 67, {576, 100, 16, 3}, [](double, double mag, float bias) {
    return 1e-6 * (1.0 + std::fabs(bias) + mag);
  });
}

TEST(Quant, FastDequantizationWithinOneRounding) {
  std::mt19937 rng(41);
  for (DType t : kBlockTypes) {
    const int64_t C = 1024;
    auto data = random_rows(t, 3, C, rng);
    std::vector<float> exact(C), fast(C);
    for (int r = 0; r < 3; ++r) {
      dequantize_row(t, data.data() + r * dtype_bytes(t, C), exact.data(), C);
      cpu::dequantize_row_fast(t, data.data() + r * dtype_bytes(t, C), fast.data(), C);
      for (int64_t i = 0; i < C; ++i)
        ASSERT_NEAR(fast[i], exact[i], 4e-7f * std::max(1.0f, std::fabs(exact[i]))) << dtype_info(t).name << " value " << i;
    }
  }
}

// silu(g) * u against the formula in double, over odd lengths (vector body plus scalar tail) and
// magnitudes from tiny to past exp's range.
TEST(SiluMul, MatchesFormulaIncludingExtremes) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  for (int n : {1, 7, 8, 29, 1536}) {
    std::vector<float> g(n), u(n);
    for (int i = 0; i < n; ++i) {
      g[i] = nd(rng) * std::pow(10.0f, float(i % 5) - 2.0f);  // 0.01 .. 100
      u[i] = nd(rng);
    }
    if (n > 4) g[0] = -200.0f, g[1] = 200.0f, g[2] = 0.0f, g[3] = -88.5f;
    std::vector<float> out = g;
    cpu::silu_mul(out.data(), u.data(), n);
    for (int i = 0; i < n; ++i) {
      const double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
      ASSERT_NEAR(out[i], want, 3e-7 * std::fabs(want) + 1e-30) << "g=" << g[i];
    }
  }
}

// Adjacent-pair RoPE on Q/K rows permuted the way the GGUF converter permutes them equals
// half-split RoPE on the original rows (the pairing pitfall of FACTS.md).
TEST(Rope, AdjacentPairsOnPermutedRowsEqualHalves) {
  const int D = 16, H = 2;
  std::vector<float> x(H * D), perm(H * D), inv(D / 2);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  for (int i = 0; i < D / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / D);
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < D / 2; ++i) {
      perm[h * D + 2 * i] = x[h * D + i];
      perm[h * D + 2 * i + 1] = x[h * D + i + D / 2];
    }
  const int32_t pos = 37;
  cpu::rope(x.data(), &pos, 1, H, D, inv.data(), cpu::RopePairing::kHalves);
  cpu::rope(perm.data(), &pos, 1, H, D, inv.data(), cpu::RopePairing::kAdjacent);
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < D / 2; ++i) {
      EXPECT_FLOAT_EQ(perm[h * D + 2 * i], x[h * D + i]);
      EXPECT_FLOAT_EQ(perm[h * D + 2 * i + 1], x[h * D + i + D / 2]);
    }
}

// Textbook causal GQA attention in double, with per-kv-head H2O mass (the group's mean of the
// row sums) and KVzip's score (the largest probability over the group's heads and the rows).
void attention_reference(std::vector<double>& out, std::vector<double>& mass, const std::vector<float>& q,
                         const std::vector<int32_t>& qpos, int T, int H, const std::vector<float>& k,
                         const std::vector<float>& v, const std::vector<int32_t>& pos, int G, int cap, int N, int D,
                         std::vector<double>* max_mass = nullptr) {
  out.assign(static_cast<size_t>(T) * H * D, 0.0);
  mass.assign(static_cast<size_t>(G) * N, 0.0);
  if (max_mass != nullptr) max_mass->assign(static_cast<size_t>(G) * N, 0.0);
  const int group = H / G;
  for (int h = 0; h < H; ++h) {
    const int g = h / group;
    for (int t = 0; t < T; ++t) {
      std::vector<double> s(N, -INFINITY);
      double mx = -INFINITY;
      for (int j = 0; j < N; ++j) {
        if (pos[g * cap + j] > qpos[t]) continue;
        double d = 0;
        for (int e = 0; e < D; ++e) d += double(q[(t * H + h) * D + e]) * k[(size_t(g) * cap + j) * D + e];
        s[j] = d / std::sqrt(double(D));
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = 0; j < N; ++j) sum += std::isinf(s[j]) ? 0 : std::exp(s[j] - mx);
      for (int j = 0; j < N; ++j) {
        const double p = std::isinf(s[j]) ? 0 : std::exp(s[j] - mx) / sum;
        for (int e = 0; e < D; ++e) out[(t * H + h) * D + e] += p * v[(size_t(g) * cap + j) * D + e];
        mass[g * N + j] += p / group;
        if (max_mass != nullptr) (*max_mass)[g * N + j] = std::max((*max_mass)[g * N + j], p);
      }
    }
  }
}

// A view of test K/V held both as f32 and as f16 (the f16 copies may be empty for kF32).
cpu::KvView view_of(cpu::KvType type, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<uint16_t>& k16, const std::vector<uint16_t>& v16, const std::vector<int32_t>& pos,
                    int N, int cap, int G, int D) {
  cpu::KvView kv;
  kv.type = kv.v_type = type;
  kv.k = type == cpu::KvType::kF16 ? static_cast<const void*>(k16.data()) : k.data();
  kv.v = type == cpu::KvType::kF16 ? static_cast<const void*>(v16.data()) : v.data();
  kv.pos = pos.data();
  kv.count = N;
  kv.capacity = cap;
  kv.n_kv_heads = G;
  kv.head_dim = D;
  return kv;
}

TEST(Attention, MatchesReferenceIncludingMass) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (auto type : {cpu::KvType::kF32, cpu::KvType::kF16}) {
    for (int N : {1, 7, 33}) {
      for (int T : {1, 4}) {
        const int H = 6, G = 2, D = 32, cap = N + 3;
        if (T > N) continue;
        std::vector<float> k(size_t(G) * cap * D), v(k.size()), q(size_t(T) * H * D);
        for (auto* vec : {&k, &v, &q})
          for (auto& x : *vec) x = nd(rng);
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        if (type == cpu::KvType::kF16) {  // the reference sees the rounded values
          for (size_t i = 0; i < k.size(); ++i) {
            k16[i] = f32_to_f16(k[i]);
            v16[i] = f32_to_f16(v[i]);
            k[i] = f16_to_f32(k16[i]);
            v[i] = f16_to_f32(v16[i]);
          }
        }
        // each head keeps its own ascending positions with gaps (as after eviction)
        std::vector<int32_t> pos(size_t(G) * cap);
        for (int g = 0; g < G; ++g) {
          int p = g;
          for (int j = 0; j < N; ++j) pos[g * cap + j] = (p += 1 + (j * 7 + g) % 3);
        }
        std::vector<int32_t> qpos(T);
        for (int t = 0; t < T; ++t) qpos[t] = std::max(pos[N - 1], pos[cap + N - 1]) - (T - 1 - t);
        const cpu::KvView kv = view_of(type, k, v, k16, v16, pos, N, cap, G, D);
        std::vector<float> out(size_t(T) * H * D), mass(size_t(G) * N, 0.0f),
            scratch(cpu::attention_scratch_floats(T, H, N));
        cpu::AttentionProbe probe;
        probe.mass = mass.data();
        cpu::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
        std::vector<double> ro, rm, rmax;
        attention_reference(ro, rm, q, qpos, T, H, k, v, pos, G, cap, N, D, &rmax);
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ro[i], 1e-4) << "N=" << N << " T=" << T;
        for (size_t i = 0; i < mass.size(); ++i) ASSERT_NEAR(mass[i], rm[i], 1e-5) << "mass N=" << N << " T=" << T;
        // mass is a sum of probability rows: per kv head it adds up to T
        for (int g = 0; g < G; ++g) {
          double s = 0;
          for (int j = 0; j < N; ++j) s += mass[g * N + j];
          EXPECT_NEAR(s, T, 1e-4);
        }
        // null mass: same output
        std::vector<float> out2(out.size());
        cpu::attention(out2.data(), q.data(), qpos.data(), T, H, kv, nullptr, scratch.data());
        EXPECT_EQ(out, out2);
        // max reduction (KVzip's score) onto a mass that already holds a score: max, not replace
        std::vector<float> maxed(mass.size(), 0.0f);
        maxed[0] = 2.0f;  // above any probability: stays
        probe = {};
        probe.mass = maxed.data();
        probe.reduce = MassReduce::kMax;
        cpu::attention(out2.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
        EXPECT_EQ(out, out2);
        EXPECT_EQ(maxed[0], 2.0f);
        for (size_t i = 1; i < maxed.size(); ++i) ASSERT_NEAR(maxed[i], rmax[i], 1e-5) << "max mass N=" << N << " T=" << T;
      }
    }
  }
}

// Dead slots (head-adaptive storage: position INT32_MAX) are invisible: attention over a head with
// dead slots equals attention over its live rows alone, and dead slots get no mass.
TEST(Attention, DeadSlotsAreInvisible) {
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  const int H = 4, G = 2, D = 32, N = 70, T = 5, cap = N;
  std::vector<float> k(size_t(G) * cap * D), v(k.size()), q(size_t(T) * H * D);
  for (auto* vec : {&k, &v, &q})
    for (auto& x : *vec) x = nd(rng);
  std::vector<int32_t> pos(size_t(G) * cap), qpos(T);
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < N; ++j) pos[g * cap + j] = j;
  for (int t = 0; t < T; ++t) qpos[t] = N + t;
  // head 0 loses rows 10..29 (dead), head 1 keeps all; the reference packs head 0's live rows
  std::vector<float> k2 = k, v2 = v;
  std::vector<int32_t> pos2 = pos;
  int w = 0;
  for (int j = 0; j < N; ++j) {
    if (j >= 10 && j < 30) {
      pos[j] = std::numeric_limits<int32_t>::max();
      continue;
    }
    std::copy_n(&k[size_t(j) * D], D, &k2[size_t(w) * D]);
    std::copy_n(&v[size_t(j) * D], D, &v2[size_t(w) * D]);
    pos2[w++] = j;
  }
  for (int j = w; j < N; ++j) pos2[j] = std::numeric_limits<int32_t>::max();  // the packed copy's tail is dead too
  const std::vector<uint16_t> none;
  for (bool fast : {true, false}) {
    std::vector<float> o1(q.size()), o2(q.size()), m1(size_t(G) * N, 0.0f), m2(m1.size(), 0.0f);
    std::vector<float> scratch(cpu::attention_scratch_floats(T, H, N));
    cpu::AttentionProbe p1, p2;
    p1.mass = m1.data();
    p2.mass = m2.data();
    p1.entropy = p2.entropy = true;
    const cpu::KvView a = view_of(cpu::KvType::kF32, k, v, none, none, pos, N, cap, G, D);
    const cpu::KvView b = view_of(cpu::KvType::kF32, k2, v2, none, none, pos2, N, cap, G, D);
    auto run = [fast](float* o, const float* qq, const int32_t* qp, int64_t TT, int HH, const cpu::KvView& kv, cpu::AttentionProbe* pr,
                      float* sc) { fast ? cpu::attention(o, qq, qp, TT, HH, kv, pr, sc) : cpu::ref::attention(o, qq, qp, TT, HH, kv, pr, sc); };
    run(o1.data(), q.data(), qpos.data(), T, H, a, &p1, scratch.data());
    run(o2.data(), q.data(), qpos.data(), T, H, b, &p2, scratch.data());
    for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 1e-5) << (fast ? "fast" : "ref");
    for (int j = 10; j < 30; ++j) EXPECT_EQ(m1[j], 0.0f);
    for (int j = 0, r = 0; j < N; ++j) {
      if (j < 10 || j >= 30) {
        ASSERT_NEAR(m1[j], m2[r++], 1e-6);
      }
    }
    EXPECT_EQ(p1.entropy_rows, p2.entropy_rows);
    EXPECT_NEAR(p1.entropy_sum, p2.entropy_sum, 1e-5);
  }
}

// Slots are unordered after eviction: permuting a head's slots (rows with their positions) must
// not change the output, and the mass follows its rows.
TEST(Attention, IndependentOfSlotOrder) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  const int H = 4, G = 2, D = 16, N = 40, T = 3, cap = N;
  std::vector<float> k(size_t(G) * cap * D), v(k.size()), q(size_t(T) * H * D);
  for (auto* vec : {&k, &v, &q})
    for (auto& x : *vec) x = nd(rng);
  std::vector<int32_t> pos(size_t(G) * cap);
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < N; ++j) pos[g * cap + j] = 2 * j + g;
  const std::vector<int32_t> qpos = {60, 70, 90};
  auto run = [&](const std::vector<float>& kk, const std::vector<float>& vv, const std::vector<int32_t>& pp,
                 std::vector<float>& mass) {
    const cpu::KvView kv = view_of(cpu::KvType::kF32, kk, vv, {}, {}, pp, N, cap, G, D);
    std::vector<float> out(size_t(T) * H * D), scratch(cpu::attention_scratch_floats(T, H, N));
    mass.assign(size_t(G) * N, 0.0f);
    cpu::AttentionProbe probe;
    probe.mass = mass.data();
    cpu::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
    return out;
  };
  std::vector<float> m1, m2;
  const auto o1 = run(k, v, pos, m1);
  std::vector<int> perm(N);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<float> k2(k.size()), v2(v.size());
  std::vector<int32_t> p2(pos.size());
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < N; ++j) {
      const int from = perm[j];
      p2[g * cap + j] = pos[g * cap + from];
      std::copy_n(&k[(size_t(g) * cap + from) * D], D, &k2[(size_t(g) * cap + j) * D]);
      std::copy_n(&v[(size_t(g) * cap + from) * D], D, &v2[(size_t(g) * cap + j) * D]);
    }
  const auto o2 = run(k2, v2, p2, m2);
  for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 1e-5);
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < N; ++j) ASSERT_NEAR(m2[g * N + j], m1[g * N + perm[j]], 1e-6);
}

// The tiled fast path against the row-at-a-time reference over odd sizes: key counts that are not
// multiples of 4, more query rows than one tile holds, long contexts with few rows (decode: keys
// split into segments and merged), prefill-shaped and gapped unordered positions, both storage
// types, a head dim without a fast path. Output, mass and entropy agree.
TEST(Attention, TiledMatchesRowReference) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  int cases = 0;
  for (auto type : {cpu::KvType::kF32, cpu::KvType::kF16})
    for (int D : {16, 64, 24, 32, 48})  // 512-bit passes over 64, 32 and 16 dims; 24: the row path
      for (int N : {1, 3, 4, 5, 17, 64, 131, 2053, 5000})  // 2053, 5000: few tiles split into key segments
        for (int T : {1, 2, 5, 16, 17, 40})
          for (bool prefill : {true, false}) {
            if (T > N || (N > 1000 && T > 5)) continue;
            const int H = 6, G = 2, cap = N + 5;
            std::vector<float> k(size_t(G) * cap * D), v(k.size()), q(size_t(T) * H * D);
            for (auto* vec : {&k, &v, &q})
              for (auto& x : *vec) x = nd(rng);
            std::vector<uint16_t> k16(k.size()), v16(v.size());
            for (size_t i = 0; i < k.size(); ++i) {
              k16[i] = f32_to_f16(k[i]);
              v16[i] = f32_to_f16(v[i]);
            }
            std::vector<int32_t> pos(size_t(G) * cap), qpos(T);
            for (int g = 0; g < G; ++g) {
              for (int j = 0; j < N; ++j) pos[g * cap + j] = prefill ? j : 3 * j + g;
              if (!prefill) std::shuffle(pos.begin() + g * cap, pos.begin() + g * cap + N, rng);
            }
            // prefill: the rows are the last T keys; otherwise queries late enough to see most keys
            for (int t = 0; t < T; ++t) qpos[t] = prefill ? N - T + t : 3 * N - 2 * (T - t);
            const cpu::KvView kv = view_of(type, k, v, k16, v16, pos, N, cap, G, D);
            std::vector<float> scratch(cpu::attention_scratch_floats(T, H, N));
            auto run = [&](bool fast, std::vector<float>& out, std::vector<float>& mass, cpu::AttentionProbe& probe,
                           MassReduce reduce = MassReduce::kSum) {
              out.assign(size_t(T) * H * D, 0.0f);
              mass.assign(size_t(G) * N, 0.0f);
              probe = {};
              probe.mass = mass.data();
              probe.mass_row_begin = T / 2;
              probe.reduce = reduce;
              probe.entropy = true;
              if (fast) cpu::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
              else cpu::ref::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
            };
            std::vector<float> o1, m1, o2, m2;
            cpu::AttentionProbe p1, p2;
            run(true, o1, m1, p1);
            run(false, o2, m2, p2);
            const std::string where = "D=" + std::to_string(D) + " N=" + std::to_string(N) + " T=" + std::to_string(T) +
                                      (prefill ? " prefill" : " gapped");
            for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 2e-5f * (1.0f + std::abs(o2[i]))) << where;
            for (size_t i = 0; i < m1.size(); ++i) ASSERT_NEAR(m1[i], m2[i], 2e-6f * T) << where;
            ASSERT_EQ(p1.entropy_rows, p2.entropy_rows) << where;
            ASSERT_NEAR(p1.entropy_sum, p2.entropy_sum, 1e-5 * (1.0 + p2.entropy_rows)) << where;
            run(true, o1, m1, p1, MassReduce::kMax);
            run(false, o2, m2, p2, MassReduce::kMax);
            for (size_t i = 0; i < m1.size(); ++i) ASSERT_NEAR(m1[i], m2[i], 2e-6f) << where << " max";
            ++cases;
          }
  EXPECT_EQ(cases, 620);  // every size above ran
}

// KV rows quantized in blocks of 32 (core/kv_rows.h) come back within half a quantization step
// (plus the f16 rounding of the block's scale and minimum): q8_0 max|x| / 254, q4_1 (max - min) /
// 30, q4_0 |max| / 16 but a whole step |max| / 8 at the extreme opposite the scale's (its grid
// runs from -8 to 7); a row of zeros stays zeros; f16 and f32 rows as before.
// The key rotation (kv_rotate) is orthonormal on every head dim the block types allow: it keeps
// dot products and norms, and it moves the values (not the identity).
TEST(KvRows, RotationKeepsDotProducts) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  for (int D : {32, 64, 96, 128, 160, 256}) {
    std::vector<float> a(D), b(D);
    for (float& x : a) x = nd(rng);
    for (float& x : b) x = nd(rng);
    std::vector<float> ra = a, rb = b;
    kv_rotate(ra.data(), D);
    kv_rotate(rb.data(), D);
    double dot = 0, rdot = 0, n = 0, rn = 0, moved = 0;
    for (int d = 0; d < D; ++d)
      dot += a[d] * b[d], rdot += ra[d] * rb[d], n += a[d] * a[d], rn += ra[d] * ra[d], moved += std::fabs(ra[d] - a[d]);
    EXPECT_NEAR(rdot, dot, 1e-4 * std::sqrt(n) * D) << "D " << D;
    EXPECT_NEAR(rn, n, 1e-4 * n) << "D " << D;
    EXPECT_GT(moved, 0.1 * D) << "D " << D;
  }
}

TEST(KvRows, QuantizedRowsWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int D = 128;
  for (auto t : {cpu::KvType::kQ8_0, cpu::KvType::kQ4_0, cpu::KvType::kQ4_1, cpu::KvType::kF16, cpu::KvType::kF32}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(D), y(D);
      for (float& e : x) e = trial == 0 ? 0.0f : nd(rng) * (trial % 7 == 0 ? 1e-3f : 1.0f);
      std::vector<uint8_t> row(kv_row_bytes(t, D));
      kv_quantize_row(t, x.data(), row.data(), D);
      kv_dequantize_row(t, row.data(), y.data(), D);
      for (int b = 0; b < D; b += 32) {
        float lo = x[b], hi = x[b], amax = 0.0f;
        for (int i = b; i < b + 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]), amax = std::max(amax, std::fabs(x[i]));
        const float step = t == cpu::KvType::kQ8_0 ? amax / 127.0f : t == cpu::KvType::kQ4_0 ? amax / 8.0f : t == cpu::KvType::kQ4_1 ? (hi - lo) / 15.0f : 0.0f;
        // q4_0's grid of 16 steps from -8 to 7 leaves the extreme opposite the scale's one step out
        const float half = t == cpu::KvType::kQ4_0 ? step : 0.5f * step;
        const float tol = t == cpu::KvType::kF32 ? 0.0f : t == cpu::KvType::kF16 ? amax * 1e-3f : half * 1.01f + amax * 2e-3f;
        for (int i = b; i < b + 32; ++i) {
          ASSERT_LE(std::fabs(y[i] - x[i]), tol) << "type " << int(t) << " trial " << trial << " i " << i;
          ASSERT_FLOAT_EQ(kv_row_value(t, row.data(), i), y[i]);
        }
      }
    }
  }
}

// kv_rows_finite reads finiteness from the bits: for every row type it agrees with dequantizing
// the rows and std::isfinite, on rows of finite values and on rows with a byte set to a pattern
// that may make an f16, f32, scale or minimum infinite or NaN (or a quant byte, which cannot).
TEST(KvRows, FiniteFromTheBitsAsDequantized) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_int_distribution<int> byte(0, 255);
  const int D = 64, n = 5;
  int bad_seen = 0;
  for (auto t : {cpu::KvType::kF16, cpu::KvType::kF32, cpu::KvType::kQ8_0, cpu::KvType::kQ4_0, cpu::KvType::kQ4_1}) {
    const size_t rb = kv_row_bytes(t, D);
    for (int trial = 0; trial < 400; ++trial) {
      std::vector<uint8_t> rows(n * rb);
      std::vector<float> x(D);
      for (int r = 0; r < n; ++r) {
        for (float& e : x) e = nd(rng);
        kv_quantize_row(t, x.data(), rows.data() + r * rb, D);
      }
      if (trial > 0) {  // damage one or two bytes (high bytes of exponents, and any other)
        const size_t at = static_cast<size_t>(byte(rng)) * 7919 % rows.size();
        rows[at] = static_cast<uint8_t>(trial % 3 == 0 ? 0xFF : trial % 3 == 1 ? 0x7C | (byte(rng) & 0x83) : byte(rng));
        if (trial % 5 == 0 && at > 0) rows[at - 1] = static_cast<uint8_t>(byte(rng));
      }
      bool want = true;
      for (int r = 0; r < n; ++r) {
        kv_dequantize_row(t, rows.data() + r * rb, x.data(), D);
        for (float e : x) want = want && std::isfinite(e);
      }
      bad_seen += !want;
      ASSERT_EQ(kv_rows_finite(t, rows.data(), n, D), want) << "type " << int(t) << " trial " << trial;
    }
  }
  EXPECT_GT(bad_seen, 100);  // the damage made values that are not finite in many trials
}

// Attention over quantized K and V rows (and mixed pairs: q8_0 keys with f16 values, f16 keys
// with q4_0 values, ...) through the tile kernels, dequantized in registers, against the scalar
// row reference reading the same stored bytes through kv_row_value, with the mass (sum and max)
// and the entropy: head dims 32, 64 and 128, prefill and gapped positions, key segments.
TEST(Attention, QuantizedRowsMatchTheReference) {
  using T_ = cpu::KvType;
  const std::pair<T_, T_> pairs[] = {{T_::kQ8_0, T_::kQ8_0}, {T_::kQ4_0, T_::kQ4_0}, {T_::kQ4_1, T_::kQ4_1},
                                     {T_::kQ8_0, T_::kF16},  {T_::kF16, T_::kQ4_0},  {T_::kQ8_0, T_::kQ4_1}};
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  int cases = 0;
  for (auto [kt, vt] : pairs)
    for (int D : {32, 64, 128})
      for (int N : {1, 5, 64, 131, 2053})
        for (int T : {1, 2, 17})
          for (bool prefill : {true, false}) {
            if (T > N || (N > 1000 && T > 2)) continue;
            const int H = 6, G = 2, cap = N + 5;
            const size_t kb = kv_row_bytes(kt, D), vb = kv_row_bytes(vt, D);
            std::vector<uint8_t> k(size_t(G) * cap * kb), v(size_t(G) * cap * vb);
            std::vector<float> row(D), q(size_t(T) * H * D);
            for (size_t r = 0; r < size_t(G) * cap; ++r) {
              for (float& e : row) e = nd(rng);
              kv_quantize_row(kt, row.data(), k.data() + r * kb, D);
              for (float& e : row) e = nd(rng);
              kv_quantize_row(vt, row.data(), v.data() + r * vb, D);
            }
            for (float& e : q) e = nd(rng);
            std::vector<int32_t> pos(size_t(G) * cap), qpos(T);
            for (int g = 0; g < G; ++g) {
              for (int j = 0; j < N; ++j) pos[g * cap + j] = prefill ? j : 3 * j + g;
              if (!prefill) std::shuffle(pos.begin() + g * cap, pos.begin() + g * cap + N, rng);
            }
            for (int t = 0; t < T; ++t) qpos[t] = prefill ? N - T + t : 3 * N - 2 * (T - t);
            cpu::KvView kv;
            kv.type = kt, kv.v_type = vt, kv.k = k.data(), kv.v = v.data(), kv.pos = pos.data();
            kv.count = N, kv.capacity = cap, kv.n_kv_heads = G, kv.head_dim = D;
            std::vector<float> scratch(cpu::attention_scratch_floats(T, H, N));
            auto run = [&](bool fast, std::vector<float>& out, std::vector<float>& mass, cpu::AttentionProbe& probe, MassReduce reduce) {
              out.assign(size_t(T) * H * D, 0.0f);
              mass.assign(size_t(G) * N, 0.0f);
              probe = {};
              probe.mass = mass.data();
              probe.reduce = reduce;
              probe.entropy = true;
              if (fast) cpu::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
              else cpu::ref::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
            };
            const std::string where = "K " + std::to_string(int(kt)) + " V " + std::to_string(int(vt)) + " D=" + std::to_string(D) +
                                      " N=" + std::to_string(N) + " T=" + std::to_string(T) + (prefill ? " prefill" : " gapped");
            for (MassReduce reduce : {MassReduce::kSum, MassReduce::kMax}) {
              std::vector<float> o1, m1, o2, m2;
              cpu::AttentionProbe p1, p2;
              run(true, o1, m1, p1, reduce);
              run(false, o2, m2, p2, reduce);
              for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o2[i], 2e-5f * (1.0f + std::abs(o2[i]))) << where;
              for (size_t i = 0; i < m1.size(); ++i) ASSERT_NEAR(m1[i], m2[i], 2e-6f * T) << where;
              ASSERT_EQ(p1.entropy_rows, p2.entropy_rows) << where;
              ASSERT_NEAR(p1.entropy_sum, p2.entropy_sum, 1e-5 * (1.0 + p2.entropy_rows)) << where;
            }
            ++cases;
          }
  EXPECT_EQ(cases, 6 * 3 * 22);  // every size above ran (N = 1: T = 1; N = 5 and 2053: T = 1, 2)
}

// x[0..D) as the 8-bit-query attention rounds a query row: quantize_q8's integers times their
// block's scale.
void round_query_to_8_bits(const float* x, int D, float* out) {
  std::vector<cpu::Q8Block> b(D / 32);
  cpu::quantize_q8(b.data(), x, D);
  for (int i = 0; i < D; ++i) out[i] = static_cast<float>(b[i / 32].q[i % 32]) * b[i / 32].d;
}

// Q8_0 keys met by 8-bit queries (int8 decode, cpu::attention's act; CPUs with AVX-512 VNNI): a
// one-token call's output and mass equal, within f32 rounding, the row reference's over the same
// keys with each query row replaced by its 8-bit rounding (quantize_q8: the integers times their
// block's scale), for every V type beside Q8_0 keys, GQA groups of 1 to 8, key counts around the
// kernel's groups of 16 keys (and its quads and tail), positions in order and shuffled with dead
// slots, and as one call of a decode batch; the same call in prompt chunks (T > 1), under f32
// decode, or on CPUs without VNNI keeps f32 queries.
TEST(Attention, Q8KeysMeetEightBitQueries) {
  using T_ = cpu::KvType;
  const bool int8 = cpu::cpu_features().avx512vnni;
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  const int D = 64;
  int cases = 0;
  for (T_ vt : {T_::kQ8_0, T_::kF16, T_::kQ4_1})
    for (auto [H, G] : {std::pair{6, 2}, std::pair{9, 3}, std::pair{8, 1}, std::pair{4, 4}, std::pair{10, 5}})
      for (int N : {1, 5, 15, 16, 17, 63, 64, 65, 131, 1000, 4100})
        for (bool gapped : {false, true}) {
          const int cap = N + 7, T = 1;
          const size_t kb = kv_row_bytes(T_::kQ8_0, D), vb = kv_row_bytes(vt, D);
          std::vector<uint8_t> k(size_t(G) * cap * kb), v(size_t(G) * cap * vb);
          std::vector<float> row(D), q(size_t(H) * D), q8(q.size());
          for (size_t r = 0; r < size_t(G) * cap; ++r) {
            for (float& e : row) e = nd(rng);
            kv_quantize_row(T_::kQ8_0, row.data(), k.data() + r * kb, D);
            for (float& e : row) e = nd(rng);
            kv_quantize_row(vt, row.data(), v.data() + r * vb, D);
          }
          for (float& e : q) e = nd(rng) * (rng() % 5 == 0 ? 6.0f : 1.0f);
          for (int h = 0; h < H; ++h) round_query_to_8_bits(q.data() + h * D, D, q8.data() + h * D);  // as the kernel rounds them
          std::vector<int32_t> pos(size_t(G) * cap);
          for (int g = 0; g < G; ++g) {
            for (int j = 0; j < N; ++j) pos[g * cap + j] = gapped ? 3 * j + g : j;
            if (gapped) {
              std::shuffle(pos.begin() + g * cap, pos.begin() + g * cap + N, rng);
              if (N > 3) pos[g * cap + N / 2] = kDeadPosition;
            }
          }
          const int32_t qpos = gapped ? 3 * N + G : N;  // after every key (3 j + g)
          cpu::KvView kv;
          kv.type = T_::kQ8_0, kv.v_type = vt, kv.k = k.data(), kv.v = v.data(), kv.pos = pos.data();
          kv.count = N, kv.capacity = cap, kv.n_kv_heads = G, kv.head_dim = D;
          std::vector<float> scratch(cpu::attention_scratch_floats(T, H, cap) * 2);  // a batch of two: each call's, by capacity
          auto run = [&](int how, const std::vector<float>& qq, std::vector<float>& out, std::vector<float>& mass) {
            out.assign(q.size(), 0.0f);
            mass.assign(size_t(G) * N, 0.0f);
            cpu::AttentionProbe probe;
            probe.mass = mass.data();
            if (how == 0) cpu::attention(out.data(), qq.data(), &qpos, T, H, kv, &probe, scratch.data(), Activations::kInt8);
            if (how == 1) cpu::ref::attention(out.data(), qq.data(), &qpos, T, H, kv, &probe, scratch.data());
            if (how == 2) cpu::attention(out.data(), qq.data(), &qpos, T, H, kv, &probe, scratch.data(), Activations::kF32);
            if (how == 3) {  // one call of a decode batch of two (the other a copy)
              std::vector<float> out2(q.size()), mass2(mass.size());
              cpu::AttentionProbe probe2;
              probe2.mass = mass2.data();
              const AttentionCall calls[2] = {{out.data(), qq.data(), &qpos, T, H, kv, &probe, {}},
                                            {out2.data(), qq.data(), &qpos, T, H, kv, &probe2, {}}};
              cpu::attention_batch(calls, 2, scratch.data(), Activations::kInt8);
            }
          };
          const std::string where = "V " + std::to_string(int(vt)) + " H=" + std::to_string(H) + " G=" + std::to_string(G) +
                                    " N=" + std::to_string(N) + (gapped ? " gapped" : "");
          std::vector<float> o_int8, m_int8, o_ref, m_ref, o_f32, m_f32, o_batch, m_batch;
          run(0, q, o_int8, m_int8);
          run(1, int8 ? q8 : q, o_ref, m_ref);
          for (size_t i = 0; i < o_ref.size(); ++i) ASSERT_NEAR(o_int8[i], o_ref[i], 2e-5f * (1.0f + std::abs(o_ref[i]))) << where;
          // (the mass: float sums over the keys, so a tolerance that grows with them)
          for (size_t i = 0; i < m_ref.size(); ++i) ASSERT_NEAR(m_int8[i], m_ref[i], 2e-6f * (1.0f + m_ref[i]) * std::max(1, N / 1000)) << where;
          run(3, q, o_batch, m_batch);  // a decode batch's call: the call's own bits
          ASSERT_EQ(0, std::memcmp(o_batch.data(), o_int8.data(), o_int8.size() * sizeof(float))) << where;
          run(2, q, o_f32, m_f32);  // f32 decode: f32 queries, within the 8-bit rounding of the int8 call's
          run(1, q, o_ref, m_ref);
          for (size_t i = 0; i < o_ref.size(); ++i) ASSERT_NEAR(o_f32[i], o_ref[i], 2e-5f * (1.0f + std::abs(o_ref[i]))) << where;
          ++cases;
        }
  EXPECT_EQ(cases, 3 * 5 * 11 * 2);
}

// The recent ring (--kv-recent-f16): a held row whose position the ring holds is read from the
// ring's f16 rows, every other from its quantized row. The tile kernels and the row reference,
// each over the ring's view, against the row reference over f32 rows in which every ring
// position's row was replaced by its ring row beforehand (no ring): rings of 4, 32 and 200 rows
// (smaller and larger than the held rows), some indices stale (holding an older position, so
// their rows are read as stored), K/V pairs with one side unquantized (no ring half there),
// prompts and decode rows, segments; and on CPUs with AVX-512 VNNI each decode step under int8
// arithmetic too, where Q8_0 keys meet the 8-bit query and ring rows the f32 one.
TEST(Attention, RecentRingRowsAreReadInPlaceOfTheirQuantizedRows) {
  using T_ = cpu::KvType;
  const std::pair<T_, T_> pairs[] = {{T_::kQ4_1, T_::kQ4_1}, {T_::kQ8_0, T_::kQ8_0}, {T_::kQ8_0, T_::kF16}, {T_::kF16, T_::kQ4_0}};
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  int cases = 0, ring_rows_read = 0, int8_cases = 0;
  for (auto [kt, vt] : pairs)
    for (int D : {64, 128})
      for (int N : {5, 131, 2053})
        for (int T : {1, 17})
          for (int R : {4, 32, 200})
            for (bool prefill : {true, false}) {
              if (T > N || (N > 1000 && T > 1)) continue;
              const int H = 6, G = 2, cap = N + 5;
              const size_t kb = kv_row_bytes(kt, D), vb = kv_row_bytes(vt, D);
              std::vector<uint8_t> k(size_t(G) * cap * kb), v(size_t(G) * cap * vb);
              std::vector<float> row(D), q(size_t(T) * H * D);
              for (size_t r = 0; r < size_t(G) * cap; ++r) {
                for (float& e : row) e = nd(rng);
                kv_quantize_row(kt, row.data(), k.data() + r * kb, D);
                for (float& e : row) e = nd(rng);
                kv_quantize_row(vt, row.data(), v.data() + r * vb, D);
              }
              for (float& e : q) e = nd(rng);
              std::vector<int32_t> pos(size_t(G) * cap), qpos(T);
              int32_t newest = 0;
              for (int g = 0; g < G; ++g) {
                for (int j = 0; j < N; ++j) pos[g * cap + j] = prefill ? j : 3 * j + g, newest = std::max(newest, pos[g * cap + j]);
                if (!prefill) std::shuffle(pos.begin() + g * cap, pos.begin() + g * cap + N, rng);
              }
              for (int t = 0; t < T; ++t) qpos[t] = prefill ? N - T + t : 3 * N - 2 * (T - t);
              // the ring: index i holds the newest position p <= newest with p % R == i, or (one in
              // five) an older one, stale; rows of other values than the quantized ones
              const bool ring_k = kv_quantized(kt), ring_v = kv_quantized(vt);
              std::vector<uint16_t> rk(ring_k ? size_t(G) * R * D : 0), rv(ring_v ? size_t(G) * R * D : 0);
              for (auto& e : rk) e = f32_to_f16(nd(rng));
              for (auto& e : rv) e = f32_to_f16(nd(rng));
              std::vector<int32_t> rpos(R);
              for (int i = 0; i < R; ++i) {
                int32_t p = newest - ((newest - i) % R + R) % R;
                if (p >= 0 && rng() % 5 == 0) p -= R;  // stale
                rpos[i] = p >= 0 ? p : -1;
              }
              cpu::KvView kv;
              kv.type = kt, kv.v_type = vt, kv.k = k.data(), kv.v = v.data(), kv.pos = pos.data();
              kv.count = N, kv.capacity = cap, kv.n_kv_heads = G, kv.head_dim = D;
              kv.ring_k = ring_k ? rk.data() : nullptr, kv.ring_v = ring_v ? rv.data() : nullptr;
              kv.ring_pos = rpos.data(), kv.ring = R, kv.ring_from = newest + 1 - R;
              // the expectation's rows: f32, each ring position's row replaced by its ring row
              std::vector<float> kf(size_t(G) * cap * D), vf(size_t(G) * cap * D);
              for (int g = 0; g < G; ++g)
                for (int j = 0; j < N; ++j) {
                  const size_t at = size_t(g) * cap + j;
                  const int32_t p = pos[at];
                  const int i = p % R;
                  const bool in_ring = p >= newest + 1 - R && rpos[i] == p;
                  ring_rows_read += in_ring;
                  for (int d = 0; d < D; ++d) {
                    kf[at * D + d] = in_ring && ring_k ? f16_to_f32(rk[(size_t(g) * R + i) * D + d]) : kv_row_value(kt, k.data() + at * kb, d);
                    vf[at * D + d] = in_ring && ring_v ? f16_to_f32(rv[(size_t(g) * R + i) * D + d]) : kv_row_value(vt, v.data() + at * vb, d);
                  }
                }
              cpu::KvView want_kv = kv;
              want_kv.type = want_kv.v_type = T_::kF32, want_kv.k = kf.data(), want_kv.v = vf.data();
              want_kv.ring_k = want_kv.ring_v = nullptr, want_kv.ring_pos = nullptr, want_kv.ring = 0;
              std::vector<float> scratch(cpu::attention_scratch_floats(T, H, N));
              auto run = [&](int how, std::vector<float>& out, std::vector<float>& mass, cpu::AttentionProbe& probe) {
                out.assign(size_t(T) * H * D, 0.0f);
                mass.assign(size_t(G) * N, 0.0f);
                probe = {};
                probe.mass = mass.data();
                if (how == 0) cpu::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
                else if (how == 1) cpu::ref::attention(out.data(), q.data(), qpos.data(), T, H, kv, &probe, scratch.data());
                else cpu::ref::attention(out.data(), q.data(), qpos.data(), T, H, want_kv, &probe, scratch.data());
              };
              const std::string where = "K " + std::to_string(int(kt)) + " V " + std::to_string(int(vt)) + " D=" + std::to_string(D) +
                                        " N=" + std::to_string(N) + " T=" + std::to_string(T) + " R=" + std::to_string(R) +
                                        (prefill ? " prefill" : " gapped");
              std::vector<float> ow, mw;
              cpu::AttentionProbe pw;
              run(2, ow, mw, pw);
              for (int how : {0, 1}) {
                std::vector<float> o, m;
                cpu::AttentionProbe p;
                run(how, o, m, p);
                for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], ow[i], 2e-5f * (1.0f + std::abs(ow[i]))) << where << " how " << how;
                for (size_t i = 0; i < m.size(); ++i) ASSERT_NEAR(m[i], mw[i], 2e-6f * T) << where << " how " << how;
              }
              if (T == 1 && cpu::cpu_features().avx512vnni) {
                // a decode step under int8 arithmetic: Q8_0 keys of head dim 64 met by the query
                // rounded to 8 bits, a ring row by the f32 query; the expectation formed here,
                // per key, from the rows the step reads
                const bool q8k = kt == T_::kQ8_0 && D == 64;
                std::vector<float> o(size_t(H) * D, 0.0f), m(size_t(G) * N, 0.0f);
                cpu::AttentionProbe p;
                p.mass = m.data();
                cpu::attention(o.data(), q.data(), qpos.data(), T, H, kv, &p, scratch.data(), Activations::kInt8);
                std::vector<double> want_mass(size_t(G) * N, 0.0);
                for (int h = 0; h < H; ++h) {
                  const int g = h / (H / G);
                  std::vector<float> q8(q.begin() + h * D, q.begin() + (h + 1) * D);
                  if (q8k) round_query_to_8_bits(q.data() + h * D, D, q8.data());
                  std::vector<double> e(N);
                  double mx = -1e300, sum = 0.0;
                  for (int j = 0; j < N; ++j) {
                    const size_t at = size_t(g) * cap + j;
                    const bool in_ring = ring_k && pos[at] >= newest + 1 - R && rpos[pos[at] % R] == pos[at];
                    double dot = 0.0;
                    for (int d = 0; d < D; ++d) dot += double(in_ring ? q[h * D + d] : q8[d]) * kf[at * D + d];
                    e[j] = dot / std::sqrt(double(D));
                    mx = std::max(mx, e[j]);
                  }
                  for (double& x : e) sum += (x = std::exp(x - mx));
                  for (int d = 0; d < D; ++d) {
                    double acc = 0.0;
                    for (int j = 0; j < N; ++j) acc += e[j] / sum * vf[(size_t(g) * cap + j) * D + d];
                    ASSERT_LE(std::abs(o[h * D + d] - acc), 2e-5 * (1.0 + std::abs(acc))) << where << " int8 dim " << d;
                  }
                  for (int j = 0; j < N; ++j) want_mass[size_t(g) * N + j] += e[j] / sum / (H / G);
                }
                for (size_t i = 0; i < m.size(); ++i) ASSERT_NEAR(m[i], want_mass[i], 2e-6) << where << " int8 mass";
                ++int8_cases;
              }
              ++cases;
            }
  EXPECT_EQ(cases, 4 * 2 * 4 * 3 * 2);  // pairs, D, (N, T) of (5, 1), (131, 1), (131, 17), (2053, 1), R, positions
  if (cpu::cpu_features().avx512vnni) {
    EXPECT_EQ(int8_cases, 4 * 2 * 3 * 3 * 2);
  }
  EXPECT_GT(ring_rows_read, 10000);  // the ring's rows were among those read, in every shape
}

// Greedy over a vocabulary-sized row (the lane-wise argmax): the first index of the largest
// logit, as std::max_element, with ties placed in every lane position and in the tail.
TEST(Sampler, GreedyOverAVocabularyTakesTheFirstLargest) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  SamplerConfig greedy;
  greedy.temperature = 0.0f;
  Sampler s(greedy);
  for (int V : {1, 5, 31, 32, 33, 1000, 49152, 49157}) {
    std::vector<float> x(static_cast<size_t>(V));
    for (auto& v : x) v = nd(rng);
    EXPECT_EQ(s.sample(x), std::max_element(x.begin(), x.end()) - x.begin()) << V;
    for (int first : {0, 7, V / 2, V - 1}) {  // a tie at the top: the lower index wins
      if (first >= V) continue;
      std::vector<float> y = x;
      y[first] = 100.0f;
      for (int j = first + 1; j < V; j += 13) y[j] = 100.0f;
      EXPECT_EQ(s.sample(y), first) << V << " first " << first;
    }
  }
}

TEST(Sampler, GreedyTopKMinPAndSeed) {
  std::vector<float> logits = {1.0f, 5.0f, 4.9f, -3.0f, 0.0f};
  SamplerConfig greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(Sampler(greedy).sample(logits), 1);
  SamplerConfig k1;
  k1.top_k = 1;
  k1.temperature = 1.0f;
  Sampler s1(k1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s1.sample(logits), 1);
  SamplerConfig mp;
  mp.temperature = 1.0f;
  mp.top_k = 0;
  mp.top_p = 1.0f;
  mp.min_p = 0.5f;  // only ids 1 and 2 are within half of the top probability
  Sampler s2(mp);
  std::set<int> seen;
  for (int i = 0; i < 500; ++i) seen.insert(s2.sample(logits));
  EXPECT_EQ(seen, (std::set<int>{1, 2}));
  SamplerConfig seeded;
  seeded.temperature = 1.5f;
  seeded.top_k = 0;
  seeded.min_p = 0.0f;
  seeded.seed = 42;
  Sampler a(seeded), b(seeded);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

// core/sample.h's top-k is the k largest logits with ties to the lower id, drawn in id order:
// of {3, 5, 5, 1, 5, 2} two are kept (ids 1 and 2, not 4), and a draw below the first's share
// picks id 1, above it id 2; with top-p on top, the shortest prefix in (q, id) order.
TEST(Sampler, TopKKeepsTheLargestLogitsTiesToTheLowerId) {
  const std::vector<float> logits = {3.0f, 5.0f, 5.0f, 1.0f, 5.0f, 2.0f};
  SampleScratch s;
  SampleParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  for (double u : {0.0, 0.2, 0.4999, 0.5001, 0.8, 0.999999}) {
    p.draw = u;
    SampleCut cut;
    EXPECT_EQ(sample_row(logits, p, s, &cut), u < 0.5 ? 1 : 2) << "draw " << u;
    EXPECT_TRUE(cut.top_k && cut.l_k == 5.0f && cut.id_k == 2);
  }
  p.top_k = 4;  // ids 0, 1, 2, 4; top-p 0.5 of their mass: the first two of (q, id) order, 1 and 2
  p.top_p = 0.5f;
  for (double u : {0.0, 0.3, 0.7, 0.999}) {
    p.draw = u;
    SampleCut cut;
    const int got = sample_row(logits, p, s, &cut);
    EXPECT_EQ(got, u < 0.5 ? 1 : 2) << "draw " << u;
    EXPECT_EQ(cut.id_tau, 2);
  }
}

// The sampler draws from exactly the tokens its cuts define (a reference that sorts the whole
// vocabulary, applies min-p and top-p over the probabilities and keeps the prefix), with their
// probabilities: top-p over a flat vocabulary (the kept prefix grown past its first 256 and 512
// candidates), min-p, both together, and no cut at all (drawn in id order, nothing sorted).
TEST(Sampler, DrawsFromTheTokensItsCutsDefine) {
  const int V = 8000;
  std::vector<float> logits(V);
  std::mt19937 rng(5);
  for (int i = 0; i < V; ++i) logits[i] = -0.004f * static_cast<float>((i * 7919) % V) + 0.01f * std::normal_distribution<float>()(rng);
  struct Cut {
    float top_p, min_p;
  };
  for (const Cut cut : {Cut{0.5f, 0.0f}, Cut{0.95f, 0.0f}, Cut{1.0f, 0.2f}, Cut{0.9f, 0.3f}, Cut{1.0f, 0.0f}}) {
    SamplerConfig c;
    c.temperature = 0.7f;
    c.top_k = 0;
    c.top_p = cut.top_p;
    c.min_p = cut.min_p;
    c.seed = 9;
    // the reference: every token sorted, probabilities, min-p then top-p on the sorted prefix
    std::vector<std::pair<double, int>> ref(V);
    for (int i = 0; i < V; ++i) ref[i] = {logits[i] / c.temperature, i};
    std::sort(ref.begin(), ref.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    const double mx = ref[0].first;
    double total = 0;
    for (auto& r : ref) total += (r.first = std::exp(r.first - mx));
    size_t keep = ref.size();
    if (c.min_p > 0) {
      keep = 1;
      while (keep < ref.size() && ref[keep].first >= c.min_p * ref[0].first) ++keep;
      total = 0;
      for (size_t i = 0; i < keep; ++i) total += ref[i].first;
    }
    if (c.top_p < 1) {
      double acc = 0;
      size_t k = 0;
      while (k < keep) {
        acc += ref[k++].first / total;
        if (acc >= c.top_p) break;
      }
      keep = k;
    }
    std::map<int, double> prob;
    double kept_mass = 0;
    for (size_t i = 0; i < keep; ++i) kept_mass += ref[i].first;
    for (size_t i = 0; i < keep; ++i) prob[ref[i].second] = ref[i].first / kept_mass;
    Sampler s(c);
    const int draws = 1000;
    std::map<int, int> seen;
    for (int d = 0; d < draws; ++d) ++seen[s.sample(logits)];
    for (const auto& [id, n] : seen) ASSERT_TRUE(prob.count(id)) << "top_p " << cut.top_p << " min_p " << cut.min_p << ": token " << id << " is cut";
    // the kept tokens' share of the draws: the 20 most likely ones within 4 standard deviations
    for (size_t i = 0; i < std::min<size_t>(20, keep); ++i) {
      const double p = prob[ref[i].second], got = static_cast<double>(seen[ref[i].second]) / draws;
      EXPECT_NEAR(got, p, 4 * std::sqrt(p * (1 - p) / draws) + 1e-3) << "top_p " << cut.top_p << " min_p " << cut.min_p << " rank " << i;
    }
    std::printf("top_p %.2f min_p %.2f: %zu tokens kept, %zu drawn\n", cut.top_p, cut.min_p, keep, seen.size());
  }
}

TEST(Sampler, RejectsBadSettings) {
  SamplerConfig c;
  c.temperature = -1.0f;
  EXPECT_THROW(validate(c), Error);
  c = {};
  c.top_p = 0.0f;
  EXPECT_THROW(validate(c), Error);
  c = {};
  c.min_p = 1.5f;
  EXPECT_THROW(validate(c), Error);
}

// The default thread count: a core's SMT siblings count once, cores of two packages with the same
// core_id apart, CPUs outside the list not at all, and a CPU without topology files as one core;
// on this machine between 1 and the usable CPUs.
TEST(CpuTopology, CountsPhysicalCoresOfTheUsableCpus) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("squeezekv_topology_" + std::to_string(::getpid()));
  fs::remove_all(root);
  // cpu0-3: package 0, cores 0 and 1, two threads each; cpu4-5: package 1, core 0, two threads;
  // cpu6: no topology files
  const int package[] = {0, 0, 0, 0, 1, 1}, core[] = {0, 1, 0, 1, 0, 0};
  for (int c = 0; c < 6; ++c) {
    const fs::path t = root / ("cpu" + std::to_string(c)) / "topology";
    fs::create_directories(t);
    std::ofstream(t / "physical_package_id") << package[c] << "\n";
    std::ofstream(t / "core_id") << core[c] << "\n";
  }
  fs::create_directories(root / "cpu6");
  const std::string dir = root.string();
  EXPECT_EQ(cpu::count_physical_cores({0, 1, 2, 3, 4, 5}, dir), 3);
  EXPECT_EQ(cpu::count_physical_cores({0, 2}, dir), 1);  // SMT siblings
  EXPECT_EQ(cpu::count_physical_cores({0, 4}, dir), 2);  // same core_id, two packages
  EXPECT_EQ(cpu::count_physical_cores({0, 1, 2, 3, 4, 5, 6}, dir), 4);
  EXPECT_EQ(cpu::count_physical_cores({}, dir), 1);
  fs::remove_all(root);
  const int n = cpu::default_threads();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, static_cast<int>(cpu::usable_cpus().size()));
  EXPECT_EQ(default_cpu_threads(), n);
}

}  // namespace
}  // namespace squeezekv
