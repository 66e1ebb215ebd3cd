// The order in which the grouped GEMM's schedules visit (M tile, N tile) pairs, shared by both
// (sm90_fp8_grouped_gemm_1d2d.cu, sm90_fp8_grouped_gemm_1d2d_large.cu), and which rows of a tile
// they store.
//
// Work item i of n_tiles N tiles per M tile: without the permutation plan, M tile i / n_tiles
// and N tile i % n_tiles (N fastest). With the plan, expert e's items occupy
// [R_e n_tiles, (R_e + m_e) n_tiles), R_e = row_offset[e] / kGemmTileM its first M tile and m_e
// its tile count, and inside that range the M tiles run fastest: the items in flight together
// read the same weight panel at about the same time, so DRAM sees each expert's weights about
// once while its few activation tiles stay in L2. The expert of item i is
// tile_expert[i / n_tiles] in either order (negative: past the last tile of this routing).
#pragma once

#include <cstdint>

#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

struct GemmItem {
  int64_t tile, n_tile;
  int32_t expert;
};

__device__ __forceinline__ GemmItem gemm_item(const int32_t* tile_expert, const int32_t* row_offset, int64_t i,
                                              int64_t n_tiles) {
  const int64_t t0 = i / n_tiles;
  const int32_t e = tile_expert[t0];
  if (e < 0 || row_offset == nullptr) return {t0, i % n_tiles, e};
  const int64_t first = row_offset[e] / kGemmTileM, tiles = (row_offset[e + 1] - row_offset[e]) / kGemmTileM;
  const int64_t local = i - first * n_tiles;
  return {first + local % tiles, local / tiles, e};
}

// Rows of M tile `tile` (of expert e) that hold routed slots, 0 to kGemmTileM; the rest are
// padding, which no schedule stores. Without the plan's counts every row of the tile counts.
__device__ __forceinline__ int routed_rows(const int32_t* row_offset, const int32_t* expert_count, int64_t tile,
                                           int32_t e) {
  if (row_offset == nullptr || expert_count == nullptr) return static_cast<int>(kGemmTileM);
  const int64_t rows = static_cast<int64_t>(expert_count[e]) - (tile * kGemmTileM - row_offset[e]);
  return rows <= 0 ? 0 : (rows >= kGemmTileM ? static_cast<int>(kGemmTileM) : static_cast<int>(rows));
}

}  // namespace moecheck::kernels
