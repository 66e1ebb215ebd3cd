// Backend "emulated": the device algorithm (docs/DEVICE-ALGORITHM.md) in float32 on the CPU.
//
// CI's stand-in for a GPU: it computes what a correct FP8 block-scale implementation computes,
// with float32 arithmetic where the device uses float32, and it is written independently of
// the float64 reference (reference/moe_forward.cpp, moe_routing.cpp): only the number-format
// conversions of reference/fp8_formats.hpp are shared. Two implementations of one contract
// must meet inside the error budget; a shared mistake would hide in both.
//
// Numerics, stage by stage (every rounding named; fl32 = float32 RNE):
//   routing     float32 scores (sigmoid 1/(1+expf(-x)), softmax with the max subtracted, sums
//               in index order); grouped top-k with excluded groups at -inf; ties to the lower
//               index; w = fl32(fl32(gate / sum_chosen) * fl32(rsf)), then routing_weight_dtype.
//   act quant   hidden_fp8 + hidden_scale when the problem has them; else per (token, group):
//               s = fl32(max(amax, eps) / 448) (amax >= eps: the float32 division amax / 448;
//               below: the constant fl32(eps / 448)), ue8m0: the next power of two >= s;
//               q = e4m3_satfinite(x / s) (float32 division).
//   GEMM1/2     p_b = sum over the 128-wide K block of q_a * q_w: each product exact in float32,
//               summed in float32 in a fixed order (16 lane sums, k = l mod 16, then a pairwise
//               tree), so a value never depends on the batch, the thread count or the machine;
//               acc = fmaf(fl32(s_a * s_w), p_b, acc), blocks ascending.
//   SiLU * up   GEMM1 output rounded to intermediate_dtype; h = fl32(silu(gate) * up),
//               silu(g) = g / (1 + expf(-g)); h rounded to intermediate_dtype, re-quantized per
//               group along I with the act-quant rule.
//   finalize    out = bf16(sum over slots 0..k-1 of fl32(w * y)), float32; non-local slots add
//               nothing; a token without local slots is exactly +0.
//   recipes     (/config combine, act_scale_floor, quant_divide, expert_output_dtype, silu_dtype;
//               reference/moe_config.hpp EngineRecipe) change those steps: combine bf16_slots
//               sums bf16(fl32(w * y)) in float32; bf16_expert_order adds them into a bf16
//               buffer, acc = bf16(acc + v), experts ascending; act_scale_floor none takes
//               s = amax / 448 and codes a zero group 0; quant_divide reciprocal computes
//               x * (1 / s); expert_output_dtype bf16 rounds y; silu_dtype bf16 rounds silu(g).
// group_size must equal weight_block (both 128 in the contract; any common value works, and
// ragged last blocks are allowed).
//
// Faults (backend "faulty:<fault>"): each injects one real bug class of
// docs/BUG-CLASSES.md ("#n" = its catalogue row), so the checking pipeline can
// be shown to catch it. Each injection point in the sources carries a comment naming it.
//   fault                    what the emulation does wrong                           class
//   gate_up_swap             silu applied to the up half: h = silu(up) * gate          #14
//   scaling_factor_missing   routed_scaling_factor not multiplied                      #16
//   scaling_factor_twice     routed_scaling_factor multiplied twice                    #16
//   bias_ignored             selection without the correction bias (deepseek_v3,       #17
//                            sigmoid_renormalize; no-op without a bias)
//   bias_bf16                bias rounded to bf16 before it is added for selection     #17
//   act_scale_transposed     GEMM1 reads the [T, H/G] activation scales as if stored    #4
//                            [H/G, T]: scale(t, g) from flat[g * T + t] (same size,
//                            always in range; no-op for T = 1 or H <= G)
//   weight_scale_transposed  w13 / w2 block scales [R, C] read as if stored [C, R]:     #4
//                            scale(r, c) from flat[c * R + r] (no-op when R or C is 1)
//   zero_group_nan           no eps in act / intermediate quantization: an all-zero     #1, #2
//                            group has s = 0 and codes 0/0 = NaN, the token's output
//                            NaN (ue8m0: the scale stays 0 instead of becoming 2^-127)
//   empty_expert_garbage     the slot outputs (GEMM2 rows) of the local expert with     #11, #13
//                            the fewest tokens (ties: lowest id) are never written and
//                            hold the "uninitialised" value kGarbage = 1e4 in every
//                            element (expert_outputs record it too)
//   ep_offset_ignored        local experts indexed as if local_expert_offset were 0:    #23
//                            e is local when e < local_num_experts, and uses the weights
//                            of local slot e (global expert offset + e)
//   ue8m0_mismatch           act / intermediate codes quantized with the ue8m0-rounded  #9
//                            scale but dequantized with the unrounded float32 scale
//                            (no-op for scale_format f32)
//   group_mask_zero          experts of excluded groups get selection score 0, not     #19
//                            -inf (shows when kept scores are negative)
//   int32_overflow           finalize reads slot output (row, h) at flat index         #22
//                            f = row * H + h; f >= threshold wraps to f mod threshold
//                            (a real int32 wrap reads f - 2^32, out of bounds; the
//                            modulo keeps the emulation memory-safe). Default threshold
//                            2^31; rows are local slots in slot order.
//   no_renormalize           weights not divided by the chosen sum (deepseek_v3,        §1.1 "Routing
//                            renormalize, sigmoid_renormalize; no-op otherwise)         formula" row
// Faults of the FP8 tensor-core validation matrix (reference/BUDGETS.md §10.6): errors small
// enough to hide inside a worst-case budget.
//   w2_scale_doubled         the w2 block scales of one expert (the local expert with   scale applied
//                            the most slots and some w2 scale above 2^-60; ties:        twice, one expert
//                            lowest id) read twice as large
//   no_requant               GEMM2 takes the SiLU*up intermediate in float32 as it is   re-quantization
//                            (no group re-quantization to FP8; float32 block sums)     skipped
//   output_scale_2pct        the combined output multiplied by 1.02 before its bf16     a constant off
//                            rounding                                                   by 2%
//   last_token_zeroed        the last token's output row is 0 (never written, or        #11, one row
//                            cleared)
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend_output.hpp"
#include "reference/moe_forward.hpp"  // MoeProblem, ExpertView: the input structs
#include "reference/tensor_core_model.hpp"

