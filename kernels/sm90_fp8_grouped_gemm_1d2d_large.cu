// The grouped FP8 GEMM's large_batch schedule (moe_stages.hpp, GemmSchedule): the same contract
// and bits as sm90_fp8_grouped_gemm_1d2d.cu (read its header for the arithmetic), with the roles
// of the operands swapped for batches that fill the tensor cores.
//
//   D[r, n] = round_out( sum_b fl32(sa[r, b] * sb[e, n/128, b]) * p_b[r, n] )
//   p_b     = 4 chained m64n128k32 wgmma instructions over K block b, the first from zero;
//             promotion acc = __fmaf_rn(__fmul_rn(sa, sb), p_b, acc), blocks ascending.
//
// Tiling: a work item is one M tile of 64 permuted rows of one expert (wgmma's M, the activations
// as A) and two N tiles of 128 weight columns (one weight-scale block each, wgmma's N = 128, the
// weights as B). Each of the two warpgroups owns one N tile: 64 accumulators and 64 block sums
// per thread. Per k32 instruction a warpgroup reads 2 KiB of A and 4 KiB of B from shared memory
// for 262144 products, 96 bytes per cycle at the tensor cores' rate against 128 for the
// small_batch tiling (docs/bench/CUDA-GEMM-NOTES.md, which also has the measurements of a
// variant with two M tiles per item, slower on the H100 and removed).
//
// Pipeline: kStages shared-memory stages, each filled by one TMA copy of the activations' box
// (the tensor map's 128-byte swizzle is the layout wgmma reads) and one bulk copy per 16 KiB
// weight block tile (WeightLayout::block_tiles, already swizzled), all completing on the stage's
// `full` mbarrier. A warpgroup waits on `full`, runs and waits for its instructions, promotes
// (while the other warpgroup's instructions run), and each of its warps arrives on the stage's
// `empty` mbarrier. Thread 0 issues the copies (Feed), kStages - 1 blocks ahead: a
// separate producer warp would be a ninth warp, and three warps on one SM sub-partition cap a
// thread at 168 registers. No CTA-wide barrier after the set-up.
//
// Persistent: one CTA per SM walks work items i = blockIdx.x, + gridDim.x, ... in the order of
// grouped_gemm_order.cuh, so the copies of the next item's blocks overlap the last item's
// output, which goes straight from registers to D (8-byte stores: whole 32-byte sectors).
//
// NOTES:
//  - An item whose second N tile is past N (N/128 odd): one weight tile is copied, and the second
//    warpgroup keeps the barrier protocol (waits on full, arrives on empty) without computing or
//    storing, so the barriers' counts never depend on the item.
//  - All 64 rows of a tile are computed, padding rows too (any codes and scales, NaN included:
//    rows never mix); with the plan's row_offset and expert_count, only the routed rows (below
//    the expert's count) are stored, as in the small_batch schedule.
#include <cuda.h>  // CUtensorMap and its enums only; the encoder comes through the runtime
#include <cuda_runtime.h>

#include <cuda_bf16.h>

#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/grouped_gemm_order.cuh"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"
#include "kernels/sm90_wgmma.cuh"

