// Stage "tokens" of compare_output (compare_stages.hpp; BUDGETS.md §10.5): one scale test per
// token, which sees what no per-expert test can: an error confined to one token (a zeroed or
// doubled output row, a token routed nowhere) that stays inside every element's worst-case budget.
//
// beta_t = sum_h (d_h o_h / sigma_h^2) / sum_h (o_h^2 / sigma_h^2), weighted least squares with
// d = observed - center (the reference as the device rounds it), o = the reference's output row.
// Its variance under the noise model is the elements' own, 1 / sum o^2 / sigma^2, plus the
// re-quantization flips, which move every element of a slot at once: their projections onto the
// slot's own output, w_j^2 c_j^2 / (sum o^2)^2 (c_j: JudgedReference::flip_projection; as in the
// bias test, unweighted, and the projection onto the other slots' outputs left out, §10.5). The test fails when |beta_t| > allow + z se_t. The same fit over every row at
// once is the whole-output scale test (R.output_scale): a constant factor on the whole output.
#include <cmath>

#include "reference/compare_stages.hpp"

namespace moecheck::compare {

void token_scale_tests(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const CompareOptions& opt,
                       CompareResult& R) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, k = c.top_k;
  const double allow = scale_allowance(c, opt.model);
  const double z = aggregate_z(p, R.experts.size(), opt);
  R.aggregate_z = z;
  R.token_scale.assign(size_t(T), {});
  double all_oo = 0, all_ow = 0, all_dow = 0, all_flips = 0;
  bool all_finite = true;
  for (int64_t t = 0; t < T; ++t) {
    TokenScale& ts = R.token_scale[size_t(t)];
    ts.token = t;
    double oo = 0, ow = 0, dow = 0, flips = 0;  // sum o^2; sum o^2 / var; sum d o / var
    bool finite = true;
    for (int64_t h = 0; h < H; ++h) {
      const double o = J.output[t * H + h], x = obs.output[t * H + h], v = J.noise_var[t * H + h];
      finite &= std::isfinite(x);
      oo += o * o;
      if (v > 0) ow += o * o / v, dow += (x - J.center[t * H + h]) * o / v;
    }
    if (!J.flip_projection.empty())
      for (int64_t j = 0; j < k; ++j)
        if (c.is_local(J.ids[t * k + j])) {
          const double f = J.weights[t * k + j] * J.flip_projection[t * k + j];
          flips += f * f;
        }
    all_oo += oo, all_ow += ow, all_dow += dow, all_flips += flips, all_finite &= finite;
    if (!(ow > 0)) continue;  // an all-zero reference row: the elementwise test judges it
    ts.beta = finite ? dow / ow : INFINITY;
    ts.se = std::sqrt(1 / ow + flips / (oo * oo));
    ts.detectable = allow + z * ts.se;
    ts.ok = !(std::fabs(ts.beta) > ts.detectable);
  }
  TokenScale& os = R.output_scale;
  os.token = -1;
  if (all_ow > 0) {
    os.beta = all_finite ? all_dow / all_ow : INFINITY;
    os.se = std::sqrt(1 / all_ow + all_flips / (all_oo * all_oo));
    os.detectable = allow + z * os.se;
    os.ok = !(std::fabs(os.beta) > os.detectable);
  }
}

}  // namespace moecheck::compare
