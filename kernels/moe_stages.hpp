// The stages of the GPU FP8 block-scale MoE path, each a host function that launches its
// kernel(s) on a stream. fp8_block_scale_moe.hpp chains them; a cuBLASLt path can reuse every
// stage except the grouped GEMM (routing, quantization, permutation, SiLU, finalize).
//
// Stage                          kernel file                           contract
//   launch_moe_routing           moe_routing.cu                        DEVICE-ALGORITHM.md §1
//   launch_fp8_group_quant       fp8_group_quant.cu                    §2
//   launch_moe_permute           moe_permute.cu (slots -> rows)        -
//   launch_moe_prologue          moe_prologue.cu (the three above, T <= 16, one launch)
//   launch_gather_rows           moe_permute.cu (token rows -> A)      -
//   launch_sm90_fp8_grouped_gemm sm90_fp8_grouped_gemm_1d2d.cu         §3 (GEMM1), §5 (GEMM2)
//   launch_silu_mul_quant        silu_mul_quant.cu                     §4
//   launch_moe_finalize          moe_finalize.cu                       §6
//   launch_pack_weight_tiles     pack_weight_tiles.cu                  - (once, when weights load)
//
// Memory: every pointer is a device pointer; nothing is allocated here. Invalid arguments
// (shapes, null pointers, misalignment) are std::invalid_argument; CUDA failures CudaError.
//
// The permuted layout ("rows"): the local slots (token t, slot j) with a local expert are
// grouped by local expert, in ascending (t, j) order inside an expert; expert e's rows start at
// row_offset[e], a multiple of kGemmTileM, and its block is padded up to a multiple of
// kGemmTileM with padding rows (row_to_slot = -1). No stage writes a padding row: the gather
// and the SiLU re-quantization visit the routed slots only, and the grouped GEMM stores a tile's
// routed rows only. Padding rows hold whatever the workspace held (NaN included); the GEMM may
// compute on them, but each output element reads one activation row, so nothing leaks into a
// routed row. M tile i of the grouped GEMM belongs to tile_expert[i].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "reference/fp8_quant.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::kernels {

inline constexpr int64_t kGemmTileM = 64;    // rows per M tile; expert blocks are padded to it
inline constexpr int64_t kGemmTileN = 128;   // columns per N tile (= one weight-scale block)
inline constexpr int64_t kScaleBlock = 128;  // activation group = weight block = GEMM K block
inline constexpr int64_t kMaxExperts = 4096; // routing keeps a token's E scores in shared memory
inline constexpr int64_t kMaxTopK = 32;

// ---- Routing (moe_routing.cu) ------------------------------------------------------------
// logits [T, E] float, bias [E] or nullptr (only deepseek_v3 / sigmoid_renormalize take one).
// topk_ids [T, k] int32 in rank order (descending selection score, ties to the lower id);
// topk_weights [T, k] float = routed_scaling_factor * weight, rounded to routing_weight_dtype.
void launch_moe_routing(const MoeConfig& c, const float* logits, const float* bias, int64_t tokens,
                        int32_t* topk_ids, float* topk_weights, cudaStream_t stream);

// ---- Activation group quantization (fp8_group_quant.cu) ---------------------------------
enum class ActivationDtype { f32, bf16 };  // bf16 values as raw uint16 bits
// x [rows, cols] row-major -> codes [rows, cols] e4m3 + scales, one per (row, 128 columns):
// row_major [rows, cols/128] or transposed [cols/128, rows]. cols % 128 == 0.
void launch_fp8_group_quant(const void* x, ActivationDtype dtype, int64_t rows, int64_t cols, ScaleFormat fmt,
                            double eps, ScaleLayout layout, uint8_t* codes, float* scales, cudaStream_t stream);

// ---- Permutation (moe_permute.cu) ---------------------------------------------------------
struct PermuteCapacity {
  int64_t max_rows = 0;   // upper bound of the padded row count, a multiple of kGemmTileM
  int64_t max_tiles = 0;  // max_rows / kGemmTileM
};
// Worst case over all routings of T tokens x k slots onto local_experts experts.
PermuteCapacity permute_capacity(int64_t tokens, int64_t top_k, int64_t local_experts);

