// The prompt matrix kernel for BF16 weights on CPUs with AMX tiles (Intel Xeon since Sapphire
// Rapids; chosen at run time, this file alone compiled with -mamx-tile -mamx-bf16): one tdpbf16ps
// multiplies a 16 x 32 bf16 tile of activations by 32 x 16 bf16 weights into 16 x 16 f32 sums,
// 8x the pairs of one vdpbf16ps. Raw pointers and intrinsics only, as gemm_bf16.cc.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/gemm_avx512.h"

namespace squeezekv::cpu::amx {
namespace {

// The tile palette (Intel SDM, LDTILECFG): palette 1, each tile's rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: f32 sums [tokens][16 weight rows] for tokens t..t+16 / t+16..t+32 by weight rows
// 0..16 / 16..32; 4-5: activations [tokens][16 pairs]; 6-7: weights [16 pairs][16 rows' pairs].
// 64 bytes a row; 16 rows, but `tokens` in the sums' and activations' tiles (the last < 16).
void configure(int tokens) {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.colsb[i] = 64, cfg.rows[i] = static_cast<uint8_t>(i < 6 ? tokens : 16);
  _tile_loadconfig(&cfg);
}

}  // namespace

bool available() { return cpu_features().amx_bf16; }

bool gemm_bf16_panel32(float* out, int64_t ldo, const uint32_t* x, int64_t T, int64_t P, const uint32_t* panel) {
  if (P % 16 != 0) return false;
  // GCC's tile intrinsics are asm statements that name no memory: barriers so that every store
  // to x and panel lands before the tile loads, and nothing reads out before the tile stores
  asm volatile("" ::: "memory");
  const long xs = static_cast<long>(P) * 4, os = static_cast<long>(ldo) * 4, ps = 32 * 4;
  int64_t t = 0;
  if (T >= 32) configure(16);
  for (; t + 32 <= T; t += 32) {  // 32 tokens: four sums tiles
    const uint32_t* x0 = x + t * P;
    const uint32_t* x1 = x0 + 16 * P;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t p = 0; p < P; p += 16) {
      _tile_loadd(4, x0 + p, xs);
      _tile_loadd(5, x1 + p, xs);
      _tile_loadd(6, panel + p * 32, ps);
      _tile_loadd(7, panel + p * 32 + 16, ps);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out + t * ldo, os);
    _tile_stored(1, out + t * ldo + 16, os);
    _tile_stored(2, out + (t + 16) * ldo, os);
    _tile_stored(3, out + (t + 16) * ldo + 16, os);
  }
  while (t < T) {  // 16 tokens, then the 1-15 left: tiles of that many rows, the same sums a row
    const int n = static_cast<int>(T - t < 16 ? T - t : 16);
    configure(n);
    const uint32_t* x0 = x + t * P;
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t p = 0; p < P; p += 16) {
      _tile_loadd(4, x0 + p, xs);
      _tile_loadd(6, panel + p * 32, ps);
      _tile_loadd(7, panel + p * 32 + 16, ps);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
    }
    _tile_stored(0, out + t * ldo, os);
    _tile_stored(1, out + t * ldo + 16, os);
    t += n;
  }
  _tile_release();  // the thread's tile state back to init: no 8 KB saved at each switch
  asm volatile("" ::: "memory");
  return true;
}

}  // namespace squeezekv::cpu::amx
