// The statistical error model (BUDGETS.md §10): beside the worst-case budget (exceeding it proves
// a bug), what a correct device's deviation from the reference looks like on ordinary data, so
// that the aggregate tests run against what a correct device really does.
//
// Every deviation is written as a sum of independent, zero-mean, bounded terms: each term of
// range (-r, r) has the Hoeffding variance proxy r^2 (a sum of such terms is sub-Gaussian with
// the sum of the proxies, P(S > t) <= exp(-t^2 / (2 V))). Which terms are taken as independent
// and zero-mean is the model's assumption, stated where each term is made (BUDGETS.md §10.1-10.4)
// and tested on bit-exact Hopper emulations (tests/noise_model_test.cpp).
//
// Roundings of a device value the reference knows to be near v (the reference's own unrounded
// value) are not noise of their own: the device rounds to the same value vr as the reference
// unless its deviation crosses a rounding boundary, so the variance after the rounding is the
// crossing probability times the squared step, centred on vr.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "reference/moe_budget.hpp"
#include "reference/moe_config.hpp"

namespace moecheck {

// P(X >= dist) for a deviation X of variance var, in the normal approximation (X is a sum of many
// independent terms; BUDGETS.md §10.2): 0.5 erfc(dist / sqrt(2 var)) (one half at dist = 0).
double crossing_probability(double dist, double var);

// The variance proxy of (device's bf16(fl32(v + X)) - vr), vr = the reference's bf16(fl32(v)),
// when the device's deviation X before the rounding has proxy var: crossing one of the two
// boundaries of vr's rounding cell has probability p <= P_lo + P_hi, and then the rounded value
// moves by about one step plus X: p (step^2 + var), at most step^2 + var, at least var.
double rounded_noise_var(double v, double vr, double var);
// The same for a rounding to precision p (bf16, or float32 where the step is 2^-23 relative).
double rounded_noise_var(double v, double vr, double var, Precision p);

// The noise model of one row's intermediate (BUDGETS.md §10.2): from the GEMM1 outputs x [2I]
// (the reference's, unrounded) and their variance proxies vx, through the roundings of gate and
// up, silu, the product and its rounding, to the re-quantization of each group: the reference's
// own pre-quantization values h [I] (float, as it quantized them), its codes [I] and scales
// [ceil(I/G)]. Writes var [I], the proxy of the device's dequantized intermediate minus the
// reference's. Where the model does not apply (a group whose scale may be 0 without a floor) it
// writes worst_dev^2, the worst case's deviation squared. rq, when given: RequantMoments below.
// The re-quantization test's view of the same deviation X (BUDGETS.md §10.7), per element [I]:
// the re-quantization's crossings move h by a step toward the nearer cell boundary, so X has a
// mean, p_hi step_hi - p_lo step_lo; |E X - mean| <= mean_bound covers what has no known sign
// (UE8M0 scale crossings; where the model does not apply, worst_dev with mean 0); var is X's
// second moment from the crossings and the scale, without var's floor at h's own variance (a
// deviation that crosses nothing leaves the code as it is); cell is the e4m3 step at the
// reference's code times the group's scale, the size of one code's move in h's units (where the
// model does not apply: worst_dev).
// scale_rel_var, when given [ceil(I/G)]: per group the variance of the device's float32 scale
// relative to the reference's, (vs / s)^2 of §10.2 step 4, its continuous part (0 for UE8M0
// scales and where the model does not apply). Unlike a code's crossing, that deviation is shared
// by every element of the group: the dequantized group moves as a whole, by that factor
// (BUDGETS.md §7).
// jumps, when given: ScaleJumps below.
struct RequantMoments {
  double* mean = nullptr;
  double* mean_bound = nullptr;
  double* var = nullptr;
  double* cell = nullptr;
};
// A float32 scale's jump (BUDGETS.md §7): where the device's amax element may leave its own
// rounding cell of intermediate_dtype (probability p > 1e-12), amax moves by a whole step and the
// scale with it, and the group is re-quantized on the moved scale: every code keeps its value
// times the new scale except those within that step of a rounding boundary, which all move one
// code step the same way. Not a small Gaussian term: the whole change of the group's dequantized
// intermediate is kept, for amax one step up and one step down, so that its projections can be
// taken exactly: h_deq(moved scale) - h_deq = rel h_deq + code, rel_up, rel_dn [ceil(I/G)] (moved
// scale / scale - 1: every code's share) and code_up, code_dn [I] (the codes that moved: (new code
// - code) x moved scale, 0 elsewhere and in groups that do not jump);
// p [ceil(I/G)]: the probability that amax leaves its cell (float32 scales) or its binade (UE8M0
// scales: the scale doubles or halves), 0: no jump. For UE8M0 the elements' own scale terms stay
// in var as well (counted twice: conservative).
struct ScaleJumps {
  double* p = nullptr;
  double* rel_up = nullptr;
  double* rel_dn = nullptr;
  double* code_up = nullptr;
  double* code_dn = nullptr;
};
// A code's own crossing (BUDGETS.md §10.8), per element [I]: the probability p that the device's
// code is the neighbour of the reference's, and step, the larger of the two e4m3 steps next to
// the reference's code times the group's scale: the crossing moves the dequantized element by
// at most step, and p step^2 of var is that move's second moment (0, 0 where the model does not
// apply, or the code cannot cross).
struct CodeFlips {
  double* p = nullptr;
  double* step = nullptr;
};
void intermediate_noise_var(const MoeConfig& c, const BudgetModel& m, const double* x, const double* vx,
                            int64_t gate0, int64_t up0, const float* h, const uint8_t* codes, const float* scales,
                            const double* worst_dev, double* var, const RequantMoments* rq = nullptr,
                            double* scale_rel_var = nullptr, const ScaleJumps* jumps = nullptr,
                            const CodeFlips* flips = nullptr);

// The variance proxy of a jump whose effect on a statistic is a_up (amax a step up), a_dn (a
// step down) or 0 (no jump), with probability p of a jump: Hoeffding's proxy for a variable of
// that range, range^2 / 4, plus its mean, at most p times the larger effect, squared (BUDGETS.md
// §7). 0 when p is 0.
inline double jump_var(double p, double a_up, double a_dn) {
  if (!(p > 0)) return 0.0;
  const double range = std::max({a_up, a_dn, 0.0}) - std::min({a_up, a_dn, 0.0});
  const double mean = p * std::max(std::fabs(a_up), std::fabs(a_dn));
  return range * range / 4 + mean * mean;
}

// The sigma multiple at which a sub-Gaussian test of `tests` statistics has a false-alarm
// probability of at most `alpha` in all (two-sided, union bound): sqrt(2 ln(2 tests / alpha)).
double noise_z(double tests, double alpha);

// False-alarm probability per judged output that the aggregate tests are held to (BUDGETS.md §10).
constexpr double kFalseAlarmPerOutput = 1e-6;
// Of that, the share spent on the rarest re-quantization crossings (BUDGETS.md §10.8): the
// aggregate tests leave out the crossings whose probabilities sum to at most this share of
// kFalseAlarmPerOutput (a union bound: none of them happens, or the output may false-alarm), and
// the tests' own level is the rest.
constexpr double kRareCrossingShare = 0.1;

// The revision of the terms a stored reference carries (noise_var, slot_noise_var,
// slot_flip_projection, the re-quantization terms): a stored /reference/quantized is reused only
// when its attribute noise_model equals this (golden/FORMAT.md). Raised whenever those terms
// change meaning; "2": the flip projections hold the groups' shared scale term (BUDGETS.md §7);
// "3": that term's jumps re-quantize the group (ScaleJumps), and the re-quantization test's
// variance holds the groups' shared terms and jumps too; "4": the flips' tails (slot_flip_tail); "5": no exact place in them below p' 1e-12; "6": the codes' crossings from the mixture of gate's and
// up's rounded values (§10.9), the re-quantization test's crossings (requant_flip_tail) and the
// energy test's (slot_energy_tail).
inline constexpr const char* kNoiseModelRevision = "6";

}  // namespace moecheck
