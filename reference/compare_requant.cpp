// Stage "requant" of compare_output (compare_stages.hpp; BUDGETS.md §10.7): a test along the one
// direction a skipped re-quantization of the intermediate moves the output. That error is below
// every element's budget and looks like noise to the energy test (it is the size of the
// re-quantization's own rounding), but the reference knows the move exactly,
// r_t = sum_j w_j W2_j (h_deq - h)_j, and projects on a direction q_t that leaves out the
// intermediates a correct device may re-quantize differently (requant_projection.hpp).
//
// beta = sum_t <d_t, q_t> / sum_t <r_t, q_t>, d = observation - center: -1 for a device that
// skips the step. Under the noise model, tokens independent:
//   Var sum_t <d_t, q_t> <= sum_t (sum_h q_h^2 var_h + requant_var_t)   (the elements' variances,
//     which count the intermediate deviations' diagonal share a second time: conservative, plus
//     those deviations' exact projections);
//   |E sum_t <d_t, q_t>| <= |sum_t requant_mean_t| + sum_t requant_mean_bound_t
//     + allow_s sum |o q|   (the crossings' mean, signed and coherent over tokens; a systematic
//     relative scale of at most allow_s, scale_allowance).
// The test fails when |beta| > allow + z se.
#include <cmath>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

void requant_test(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const CompareOptions& opt,
                  CompareResult& R) {
  R.requant = {};
  const RequantTerms& q = J.requant;
  if (!opt.requant_test || q.direction.empty()) return;
  const int64_t T = p.tokens, H = p.config.hidden_size;
  const double allow_s = scale_allowance(p.config, opt.model);
  double signal = 0, dq = 0, var = 0, mean = 0, bound = 0;
  bool finite = true;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = size_t(t * H + h);
      const double d = q.direction[i], x = obs.output[i];
      finite &= std::isfinite(x);
      dq += (x - J.center[i]) * d;
      var += d * d * J.noise_var[i];
      bound += allow_s * std::fabs(J.output[i] * d);
    }
    signal += q.signal[size_t(t)];
    var += q.var[size_t(t)];
    mean += q.mean[size_t(t)];
    bound += q.mean_bound[size_t(t)];
  }
  if (!(signal > 0)) return;
  RequantTest& out = R.requant;
  out.fitted = true;
  out.beta = finite ? dq / signal : INFINITY;
  out.se = std::sqrt(var) / signal;
  out.allow = (std::fabs(mean) + bound) / signal;
  out.detectable = out.allow + aggregate_z(p, R.experts.size(), opt) * out.se;
  // Fails closed: a statistic that is not a number (a non-finite term) is no evidence of a pass.
  out.ok = std::fabs(out.beta) <= out.detectable;
}

}  // namespace moecheck::compare
