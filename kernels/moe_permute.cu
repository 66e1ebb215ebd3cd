// Permutation of the MoE slots into the grouped GEMM's row layout (moe_stages.hpp, "The
// permuted layout"), and the gather of token rows into the permuted A operand.
//
// Small batches (T k <= kFusedMaxSlots) take one launch, permute_fused below; larger ones four,
// with the same results. Deterministic either way (no result depends on thread scheduling):
//   count_local_slots   slots of each local expert (atomic counts: order-free integers);
//                       slots of non-local experts get slot_to_row = -1 (EP skip)
//   build_row_offsets   one block: padded offsets (the block-wide exclusive scan permute_fused
//                       uses too), tile -> expert map,
//                       totals, row_to_slot = -1 for the unused rows past the last tile
//   scatter_slots       one block per local expert: stable compaction of its slots in
//                       ascending (t, j) order by warp ballots, padding rows -> -1
//   gather_rows         one block per slot: codes + scales of the slot's token into its row
//                       (slots of non-local experts and padding rows: nothing written)
// Host-sync free: the kernels size their work from device-side totals, the grids from the
// capacity bound (permute_capacity), so the whole MoE can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kScatterThreads = 256;
constexpr int kTileM = static_cast<int>(kGemmTileM);
constexpr int kFusedThreads = 1024;
constexpr int64_t kFusedMaxSlots = kFusedThreads;  // one slot per thread
constexpr int kFusedExpertsPerThread = static_cast<int>((kMaxExperts + kFusedThreads - 1) / kFusedThreads);