namespace moecheck {

enum class Fault {
  none,
  gate_up_swap,
  scaling_factor_missing,
  scaling_factor_twice,
  bias_ignored,
  bias_bf16,
  act_scale_transposed,
  weight_scale_transposed,
  zero_group_nan,
  empty_expert_garbage,
  ep_offset_ignored,
  ue8m0_mismatch,
  group_mask_zero,
  int32_overflow,
  no_renormalize,
  w2_scale_doubled,
  no_requant,
  output_scale_2pct,
  last_token_zeroed,
};

std::string_view to_string(Fault f);
std::optional<Fault> parse_fault(std::string_view s);
// Every fault but none, in declaration order.
const std::vector<Fault>& all_faults();
inline std::ostream& operator<<(std::ostream& os, Fault f) { return os << to_string(f); }

// Value of the never-written slot outputs under Fault::empty_expert_garbage.
inline constexpr float kGarbage = 1.0e4f;

// Intermediates of a run, for stage-by-stage tests. Slot arrays are [T, k, ...] (slot t*k + j);
// slots whose expert is not local stay 0.
struct EmulatedTrace {
  std::vector<uint8_t> act_codes;  // [T, H]   GEMM1 A operand (given or quantized)
  std::vector<float> act_scales;   // [T, ceil(H/G)] their scales (as stored, row-major)
  std::vector<float> gemm1;        // [T, k, 2I] GEMM1 output, rounded to intermediate_dtype
  std::vector<float> h;            // [T, k, I]  silu(gate) * up, rounded to intermediate_dtype
  std::vector<uint8_t> h_codes;    // [T, k, I]  GEMM2 A operand
  std::vector<float> h_scales;     // [T, k, ceil(I/G)]
};

struct EmulatedOptions {
  bool expert_outputs = false;  // fill BackendOutput::expert_outputs
  Fault fault = Fault::none;
  int threads = 0;              // 0: std::thread::hardware_concurrency(); results never depend on it
  int64_t int32_overflow_threshold = int64_t(1) << 31;  // Fault::int32_overflow only
  EmulatedTrace* trace = nullptr;                        // filled when not null
  // How each K block's products are summed: nullptr, a fixed-order float32 sum (CUDA-core
  // code); otherwise chained instructions of this tensor-core model (the wgmma path of
  // DeepGEMM and cuBLASLt: TensorCoreModel::hopper_wgmma(), backend name suffix "@hopper").
  const TensorCoreModel* tensor_core = nullptr;
};

// Runs the layer. Throws InputError (file p.source, "/weights/expert_ids") when a token routes
// to a local expert that p.stored_experts lacks; std::invalid_argument for an invalid config,
// missing inputs, a bias with a method that has none, or group_size != weight_block.
BackendOutput run_emulated(const MoeProblem& p, const EmulatedOptions& opt = {});

}  // namespace moecheck
