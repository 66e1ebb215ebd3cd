// The one-block permutation (device code), shared by the permutation stage (moe_permute.cu) and
// the one-launch prologue of small batches (moe_prologue.cu). The plan it writes: moe_stages.hpp,
// "The permuted layout".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/moe_stages.hpp"

namespace moecheck::kernels::permute {

constexpr int kTileM = static_cast<int>(kGemmTileM);
constexpr int kFusedThreads = 1024;
constexpr int64_t kFusedMaxSlots = kFusedThreads;  // one slot per thread
constexpr int kFusedExpertsPerThread = static_cast<int>((kMaxExperts + kFusedThreads - 1) / kFusedThreads);

// Host side: throws std::invalid_argument naming `who` unless the sizes are in range, the
// capacity holds permute_capacity(T, k, E_local) and the plan's arrays are given (moe_permute.cu).
void require_permute_args(const char* who, const int32_t* topk_ids, int64_t tokens, int64_t top_k,
                          int64_t local_expert_offset, int64_t local_experts, const PermuteCapacity& cap,
                          const PermutePlan& plan);

// Shared memory permute_block takes: count [local], tile_start [local + 1], expert_of [slots].
inline size_t permute_block_smem_bytes(int64_t local, int64_t slots) {
  return sizeof(int32_t) * static_cast<size_t>(2 * local + 1 + slots);
}

// The last expert whose first tile (or row, with unit kTileM) is <= t: the one holding it, since
// empty experts share the next one's start. Invariant: start[lo] <= t < start[local].
__device__ __forceinline__ int32_t expert_at(const int32_t* start, int32_t local, int64_t t, int64_t unit) {
  int32_t lo = 0, hi = local;
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(start[mid]) * unit <= t) lo = mid;
    else hi = mid;
  }
  return lo;
}

// By the whole block, from the tile starts of every expert: tile_expert (-1 past the last tile)
// and row_to_slot = -1 for the rows past the last tile.
__device__ __forceinline__ void write_tile_map(const int32_t* tile_start, int32_t local, int64_t max_tiles, int32_t* tile_expert,
                               int32_t* row_to_slot) {
  const int32_t tiles = tile_start[local];
  for (int64_t t = threadIdx.x; t < max_tiles; t += blockDim.x)
    tile_expert[t] = t < tiles ? expert_at(tile_start, local, t, 1) : -1;
  for (int64_t r = static_cast<int64_t>(tiles) * kTileM + threadIdx.x; r < max_tiles * kTileM; r += blockDim.x)
    row_to_slot[r] = -1;
}

// By the whole block (kFusedThreads threads): the exclusive scan of the tiles per expert,
// kFusedExpertsPerThread consecutive experts per thread (a warp scan, then the warps' sums), into
// tile_start [local + 1] (shared memory), row_offset [local + 1] and totals (rows, tiles).
__device__ __forceinline__ void scan_tiles(const int32_t* count, int32_t local, int32_t* tile_start, int32_t* row_offset,
                           int32_t* totals) {
  __shared__ int32_t warp_sum[kFusedThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t e0 = tid * kFusedExpertsPerThread;
  int32_t mine = 0;
  for (int i = 0; i < kFusedExpertsPerThread; ++i)
    if (e0 + i < local) mine += (count[e0 + i] + kTileM - 1) / kTileM;
  int32_t incl = mine;  // inclusive scan within the warp
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  if (lane == 31) warp_sum[warp] = incl;
  __syncthreads();
  int32_t before = incl - mine;
  for (int w = 0; w < warp; ++w) before += warp_sum[w];
  for (int i = 0; i < kFusedExpertsPerThread; ++i) {
    const int32_t e = e0 + i;
    if (e >= local) break;
    tile_start[e] = before;
    row_offset[e] = before * kTileM;
    before += (count[e] + kTileM - 1) / kTileM;
  }
  if (e0 < local && e0 + kFusedExpertsPerThread >= local) {  // the thread holding the last expert
    tile_start[local] = before;
    row_offset[local] = before * kTileM;
    totals[0] = before * kTileM;
    totals[1] = before;
  }
  __syncthreads();
}

// The whole plan in one block of kFusedThreads threads, for T k <= kFusedMaxSlots: counts
// (shared-memory atomics on integers), the padded offsets by a block-wide exclusive scan of the
// tile counts, the tile map, then each slot's row = its expert's first row + the number of earlier
// slots of that expert (O(slots) per thread: at most 1024 comparisons), which is the multi-launch
// path's stable order. smem: permute_block_smem_bytes. ids may have been written earlier in the
// same launch by this block (behind a barrier): they are read through L2, never the read-only path.
__device__ __forceinline__ void permute_block(const int32_t* ids, int32_t slots, int32_t offset, int32_t local,
                                              int64_t max_tiles, int32_t* smem, const PermutePlan& plan) {
  int32_t* expert_count = plan.expert_count;
  int32_t* row_offset = plan.row_offset;
  int32_t* tile_expert = plan.tile_expert;
  int32_t* slot_to_row = plan.slot_to_row;
  int32_t* row_to_slot = plan.row_to_slot;
  int32_t* totals = plan.totals;
  int32_t* count = smem;                    // [local]
  int32_t* tile_start = count + local;      // [local + 1]
  int32_t* expert_of = tile_start + local + 1;  // [slots]: local expert of each slot, -1 if not local
  const int tid = threadIdx.x;

  // Counts
  for (int32_t e = tid; e < local; e += kFusedThreads) count[e] = 0;
  __syncthreads();
  if (tid < slots) {
    const int32_t e = __ldcg(ids + tid) - offset;  // L2: the prologue writes ids in the same launch
    const bool mine = e >= 0 && e < local;
    expert_of[tid] = mine ? e : -1;
    if (mine) atomicAdd(count + e, 1);
    else slot_to_row[tid] = -1;
  }
  __syncthreads();

  scan_tiles(count, local, tile_start, row_offset, totals);
  for (int32_t e = tid; e < local; e += kFusedThreads) expert_count[e] = count[e];

  write_tile_map(tile_start, local, max_tiles, tile_expert, row_to_slot);
  const int32_t tiles = tile_start[local];

  // Slots to rows, then each expert's padding rows
  if (tid < slots && expert_of[tid] >= 0) {
    const int32_t e = expert_of[tid];
    int32_t rank = 0;
    for (int32_t j = 0; j < tid; ++j) rank += expert_of[j] == e;
    const int32_t row = tile_start[e] * kTileM + rank;
    slot_to_row[tid] = row;
    row_to_slot[row] = tid;
  }
  for (int64_t r = tid; r < static_cast<int64_t>(tiles) * kTileM; r += kFusedThreads) {
    const int32_t e = expert_at(tile_start, local, r, kTileM);
    if (r - static_cast<int64_t>(tile_start[e]) * kTileM >= count[e]) row_to_slot[r] = -1;
  }
}


}  // namespace moecheck::kernels::permute
