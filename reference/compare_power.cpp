// Stage "power" of compare_output (compare_stages.hpp; BUDGETS.md §10.6): the smallest errors the
// judgement would have detected, from the same statistics it tested, and whether its budgets say
// anything at all about this output.
#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// min / max where NaN means "nothing yet".
double nan_min(double a, double b) { return std::isnan(a) ? b : std::min(a, b); }
double nan_max(double a, double b) { return std::isnan(a) ? b : std::max(a, b); }

// The largest and the median of xs (NaN, NaN when empty).
std::pair<double, double> max_and_median(std::vector<double> xs) {
  if (xs.empty()) return {kNaN, kNaN};
  const double mx = *std::max_element(xs.begin(), xs.end());
  std::nth_element(xs.begin(), xs.begin() + xs.size() / 2, xs.end());
  return {mx, xs[xs.size() / 2]};
}
}  // namespace

void judge_power(const JudgedReference& J, const CompareOptions& opt, CompareResult& R) {
  Power& P = R.power;
  // Bias test: expert e fails when |beta_e| > allow + z SE_e, and a scale error s of its
  // contribution moves beta_e by s (the fit is unbiased for a pure scale).
  P.scale_output = P.scale_any_expert = kNaN;
  for (const ExpertVerdict& v : R.experts) {
    if (!(v.beta_detectable > 0)) continue;  // nothing fitted: no data, no power
    P.scale_output = nan_min(P.scale_output, v.beta_detectable);
    P.scale_any_expert = nan_max(P.scale_any_expert, v.beta_detectable);
  }
  // The whole-output scale test sees a constant factor on the output directly.
  if (R.output_scale.detectable > 0) P.scale_output = nan_min(P.scale_output, R.output_scale.detectable);
  // Per-token scale test: a row scaled by (1 + s) moves beta_t by s.
  std::vector<double> tok;
  for (const TokenScale& t : R.token_scale)
    if (t.detectable > 0) tok.push_back(t.detectable);
  std::tie(P.token_scale, P.token_scale_median) = max_and_median(tok);
  // Elementwise test on one row: it passes exactly the deviations with |d_h| <= b_h for every h,
  // whose norms reach ||b_t|| (d = b) and no further. Over-magnitude shares: the worst-case
  // budget's, and the noise model's limit at the aggregate tests' z.
  const int64_t T = R.tokens, H = R.hidden;
  std::vector<double> rho;
  int64_t over = 0, noise_over = 0;
  for (int64_t t = 0; t < T; ++t) {
    double bb = 0, rr = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double b = J.budget[t * H + h], r = J.output[t * H + h];
      bb += b * b, rr += r * r;
      over += b > std::fabs(r);
      noise_over += R.aggregate_z * std::sqrt(J.noise_var[t * H + h]) > std::fabs(r);
    }
    if (rr > 0) rho.push_back(std::sqrt(bb / rr));
  }
  std::tie(P.token_rel_l2, P.token_rel_l2_median) = max_and_median(rho);
  P.over_magnitude = R.elements > 0 ? double(over) / double(R.elements) : 0.0;
  P.noise_over_magnitude = R.elements > 0 ? double(noise_over) / double(R.elements) : 0.0;
  // NaN (nothing fitted) does not make an output vacuous: its elementwise test still judges it.
  // Only the whole output decides: a token whose outputs are bf16 subnormals (a tiny token) has no
  // scale to see, and that says nothing about the others (golden tiny-qwen-subnormal-slots-*).
  P.vacuous = P.scale_output >= opt.vacuous_scale;
}

}  // namespace moecheck::compare
