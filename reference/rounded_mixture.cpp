// The device's intermediate as a mixture of grid points (rounded_mixture.hpp; BUDGETS.md §10.9).
#include "reference/rounded_mixture.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "reference/fp8_formats.hpp"
#include "reference/moe_forward.hpp"
#include "reference/noise_model.hpp"

namespace moecheck {

namespace {
constexpr double kU32 = 0x1p-24;

}  // namespace

float grid_next(float v, Precision prec, int dir) {
  const uint32_t unit = prec == Precision::bf16 ? 0x10000u : 1u;
  if (v == 0) return dir > 0 ? std::bit_cast<float>(unit) : -std::bit_cast<float>(unit);
  const uint32_t b = std::bit_cast<uint32_t>(v);
  return std::bit_cast<float>((v > 0) == (dir > 0) ? b + unit : b - unit);
}

GridPoints rounded_points(double v0, double vr, double var, Precision prec) {
  GridPoints g;
  g.v[0] = vr, g.p[0] = 1, g.n = 1;
  if (!(var > 0) || !std::isfinite(vr) || !std::isfinite(v0)) return g;
  const float fr = float(vr);
  const double step = std::min(double(grid_next(fr, prec, +1)) - vr, vr - double(grid_next(fr, prec, -1)));
  if (std::sqrt(var) > 2 * step) {
    g.var = rounded_noise_var(v0, vr, var, prec);
    return g;
  }
  double rest = 1;
  for (const int dir : {+1, -1}) {
    // tail[k]: P(the device's value lies beyond the edge between point k - 1 and point k); what
    // lies beyond the last point's far edge is `far`.
    double tail[GridPoints::kSide + 1] = {};
    float pts[GridPoints::kSide];
    int n = 0;
    double far = 0;
    float a = fr;
    while (n <= GridPoints::kSide) {
      const float b = grid_next(a, prec, dir);
      if (!std::isfinite(b)) break;
      const double edge = (double(a) + double(b)) / 2;
      const double t = crossing_probability(dir > 0 ? edge - v0 : v0 - edge, var);
      if (!(t > 1e-30)) break;
      if (n == GridPoints::kSide) {
        far = t;
        break;
      }
      tail[n] = t, pts[n] = b, ++n, a = b;
    }
    for (int k = 0; k < n; ++k) {
      const double beyond = k + 1 < n ? tail[k + 1] : far;
      g.v[g.n] = pts[k], g.p[g.n] = tail[k] - beyond, rest -= g.p[g.n], ++g.n;
    }
    g.far += far, rest -= far;
  }
  g.p[0] = std::max(rest, 0.0);
  return g;
}

IntermediateMixture intermediate_mixture(const MoeConfig& c, const BudgetModel& m, double g0, double vg, double u0,
                                         double vu) {
  const Precision ip = c.intermediate_dtype;
  const GridPoints G = rounded_points(g0, round_to(g0, ip), vg, ip);
  const GridPoints U = rounded_points(u0, round_to(u0, ip), vu, ip);
  IntermediateMixture mix;
  mix.far = 1 - (1 - G.far) * (1 - U.far);
  for (int a = 0; a < G.n; ++a) {
    // The same linearised terms as §10.2 step 1, at this point of gate: silu's float32 slack
    // (and, with gate's Gaussian variance, its slope), silu's own rounding to bf16.
    const double g = G.v[a], s0 = silu(g), slope = silu_slope(g), ds = m.silu_ulps * kU32 * std::fabs(s0);
    double vs = slope * slope * G.var + ds * ds, sg = s0;
    if (c.recipe.silu_dtype == Precision::bf16) sg = round_to(s0, Precision::bf16), vs = rounded_noise_var(s0, sg, vs);
    for (int b = 0; b < U.n; ++b) {
      const double p = G.p[a] * U.p[b];
      if (!(p > 1e-40)) continue;
      const double u = U.v[b], h = sg * u, dp = kU32 * std::fabs(h);
      const double var = u * u * vs + sg * sg * U.var + vs * U.var + dp * dp;  // Var(S U), as §10.2 step 1
      mix.p[mix.n] = p, mix.h[mix.n] = h, mix.var[mix.n] = var, ++mix.n;
    }
  }
  return mix;
}

std::pair<double, double> IntermediateMixture::exits(double lo, double hi, double rel_var, double abs_var) const {
  // The mass beyond the listed grid points is counted as leaving on either side (conservative).
  double below = lo > -INFINITY ? far : 0.0, above = hi < INFINITY ? far : 0.0;
  for (int i = 0; i < n; ++i) {
    const double v = var[i] + rel_var * h[i] * h[i] + abs_var;
    if (lo > -INFINITY) below += p[i] * crossing_probability(h[i] - lo, v);
    if (hi < INFINITY) above += p[i] * crossing_probability(hi - h[i], v);
  }
  return {std::min(below, 1.0), std::min(above, 1.0)};
}

std::pair<double, double> code_cell_before_rounding(double cv, double s, Precision prec) {
  const uint8_t code = fp8_encode(cv, Fp8Format::e4m3fn, Saturation::finite);
  const bool even = (code & 1) == 0;  // RNE gives a midpoint to the even code
  // The e4m3 neighbour toward +inf (dir > 0) or -inf; none beyond +-448 (saturation). Codes of one
  // sign grow with the magnitude.
  auto neighbour = [&](int dir) {
    if (cv == 0) return dir * 0x1p-9;
    if (std::fabs(cv) == 448.0 && (cv > 0) == (dir > 0)) return std::numeric_limits<double>::quiet_NaN();
    return double(e4m3_decode(uint8_t((cv > 0) == (dir > 0) ? code + 1 : code - 1)));
  };
  const double n_lo = neighbour(-1), n_hi = neighbour(+1);
  const double m_lo = std::isnan(n_lo) ? -INFINITY : (cv + n_lo) / 2 * s;
  const double m_hi = std::isnan(n_hi) ? INFINITY : (cv + n_hi) / 2 * s;
  if (prec != Precision::bf16) return {m_lo, m_hi};
  // bf16: the rounded values in the cell run from the first at or above m_lo to the last at or
  // below m_hi (a midpoint itself only when the code is even); before the rounding, from half a
  // bf16 step below the first to half a step above the last.
  double lo = -INFINITY, hi = INFINITY;
  if (m_lo > -INFINITY) {
    float r = float(round_to(m_lo, prec));
    if (double(r) < m_lo || (double(r) == m_lo && !even)) r = grid_next(r, prec, +1);
    lo = (double(r) + double(grid_next(r, prec, -1))) / 2;
  }
  if (m_hi < INFINITY) {
    float r = float(round_to(m_hi, prec));
    if (double(r) > m_hi || (double(r) == m_hi && !even)) r = grid_next(r, prec, -1);
    hi = (double(r) + double(grid_next(r, prec, +1))) / 2;
  }
  return {lo, hi};
}

std::pair<double, double> rounding_cell(double vr, Precision prec) {
  const float r = float(vr);
  return {(vr + double(grid_next(r, prec, -1))) / 2, (vr + double(grid_next(r, prec, +1))) / 2};
}

double upper_rounding_edge(double b, Precision prec) { return rounding_cell(b, prec).second; }

}  // namespace moecheck
