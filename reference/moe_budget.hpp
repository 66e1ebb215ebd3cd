// Error budgets: for every element a backend records, a bound on how far a correct
// implementation of docs/DEVICE-ALGORITHM.md may land from the float64 quantized-tier reference.
// The derivation is reference/BUDGETS.md; this header names each term as that document does.
//
// The method is interval propagation along the recipe. At each step the reference holds the
// exact value v of its own computation and an interval [lo, hi] that contains every value a
// correct device may hold there (v included). Roundings and re-quantizations are applied to the
// interval ends (they are monotone), so a value far from a rounding boundary keeps a zero-width
// deviation after rounding, and one whose interval straddles a boundary gets both neighbours:
// that is how "re-quantization flips" are admitted without loosening every element.
// Dot products use the deterministic accumulation bound c(K) * sum |a||w| (sums computed by the
// reference with an extra GEMM on absolute values).
#pragma once

#include <cstdint>
#include <string>

#include "reference/moe_config.hpp"

namespace moecheck {

// How the backend accumulates the products of one 128-wide K block (BUDGETS.md §2).
struct AccumulatorModel {
  // Significant bits the accumulator keeps. 24 = IEEE float32 with round-to-nearest (CPU,
  // CUDA-core FFMA); Hopper FP8 tensor cores keep 14 and truncate (hopper_tensor_core()).
  int kept_bits = 24;
  bool truncating = false;  // true: each addition's terms are aligned to the largest and truncated
  int instr_k = 32;         // products summed per tensor-core instruction (k32 for FP8 MMA)

  static AccumulatorModel fp32() { return {24, false, 32}; }
  // Hopper FP8 wgmma, derived from the model `moecheck probe` measured on an H200
  // (TensorCoreModel::hopper_wgmma, BUDGETS.md §2.1): terms cut 13 bits below the largest
  // exponent-field sum (a grid of 2^(1-14) of the alignment magnitude), the result cut to 14
  // significant bits: 14 kept bits, truncating, 32 products per instruction.
  static AccumulatorModel hopper_tensor_core() { return {14, true, 32}; }
  // FP8 converted to f16 and summed by HMMA with a float32 accumulator (what mma.sync e4m3
  // lowers to on sm_90: F2FP unpack + HMMA.16816.F32, seen in our kernels' SASS): modelled as a
  // 24-bit truncating aligned sum over chunks of 4 products (Fasi, Higham, Mikaitis, Pranesh,
  // PeerJ CS 2021, measured round-toward-zero alignment in fp32-accumulating tensor cores; chunks
  // of 4 is the conservative choice of their findings).
  static AccumulatorModel hmma_f32() { return {24, true, 4}; }
  std::string describe() const;
  bool operator==(const AccumulatorModel&) const = default;
};

struct BudgetModel {
  AccumulatorModel acc;
  // Float32 slack granted to engine code that is not bit-exact with the contract's correctly
  // rounded operations (BUDGETS.md §1): amax/448 computed as amax * (1/448), x / s as x * (1/s),
  // expf within 2 ulp. Counted in units of 2^-24 relative.
  int scale_ulps = 2;    // activation / intermediate scale s
  int divide_ulps = 2;   // x / s before the FP8 rounding
  int silu_ulps = 8;     // silu(g) = g / (1 + expf(-g)) in float32
  int routing_ulps = 8;  // each routing score, relative to its magnitude (margin_scale)
};

// Relative bound c such that a backend's two-level dot product of length K (blocks of `block`,
// per-block scale products sa*sb, float32 promotion) errs by at most c * sum |a_k||b_k| from the
// exact dot product of the same quantized operands. pow2_scales: both scales powers of two (the
// scale product is then exact).
double dot_product_bound(const AccumulatorModel& acc, int64_t K, int64_t block, bool pow2_scales);

// The promotion part of that bound alone: fl32(sa * sb) (0 for powers of two) and one FFMA per
// block, (1 + u)(1 + gamma_nb(u)) - 1. With the chunked truncation bound (truncation_bound.hpp)
// the block accumulation is bounded separately and only this constant multiplies sum |a||w|.
double promotion_bound(int64_t K, int64_t block, bool pow2_scales);

// A closed interval of real numbers.
struct Interval {
  double lo = 0, hi = 0;
  double width_from(double v) const;  // max(hi - v, v - lo), >= 0 when v lies inside
};

// Round both ends to precision p (monotone, so every rounded value of the interval lies inside).
Interval round_interval(Interval x, Precision p);

// Range of silu over g in [lo, hi] (silu has one minimum, at g* = -1.2784645...), widened by
// silu_ulps * 2^-24 of the largest magnitude for the float32 evaluation.
Interval silu_interval(Interval g, int silu_ulps);

// Product of two intervals, widened by one float32 rounding of the largest magnitude.
Interval product_interval_f32(Interval a, Interval b);

// Re-quantization of one group (BUDGETS.md §4): h[i] in [lo[i], hi[i]], the reference's own
// dequantized values ref_deq[i] (decode(code) * scale of its own group_quantize_row). Writes
// dev[i] = how far a correct device's dequantized value may lie from ref_deq[i].
void requant_deviation(const double* lo, const double* hi, const double* ref_deq, int64_t n, ScaleFormat fmt,
                       double eps, const BudgetModel& m, double* dev);
// The same under a recipe's rule (BUDGETS.md §9.3-9.4): without a floor the scale interval may
// reach 0; x * fl32(1/s) lies within the divide_ulps slack of x / s.
struct ActQuantRule;
void requant_deviation(const double* lo, const double* hi, const double* ref_deq, int64_t n, const ActQuantRule& r,
                       const BudgetModel& m, double* dev);

// Deviation of a routing weight: the reference's double weight w (before rounding), the
// device's float32 evaluation within (slack_ulps + routing_ulps) 2^-24 relative (slack_ulps =
// E + k covers a softmax sum over E experts and a renormalising sum over k), then rounded to p;
// measured from the reference's rounded weight w_ref.
double weight_deviation(double w, double w_ref, Precision p, int64_t slack_ulps, const BudgetModel& m);

// The final bf16 rounding of an output element whose device float32 value lies within e of the
// reference's double value o: the largest distance from o of bf16(o - e) and bf16(o + e).
double output_budget_bf16(double o, double e);

// Spacing of bf16 values at |x| (0 for x = 0): 2^(floor(log2|x|) - 7), at least the subnormal step.
double bf16_ulp(double x);

// The unit of a fresh bf16 rounding of a value near x: bf16_ulp(x), and bf16's subnormal step
// 2^-133 at x = 0 (where a rounding residual is still up to half that step, BUDGETS.md §10.3).
inline double bf16_rounding_unit(double x) { return bf16_ulp(x) > 0x1p-133 ? bf16_ulp(x) : 0x1p-133; }

}  // namespace moecheck
