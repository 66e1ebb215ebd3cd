// Stage "tokens" of compare_output (compare_stages.hpp; BUDGETS.md §10.5): one scale test per
// token, which sees what no per-expert test can: an error confined to one token (a zeroed or
// doubled output row, a token routed nowhere) that stays inside every element's worst-case budget.
//
// beta_t = sum_h (d_h o_h / sigma_h^2) / sum_h (o_h^2 / sigma_h^2), weighted least squares with
// d = observed - center (the reference as the device rounds it), o = the reference's output row.
// Its noise under the noise model is the elements' own, variance 1 / sum o^2 / sigma^2, plus the
// re-quantization flips, which move every element of a slot at once: their projections onto the
// slot's own output times w_j / sum o^2 (JudgedReference::flip_projection and flip_tail; as in
// the bias test, unweighted, and the projection onto the other slots' outputs left out, §10.5).
// The test fails when |beta_t| > allow + the threshold of that noise at the aggregate tests'
// level (z se_t where no rare flip dominates; §10.8). The same fit over every row at once is the
// whole-output scale test (R.output_scale): a constant factor on the whole output.
#include <cmath>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

namespace {
// The weighted fit's sums over some rows: sum o^2, sum o^2 / var, sum d o / var.
struct ScaleSums {
  double oo = 0, ow = 0, dow = 0;
  bool finite = true;
};
// beta, its standard error and the test at allow + the threshold of its noise (the elements' own
// 1 / sum o^2 / var and the flip projections of `slots`, each moving beta by w_j / sum o^2);
// untouched where nothing was fitted (an all-zero reference: the elementwise test judges it).
template <class Slots>
void finish_scale_test(const ScaleSums& S, const JudgedReference& J, const Slots& slots, double allow, double z,
                       TokenScale& ts) {
  if (!(S.ow > 0)) return;
  TailBound tb;
  tb.add_gaussian(1 / S.ow);
  slots([&](int64_t s) { add_slot_flips(J, s, J.weights[size_t(s)] / S.oo, tb); });
  ts.beta = S.finite ? S.dow / S.ow : INFINITY;
  ts.se = std::sqrt(tb.variance());
  ts.detectable = allow + aggregate_threshold(tb, z);
  ts.ok = !(std::fabs(ts.beta) > ts.detectable);
}
}  // namespace

void token_scale_tests(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const CompareOptions& opt,
                       CompareResult& R) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, k = c.top_k;
  const double allow = scale_allowance(c, opt.model);
  const double z = aggregate_z(p, R.experts.size(), opt);
  R.aggregate_z = z;
  R.token_scale.assign(size_t(T), {});
  auto local_slots_of = [&](int64_t t0, int64_t t1) {
    return [&, t0, t1](auto&& add) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t j = 0; j < k; ++j)
          if (c.is_local(J.ids[t * k + j])) add(t * k + j);
    };
  };
  ScaleSums all;
  for (int64_t t = 0; t < T; ++t) {
    ScaleSums S;
    for (int64_t h = 0; h < H; ++h) {
      const double o = J.output[t * H + h], x = obs.output[t * H + h], v = J.noise_var[t * H + h];
      S.finite &= std::isfinite(x);
      S.oo += o * o;
      if (v > 0) S.ow += o * o / v, S.dow += (x - J.center[t * H + h]) * o / v;
    }
    all.oo += S.oo, all.ow += S.ow, all.dow += S.dow, all.finite &= S.finite;
    R.token_scale[size_t(t)].token = t;
    finish_scale_test(S, J, local_slots_of(t, t + 1), allow, z, R.token_scale[size_t(t)]);
  }
  R.output_scale.token = -1;
  finish_scale_test(all, J, local_slots_of(0, T), allow, z, R.output_scale);
}

}  // namespace moecheck::compare
