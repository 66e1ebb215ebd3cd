// Stage "verdict" of compare_output (compare_stages.hpp): the experts ordered worst first and the
// output's checks counted. Per output: 3 checks per expert (elementwise, bias, energy), one for
// routing (a mismatch that is not an accepted near-tie), one for token-local failures, one for
// the per-token scale tests, one for the whole-output scale test, and one for the re-quantization
// test when it ran. A vacuous output (judge_power) does not pass unless
// CompareOptions::allow_vacuous, whatever its checks.
#include <algorithm>
#include <cmath>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

void give_verdict(const MoeProblem&, const CompareOptions& opt, CompareResult& R) {
  // Severity: how far past its limit the expert's worst test is (1 = at the limit).
  auto severity = [&](const ExpertVerdict& v) {
    const double limit = v.beta_detectable - v.beta_allow;
    const double bias = limit > 0 ? (std::fabs(v.beta) - v.beta_allow) / limit : 0.0;
    return std::max({v.max_ratio, bias, v.energy_limit > 0 ? v.energy_ratio / v.energy_limit : 0.0});
  };
  std::stable_sort(R.experts.begin(), R.experts.end(), [&](const ExpertVerdict& a, const ExpertVerdict& b) {
    if (a.pass != b.pass) return !a.pass;
    return severity(a) > severity(b);
  });
  R.checks = 3 * static_cast<int64_t>(R.experts.size()) + 4 + (R.requant.fitted ? 1 : 0);
  for (const auto& v : R.experts) R.checks_failed += (v.blamed || !(v.max_ratio <= 1.0)) + !v.bias_ok + !v.energy_ok;
  R.checks_failed += !R.mismatched.empty();
  R.checks_failed += !R.failing_tokens_unexplained.empty();
  R.checks_failed += std::any_of(R.token_scale.begin(), R.token_scale.end(), [](const TokenScale& t) { return !t.ok; });
  R.checks_failed += !R.output_scale.ok;
  R.checks_failed += !R.requant.ok;
  R.pass = R.checks_failed == 0 && (!R.power.vacuous || opt.allow_vacuous);
}

}  // namespace moecheck::compare

namespace moecheck {
const char* verdict_label(const CompareResult& r) {
  if (r.checks_failed > 0) return "fail";
  return r.power.vacuous ? "vacuous" : r.pass ? "pass" : "fail";
}

std::vector<int64_t> failing_expert_ids(const CompareResult& r) {
  std::vector<int64_t> ids;
  for (const ExpertVerdict& e : r.experts)
    if (!e.pass) ids.push_back(e.expert);
  return ids;
}
}  // namespace moecheck
