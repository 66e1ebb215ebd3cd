// Grouped FP8 x FP8 GEMM with DeepSeek block scales ("1d2d": 1x128 activation scales x 128x128
// weight scales), the GEMM1 and GEMM2 of the MoE (docs/DEVICE-ALGORITHM.md §3, §5), on Hopper's
// FP8 tensor cores (wgmma.mma_async e4m3 x e4m3 -> f32, sm_90a).
//
//   D[r, n] = round_out( sum_b fl32(sa[r, b] * sb[e, n/128, b]) * p_b[r, n] ),  e = expert of r's tile
//   p_b     = tensor-core sum of the 128 products qa * qw of K block b: 4 chained k32 wgmma
//             instructions, the first one from zero (the measured accumulation of
//             reference/tensor_core_model.hpp, TensorCoreModel::hopper_wgmma)
//
// Promotion (DeepSeek-V3 report, arXiv 2412.19437 §3.3.2) after each block, on the CUDA cores:
//   acc = __fmaf_rn(__fmul_rn(sa, sb), p_b, acc)
// with the _rn intrinsics so the compiler can neither contract nor reorder them; blocks ascend.
//
// Tiling ("swap AB", the weights are the instruction's M side): one CTA of two warpgroups
// computes the 128 output columns n of one weight-scale block (64 per warpgroup: wgmma's M) for
// the rows of one M tile of kGemmTileM = 64 permuted rows (wgmma's N). A tile whose expert has
// fewer rows there runs the instruction with N = 8, 16 or 32 (the smallest that covers them) and
// stores its routed rows only; so a decode step with one token per expert does 1/8 of the tensor
// work of a full tile and writes one row, and the weights, read once, set the time.
//
// Pipeline: S::kStages shared-memory stages filled by cp.async (16-byte copies, whole 128-byte
// rows per 8 threads; a block-tile weight panel, WeightLayout::block_tiles, is one contiguous
// 16 KiB run), all of them in flight before the first wgmma and kStages - 1 ahead of it after.
// The general variant: stages of 64 activation rows, 4 of them, two CTAs per SM, so one CTA's
// promotion overlaps the other's wgmma. The decode variants (tiles of at most 16 rows) carry 16
// rows per stage (19 KiB instead of 25) and 2, 3 or 5 stages, so an SM holds five, three or two
// CTAs; small_batch_variant picks one (measured, not derived: docs/bench/CUDA-GEMM-NOTES.md,
// "Decode variants"). The epilogue stages the tile through shared memory so that D rows are
// written with coalesced 16-byte stores.
//
// NOTES:
//  - Grid: one CTA per (M tile, N tile), in the order of grouped_gemm_order.cuh.
//  - This is the small_batch schedule (moe_stages.hpp, GemmSchedule); launch_sm90_fp8_grouped_gemm
//    hands large batches to sm90_fp8_grouped_gemm_1d2d_large.cu.
//  - Padding rows among the computed ones may hold anything, NaN included: rows never mix (each
//    output element reads one activation row), so nothing leaks between rows or experts, and
//    their results are not stored.
//  - Shared-memory layout and fragments: sm90_wgmma.cuh.
#include <cuda_runtime.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
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

constexpr int kTileRows = static_cast<int>(kGemmTileM);  // activation rows per tile (wgmma N, at most)
constexpr int kTileCols = static_cast<int>(kGemmTileN);  // output columns per tile (2 x wgmma M)
constexpr int kBlockK = static_cast<int>(kScaleBlock);
constexpr int kThreads = 256;  // two warpgroups
constexpr int kWeightBytes = kTileCols * kBlockK;  // 16 KiB
constexpr int kEpiStride = kTileCols + 4;  // floats per staged output row: conflict-free fragment stores
static_assert(kTileCols == 128 && kBlockK == 128, "one weight-scale block per CTA column tile and K block");
static_assert(kTileRows == 64, "wgmma N of at most 64 rows per tile");

