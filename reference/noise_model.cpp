// The statistical error model's building blocks (noise_model.hpp; BUDGETS.md §10).
#include "reference/noise_model.hpp"

#include <algorithm>
#include <cmath>

#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_forward.hpp"
#include "reference/rounded_mixture.hpp"

namespace moecheck {

namespace {
constexpr double kU32 = 0x1p-24;

// A rounding that maps the device's v + X to a value on a grid, where the reference's v went to
// vr: the cell of vr reaches lo below it and hi above it (hi = inf: nothing above rounds
// elsewhere, saturation), and leaving it moves the result by about a step (step_lo below,
// step_hi above) plus X itself.
struct Crossing {
  double var = 0;      // the variance proxy of the rounded result's deviation (at least the input's)
  double mean = 0;     // E of that deviation: p_hi step_hi - p_lo step_lo
  double crossed = 0;  // its second moment from the crossings alone, p (step^2 + var): no floor
  double p = 0;        // the crossing's probability, p_lo + p_hi (at most 1)
};
// The crossing of probabilities p_lo (down, by step_lo) and p_hi (up, by step_hi).
Crossing crossing_of(double p_lo, double p_hi, double step_lo, double step_hi, double var) {
  const double step = std::max(step_lo, step_hi);
  // Never below var itself: an element whose crossing probability underflows keeps a finite
  // weight in the aggregate fits (and the model stays conservative there).
  const double crossed = std::min(1.0, p_lo + p_hi) * (step * step + var);
  return {std::max(crossed, var), std::min(1.0, p_hi) * step_hi - std::min(1.0, p_lo) * step_lo, crossed,
          std::min(1.0, p_lo + p_hi)};
}
Crossing cell_crossing(double v, double vr, double var, double lo, double hi, double step_lo, double step_hi) {
  if (!(var > 0)) return {};
  const double p_lo = crossing_probability(v - (vr - lo), var);
  const double p_hi = std::isinf(hi) ? 0.0 : crossing_probability(vr + hi - v, var);
  return crossing_of(p_lo, p_hi, step_lo, step_hi, var);
}

// Steps of a binary grid with `mant` fraction bits and smallest normal exponent emin at r: the
// step at |r| and the step below |r| (half of it at a power of two above the subnormals).
struct Steps {
  double at, below;
};
Steps grid_steps(double r, int mant, int emin) {
  const double a = std::fabs(r);
  const double sub = std::ldexp(1.0, emin - mant);
  if (a < std::ldexp(1.0, emin)) return {sub, sub};
  int e;
  const double f = std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1)
  const double at = std::ldexp(1.0, e - 1 - mant);
  return {at, f == 0.5 && a > std::ldexp(1.0, emin) ? at / 2 : at};
}

// The crossing for a value rounded to nearest on that grid: toward zero the cell reaches half
// the step below, away from zero half the step at vr (mirrored for negatives).
Crossing grid_crossing(double v, double vr, double var, int mant, int emin) {
  const Steps s = grid_steps(vr, mant, emin);
  const double toward0 = s.below, away = s.at;
  if (vr > 0) return cell_crossing(v, vr, var, toward0 / 2, away / 2, toward0, away);
  if (vr < 0) return cell_crossing(v, vr, var, away / 2, toward0 / 2, away, toward0);
  return cell_crossing(v, vr, var, s.at / 2, s.at / 2, s.at, s.at);
}
double grid_crossing_var(double v, double vr, double var, int mant, int emin) {
  return grid_crossing(v, vr, var, mant, emin).var;
}

// An e4m3 code's crossing with the probabilities of leaving its cell down (p_lo) and up (p_hi):
// the move is the step toward zero or away from it, as for grid_crossing.
Crossing code_crossing(double cv, double var, double p_lo, double p_hi) {
  const Steps s = grid_steps(cv, 3, -6);
  return cv < 0 ? crossing_of(p_lo, p_hi, s.at, s.below, var) : crossing_of(p_lo, p_hi, s.below, s.at, var);
}

}  // namespace

