// Stage "power" of compare_output (compare_stages.hpp; derivation BUDGETS.md §7, "Power"): the
// smallest errors the judgement would have detected, from the same statistics it tested, and
// whether its budgets say anything at all about this output.
#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

void judge_power(const JudgedReference& J, const CompareOptions& opt, CompareResult& R) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  Power& P = R.power;
  // Bias test: expert e fails when |beta_e| > allow + z SE_e, and a scale error s of its
  // contribution moves beta_e by s (the fit is unbiased for a pure scale).
  P.scale_output = P.scale_any_expert = kNaN;
  for (const ExpertVerdict& v : R.experts) {
    if (!(v.beta_detectable > 0)) continue;  // nothing fitted: no data, no power
    const double s = v.beta_detectable;
    P.scale_output = std::isnan(P.scale_output) ? s : std::min(P.scale_output, s);
    P.scale_any_expert = std::isnan(P.scale_any_expert) ? s : std::max(P.scale_any_expert, s);
  }
  // Elementwise test on one row: it passes exactly the deviations with |d_h| <= b_h for every h,
  // whose norms reach ||b_t|| (d = b) and no further.
  const int64_t T = R.tokens, H = R.hidden;
  std::vector<double> rho;
  int64_t over = 0;
  for (int64_t t = 0; t < T; ++t) {
    double bb = 0, rr = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double b = J.budget[t * H + h], r = J.output[t * H + h];
      bb += b * b, rr += r * r;
      over += b > std::fabs(r);
    }
    if (rr > 0) rho.push_back(std::sqrt(bb / rr));
  }
  if (rho.empty()) {
    P.token_rel_l2 = P.token_rel_l2_median = kNaN;
  } else {
    P.token_rel_l2 = *std::max_element(rho.begin(), rho.end());
    std::nth_element(rho.begin(), rho.begin() + rho.size() / 2, rho.end());
    P.token_rel_l2_median = rho[rho.size() / 2];
  }
  P.over_magnitude = R.elements > 0 ? double(over) / double(R.elements) : 0.0;
  P.vacuous = P.over_magnitude > opt.vacuous_fraction;
}

}  // namespace moecheck::compare
