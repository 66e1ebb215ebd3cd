// Permutation of the MoE slots into the grouped GEMM's row layout (moe_stages.hpp, "The
// permuted layout"), and the gather of token rows into the permuted A operand.
//
// Small batches (T k <= kFusedMaxSlots) take one launch, one block running permute_block
// (moe_permute.cuh); larger ones four, with the same results. Deterministic either way (no result depends on thread scheduling):
//   count_local_slots   slots of each local expert (atomic counts: order-free integers);
//                       slots of non-local experts get slot_to_row = -1 (EP skip)
//   build_row_offsets   one block: padded offsets (the block-wide exclusive scan permute_block
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
#include "kernels/dependent_launch.cuh"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_permute.cuh"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

using namespace permute;

constexpr int kScatterThreads = 256;

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

__global__ void __launch_bounds__(kFusedThreads)
    permute_fused_kernel(const int32_t* __restrict__ ids, int32_t slots, int32_t offset, int32_t local,
                         int64_t max_tiles, PermutePlan plan) {
  extern __shared__ int32_t fused_smem[];
  permute_block(ids, slots, offset, local, max_tiles, fused_smem, plan);
}

__global__ void gather_rows_kernel(const uint8_t* __restrict__ codes, const float* __restrict__ scales,
                                   bool transposed, int64_t tokens, int64_t hidden, int64_t top_k,
                                   const int32_t* __restrict__ slot_to_row, uint8_t* __restrict__ a_codes,
                                   float* __restrict__ a_scales) {
  wait_for_previous_grid();  // first: dependent_launch.cuh
  let_dependents_start();
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

// The host-side contract of a permutation (the stage's launch and the prologue's): sizes in
// range, a capacity of at least permute_capacity(T, k, E_local), the plan's arrays given.
void permute::require_permute_args(const char* who, const int32_t* topk_ids, int64_t tokens, int64_t top_k,
                                   int64_t local_expert_offset, int64_t local_experts, const PermuteCapacity& cap,
                                   const PermutePlan& plan) {
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
  if (tokens * top_k > 0) {
    require_ptr(topk_ids, who, "topk_ids", 4);
    require_ptr(plan.slot_to_row, who, "slot_to_row", 4);
  }
}

void launch_moe_permute(const int32_t* topk_ids, int64_t tokens, int64_t top_k, int64_t local_expert_offset,
                        int64_t local_experts, const PermuteCapacity& cap, const PermutePlan& plan,
                        cudaStream_t stream) {
  const char* who = "moe_permute";
  permute::require_permute_args(who, topk_ids, tokens, top_k, local_expert_offset, local_experts, cap, plan);
  const int64_t slots = tokens * top_k;
  const auto local = static_cast<int32_t>(local_experts);
  const auto offset = static_cast<int32_t>(local_expert_offset);

  if (slots <= kFusedMaxSlots) {
    const size_t smem = permute_block_smem_bytes(local_experts, slots);
    permute_fused_kernel<<<1, kFusedThreads, smem, stream>>>(topk_ids, static_cast<int32_t>(slots), offset, local,
                                                             cap.max_tiles, plan);
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
  launch_dependent("gather_rows_kernel", gather_rows_kernel, grid_x(tokens * top_k, who), 128, 0, stream,
                   codes, scales, scale_layout == ScaleLayout::transposed, tokens, hidden, top_k,
                   static_cast<const int32_t*>(plan.slot_to_row), a_codes, a_scales);
}

}  // namespace moecheck::kernels