double crossing_probability(double dist, double var) {
  if (!(var > 0)) return dist > 0 ? 0.0 : 1.0;
  // Beyond 27 of erfc's argument the result is below 1e-318: no call needed.
  if (dist * dist > 1458 * var) return dist > 0 ? 0.0 : 1.0;
  return 0.5 * std::erfc(dist / std::sqrt(2 * var));
}

double rounded_noise_var(double v, double vr, double var) { return rounded_noise_var(v, vr, var, Precision::bf16); }

double rounded_noise_var(double v, double vr, double var, Precision p) {
  if (!(var > 0)) return 0.0;
  if (!std::isfinite(vr)) return var;
  return p == Precision::bf16 ? grid_crossing_var(v, vr, var, 7, -126) : grid_crossing_var(v, vr, var, 23, -126);
}

double noise_z(double tests, double alpha) { return std::sqrt(2 * std::log(2 * std::max(tests, 1.0) / alpha)); }

namespace {
// h_deq(the group's values h, re-quantized on scale s_new) - h_deq(as the reference quantized it:
// codes on scale s), for the n elements of one group (the rule's own quantization), as its split
// (ScaleJumps): s_new / s - 1 (returned) and the moved codes' part code_part.
double jumped_group(const float* h, int64_t n, float s_new, QuantDivide d, const uint8_t* codes, double s,
                    double* code_part) {
  std::vector<uint8_t> mc(static_cast<size_t>(n));
  quantize_with_scale(h, n, s_new, d, mc.data());
  for (int64_t i = 0; i < n; ++i)
    code_part[i] = (double(e4m3_decode(mc[size_t(i)])) - double(e4m3_decode(codes[i]))) * double(s_new);
  return double(s_new) / s - 1;
}

// What every step of intermediate_noise_var reads: its arguments (noise_model.hpp) and h's variance
// before the re-quantization, vh [I].
struct NoiseRow {
  const MoeConfig& c;
  const BudgetModel& m;
  const double* x;
  const double* vx;
  int64_t gate0, up0;
  const float* h;
  const uint8_t* codes;
  const float* scales;
  std::vector<double> vh;
  // Where the device's h may leave an interval (a code's cell, a scale's binade), the probability
  // is taken from gate's and up's rounded values themselves (§10.9), not from vh's normal
  // approximation.
  IntermediateMixture mixture(int64_t i) const {
    return intermediate_mixture(c, m, x[gate0 + i], vx[gate0 + i], x[up0 + i], vx[up0 + i]);
  }
};

// Step 1 (§10.2): h before re-quantization, linearised: gate and up rounded to ip, silu in
// float32 (silu_ulps) and possibly bf16, the product and its rounding to ip.
void intermediate_var_before_requant(NoiseRow& in) {
  const MoeConfig& c = in.c;
  const int64_t I = c.intermediate_size;
  const Precision ip = c.intermediate_dtype;
  in.vh.assign(static_cast<size_t>(I), 0.0);
  for (int64_t i = 0; i < I; ++i) {
    const double g0 = in.x[in.gate0 + i], u0 = in.x[in.up0 + i];
    const double g = round_to(g0, ip), u = round_to(u0, ip);
    const double vg = rounded_noise_var(g0, g, in.vx[in.gate0 + i], ip);
    const double vu = rounded_noise_var(u0, u, in.vx[in.up0 + i], ip);
    const double s0 = silu(g), slope = silu_slope(g), ds = in.m.silu_ulps * kU32 * std::fabs(s0);
    double vs = slope * slope * vg + ds * ds;
    double sg = s0;
    if (c.recipe.silu_dtype == Precision::bf16) sg = round_to(s0, Precision::bf16), vs = rounded_noise_var(s0, sg, vs);
    // Var(S U) of independent S, U is sg^2 vu + u^2 vs + vs vu: the last, second-order term is
    // what remains where gate and up both cancel to about 0 (gate seed 50 case 255: an h of 1e-31
    // whose device value was a third of the group's amax, error energy 8.5 times the first-order
    // prediction).
    const double h0 = sg * u, dp = kU32 * std::fabs(h0);
    in.vh[size_t(i)] = rounded_noise_var(h0, double(in.h[i]), u * u * vs + sg * sg * vu + vs * vu + dp * dp, ip);
  }
}

// One group: its n elements from g0 (G, fewer in the last group), its scale s, and jmax, its
// element of the largest |h|.
struct NoiseGroup {
  int64_t g0, n, jmax;
  double s;
};

// The shared scale's deviation: vs, the proxy of the device's scale minus s (continuous, float32
// scales), and the probabilities that it doubles (p_up) or halves (p_dn) (UE8M0 scales).
struct ScaleMoves {
  double vs = 0, p_up = 0, p_dn = 0;
};

// A group whose scale is not positive, or all zero without an eps floor: each element keeps its
// worst case as its variance, nothing else.
void worst_case_group(const NoiseGroup& gr, const double* worst_dev, double* var, const RequantMoments* rq,
                      const CodeFlips* flips) {
  for (int64_t i = gr.g0; i < gr.g0 + gr.n; ++i) {
    var[i] = worst_dev[i] * worst_dev[i];
    if (rq) rq->mean[i] = 0, rq->mean_bound[i] = worst_dev[i], rq->var[i] = var[i], rq->cell[i] = worst_dev[i];
    if (flips) flips->p[i] = flips->step[i] = 0;
  }
}

// Float32 scales: vs from amax's variance and the scale's own float32 rounding (scale_ulps). The
// shared factor's continuous part, vs / s^2. The amax element's own rounding to
// intermediate_dtype, where the device's value may leave its cell, moves amax by a whole step and
// re-quantizes the group (ScaleJumps): measured, gate --backend cuda seed 45 case 403 (a one-group
// slot; amax a bf16 step low, the scale 0.6% low, and every code within 0.6% below a rounding
// boundary one step up: the slot 2.8% high).
ScaleMoves f32_scale_moves(const NoiseRow& in, const NoiseGroup& gr, const ActQuantRule& rule, double* scale_rel_var,
                           const ScaleJumps* jumps) {
  const int64_t g0 = gr.g0, n = gr.n, jmax = gr.jmax, G = in.c.group_size;
  const double s = gr.s, amax = std::fabs(in.h[jmax]), vamax = in.vh[size_t(jmax)];
  const double dsl = in.m.scale_ulps * kU32 * s;
  ScaleMoves mv;
  mv.vs = (s / amax) * (s / amax) * vamax + dsl * dsl;
  if (scale_rel_var) scale_rel_var[g0 / G] = mv.vs / (s * s);
  if (!jumps) return mv;
  const Precision ip = in.c.intermediate_dtype;
  const auto [lo, hi] = rounding_cell(double(in.h[jmax]), ip);
  const auto [p_lo, p_hi] = in.mixture(jmax).exits(lo, hi, 0.0, 0.0);
  if (!(p_lo + p_hi > 1e-12)) return mv;
  // The device's amax is the neighbour; the others keep their values.
  jumps->p[g0 / G] = std::min(1.0, p_lo + p_hi);
  std::vector<float> moved(in.h + g0, in.h + g0 + n);
  for (int dir : {+1, -1}) {  // amax one step up or down in magnitude
    moved[size_t(jmax - g0)] = grid_next(in.h[jmax], ip, in.h[jmax] > 0 ? dir : -dir);
    float moved_amax = 0;  // another element may tie with amax: the device's amax then stays
    for (const float v : moved) moved_amax = std::max(moved_amax, std::fabs(v));
    const float s_new = group_scale(moved_amax, rule);
    const bool up = dir > 0;
    (up ? jumps->rel_up : jumps->rel_dn)[g0 / G] = jumped_group(moved.data(), n, s_new, rule.divide, in.codes + g0, s,
                                                                (up ? jumps->code_up : jumps->code_dn) + g0);
  }
  return mv;
}

// UE8M0 scales: s = 2^e covers amax / 448 in (s / 2, s]; leaving it doubles (p_up) or halves
// (p_dn) the scale, and every element of the group is re-quantized on the other grid. Any |h|
// rounded above 448 s doubles the scale (a union bound over the elements within reach of it);
// amax rounded to 224 s or below halves it (the amax element alone: all of them must fall, so
// this is conservative). The division by 448 adds its float32 slack.
ScaleMoves ue8m0_scale_moves(const NoiseRow& in, const NoiseGroup& gr, const ActQuantRule& rule,
                             const ScaleJumps* jumps) {
  const int64_t g0 = gr.g0, n = gr.n, jmax = gr.jmax, G = in.c.group_size;
  const double s = gr.s, dsl = in.m.scale_ulps * kU32 * s;
  const Precision ip = in.c.intermediate_dtype;
  const float* h = in.h;
  ScaleMoves mv;
  const double up_edge = upper_rounding_edge(448.0 * s, ip), dn_edge = upper_rounding_edge(224.0 * s, ip);
  const IntermediateMixture mj = in.mixture(jmax);
  const double va = (448 * dsl) * (448 * dsl);
  if (h[jmax] >= 0) {
    const auto e = mj.exits(dn_edge, up_edge, 0.0, va);
    mv.p_dn = e.first, mv.p_up = e.second;
  } else {
    const auto e = mj.exits(-up_edge, -dn_edge, 0.0, va);
    mv.p_up = e.first, mv.p_dn = e.second;
  }
  for (int64_t i = g0; i < g0 + n; ++i) {
    const double gap = up_edge - std::fabs(double(h[i]));
    if (i == jmax || (std::fabs(double(h[i])) < 0.9 * 448.0 * s && gap * gap > 50 * in.vh[size_t(i)])) continue;
    const auto e = in.mixture(i).exits(-up_edge, up_edge, 0.0, va);
    mv.p_up += e.first + e.second;
  }
  mv.p_up = std::min(mv.p_up, 1.0);
  // The doubled or halved scale re-quantizes the whole group (ScaleJumps): every element
  // rounds on the other grid, a change shared by the group's projections, as for the
  // float32 scale's jump (f32_scale_moves).
  if (jumps && (mv.p_up > 1e-12 || mv.p_dn > 1e-12)) {
    jumps->p[g0 / G] = std::min(1.0, mv.p_up + mv.p_dn);
    if (mv.p_up > 1e-12)
      jumps->rel_up[g0 / G] = jumped_group(h + g0, n, float(2 * s), rule.divide, in.codes + g0, s, jumps->code_up + g0);
    if (mv.p_dn > 1e-12)
      jumps->rel_dn[g0 / G] = jumped_group(h + g0, n, float(s / 2), rule.divide, in.codes + g0, s, jumps->code_dn + g0);
  }
  return mv;
}

// Each element's code on the group's scale: its variance, its crossing (flips) and the
// re-quantization test's moments. A UE8M0 scale's move re-quantizes the element on the other
// grid: its dequantized value moves by at most half a step of each grid, 1.5 (doubled) or 0.75
// (halved) steps.
void group_code_terms(const NoiseRow& in, const NoiseGroup& gr, const ScaleMoves& mv, double* var,
                      const RequantMoments* rq, const CodeFlips* flips) {
  const double s = gr.s, vs = mv.vs, p_up = mv.p_up, p_dn = mv.p_dn;
  const double dw = in.m.divide_ulps * kU32;
  const Precision ip = in.c.intermediate_dtype;
  for (int64_t i = gr.g0; i < gr.g0 + gr.n; ++i) {
    const double v = double(in.h[i]) / s, cv = double(e4m3_decode(in.codes[i]));
    const double vv = in.vh[size_t(i)] / (s * s) + v * v * vs / (s * s) + (dw * v) * (dw * v);
    const double st = grid_steps(cv, 3, -6).at * s;
    // The code's crossing (§10.9): the mixture's probability of leaving the code's cell (none
    // beyond a code saturated at +-448), with the scale's continuous deviation and the
    // division's slack as the last continuous terms.
    const auto [lo, hi] = code_cell_before_rounding(cv, s, ip);
    const auto [p_lo, p_hi] = in.mixture(i).exits(lo, hi, vs / (s * s) + dw * dw, 0.0);
    const Crossing x = code_crossing(cv, vv, p_lo, p_hi);
    const double scale_terms = cv * cv * vs + std::min(1.0, p_up) * (1.5 * st) * (1.5 * st) +
                               std::min(1.0, p_dn) * (0.75 * st) * (0.75 * st);
    var[i] = s * s * x.var + scale_terms;
    if (flips) flips->p[i] = x.p, flips->step[i] = st;
    // The mean: the code's crossings, signed (the continuous parts, h's own rounding and the
    // float32 scale's slack, are taken as centred, A2 of §10.4); the UE8M0 scale's crossings,
    // whose direction depends on every element of the group, as a bound.
    if (rq) {
      rq->mean[i] = s * x.mean;
      rq->mean_bound[i] = std::min(1.0, p_up) * 1.5 * st + std::min(1.0, p_dn) * 0.75 * st;
      // A deviation of h that crosses no boundary leaves its code, so h_deq, unchanged: the
      // second moment is the crossings' (the floor at h's own variance, kept in var for the
      // fits' weights, is no deviation of h_deq).
      rq->var[i] = s * s * x.crossed + scale_terms;
      rq->cell[i] = st;
    }
  }
}
}  // namespace