namespace moecheck::kernels {

namespace {

using namespace sm90;

constexpr int kRows = static_cast<int>(kGemmTileM);    // 64: wgmma M
constexpr int kCols = static_cast<int>(kGemmTileN);    // 128 per warpgroup: wgmma N
constexpr int kBlockK = static_cast<int>(kScaleBlock); // 128
constexpr int kConsumerWarps = 8;
constexpr int kThreads = 32 * kConsumerWarps;
constexpr int kStages = 5;
constexpr int kActBytes = kRows * kBlockK;             // 8 KiB
constexpr int kWeightBytes = kCols * kBlockK;          // 16 KiB per N tile
constexpr int kStageBytes = kActBytes + 2 * kWeightBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 1024 + 2 * kStages * 8;  // + atom alignment, barriers
static_assert(kStageBytes % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");
static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");

struct LargeParams {
  const float* a_scale;
  const uint8_t* b;  // block tiles
  const float* b_scale;
  const int32_t* tile_expert;
  const int32_t* row_offset;  // optional, with expert_count: rows stored per tile
  const int32_t* expert_count;
  int64_t max_tiles, n, k, experts;
  float* d;
  bool bf16_out;
};

// Items of this launch: the plan's used tiles (row_offset[E] rows), else every tile, times the
// N-tile pairs. Item i is (M tile, N pair) in the order of grouped_gemm_order.cuh.
__device__ __forceinline__ int64_t item_count(const LargeParams& p, int64_t n_pairs) {
  const int64_t tiles = p.row_offset != nullptr ? p.row_offset[p.experts] / kRows : p.max_tiles;
  return tiles * n_pairs;
}

// The copies into the stages, issued by thread 0 (a consumer thread too): a cursor over this
// CTA's work items and their K blocks, in the consumers' order. fill() copies the next K block
// into stage `it % kStages` once both warpgroups have released it (mbarrier `empty`); the copies
// complete on `full`. Thread 0 calls it once per block it consumes, so the copies run a fixed
// number of blocks ahead, across item boundaries.
struct Feed {
  const LargeParams& p;
  const CUtensorMap* act_map;
  uint32_t stages, bars;  // shared addresses: stage 0, full[0]
  int64_t k_blocks, n_tiles, n_pairs, items;
  int64_t i = 0, kb = 0;
  uint32_t it = 0;
  GemmItem w{};
  bool valid = false;

  __device__ Feed(const LargeParams& p_, const CUtensorMap* map, uint32_t stages_, uint32_t bars_)
      : p(p_), act_map(map), stages(stages_), bars(bars_), k_blocks(p_.k / kBlockK), n_tiles(p_.n / kCols),
        n_pairs((n_tiles + 1) / 2), items(item_count(p_, n_pairs)), i(static_cast<int64_t>(blockIdx.x) - gridDim.x) {
    next_item();
  }
  __device__ void next_item() {
    valid = false;
    for (i += gridDim.x; i < items; i += gridDim.x) {
      w = gemm_item(p.tile_expert, p.row_offset, i, n_pairs);
      if (w.expert >= 0) {
        valid = true, kb = 0;
        return;
      }
    }
  }
  __device__ void fill() {
    if (!valid) return;
    const int64_t n_tile = 2 * w.n_tile;
    const bool second_n = n_tile + 1 < n_tiles;
    const uint8_t* panel = p.b + (static_cast<int64_t>(w.expert) * n_tiles + n_tile) * k_blocks * kWeightBytes;
    const uint32_t bytes = kActBytes + (second_n ? 2 : 1) * kWeightBytes;
    const uint32_t s = it % kStages, phase = (it / kStages) & 1;
    const uint32_t full = bars + 8 * s, empty = bars + 8 * (kStages + s), st = stages + s * kStageBytes;
    mbarrier_wait(empty, phase ^ 1);
    mbarrier_arrive_expect_tx(full, bytes);
    tensor_copy_2d_g2s(st, act_map, static_cast<int32_t>(kb * kBlockK), static_cast<int32_t>(w.tile * kRows), full);
    bulk_copy_g2s(st + kActBytes, panel + kb * kWeightBytes, kWeightBytes, full);
    if (second_n)
      bulk_copy_g2s(st + kActBytes + kWeightBytes, panel + (k_blocks + kb) * kWeightBytes, kWeightBytes, full);
    ++it;
    if (++kb == k_blocks) next_item();
  }
};

// acc += fl32(sa * sb) * part, per row of the fragment (sm90_wgmma.cuh): part[4j], part[4j+1]
// are row r0, columns 8j + 2t, +1; part[4j+2], part[4j+3] row r0 + 8.
__device__ __forceinline__ void promote(float (&acc)[kCols / 2], const float (&part)[kCols / 2], float sa0, float sa1,
                                        float sb) {
  const float s0 = __fmul_rn(sa0, sb), s1 = __fmul_rn(sa1, sb);
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    acc[4 * j + 0] = __fmaf_rn(s0, part[4 * j + 0], acc[4 * j + 0]);
    acc[4 * j + 1] = __fmaf_rn(s0, part[4 * j + 1], acc[4 * j + 1]);
    acc[4 * j + 2] = __fmaf_rn(s1, part[4 * j + 2], acc[4 * j + 2]);
    acc[4 * j + 3] = __fmaf_rn(s1, part[4 * j + 3], acc[4 * j + 3]);
  }
}

// Rows r0 and r0 + 8 of the fragment, rounded to the output precision, to D (8-byte stores),
// each only if routed (r < stored).
__device__ __forceinline__ void store_rows(const LargeParams& p, const float (&acc)[kCols / 2], float* g_d, int r0,
                                           int stored) {
  const bool first = r0 < stored, second = r0 + 8 < stored;
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
    float v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = p.bf16_out ? __bfloat162float(__float2bfloat16_rn(acc[4 * j + q])) : acc[4 * j + q];
    if (first) *reinterpret_cast<float2*>(g_d + 8 * j) = make_float2(v[0], v[1]);
    if (second) *reinterpret_cast<float2*>(g_d + 8 * p.n + 8 * j) = make_float2(v[2], v[3]);
  }
}

__device__ void consume(const LargeParams& p, const CUtensorMap* act_map, uint8_t* smem, uint32_t bars) {
  const int64_t k_blocks = p.k / kBlockK, n_tiles = p.n / kCols, n_pairs = (n_tiles + 1) / 2;
  const int64_t items = item_count(p, n_pairs);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int r0 = 16 * warp + (lane >> 2);  // this thread's rows of the M tile: r0 and r0 + 8
  const int c0 = 2 * (lane & 3);           // and its first column of each 8
  Feed feed(p, act_map, smem_addr(smem), bars);  // used by thread 0 only
  // kStages - 1 blocks ahead: the stage refilled after block it is block it - 1's, which the
  // other warpgroup has most likely left by then, so thread 0 seldom waits for it (refilling the
  // stage just left would hold warpgroup 0 until warpgroup 1 had promoted the same block).
  if (tid == 0)
    for (int s = 0; s < kStages - 1; ++s) feed.fill();
  __syncwarp();
  uint32_t it = 0;
  for (int64_t i = blockIdx.x; i < items; i += gridDim.x) {
    const GemmItem w = gemm_item(p.tile_expert, p.row_offset, i, n_pairs);
    if (w.expert < 0) continue;
    const int64_t n_tile = 2 * w.n_tile + wg;
    const bool active = n_tile < n_tiles;
    const int64_t row0 = w.tile * kRows;
    const float* g_sa = p.a_scale + (row0 + r0) * k_blocks;  // rows r0 and r0 + 8
    const int64_t sa_step = 8 * k_blocks;
    const float* g_sb = p.b_scale + (static_cast<int64_t>(w.expert) * n_tiles + (active ? n_tile : 0)) * k_blocks;

    float acc[kCols / 2], part[kCols / 2];
#pragma unroll
    for (int j = 0; j < kCols / 2; ++j) acc[j] = 0.0f;
    for (int64_t kb = 0; kb < k_blocks; ++kb, ++it) {
      const float sb = __ldg(g_sb + kb), sa0 = __ldg(g_sa + kb), sa1 = __ldg(g_sa + sa_step + kb);
      const uint32_t s = it % kStages, phase = (it / kStages) & 1;
      const uint32_t st = smem_addr(smem + s * kStageBytes), s_w = st + kActBytes + wg * kWeightBytes;
      mbarrier_wait(bars + 8 * s, phase);
      if (active) {
        wgmma_block_sum<kCols>(part, st, s_w);
        promote(acc, part, sa0, sa1, sb);
      }
      __syncwarp();
      if (lane == 0) mbarrier_arrive(bars + 8 * (kStages + s));  // this warp is done with the stage
      if (tid == 0) feed.fill();  // the block kStages - 1 ahead, into block it - 1's stage
      __syncwarp();
    }
    if (!active) continue;
    store_rows(p, acc, p.d + (row0 + r0) * p.n + n_tile * kCols + c0, r0, routed_rows(p.row_offset, p.expert_count, w.tile, w.expert));
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    sm90_fp8_grouped_gemm_1d2d_large_kernel(const __grid_constant__ CUtensorMap act_map, LargeParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  wait_for_previous_grid();  // first: dependent_launch.cuh. No early start for the next stage: on the
  // H100 at T = 1 it gained nothing measurable, and its blocks would hold SM resources meanwhile.
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t bars = smem_addr(smem + kStages * kStageBytes);  // full[kStages], then empty[kStages]
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(bars + 8 * s, 1);                           // thread 0's arrive + the bytes
      mbarrier_init(bars + 8 * (kStages + s), kConsumerWarps);  // one arrival per consumer warp
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  consume(p, &act_map, smem, bars);
#else
  (void)act_map, (void)p;
  __trap();  // wgmma needs sm_90a; the library is built for it only
#endif
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    MOECHECK_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || f == nullptr)
      throw CudaError("cuTensorMapEncodeTiled: not found in the driver", cudaErrorSymbolNotFound);
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

// The activations [rows, K] e4m3 as a 2D tensor with 64-row x 128-byte boxes in the 128-byte
// swizzle: each box lands in shared memory in the layout the wgmma descriptors read.
CUtensorMap activation_map(const uint8_t* a, int64_t rows, int64_t k) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {kBlockK, kRows}, step[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(a), dims, strides, box,
                                    step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError("cuTensorMapEncodeTiled: driver error " + std::to_string(static_cast<int>(r)) +
                        " encoding the activations' tensor map",
                    cudaErrorInvalidValue);
  return m;
}

}  // namespace

bool large_batch_schedule_fits(const GroupedGemmArgs& g) {
  return g.b_layout == WeightLayout::block_tiles && g.k <= (int64_t{1} << 31) &&
         g.max_tiles * kRows <= (int64_t{1} << 31);
}

void launch_sm90_fp8_grouped_gemm_large(const GroupedGemmArgs& g, cudaStream_t stream) {
  const char* who = "sm90_fp8_grouped_gemm_large";
  require_grouped_gemm_args(g, who);
  require(large_batch_schedule_fits(g), who,
          "the large_batch schedule reads block-tile weights, and K and the row count must fit a tensor map's "
          "32-bit coordinates");
  static const bool smem_raised = [] {
    MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp8_grouped_gemm_1d2d_large_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)smem_raised;
  const int sms = current_device_sm_count();
  const CUtensorMap act_map = activation_map(g.a, g.max_tiles * kRows, g.k);
  const LargeParams p{g.a_scale, g.b, g.b_scale, g.tile_expert, g.row_offset, g.expert_count, g.max_tiles, g.n, g.k,
                      g.experts, g.d, g.out_precision == Precision::bf16};
  const int64_t items = g.max_tiles * ((g.n / kCols + 1) / 2);
  const int64_t grid = items < sms ? items : sms;
  launch_dependent("sm90_fp8_grouped_gemm_1d2d_large_kernel", sm90_fp8_grouped_gemm_1d2d_large_kernel,
                   grid_x(grid, who), kThreads, kSmemBytes, stream, act_map, p);
}

}  // namespace moecheck::kernels