// A kernel variant: the most routed rows any of its tiles holds (its stages carry that many
// activation rows) and its number of shared-memory stages, all of them in flight from the start.
// The general variant takes any tile; the decode variants take tiles of at most 16 rows (the
// host knows: a token routes to an expert at most once, so no tile of T <= 16 tokens holds more)
// and, with stages of 19 KiB instead of 25, trade stages against CTAs per SM.
template <int kMaxRows_, int kStages_>
struct Shape {
  static constexpr int kMaxRows = kMaxRows_, kStages = kStages_;
  static constexpr int kActBytes = kMaxRows * kBlockK;
  static constexpr int kStageBytes = kWeightBytes + kActBytes + 1024;  // + the scales; 1024-aligned (swizzle atoms)
  static constexpr int kScaleBOffset = 4 * kMaxRows;  // the weight scale, after the row scales
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;       // + room to align the first atom to 1024
  static_assert(kMaxRows == 16 || kMaxRows == 64, "tiles of 8, 16, 32 or 64 rows");
  static_assert(kStages >= 2, "a stage to compute from and one to fill");
  static_assert(kScaleBOffset + 4 <= 1024, "the row scales and the weight scale fit the stage's 1024 bytes");
  static_assert(kStageBytes % 1024 == 0 && kWeightBytes % 1024 == 0, "swizzle atoms must stay 1024-byte aligned");
  static_assert(kMaxRows * kEpiStride * 4 <= kStages * kStageBytes, "the epilogue reuses the pipeline's shared memory");
};
using GeneralShape = Shape<64, 4>;

struct GemmParams {
  const uint8_t* a;
  const float* a_scale;
  const uint8_t* b;
  const float* b_scale;
  const int32_t* tile_expert;
  const int32_t* row_offset;    // optional, with expert_count: rows of each tile
  const int32_t* expert_count;
  int64_t n, k;
  float* d;
  bool bf16_out;
  bool b_tiles;  // b is WeightLayout::block_tiles
};

// Where a CTA's weight panel starts, and how K block kb of it is found. Row-major: 128 rows of
// K bytes, block kb at column 128 kb of each. Block tiles: 16 KiB per block, already swizzled.
struct WeightPanel {
  const uint8_t* base;
  bool tiles;
};
__device__ __forceinline__ WeightPanel weight_panel(const GemmParams& p, int32_t expert, int64_t n_tile) {
  const int64_t panel = static_cast<int64_t>(expert) * (p.n / kTileCols) + n_tile;
  return {p.b + panel * kTileCols * p.k, p.b_tiles};  // a panel is 128 K bytes in either layout
}

// One K block into stage `st`: the 128 x 128 weight panel, kRows activation rows and their scales.
template <typename S, int kRows>
__device__ __forceinline__ void load_stage(uint8_t* st, const WeightPanel& w, const uint8_t* g_a, const float* g_sa,
                                           const float* g_sb, int64_t k, int64_t k_blocks, int64_t kb, int tid) {
  const uint32_t s_w = smem_addr(st), s_a = s_w + kWeightBytes, s_sa = s_a + S::kActBytes;
  // Chunk i: row i / 8, 16-byte column i % 8: a warp copies 4 whole 128-byte rows, and the
  // swizzle spreads each row's 8 chunks over distinct banks. A block tile is copied as it lies.
  if (w.tiles) {
    const uint8_t* src = w.base + kb * kWeightBytes;
#pragma unroll
    for (int j = 0; j < kWeightBytes / 16 / kThreads; ++j) {
      const int i = tid + j * kThreads;
      cp_async_16(s_w + 16 * i, src + 16 * i);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kWeightBytes / 16 / kThreads; ++j) {
      const int i = tid + j * kThreads, row = i >> 3, c16 = i & 7;
      cp_async_16_l2_256(s_w + swizzle_offset(row, c16), w.base + row * k + kb * kBlockK + c16 * 16);
    }
  }
  for (int i = tid; i < kRows * 8; i += kThreads) {
    const int row = i >> 3, c16 = i & 7;
    cp_async_16(s_a + swizzle_offset(row, c16), g_a + row * k + kb * kBlockK + c16 * 16);
  }
  if (tid < kRows) cp_async_4(s_sa + 4 * tid, g_sa + tid * k_blocks + kb);
  // The block's weight scale rides with its stage: a load issued kStages - 1 blocks ahead, where a
  // plain load at the top of the iteration would wait one L2 (or, after a flush, DRAM) round trip
  // per block behind the wgmma.
  if (tid == kThreads - 1) cp_async_4(s_sa + S::kScaleBOffset, g_sb + kb);
}