void intermediate_noise_var(const MoeConfig& c, const BudgetModel& m, const double* x, const double* vx,
                            int64_t gate0, int64_t up0, const float* h, const uint8_t* codes, const float* scales,
                            const double* worst_dev, double* var, const RequantMoments* rq,
                            double* scale_rel_var, const ScaleJumps* jumps, const CodeFlips* flips) {
  const int64_t I = c.intermediate_size, G = c.group_size;
  NoiseRow in{c, m, x, vx, gate0, up0, h, codes, scales, {}};
  intermediate_var_before_requant(in);
  // Step 2: re-quantization per group. The scale follows the group's amax (the element of the
  // largest |h|): float32 scales move continuously with it, UE8M0 scales by a factor of two
  // when amax crosses a power-of-two boundary.
  const ActQuantRule rule = act_quant_rule(c);
  for (int64_t g0 = 0; g0 < I; g0 += G) {
    NoiseGroup gr{g0, std::min(G, I - g0), g0, scales[g0 / G]};
    for (int64_t i = g0; i < g0 + gr.n; ++i)
      if (std::fabs(h[i]) > std::fabs(h[gr.jmax])) gr.jmax = i;
    const double amax = std::fabs(h[gr.jmax]);
    const bool floored = rule.floor == ActScaleFloor::eps && amax < rule.eps;
    if (scale_rel_var) scale_rel_var[g0 / G] = 0;
    if (jumps) {
      std::fill_n(jumps->code_up + g0, gr.n, 0.0), std::fill_n(jumps->code_dn + g0, gr.n, 0.0);
      jumps->p[g0 / G] = jumps->rel_up[g0 / G] = jumps->rel_dn[g0 / G] = 0;
    }
    if (!(gr.s > 0) || (rule.floor != ActScaleFloor::eps && amax == 0)) {
      worst_case_group(gr, worst_dev, var, rq, flips);
      continue;
    }
    ScaleMoves mv;
    if (!floored)
      mv = rule.format == ScaleFormat::f32 ? f32_scale_moves(in, gr, rule, scale_rel_var, jumps)
                                           : ue8m0_scale_moves(in, gr, rule, jumps);
    group_code_terms(in, gr, mv, var, rq, flips);
  }
}

}  // namespace moecheck
