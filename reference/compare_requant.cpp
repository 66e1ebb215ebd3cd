// Stage "requant" of compare_output (compare_stages.hpp; BUDGETS.md §10.7): a test along the one
// direction a skipped re-quantization of the intermediate moves the output. That error is below
// every element's budget and looks like noise to the energy test (it is the size of the
// re-quantization's own rounding), but the reference knows its direction exactly:
// r_t = sum_j w_j W2_j (h_deq - h)_j, and a device that skips the step shows beta = -1 along it.
//
// beta = sum_t <d_t, r_t> / sum_t <r_t, r_t>, d = observation - center. Under the noise model,
// tokens independent:
//   Var sum_t <d_t, r_t> <= sum_t (sum_h r_h^2 var_h + requant_var_t)   (the elements' variances,
//     which count the intermediate deviations' diagonal share a second time: conservative, plus
//     those deviations' exact projections, requant_projection.hpp);
//   |E sum_t <d_t, r_t>| <= |sum_t requant_mean_t| + sum_t requant_mean_bound_t
//     + allow_s sum |o r|   (the crossings' mean, signed and coherent over tokens; a systematic
//     relative scale of at most allow_s, scale_allowance).
// The test fails when |beta| > allow + z se.
#include <cmath>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

void requant_test(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const CompareOptions& opt,
                  CompareResult& R) {
  R.requant = {};
  if (!opt.requant_test || J.requant_direction.empty()) return;
  const int64_t T = p.tokens, H = p.config.hidden_size;
  const double allow_s = scale_allowance(p.config, opt.model);
  double rr = 0, dr = 0, var = 0, mean = 0, bound = 0;
  bool finite = true;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = size_t(t * H + h);
      const double r = J.requant_direction[i], x = obs.output[i];
      finite &= std::isfinite(x);
      rr += r * r;
      dr += (x - J.center[i]) * r;
      var += r * r * J.noise_var[i];
      bound += allow_s * std::fabs(J.output[i] * r);
    }
    var += J.requant_var[size_t(t)];
    mean += J.requant_mean[size_t(t)];
    bound += J.requant_mean_bound[size_t(t)];
  }
  if (!(rr > 0)) return;
  RequantTest& q = R.requant;
  q.fitted = true;
  q.beta = finite ? dr / rr : INFINITY;
  q.se = std::sqrt(var) / rr;
  q.allow = (std::fabs(mean) + bound) / rr;
  q.detectable = q.allow + aggregate_z(p, R.experts.size(), opt) * q.se;
  q.ok = !(std::fabs(q.beta) > q.detectable);
}

}  // namespace moecheck::compare