__global__ void count_local_slots_kernel(const int32_t* __restrict__ ids, int64_t slots, int32_t offset,
                                         int32_t local, int32_t* __restrict__ counts,
                                         int32_t* __restrict__ slot_to_row) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < slots;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t e = ids[i] - offset;
    if (e >= 0 && e < local) atomicAdd(counts + e, 1);
    else slot_to_row[i] = -1;
  }
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
__device__ void write_tile_map(const int32_t* tile_start, int32_t local, int64_t max_tiles, int32_t* tile_expert,
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
__device__ void scan_tiles(const int32_t* count, int32_t local, int32_t* tile_start, int32_t* row_offset,
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

// The offsets and the tile map from the counts of count_local_slots.
__global__ void __launch_bounds__(kFusedThreads)
    build_row_offsets_kernel(const int32_t* __restrict__ counts, int32_t local, int64_t max_tiles,
                             int32_t* __restrict__ row_offset, int32_t* __restrict__ tile_expert,
                             int32_t* __restrict__ row_to_slot, int32_t* __restrict__ totals) {
  extern __shared__ int32_t tile_start[];  // [local + 1]
  scan_tiles(counts, local, tile_start, row_offset, totals);
  write_tile_map(tile_start, local, max_tiles, tile_expert, row_to_slot);
}

__global__ void __launch_bounds__(kScatterThreads)
    scatter_slots_kernel(const int32_t* __restrict__ ids, int64_t slots, int32_t offset,
                         const int32_t* __restrict__ counts, const int32_t* __restrict__ row_offset,
                         int32_t* __restrict__ slot_to_row, int32_t* __restrict__ row_to_slot) {
  __shared__ int32_t warp_count[kScatterThreads / 32];
  const int32_t e = blockIdx.x;
  const int32_t expert = offset + e;
  const int32_t base = row_offset[e];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int32_t running = 0;
  for (int64_t chunk = 0; chunk < slots; chunk += kScatterThreads) {
    const int64_t i = chunk + threadIdx.x;
    const bool mine = i < slots && ids[i] == expert;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int32_t before = 0, total = 0;
    for (int w = 0; w < kScatterThreads / 32; ++w) {
      before += w < warp ? warp_count[w] : 0;
      total += warp_count[w];
    }
    if (mine) {
      const int32_t row = base + running + before + __popc(ballot & ((1u << lane) - 1u));
      slot_to_row[i] = row;
      row_to_slot[row] = static_cast<int32_t>(i);
    }
    running += total;
    __syncthreads();  // warp_count is rewritten by the next chunk
  }
  const int32_t padded_end = row_offset[e + 1];
  for (int32_t r = base + counts[e] + threadIdx.x; r < padded_end; r += kScatterThreads) row_to_slot[r] = -1;
}

// The whole plan in one block, for T k <= kFusedMaxSlots: counts (shared-memory atomics on
// integers), the padded offsets by a block-wide exclusive scan of the tile counts, the tile map,
// then each slot's row = its expert's first row + the number of earlier slots of that expert
// (O(slots) per thread: at most 1024 comparisons), which is the multi-launch path's stable order.
__global__ void __launch_bounds__(kFusedThreads)
    permute_fused_kernel(const int32_t* __restrict__ ids, int32_t slots, int32_t offset, int32_t local,
                         int64_t max_tiles, int32_t* __restrict__ expert_count, int32_t* __restrict__ row_offset,
                         int32_t* __restrict__ tile_expert, int32_t* __restrict__ slot_to_row,
                         int32_t* __restrict__ row_to_slot, int32_t* __restrict__ totals) {
  extern __shared__ int32_t fused_smem[];
  int32_t* count = fused_smem;              // [local]
  int32_t* tile_start = count + local;      // [local + 1]
  int32_t* expert_of = tile_start + local + 1;  // [slots]: local expert of each slot, -1 if not local
  const int tid = threadIdx.x;

  // Counts
  for (int32_t e = tid; e < local; e += kFusedThreads) count[e] = 0;
  __syncthreads();
  if (tid < slots) {
    const int32_t e = ids[tid] - offset;
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

__global__ void gather_rows_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales,
                                   bool transposed, int64_t tokens, int64_t hidden, int64_t top_k,
                                   const int32_t* __restrict__ slot_to_row, uint8_t* __restrict__ a_codes,
                                   float* __restrict__ a_scales) {
  const int64_t slot = blockIdx.x;
  const int32_t r = slot_to_row[slot];
  if (r < 0) return;  // a non-local expert's slot
  const int64_t t = slot / top_k, groups = hidden / kScaleBlock;
  const uint4* src = reinterpret_cast<const uint4*>(codes + t * hidden);
  uint4* dst = reinterpret_cast<uint4*>(a_codes + r * hidden);
  for (int64_t i = threadIdx.x; i < hidden / 16; i += blockDim.x) dst[i] = src[i];
  float* dst_scale = a_scales + r * groups;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x)
    dst_scale[g] = transposed ? scales[g * tokens + t] : scales[t * groups + g];
}

}  // namespace

PermuteCapacity permute_capacity(int64_t tokens, int64_t top_k, int64_t local_experts) {
  PermuteCapacity c;
  const int64_t slots = tokens * top_k;
  // Each non-empty expert wastes at most kGemmTileM - 1 rows; at most min(E_local, slots) are
  // non-empty: tiles = sum ceil(c_e / M) <= (slots + nonempty * (M - 1)) / M.
  const int64_t nonempty = std::min(local_experts, slots);
  c.max_tiles = std::max<int64_t>(1, (slots + nonempty * (kGemmTileM - 1)) / kGemmTileM);
  c.max_rows = c.max_tiles * kGemmTileM;
  return c;
}

void launch_moe_permute(const int32_t* topk_ids, int64_t tokens, int64_t top_k, int64_t local_expert_offset,
                        int64_t local_experts, const PermuteCapacity& cap, const PermutePlan& plan,
                        cudaStream_t stream) {
  const char* who = "moe_permute";
  require(tokens >= 0 && top_k >= 1 && tokens * top_k <= 0x7FFFFFFF, who, "T * top_k must fit in int32");
  require(local_experts >= 1 && local_experts <= kMaxExperts, who,
          "local_num_experts must be in [1, " + std::to_string(kMaxExperts) + "]");
  require(local_expert_offset >= 0 && local_expert_offset + local_experts <= 0x7FFFFFFF, who,
          "local_expert_offset out of range");
  const PermuteCapacity need = permute_capacity(tokens, top_k, local_experts);
  require(cap.max_tiles >= need.max_tiles && cap.max_rows == cap.max_tiles * kGemmTileM, who,
          "capacity smaller than permute_capacity(T, k, E_local)");
  require_ptr(plan.expert_count, who, "expert_count", 4);
  require_ptr(plan.row_offset, who, "row_offset", 4);
  require_ptr(plan.tile_expert, who, "tile_expert", 4);
  require_ptr(plan.row_to_slot, who, "row_to_slot", 4);
  require_ptr(plan.totals, who, "totals", 4);
  const int64_t slots = tokens * top_k;
  if (slots > 0) {
    require_ptr(topk_ids, who, "topk_ids", 4);
    require_ptr(plan.slot_to_row, who, "slot_to_row", 4);
  }
  const auto local = static_cast<int32_t>(local_experts);
  const auto offset = static_cast<int32_t>(local_expert_offset);

  if (slots <= kFusedMaxSlots) {
    const size_t smem = sizeof(int32_t) * static_cast<size_t>(2 * local_experts + 1 + slots);
    permute_fused_kernel<<<1, kFusedThreads, smem, stream>>>(topk_ids, static_cast<int32_t>(slots), offset, local,
                                                             cap.max_tiles, plan.expert_count, plan.row_offset,
                                                             plan.tile_expert, plan.slot_to_row, plan.row_to_slot,
                                                             plan.totals);
    MOECHECK_CUDA_CHECK_LAUNCH("permute_fused_kernel");
    return;
  }
  MOECHECK_CUDA_CHECK(cudaMemsetAsync(plan.expert_count, 0, sizeof(int32_t) * local_experts, stream));
  if (slots > 0) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((slots + 255) / 256, 4096));
    count_local_slots_kernel<<<blocks, 256, 0, stream>>>(topk_ids, slots, offset, local, plan.expert_count,
                                                          plan.slot_to_row);
    MOECHECK_CUDA_CHECK_LAUNCH("count_local_slots_kernel");
  }
  build_row_offsets_kernel<<<1, kFusedThreads, sizeof(int32_t) * (local_experts + 1), stream>>>(
      plan.expert_count, local, cap.max_tiles, plan.row_offset, plan.tile_expert, plan.row_to_slot, plan.totals);
  MOECHECK_CUDA_CHECK_LAUNCH("build_row_offsets_kernel");
  scatter_slots_kernel<<<static_cast<unsigned>(local), kScatterThreads, 0, stream>>>(
      topk_ids, slots, offset, plan.expert_count, plan.row_offset, plan.slot_to_row, plan.row_to_slot);
  MOECHECK_CUDA_CHECK_LAUNCH("scatter_slots_kernel");
}

void launch_gather_rows(const uint8_t* codes, const float* scales, ScaleLayout scale_layout, int64_t tokens,
                        int64_t hidden, int64_t top_k, const PermutePlan& plan, uint8_t* a_codes,
                        float* a_scales, cudaStream_t stream) {
  const char* who = "gather_rows";
  require(hidden > 0 && hidden % kScaleBlock == 0, who, "hidden size must be a positive multiple of 128");
  require(tokens >= 0 && top_k >= 1, who, "need tokens >= 0 and top_k >= 1");
  require_ptr(a_codes, who, "a_codes", 16);
  require_ptr(a_scales, who, "a_scales", 4);
  if (tokens == 0) return;
  require_ptr(plan.slot_to_row, who, "slot_to_row", 4);
  require_ptr(codes, who, "hidden codes", 16);
  require_ptr(scales, who, "hidden scales", 4);
  gather_rows_kernel<<<grid_x(tokens * top_k, who), 128, 0, stream>>>(
      codes, scales, scale_layout == ScaleLayout::transposed, tokens, hidden, top_k, plan.slot_to_row, a_codes,
      a_scales);
  MOECHECK_CUDA_CHECK_LAUNCH("gather_rows_kernel");
}

}  // namespace moecheck::kernels