struct PermutePlan {              // device arrays
  int32_t* expert_count = nullptr;  // [E_local] slots routed to each local expert
  int32_t* row_offset = nullptr;    // [E_local + 1] first row of each expert; [E_local] = total rows
  int32_t* tile_expert = nullptr;   // [max_tiles] local expert of each M tile, -1 past the last tile
  int32_t* slot_to_row = nullptr;   // [T * k] permuted row of slot t*k+j, -1 if its expert is not local
  int32_t* row_to_slot = nullptr;   // [max_rows] slot t*k+j of each row, -1 for padding (and unused) rows
  int32_t* totals = nullptr;        // [2] total padded rows, number of M tiles
};
// Builds the plan from topk_ids [T, k] (global ids); experts outside [offset, offset + local)
// are skipped. Writes every element of every plan array.
void launch_moe_permute(const int32_t* topk_ids, int64_t tokens, int64_t top_k, int64_t local_expert_offset,
                        int64_t local_experts, const PermuteCapacity& cap, const PermutePlan& plan,
                        cudaStream_t stream);

// Gathers token rows into the permuted A operand: a_codes [max_rows, H], a_scales row-major
// [max_rows, H/128] from codes [T, H] and scales (layout as given: [T, H/128] or [H/128, T]).
// One block per slot (T k, not the capacity's rows): only the routed rows slot_to_row names
// are written; padding rows and rows past the plan are left untouched.
void launch_gather_rows(const uint8_t* codes, const float* scales, ScaleLayout scale_layout, int64_t tokens,
                        int64_t hidden, int64_t top_k, const PermutePlan& plan, uint8_t* a_codes,
                        float* a_scales, cudaStream_t stream);

// ---- One-launch prologue of small batches (moe_prologue.cu) ---------------------------------
// Routing, the bf16 entry's activation quantization (hidden_bf16 [T, H] bf16 bits; null for the
// fp8 entry: none) and the permutation in one block: the bits launch_moe_routing,
// launch_fp8_group_quant (transposed scales [H/128, T]) and launch_moe_permute give, in one
// launch instead of three. For batches moe_prologue_fits accepts: T <= kPrologueMaxTokens,
// T k <= 1024, and the routing's scores (T (2E + n_group) floats) within 47 KiB.
inline constexpr int64_t kPrologueMaxTokens = 16;
bool moe_prologue_fits(const MoeConfig& c, int64_t tokens);
void launch_moe_prologue(const MoeConfig& c, const float* logits, const float* bias, const void* hidden_bf16,
                         int64_t tokens, int32_t* topk_ids, float* topk_weights, uint8_t* hidden_codes,
                         float* hidden_scales, const PermuteCapacity& cap, const PermutePlan& plan,
                         cudaStream_t stream);

// ---- Weight layout of the grouped GEMM (pack_weight_tiles.cu) ------------------------------
// How the B operand's (the weights') codes lie in memory.
//   row_major    [E_local, N, K]: row n of expert e is output column n (FlashInfer's MajorK).
//   block_tiles  [E_local, N/128, K/128, 16 KiB]: each 128 x 128 weight block (rows n, columns k)
//                contiguous, in the GEMM's shared-memory order (row r's 16-byte chunk c at byte
//                128 r + 16 (c ^ (r mod 8)), the 128-byte swizzle of sm90_wgmma.cuh), so a K block
//                of a CTA is one 16 KiB run of DRAM instead of 128 runs of 128 bytes 7168 apart.
//                Made once from row_major by launch_pack_weight_tiles (as engines prepare weights
//                at load time: FlashInfer's BlockMajorK); the codes themselves are unchanged.
enum class WeightLayout { row_major, block_tiles };

// row_major [experts, n, k] -> block_tiles (above); n, k multiples of 128; the two must not overlap.
void launch_pack_weight_tiles(const uint8_t* row_major, int64_t experts, int64_t n, int64_t k, uint8_t* tiles,
                              cudaStream_t stream);
// Both weight tensors of a layer of config c into their block tiles: w13 [E_local, 2I, H] -> t13,
// w2 [E_local, H, I] -> t2 (each the size of its source).
void launch_pack_layer_weight_tiles(const MoeConfig& c, const uint8_t* w13, const uint8_t* w2, uint8_t* t13,
                                    uint8_t* t2, cudaStream_t stream);

