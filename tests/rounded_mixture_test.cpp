// The intermediate's code crossings from the mixture of gate's and up's rounded values
// (reference/rounded_mixture.hpp, BUDGETS.md §10.9), against a simulated device that draws the
// GEMM1 deviations from the same Gaussian model and rounds as a device does: bf16 gate and up,
// silu, the bf16 product, e4m3 at the group's scale. The normal approximation this replaces gave
// golden case tiny-kimi-hopper-compound-rounding a crossing probability of 3e-16 where the
// simulation finds about 1 %.
//
// Random scenarios come from a fixed seed (MOECHECK_SEED=<s> replays another).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fmt/format.h>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_forward.hpp"
#include "reference/noise_model.hpp"
#include "reference/rounded_mixture.hpp"

namespace moecheck {
namespace {

MoeConfig bf16_intermediate() {
  MoeConfig c;
  c.intermediate_dtype = Precision::bf16;
  return c;
}

double code_value(double h, double s) {
  return double(fp8_decode(fp8_encode(double(fl32(h / s)), Fp8Format::e4m3fn), Fp8Format::e4m3fn));
}

// The reference's code and the mixture's probability that the device's code differs.
struct Scenario {
  double g0, vg, u0, vu, s;
};
double reference_code(const Scenario& x) {
  const double g = bf16_round(x.g0), u = bf16_round(x.u0);
  return code_value(bf16_round(silu(g) * u), x.s);
}
// The probabilities that the device's code lies below and above the reference's.
std::pair<double, double> mixture_exits(const Scenario& x) {
  const IntermediateMixture mix = intermediate_mixture(bf16_intermediate(), BudgetModel{}, x.g0, x.vg, x.u0, x.vu);
  const auto [lo, hi] = code_cell_before_rounding(reference_code(x), x.s, Precision::bf16);
  return mix.exits(lo, hi, 0.0, 0.0);
}
double mixture_p(const Scenario& x) {
  const auto [p_lo, p_hi] = mixture_exits(x);
  return p_lo + p_hi;
}
// The fractions of n simulated devices whose code lies below and above the reference's.
std::pair<double, double> simulated_exits(const Scenario& x, uint64_t seed, int n) {
  const CounterRng rng{seed, 11};
  const double cv = reference_code(x);
  int below = 0, above = 0;
  for (int i = 0; i < n; ++i) {
    const double g = bf16_round(x.g0 + std::sqrt(x.vg) * rng.normal(2 * uint64_t(i)));
    const double u = bf16_round(x.u0 + std::sqrt(x.vu) * rng.normal(2 * uint64_t(i) + 1));
    const double c = code_value(bf16_round(silu(g) * u), x.s);
    below += c < cv, above += c > cv;
  }
  return {double(below) / n, double(above) / n};
}
double simulated_p(const Scenario& x, uint64_t seed, int n) {
  const auto [b, a] = simulated_exits(x, seed, n);
  return a + b;
}

TEST(RoundedMixture, GridPointsAreTheGaussiansCells) {
  // bf16 near 1 (step 2^-7 above, 2^-8 below): v0 0.1 step below the upper edge, sigma 0.2 step.
  const double step = 0x1p-7, v0 = 1.0 + 0.4 * step, var = std::pow(0.2 * step, 2);
  const GridPoints g = rounded_points(v0, 1.0, var, Precision::bf16);
  ASSERT_GE(g.n, 2);
  EXPECT_EQ(g.var, 0.0);
  double sum = 0, up = 0;
  for (int i = 0; i < g.n; ++i) {
    sum += g.p[i];
    if (g.v[i] > 1.0) up += g.p[i];
  }
  EXPECT_NEAR(sum + g.far, 1.0, 1e-12);
  EXPECT_NEAR(up, crossing_probability(0.1 * step, var), 1e-12);  // P(beyond the edge 0.1 step away)
  // A deviation wider than two steps: one point with the rounded value's variance.
  const GridPoints w = rounded_points(v0, 1.0, std::pow(3 * step, 2), Precision::bf16);
  EXPECT_EQ(w.n, 1);
  EXPECT_GT(w.var, std::pow(3 * step, 2));
}

TEST(RoundedMixture, CodeCellHonoursTiesToEven) {
  const double s = 0x1p-11;
  // 352 (odd code): the midpoint 336 with 320 goes to 320, so the first bf16 value of the cell is
  // 338 s (bf16's step at 336 s is 2 s) and the cell starts half a step below it.
  EXPECT_EQ(code_cell_before_rounding(352, s, Precision::bf16).first, 337 * s);
  // 320 (even code): the midpoint 336 is its own; the cell ends half a step above it.
  EXPECT_EQ(code_cell_before_rounding(320, s, Precision::bf16).second, 337 * s);
  // float32: the midpoints themselves; saturation: nothing above 448.
  EXPECT_EQ(code_cell_before_rounding(352, s, Precision::f32).first, 336 * s);
  EXPECT_EQ(code_cell_before_rounding(448, s, Precision::f32).second, INFINITY);
  EXPECT_EQ(code_cell_before_rounding(-448, s, Precision::bf16).first, -INFINITY);
}

// The golden case's element: gate 1e-4 above a bf16 rounding edge with sigma 4.2e-5, h one bf16
// step above an e4m3 midpoint. One gate rounding down (p ~ 1 %) moves the code.
TEST(RoundedMixture, OneRareRoundingOfGateThatMovesACode) {
  const Scenario x{0.603618801, 1.8e-9, 0.421022058, 1.8e-9, 0x1p-11};
  const double p = mixture_p(x), sim = simulated_p(x, 40, 200000);
  EXPECT_GT(p, 1e-3);
  EXPECT_NEAR(p, sim, 5 * std::sqrt(p * (1 - p) / 200000) + 1e-5) << "simulated " << sim;
}

TEST(RoundedMixture, CodeCrossingsMatchASimulatedDevice) {
  const char* env = std::getenv("MOECHECK_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : 20261206;
  const CounterRng rng{seed, 3};
  const int scenarios = 80, n = 20000;
  int nontrivial = 0, negative = 0, small = 0;
  for (int k = 0; k < scenarios; ++k) {
    auto U = [&](int j) { return rng.uniform(uint64_t(k) * 16 + uint64_t(j)); };
    Scenario x;
    x.g0 = -3 + 6 * U(0);
    const double gs = bf16_round(x.g0), sg = silu(gs);
    // sigma between 0.05 and 2 bf16 steps of its value: the grid points' regime and beyond.
    auto sd = [&](double v, double u) { return std::max(std::fabs(v), 1e-3) * 0x1p-8 * std::pow(40.0, u) / 20; };
    x.vg = std::pow(sd(x.g0, U(1)), 2);
    // h of either sign; its code from the top of e4m3's range down to the subnormals (scales up
    // to 2^19 above the normal one: codes down to 448 2^-19, below the smallest normal 2^-6 and
    // the smallest subnormal 2^-9).
    const double h_target = (U(6) < 0.5 ? -1 : 1) * (0.05 + U(2));
    x.s = std::ldexp(1.0, int(std::floor(std::log2(std::fabs(h_target) / 448))) + int(U(3) * 20));
    double u0 = h_target / sg;
    // Half the scenarios put h within a few bf16 steps of an e4m3 midpoint, where codes cross.
    if (k % 2 == 0) {
      const double cv = code_value(h_target, x.s);
      const uint8_t code = fp8_encode(cv, Fp8Format::e4m3fn);
      // The neighbour one code away in magnitude (toward zero from the largest code).
      const bool up = std::fabs(cv) < 448 && U(7) < 0.5;
      const uint8_t nc = cv == 0 ? uint8_t(1) : uint8_t(up ? code + 1 : code - 1);
      const double nb = double(fp8_decode(nc, Fp8Format::e4m3fn));  // same sign as cv (0: the smallest positive)
      const double mid = (cv + nb) / 2 * x.s;
      u0 = mid * (1 + (U(4) - 0.5) * 0x1p-6) / sg;
    }
    if (!std::isfinite(u0) || std::fabs(sg) < 1e-3) continue;
    x.u0 = u0, x.vu = std::pow(sd(u0, U(5)), 2);
    const auto [p_lo, p_hi] = mixture_exits(x);
    const auto [s_lo, s_hi] = simulated_exits(x, seed + uint64_t(k), n);
    const double p = p_lo + p_hi, sim = s_lo + s_hi;
    nontrivial += sim > 0.002 && sim < 0.998;
    negative += h_target < 0, small += std::fabs(reference_code(x)) < 0x1p-6;
    auto tol = [&](double q) { return 5 * std::sqrt(std::max(q * (1 - q), 1.0 / n) / n) + 2e-4; };
    const std::string where = fmt::format("scenario {} (replay: MOECHECK_SEED={}): g0 {} vg {} u0 {} vu {} s {}", k,
                                          seed, x.g0, x.vg, x.u0, x.vu, x.s);
    EXPECT_NEAR(p_lo, s_lo, tol(p_lo)) << "below: " << where;
    EXPECT_NEAR(p_hi, s_hi, tol(p_hi)) << "above: " << where;
    EXPECT_NEAR(p, sim, tol(p)) << where;
  }
  EXPECT_GE(nontrivial, 10) << "too few scenarios where codes cross: the comparison says little";
  EXPECT_GE(negative, 10) << "too few scenarios with a negative h";
  EXPECT_GE(small, 5) << "too few scenarios with subnormal codes";
}

}  // namespace
}  // namespace moecheck
