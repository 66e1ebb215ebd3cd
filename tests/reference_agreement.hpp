// The agreement interval of two float64 references whose weight products run on different
// engines (reference/weight_products.hpp; BUDGETS.md §11), computed with products of its own
// (it shares the reference's rounding, re-quantization range and combine functions, so it finds
// engines that disagree, not a bug in those functions), and a check of two engines' forwards
// against it. Used by reference_products_test (CPU engines) and
// gpu_reference_test (the GPU's).
//
//   x:    both engines' GEMM1 outputs lie within 2 gamma_H sum|a||W13| of this file's own double
//         product (each is within gamma_H of the exact one, and so is this file's; the magnitude
//         sum itself within gamma_H); every interval end moved outward by one double rounding;
//   h:    the tier's steps on intervals: rounding to intermediate_dtype (monotone), SiLU's range
//         (reference/moe_budget.hpp silu_interval, no float32 slack), the product's corners
//         widened by one double rounding, rounding again, and for the quantized tier the group
//         re-quantization's range (requant_deviation: the scale's own formula, and one or two
//         2^-24 ulps of slack for the float32 quotient of group_quantize_row);
//   y:    W2 applied to h's box (centre and radius) plus 3 gamma_I sum|h||W2| for the engines'
//         GEMM2 and this file's own evaluation, then expert_output_dtype's rounding at both ends;
//   out:  the combine at both ends of every slot's interval: every combine recipe is monotone in
//         each slot output when the routing weights are >= 0 (each rounding is monotone).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "golden/case_problem.hpp"
#include "reference/array_agreement.hpp"
#include "reference/moe_forward.hpp"

namespace moecheck::testing {

// An FP8 weight [N, K] dequantized exactly in double (decode(code) * its block's scale), row-major.
std::vector<double> dequantize_weight(const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B);

// Per output element [T, H] and per slot output [T, k, H]: the interval every float64 engine's
// result of this tier lies in.
struct Agreement {
  std::vector<double> lo, hi, slot_lo, slot_hi;
};
Agreement agreement_interval(const MoeProblem& p, Tier tier, const Routing& rt);

struct AgreementTally {
  int64_t elements = 0, identical = 0;  // outputs [T, H] of the CPU's forward, and those equal in the engine's
  int64_t checked = 0, outside = 0;     // values checked (outputs and slot outputs of both forwards), outside
  int64_t wide = 0;  // outputs whose interval is wider than 2^-30 of the largest |output|: a rounding boundary in reach
  double widest = 0, largest_diff = 0;  // relative to the largest |output| of each case
  std::string first_outside;  // the first element outside, with its tier and the replay text
  std::string summary(const std::string& what) const;
};

// Both tiers of the problem on the CPU and with `products`, every output and slot output of both
// checked against the agreement interval (counted in tally; replay kept with the first outside);
// ASSERTs equal routing.
void check_engines_agree(const MoeProblem& p, WeightProducts& products, const std::string& replay, AgreementTally& tally);

// The budget's arrays of two forwards of one problem under one budget model (the CPU's and an
// engine's, ProductExtras): per array, named, how far the two lie apart (array_agreement.hpp).
struct BudgetArrayDiff : ArrayAgreement {
  std::string name;
  std::string describe() const;
};
std::vector<BudgetArrayDiff> budget_differences(const ForwardResult& cpu, const ForwardResult& engine);

}  // namespace moecheck::testing