// Computes the tile's first kRows rows (kRows >= stored) and stores its first `stored`.
template <typename S, int kRows>
__device__ void gemm_tile(const GemmParams& p, uint8_t* smem, int64_t row0, int64_t n_tile, int32_t expert,
                          int stored) {
  static_assert(kRows <= S::kMaxRows, "a stage holds S::kMaxRows activation rows");
  constexpr int kStages = S::kStages;
  constexpr int kFrag = kRows / 2;  // f32 accumulators per thread: 64 columns x kRows / 128 threads
  const int64_t k_blocks = p.k / kBlockK;
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, warp = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;

  const uint8_t* g_a = p.a + row0 * p.k;
  const float* g_sa = p.a_scale + row0 * k_blocks;
  const WeightPanel g_w = weight_panel(p, expert, n_tile);
  const float* g_sb = p.b_scale + (static_cast<int64_t>(expert) * (p.n / kTileCols) + n_tile) * k_blocks;

  float acc[kFrag], part[kFrag];  // part: one block's tensor-core sum
#pragma unroll
  for (int i = 0; i < kFrag; ++i) acc[i] = part[i] = 0.0f;

  // Prologue: every stage filled, blocks 0 .. kStages - 1 in flight (commit group b holds block b;
  // groups past the last block are empty). Then iteration kb >= 1 refills the stage of block
  // kb - 1 with block kb - 1 + kStages as group kStages + kb - 1.
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (s < k_blocks) load_stage<S, kRows>(smem + s * S::kStageBytes, g_w, g_a, g_sa, g_sb, p.k, k_blocks, s, tid);
    cp_async_commit();
  }

  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    uint8_t* st = smem + (kb % kStages) * S::kStageBytes;
    // Group kb complete: kStages groups committed before iteration 0, one more per iteration since.
    if (kb == 0) cp_async_wait<kStages - 1>();
    else cp_async_wait<kStages - 2>();
    fence_async_shared();
    __syncthreads();  // everyone's copies of block kb have landed, and block kb - 1's stage is free (its wgmma completed)

    if (kb > 0) {
      const int64_t next = kb - 1 + kStages;
      if (next < k_blocks)
        load_stage<S, kRows>(smem + ((kb - 1) % kStages) * S::kStageBytes, g_w, g_a, g_sa, g_sb, p.k, k_blocks, next,
                             tid);
      cp_async_commit();
    }

    // Tensor-core sum of this block, from zero: the weights as A, the rows as B.
    const uint32_t s_w = smem_addr(st) + wg * (kTileCols / 2) * kSwizzleRowBytes, s_a = smem_addr(st) + kWeightBytes;
    wgmma_block_sum<kRows>(part, s_w, s_a);

    // Promote: column c of the fragment is activation row c, scaled by its own sa.
    const float* s_sa = reinterpret_cast<const float*>(st + kWeightBytes + S::kActBytes);
    const float sb = s_sa[S::kScaleBOffset / 4];
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j) {
      const float s0 = __fmul_rn(s_sa[8 * j + 2 * t], sb), s1 = __fmul_rn(s_sa[8 * j + 2 * t + 1], sb);
      acc[4 * j + 0] = __fmaf_rn(s0, part[4 * j + 0], acc[4 * j + 0]);
      acc[4 * j + 1] = __fmaf_rn(s1, part[4 * j + 1], acc[4 * j + 1]);
      acc[4 * j + 2] = __fmaf_rn(s0, part[4 * j + 2], acc[4 * j + 2]);
      acc[4 * j + 3] = __fmaf_rn(s1, part[4 * j + 3], acc[4 * j + 3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every stage consumed: the epilogue reuses shared memory

  // Epilogue: the fragment into a [rows][128] float tile, rounded to the output precision.
  float* tile = reinterpret_cast<float*>(smem);
  const int col_base = wg * (kTileCols / 2) + 16 * warp + g;
#pragma unroll
  for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = 8 * j + 2 * t + (q & 1), col = col_base + 8 * (q >> 1);
      float v = acc[4 * j + q];
      if (p.bf16_out) v = __bfloat162float(__float2bfloat16_rn(v));
      tile[row * kEpiStride + col] = v;
    }
  __syncthreads();
  float* g_d = p.d + row0 * p.n + n_tile * kTileCols;
  for (int i = tid; i < stored * (kTileCols / 4); i += kThreads) {
    const int row = i / (kTileCols / 4), c4 = i % (kTileCols / 4);
    *reinterpret_cast<float4*>(g_d + row * p.n + 4 * c4) =
        *reinterpret_cast<const float4*>(tile + row * kEpiStride + 4 * c4);
  }
}

// CTAs per SM that a variant's shared memory allows (228 KiB per SM, 1 KiB of it reserved per CTA),
// so that ptxas keeps the registers within what that many CTAs leave.
template <typename S>
constexpr int ctas_per_sm() {
  const int n = (228 * 1024) / (S::kSmemBytes + 1024);
  return n < 1 ? 1 : (n > 8 ? 8 : n);
}

template <typename S>
__global__ void __launch_bounds__(kThreads, ctas_per_sm<S>()) sm90_fp8_grouped_gemm_1d2d_kernel(GemmParams p,
                                                                                             int64_t n_tiles) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  wait_for_previous_grid();  // first: dependent_launch.cuh. No early start for the next stage: on the
  // H100 at T = 1 it gained nothing measurable, and its blocks would hold SM resources meanwhile.
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const GemmItem c = gemm_item(p.tile_expert, p.row_offset, blockIdx.x, n_tiles);
  if (c.expert < 0) return;  // past the last tile of this routing
  const int32_t expert = c.expert;
  const int64_t n_tile = c.n_tile, row0 = c.tile * kTileRows;
  const int rows = routed_rows(p.row_offset, p.expert_count, c.tile, expert);
  if (rows <= 8) gemm_tile<S, 8>(p, smem, row0, n_tile, expert, rows);
  else if (rows <= 16) gemm_tile<S, 16>(p, smem, row0, n_tile, expert, rows);
  else if constexpr (S::kMaxRows == 64) {
    if (rows <= 32) gemm_tile<S, 32>(p, smem, row0, n_tile, expert, rows);
    else gemm_tile<S, 64>(p, smem, row0, n_tile, expert, rows);
  } else {
    __trap();  // a tile of more than 16 rows: GroupedGemmArgs::max_expert_rows was wrong
  }
#else
  (void)p, (void)n_tiles;
  __trap();  // wgmma needs sm_90a; the library is built for it only
#endif
}

