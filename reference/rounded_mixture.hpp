// The device's intermediate before its rounding, as a mixture of grid points (BUDGETS.md §10.9).
//
// GEMM1's outputs gate and up are rounded to intermediate_dtype before SiLU. Where the device's
// deviation X before that rounding is small beside the grid's step, the device's rounded value is
// the reference's own or one of its few neighbours, each with its probability: a discrete
// variable. The normal approximation of §10.2 replaces it by a Gaussian of the same variance,
// p step^2, whose tail at one step is far below p: a rounding of gate one bf16 step down
// (p ~ 1 %) that carries h across a re-quantization boundary with certainty was given a
// probability of 3e-16 (golden/findings case 40, gate seed 50). Here each such rounding keeps its
// grid points, h is taken at every pair of points, and the probability that the device's h
// leaves an interval (a code's cell, a scale's binade) is the mixture's: the roundings of gate
// and up kept as their grid points (up to 7 on each side, the mass beyond counted as leaving),
// the normal approximation only for the small continuous terms after them (the float32 slack of
// silu and the product, the scale's and the division's; silu's own bf16 rounding under
// silu_dtype = bf16 stays a Gaussian crossing).
#pragma once

#include <cstdint>
#include <utility>

#include "reference/moe_budget.hpp"
#include "reference/moe_config.hpp"

namespace moecheck {

// The neighbour of the representable v on the grid of `prec` (bf16 or float32), toward +inf
// (dir > 0) or -inf: one unit of the last place (bf16: bit 16) added to or taken from the
// magnitude (from 0: the smallest subnormal of that sign).
float grid_next(float v, Precision prec, int dir);

// The device's round_p(v0 + X), X of variance var, where the reference rounded v0 to vr: its
// possible values v[j] with probabilities p[j] (j = 0 is vr), each carrying a continuous variance
// `var` (0 when the points are the grid's own). Where X's sigma exceeds twice the step at vr the
// rounding is smooth beside X: one point, vr, with §10.2's variance of the rounded value.
// Neighbours are listed while the tail beyond them is above 1e-30, at most kSide per side; the
// mass beyond the last ones (below 2e-4 at sigma = 2 steps) is `far`, which the mixture counts
// as leaving any interval (conservative).
struct GridPoints {
  static constexpr int kSide = 7;
  static constexpr int kMax = 2 * kSide + 1;
  double v[kMax] = {}, p[kMax] = {};
  int n = 0;
  double var = 0, far = 0;
};
GridPoints rounded_points(double v0, double vr, double var, Precision prec);

// The device's h = sg u before its rounding to intermediate_dtype, sg = silu(gate) (rounded to
// silu_dtype), over gate's and up's GridPoints (independent: different rows of W13): per pair its
// probability p, h, and the variance of its continuous terms. Pairs of probability below 1e-40
// are dropped.
struct IntermediateMixture {
  static constexpr int kMax = GridPoints::kMax * GridPoints::kMax;
  double p[kMax], h[kMax], var[kMax];
  int n = 0;
  double far = 0;  // the probability that gate or up lies beyond its listed points
  // P(h + Y < lo) and P(h + Y > hi), Y the pair's continuous terms plus rel_var h^2 + abs_var.
  std::pair<double, double> exits(double lo, double hi, double rel_var, double abs_var) const;
};
IntermediateMixture intermediate_mixture(const MoeConfig& c, const BudgetModel& m, double g0, double vg, double u0,
                                         double vu);

// The values h before its rounding to `prec` whose rounded value quantizes to code value cv at
// scale s (e4m3, round to nearest even, saturating): (lo, hi), infinite beyond a saturated code.
// The division's own slack is left to the caller's continuous terms.
std::pair<double, double> code_cell_before_rounding(double cv, double s, Precision prec);

// The values before a rounding to `prec` that round to the representable vr: its rounding cell.
std::pair<double, double> rounding_cell(double vr, Precision prec);

// The edge above which a value rounds (to `prec`) to something greater than the representable b.
double upper_rounding_edge(double b, Precision prec);

}  // namespace moecheck
