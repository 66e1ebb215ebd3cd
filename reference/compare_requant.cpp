// Stage "requant" of compare_output (compare_stages.hpp; BUDGETS.md §10.7): a test along the one
// direction a skipped re-quantization of the intermediate moves the output. That error is below
// every element's budget and looks like noise to the energy test (it is the size of the
// re-quantization's own rounding), but the reference knows the move exactly,
// r_t = sum_j w_j W2_j (h_deq - h)_j, and projects on a direction q_t that leaves out the
// intermediates a correct device may re-quantize differently (requant_projection.hpp).
//
// Per token, P_t = <d_t, q_t> (d = observation - center) is -signal_t for a device that skips the
// step, and under the noise model has variance at most
//   V_t = sum_h q_h^2 var_h + requant_var_t   (the elements' variances, which count the
//         intermediate deviations' diagonal share a second time: conservative, plus those
//         deviations' exact projections),
// and a mean of at most |requant_mean_t| + requant_mean_bound_t + allow_s sum_h |o_h q_h| (the
// crossings' mean, signed; a systematic relative scale of at most allow_s, scale_allowance).
// Tokens are independent, so the best linear combination weighs each by c_t = signal_t / V_t
// (its signal over its noise): beta = sum_t c_t P_t / sum_t c_t signal_t, -1 for a skipped step.
// Equal weights, the earlier rule, let the largest token decide alone (small-deepseek T = 16:
// se 0.174 against 0.026 weighted). The weights come from the reference alone, so the test stays
// exact. The codes' crossings among the variance terms are rare terms of their own size (§10.8:
// one crossing with p ~ 1 % moved a slot's projection 1.5 times the Gaussian threshold, gate seed
// 50 case 40): the threshold is Chernoff's over them, scaled by c_t, and a sub-Gaussian rest
// (TailBound). The test fails when |beta| > allow + threshold / sum_t c_t signal_t.
#include <cmath>

#include "reference/compare_stages.hpp"
#include "reference/tail_bound.hpp"

namespace moecheck::compare {

void requant_test(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const CompareOptions& opt,
                  CompareResult& R) {
  R.requant = {};
  const RequantTerms& q = J.requant;
  if (!opt.requant_test || q.direction.empty()) return;
  const int64_t T = p.tokens, H = p.config.hidden_size, k = p.config.top_k;
  const double allow_s = scale_allowance(p.config, opt.model);
  double signal = 0, dq = 0, var = 0, mean = 0, bound = 0, tail_var = 0;
  bool finite = true;
  TailBound tb;
  for (int64_t t = 0; t < T; ++t) {
    double p_t = 0, v_t = q.var[size_t(t)], b_t = q.mean_bound[size_t(t)];
    bool finite_t = true;
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = size_t(t * H + h);
      const double d = q.direction[i], x = obs.output[i];
      finite_t &= std::isfinite(x);
      p_t += (x - J.center[i]) * d;
      v_t += d * d * J.noise_var[i];
      b_t += allow_s * std::fabs(J.output[i] * d);
    }
    const double s_t = q.signal[size_t(t)];
    // A token without signal, or without noise to weigh it by, takes no part.
    if (!(s_t > 0) || !(v_t > 0) || !std::isfinite(v_t)) continue;
    const double c = s_t / v_t;
    finite &= finite_t;
    signal += c * s_t, dq += c * p_t, var += c * c * v_t;
    mean += c * q.mean[size_t(t)], bound += c * b_t;
    for (int64_t j = 0; j < k; ++j) {
      const double* tail = &q.tail[size_t((t * k + j) * kFlipTailWidth)];
      tail_var += c * c * FlipTail::variance(tail);
      tb.add_slot_tail(tail, c);
    }
  }
  if (!(signal > 0)) return;
  tb.add_gaussian(std::max(var - tail_var, 0.0));
  RequantTest& out = R.requant;
  out.fitted = true;
  out.beta = finite ? dq / signal : INFINITY;
  out.se = std::sqrt(var) / signal;
  out.allow = (std::fabs(mean) + bound) / signal;
  out.detectable = out.allow + aggregate_threshold(tb, aggregate_z(p, R.experts.size(), opt)) / signal;
  // Fails closed: a statistic that is not a number (a non-finite term) is no evidence of a pass.
  out.ok = std::fabs(out.beta) <= out.detectable;
}

}  // namespace moecheck::compare