// MOECHECK_GEMM_SCHEDULE (moe_stages.hpp), read once: automatic when unset.
GemmSchedule schedule_from_environment() {
  static const GemmSchedule forced = [] {
    const char* v = std::getenv("MOECHECK_GEMM_SCHEDULE");
    if (v == nullptr || *v == '\0') return GemmSchedule::automatic;
    if (std::string(v) == "small_batch") return GemmSchedule::small_batch;
    if (std::string(v) == "large_batch") return GemmSchedule::large_batch;
    throw std::invalid_argument(std::string("MOECHECK_GEMM_SCHEDULE: '") + v +
                                "' is not small_batch or large_batch");
  }();
  return forced;
}

// The schedule a launch takes: the caller's, else the environment's, else automatic's choice.
bool use_large_batch(const GroupedGemmArgs& g) {
  if (g.schedule != GemmSchedule::automatic) return g.schedule == GemmSchedule::large_batch;
  // Where the large-batch kernel cannot run, automatic and the environment keep the small-batch one.
  if (!large_batch_schedule_fits(g)) return false;
  const GemmSchedule forced = schedule_from_environment();
  if (forced != GemmSchedule::automatic) return forced == GemmSchedule::large_batch;
  return g.max_tiles >= 2 * g.experts;
}

// A variant ready to launch: its kernel with the shared memory it asks for, and how many of its
// CTAs one SM holds on this device (registers and shared memory, from the occupancy calculator).
struct Variant {
  void (*kernel)(GemmParams, int64_t);
  int stages, smem_bytes, ctas_per_sm;
};

template <typename S>
const Variant& variant() {
  static const Variant v = [] {
    MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(sm90_fp8_grouped_gemm_1d2d_kernel<S>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes));
    int per_sm = 0;
    MOECHECK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sm90_fp8_grouped_gemm_1d2d_kernel<S>,
                                                                      kThreads, S::kSmemBytes));
    return Variant{sm90_fp8_grouped_gemm_1d2d_kernel<S>, S::kStages, S::kSmemBytes, per_sm};
  }();
  return v;
}

// MOECHECK_DECODE_STAGES=2|3|5 forces a decode variant's stage count (measurements); unset or
// 0: chosen per launch.
int decode_stages_from_environment() {
  static const int forced = [] {
    const char* v = std::getenv("MOECHECK_DECODE_STAGES");
    if (v == nullptr || *v == '\0' || std::string(v) == "0") return 0;
    const std::string s(v);
    if (s == "2" || s == "3" || s == "5") return std::stoi(s);
    throw std::invalid_argument("MOECHECK_DECODE_STAGES: '" + s + "' is not 0, 2, 3 or 5");
  }();
  return forced;
}

