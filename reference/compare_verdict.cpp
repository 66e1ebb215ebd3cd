// Stage "verdict" of compare_output (compare_stages.hpp): the experts ordered worst first and the
// output's checks counted. Per output: 3 checks per expert (elementwise, bias, energy), one for
// routing (a mismatch that is not an accepted near-tie), one for token-local failures.
#include <algorithm>
#include <cmath>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

void give_verdict(const CompareOptions& opt, CompareResult& R) {
  // Severity: how far past its limit the expert's worst test is (1 = at the limit).
  auto severity = [&](const ExpertVerdict& v) {
    const double bias = v.beta_se > 0 ? (std::fabs(v.beta) - v.beta_allow) / (opt.z * v.beta_se) : 0.0;
    return std::max({v.max_ratio, bias, v.energy_limit > 0 ? v.energy_ratio / v.energy_limit : 0.0});
  };
  std::stable_sort(R.experts.begin(), R.experts.end(), [&](const ExpertVerdict& a, const ExpertVerdict& b) {
    if (a.pass != b.pass) return !a.pass;
    return severity(a) > severity(b);
  });
  R.checks = 3 * static_cast<int64_t>(R.experts.size()) + 2;
  for (const auto& v : R.experts) R.checks_failed += (v.blamed || !(v.max_ratio <= 1.0)) + !v.bias_ok + !v.energy_ok;
  R.checks_failed += !R.mismatched.empty();
  R.checks_failed += !R.failing_tokens_unexplained.empty();
  R.pass = R.checks_failed == 0;
}

}  // namespace moecheck::compare