// ---- Grouped GEMM, FP8 x FP8, 1x128 x 128x128 scales (sm90_fp8_grouped_gemm_1d2d.cu) ------
// D[r, n] = sum over K blocks b (ascending) of fl32(sa[r, b] * sb[e, n/128, b]) * p_b, with p_b
// the tensor-core sum of the 128 code products of block b (restarted from zero every block) and
// e = tile_expert[r / kGemmTileM]; then rounded to out_precision. Tiles with tile_expert < 0 are
// skipped (their D rows are not written). With row_offset and expert_count, only the routed rows
// of a tile (below its expert's count) are written; padding rows may hold any codes and scales,
// NaN included, and their D rows are left untouched. Without them, every row of a tile is
// computed and written.
//
// Two schedules compute the same bits (the tensor-core sum is the same instruction's, only the
// operands' roles differ; measured equal on the GpuGemm tests' data):
//   small_batch  the weights as wgmma's A (64 columns per warpgroup), 8-64 rows as its N: bound
//                by reading the weights, the decode case (sm90_fp8_grouped_gemm_1d2d.cu). With
//                row_offset and expert_count it computes a tile's rows only up to its expert's
//                last routed row (rounded up to 8, 16, 32 or 64);
//   large_batch  the activations as A (64 rows per CTA, all computed), 2 x 128 weight columns
//                as N, TMA and bulk copies on mbarriers issued by one thread, one persistent CTA
//                per SM; needs block_tiles weights (sm90_fp8_grouped_gemm_1d2d_large.cu).
// automatic picks large_batch when the weights are block tiles and the plan's row bound averages
// at least 128 rows per expert (max_tiles >= 2 experts); with block tiles, the environment
// variable MOECHECK_GEMM_SCHEDULE (small_batch, large_batch) overrides automatic, for benchmarks
// and for running the gate on either schedule.
enum class GemmSchedule { automatic, small_batch, large_batch };
struct GroupedGemmArgs {
  const uint8_t* a = nullptr;        // [max_tiles * kGemmTileM, K] e4m3
  const float* a_scale = nullptr;    // [max_tiles * kGemmTileM, K/128]
  const uint8_t* b = nullptr;        // e4m3, as b_layout says: [E_local, N, K] or its block tiles
  WeightLayout b_layout = WeightLayout::row_major;
  const float* b_scale = nullptr;    // [E_local, N/128, K/128]
  const int32_t* tile_expert = nullptr;  // [max_tiles]
  const int32_t* row_offset = nullptr;   // optional [E_local + 1], with expert_count [E_local]
  const int32_t* expert_count = nullptr;
  int64_t max_tiles = 0, n = 0, k = 0, experts = 0;
  // At most this many routed rows in any M tile, or 0 if unknown. A token routes to an expert at
  // most once, so a layer of T tokens passes T; at <= 16, with row_offset, the small-batch
  // schedule takes a decode variant (stages of 16 activation rows, more CTAs per SM). A bound
  // that a tile exceeds is a contract violation: a tile of more than 16 rows traps the kernel.
  int64_t max_expert_rows = 0;
  // A decode variant's stage count, 2, 3 or 5 (with max_expert_rows <= 16), for tests and
  // measurements; 0: MOECHECK_DECODE_STAGES if set, else chosen per launch.
  int decode_stages = 0;
  Precision out_precision = Precision::f32;
  float* d = nullptr;                // [max_tiles * kGemmTileM, N]
  GemmSchedule schedule = GemmSchedule::automatic;
};
void launch_sm90_fp8_grouped_gemm(const GroupedGemmArgs& g, cudaStream_t stream);
// The launch's argument rules, which both schedules check (std::invalid_argument naming `who`).
void require_grouped_gemm_args(const GroupedGemmArgs& g, const char* who);
// The large_batch schedule alone (with the same argument checks), and whether it
// can run g at all: block-tile weights, K and the row count within a tensor map's 32-bit
// coordinates (automatic and MOECHECK_GEMM_SCHEDULE keep the small_batch schedule where not).
void launch_sm90_fp8_grouped_gemm_large(const GroupedGemmArgs& g, cudaStream_t stream);
bool large_batch_schedule_fits(const GroupedGemmArgs& g);

// ---- SiLU * up and re-quantization (silu_mul_quant.cu) -------------------------------------
// gemm1_out [max_rows, 2I] float (already rounded to intermediate); the routed rows (those
// slot_to_row [slots] names; -1 entries are skipped) become codes [max_rows, I] + row-major
// scales [max_rows, I/128]: h = fl32(silu(gate) * up) rounded to `intermediate`, quantized per
// 128 along I. Padding rows are neither read nor written.
void launch_silu_mul_quant(const float* gemm1_out, const int32_t* slot_to_row, int64_t slots, int64_t inter,
                           GateUpLayout layout, Precision intermediate, ScaleFormat fmt, double eps,
                           uint8_t* codes, float* scales, cudaStream_t stream);

// ---- Finalize (moe_finalize.cu) -------------------------------------------------------------
// out [T, H] bf16 bits = bf16(sum over local slots j (ascending) of w_j * y_j, FFMA in float32),
// exactly 0 for tokens with no local slot; expert_outputs [T, k, H] (optional) = y of each
// slot, 0 for non-local slots.
void launch_moe_finalize(const float* gemm2_out, const int32_t* slot_to_row, const float* topk_weights,
                         int64_t tokens, int64_t top_k, int64_t hidden, uint16_t* out_bf16, float* expert_outputs,
                         cudaStream_t stream);

}  // namespace moecheck::kernels
