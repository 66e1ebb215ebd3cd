// FP8 quantization recipes of the DeepSeek-V3 block-scale path (arXiv 2412.19437 §3.3.2;
// deepseek-ai/DeepSeek-V3 README_WEIGHTS.md and inference/kernel.py):
//  - activation group quantization: per row, per group of G consecutive columns
//    (G = 128 along H for hidden states, along I for the SiLU*up intermediate);
//  - weight block quantization: per 128x128 block, ragged edges allowed;
//  - dequantization: w = decode(q) * scale (scales are dequantization multipliers, the
//    checkpoint's weight_scale_inv convention).
//
// Rounding, step by step (every step named):
//   amax  = max |x| over the group (exact; inputs are float)
//   f32:   s = fl32(max(amax, eps) / 448)           (one fp32 rounding of the exact quotient)
//   ue8m0: s = 2^ceil(log2(fl32(max(amax, eps) / 448)))  (ceil on the fp32 quotient, as DeepGEMM)
//   q     = e4m3_satfinite(fl32(x / s))             (fp32 division, then RNE to e4m3, saturating)
// Scales are float32; with eps > 0 they are always finite and > 0, so an all-zero group gives
// s = fl32(eps/448) and zero codes.
//
// Engine recipes (moe_config.hpp EngineRecipe, BUDGETS.md §9) change two steps of the activation
// and intermediate rule (ActQuantRule; weights always use the rule above):
//   act_scale_floor = none:  s = fl32(amax / 448) (ue8m0: its power-of-two ceiling), no eps. An
//       all-zero group (or one whose amax / 448 underflows float32) has s = 0. DeepSeek's
//       reference act_quant kernel then computes 0 / 0 = NaN codes; the reference does not
//       follow it there: it defines that group's codes as 0 (the group dequantizes to 0, what
//       the layer means and what any floor gives). An engine's NaN there is a bug moecheck
//       reports (the emulated fault zero_group_nan), not a recipe.
//   quant_divide = reciprocal:  q = e4m3_satfinite(fl32(x * fl32(1 / s))), evaluated as
//       fl32(double(x) * fl32(1.0 / s)): 1/s once rounded (double rounding is innocuous for a
//       quotient of floats), the product of two floats exact in double, then rounded once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "reference/moe_config.hpp"

namespace moecheck {

// Where scale (row r, group g) lives: row-major [rows, groups] or transposed [groups, rows]
// (FlashInfer's hidden_states_scale is the transposed [H/128, T]).
enum class ScaleLayout { row_major, transposed };

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scale of one group from its amax (rule above).
float group_scale(float amax, ScaleFormat fmt, double eps);

// The activation / intermediate quantization rule of a case: scale format, eps, and the recipe's
// floor and division.
struct ActQuantRule {
  ScaleFormat format = ScaleFormat::f32;
  double eps = 1e-10;
  ActScaleFloor floor = ActScaleFloor::eps;
  QuantDivide divide = QuantDivide::divide;
};
ActQuantRule act_quant_rule(const MoeConfig& c);
// Scale of one group from its amax under the rule (0 for a zero group without a floor).
float group_scale(float amax, const ActQuantRule& r);
// Codes of n elements on a given scale, as the rule's quantization forms them: e4m3 satfinite of
// fl32(x / s) (divide) or fl32(x * fl32(1 / s)) (reciprocal); zero codes for s = 0.
void quantize_with_scale(const float* x, int64_t n, float s, QuantDivide d, uint8_t* codes);

struct GroupQuantized {
  int64_t rows = 0, cols = 0, group = 0;
  ScaleLayout layout = ScaleLayout::row_major;
  std::vector<uint8_t> codes;   // [rows, cols] e4m3fn
  std::vector<float> scales;    // [rows, ceil(cols/group)] or its transpose
  int64_t groups() const { return ceil_div(cols, group); }
  float scale(int64_t r, int64_t g) const {
    return layout == ScaleLayout::row_major ? scales[r * groups() + g] : scales[g * rows + r];
  }
};

// Quantize x [rows, cols] (row-major float) per (row, group of `group` columns).
GroupQuantized group_quantize(const float* x, int64_t rows, int64_t cols, int64_t group, ScaleFormat fmt,
                              double eps, ScaleLayout layout = ScaleLayout::row_major);
GroupQuantized group_quantize(const float* x, int64_t rows, int64_t cols, int64_t group, const ActQuantRule& r);
// One row into caller buffers: codes[cols], scales[ceil(cols/group)] (contiguous).
void group_quantize_row(const float* x, int64_t cols, int64_t group, ScaleFormat fmt, double eps, uint8_t* codes,
                        float* scales);
void group_quantize_row(const float* x, int64_t cols, int64_t group, const ActQuantRule& r, uint8_t* codes,
                        float* scales);

// Reorder scales between the two layouts.
std::vector<float> transpose_scales(const std::vector<float>& s, int64_t rows, int64_t groups, ScaleLayout from);

struct BlockQuantized {
  int64_t rows = 0, cols = 0, block = 0;  // [N, K] weight, block x block scales
  std::vector<uint8_t> codes;             // [N, K]
  std::vector<float> scales;              // [ceil(N/block), ceil(K/block)]
  int64_t block_rows() const { return ceil_div(rows, block); }
  int64_t block_cols() const { return ceil_div(cols, block); }
};

// Quantize a weight w [N, K] per block: s = fl32(max(amax, eps)/448) (or its ue8m0 ceil),
// q = e4m3_satfinite(fl32(w / s)). Ragged edge blocks use only their real elements.
BlockQuantized block_quantize(const float* w, int64_t rows, int64_t cols, int64_t block, ScaleFormat fmt,
                              double eps = 1e-12);

// Exact dequantization into double: out[r, c] = decode(codes[r, c]) * scales[r/block, c/block].
void block_dequantize(const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t block,
                      double* out);

}  // namespace moecheck