// The small-batch variant for g. Tiles of more than 16 rows, an unknown bound or no plan (without
// row_offset every tile counts 64 rows): the general one. Otherwise a decode variant, by a rule
// fitted to the H100 measurements of docs/bench/CUDA-GEMM-NOTES.md ("Decode variants"), not
// derived: CTAs per SM mattered more than depth, so three stages (three CTAs per SM), else two
// (five per SM), whichever first fits the grid on the device in one wave; where neither does,
// the most stages up to five (two CTAs per SM). Never more stages than K blocks, except two.
const Variant& small_batch_variant(const GroupedGemmArgs& g, int64_t grid) {
  if (g.max_expert_rows <= 0 || g.max_expert_rows > 16 || g.row_offset == nullptr) return variant<GeneralShape>();
  const Variant* decode[] = {&variant<Shape<16, 5>>(), &variant<Shape<16, 3>>(), &variant<Shape<16, 2>>()};
  if (const int forced = g.decode_stages != 0 ? g.decode_stages : decode_stages_from_environment(); forced != 0) {
    for (const Variant* v : decode)
      if (v->stages == forced) return *v;
  }
  const int64_t k_blocks = g.k / kBlockK;
  auto fits_k = [&](const Variant* v) { return v->stages <= std::max<int64_t>(2, k_blocks); };
  for (const Variant* v : {decode[1], decode[2]})
    if (fits_k(v) && grid <= static_cast<int64_t>(v->ctas_per_sm) * current_device_sm_count()) return *v;
  for (const Variant* v : decode)
    if (fits_k(v)) return *v;
  return *decode[2];  // not reached: two stages always fit
}

}  // namespace

void require_grouped_gemm_args(const GroupedGemmArgs& g, const char* who) {
  require(g.n > 0 && g.n % kTileCols == 0, who, "N must be a positive multiple of 128, got " + std::to_string(g.n));
  require(g.k > 0 && g.k % kBlockK == 0, who, "K must be a positive multiple of 128, got " + std::to_string(g.k));
  require(g.experts >= 1, who, "need at least one expert");
  require(g.max_tiles >= 1, who, "need max_tiles >= 1");
  require(g.max_expert_rows >= 0, who, "max_expert_rows must be >= 0 (0: unknown)");
  require(g.decode_stages == 0 || ((g.decode_stages == 2 || g.decode_stages == 3 || g.decode_stages == 5) &&
                                   g.max_expert_rows > 0 && g.max_expert_rows <= 16),
          who, "decode_stages must be 0, or 2, 3 or 5 with 0 < max_expert_rows <= 16");
  require(g.decode_stages == 0 || g.row_offset != nullptr, who,
          "decode_stages needs the plan's row_offset and expert_count (without them every tile counts 64 rows)");
  require((g.row_offset == nullptr) == (g.expert_count == nullptr), who,
          "row_offset and expert_count come together (or neither)");
  require_ptr(g.a, who, "A codes", 16);
  require_ptr(g.a_scale, who, "A scales", 4);
  require_ptr(g.b, who, "B codes", 16);
  require_ptr(g.b_scale, who, "B scales", 4);
  require_ptr(g.tile_expert, who, "tile_expert", 4);
  require_ptr(g.d, who, "D", 16);
}

void launch_sm90_fp8_grouped_gemm(const GroupedGemmArgs& g, cudaStream_t stream) {
  const char* who = "sm90_fp8_grouped_gemm";
  require_grouped_gemm_args(g, who);
  if (use_large_batch(g)) return launch_sm90_fp8_grouped_gemm_large(g, stream);
  GemmParams p{g.a,         g.a_scale, g.b, g.b_scale, g.tile_expert, g.row_offset, g.expert_count,
               g.n,         g.k,       g.d, g.out_precision == Precision::bf16,
               g.b_layout == WeightLayout::block_tiles};
  const int64_t n_tiles = g.n / kTileCols, grid = g.max_tiles * n_tiles;
  const Variant& v = small_batch_variant(g, grid);
  launch_dependent("sm90_fp8_grouped_gemm_1d2d_kernel", v.kernel, grid_x(grid, who), kThreads, v.smem_bytes, stream, p,
                   n_tiles);
}

}  // namespace moecheck::kernels
