// Stage "aggregates" of compare_output (compare_stages.hpp; derivation BUDGETS.md §7): per expert,
// a bias (scale) test and an energy test, which catch systematic errors every element of which
// is inside its worst-case budget.
//
// Bias: fit observed - reference = beta_e z + noise by weighted least squares, z = w_j y_j the
// expert's reference contributions (per slot output y when slots are recorded), weights 1 /
// sigma^2 from the noise model (ForwardResult::noise_var). With only the combined output the
// experts of a token share its elements, so all experts are fitted jointly (normal equations
// M beta = b). beta's standard error adds the re-quantization flips' projections (flip_var), the
// one error correlated across a slot's elements. The test fails when |beta| > allow + z SE.
// Energy: observed sum d^2 against the predicted sum sigma^2, limit 1 + z sqrt(2 / n_eff).
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "reference/compare_stages.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_budget.hpp"

namespace moecheck::compare {

namespace {

// The weighted least-squares system and the energy sums, per expert row of R.experts.
struct Sums {
  Eigen::MatrixXd M;          // normal matrix sum z_a z_b / sigma^2
  Eigen::VectorXd b;          // sum d z / sigma^2
  std::vector<double> en_obs, en_pred, var_sq;  // sum d^2, sum sigma^2, sum sigma^4 (attributed elements)
  std::vector<double> l2_d, l2_r;               // for rel_l2
  std::vector<double> flip_num, z_sq;           // sum c^2 (flip projections), sum z^2 (all elements)
  explicit Sums(size_t A)
      : M(Eigen::MatrixXd::Zero(A, A)), b(Eigen::VectorXd::Zero(A)), en_obs(A), en_pred(A), var_sq(A), l2_d(A),
        l2_r(A), flip_num(A), z_sq(A) {}
};

// Per slot: each recorded slot output against its own reference, one expert per row.
void accumulate_slots(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const Ratios& X,
                      const Attribution& A, Sums& S) {
  const int64_t H = p.config.hidden_size;
  for (const auto& [e, slots] : A.slots_of) {
    const size_t x = A.index.at(e);
    for (int64_t s : slots)
      for (int64_t h = 0; h < H; ++h) {
        const double yo = X.slots[s * H + h], yr = J.slot_output[s * H + h], bud = J.slot_budget[s * H + h];
        const double ulp = obs.expert_outputs_bf16 ? bf16_ulp(yr) : 0.0;
        const double var = bud * bud + ulp * ulp / 12, d = yo - yr;  // as ForwardResult::noise_var
        S.z_sq[x] += yr * yr;
        if (!std::isfinite(yo) || !(var > 0)) continue;
        S.M(x, x) += yr * yr / var, S.b(x) += d * yr / var;
        S.en_obs[x] += d * d, S.en_pred[x] += var, S.var_sq[x] += var * var, S.l2_d[x] += d * d, S.l2_r[x] += yr * yr;
      }
  }
}

// Combined output only: each element of token t is explained by the contributions of its local
// slots, z_a = w_a y_a; the energy of a failing token counts only for the expert it was blamed on.
void accumulate_combined(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const Attribution& A,
                         const CompareResult& R, Sums& S) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, k = c.top_k;
  std::vector<std::pair<size_t, int64_t>> present;  // (expert row, slot) of one token
  for (int64_t t = 0; t < T; ++t) {
    present.clear();
    for (int64_t j = 0; j < k; ++j)
      if (c.is_local(J.ids[t * k + j])) present.push_back({A.index.at(J.ids[t * k + j]), t * k + j});
    for (int64_t h = 0; h < H; ++h) {
      for (auto [xa, sa] : present) {
        const double za = J.weights[sa] * J.slot_output[sa * H + h];
        S.z_sq[xa] += za * za;
      }
      const double o = obs.output[t * H + h], var = J.noise_var[t * H + h], ref = J.output[t * H + h];
      if (!std::isfinite(o) || !(var > 0)) continue;
      const double d = o - ref;
      for (auto [xa, sa] : present) {
        const double za = J.weights[sa] * J.slot_output[sa * H + h];
        S.b(xa) += d * za / var;
        for (auto [xb, sb] : present) S.M(xa, xb) += za * J.weights[sb] * J.slot_output[sb * H + h] / var;
        const bool mine = A.owner[t] < 0 || A.owner[t] == R.experts[xa].expert;
        if (mine) S.en_obs[xa] += d * d, S.en_pred[xa] += var, S.var_sq[xa] += var * var;
        S.l2_d[xa] += d * d, S.l2_r[xa] += ref * ref;
      }
    }
  }
}

// The largest systematic relative scale a correct device may have: a weight's rounding, half of
// the two GEMMs' accumulation bounds for a truncating accumulator (a one-signed error's mean is
// at most half its bound), and the float32 scale and division slack of two quantizations.
double scale_allowance(const MoeConfig& c, const BudgetModel& m) {
  const int64_t k = c.top_k;
  const double u_w = c.routing_weight_dtype == Precision::bf16 ? 0x1p-8 : double(c.num_experts + k + 8) * 0x1p-24;
  const double acc = m.acc.truncating ? 0.5 * (dot_product_bound(m.acc, c.hidden_size, c.weight_block, false) +
                                               dot_product_bound(m.acc, c.intermediate_size, c.weight_block, false))
                                      : 0.0;
  const double slack = 2.0 * (m.scale_ulps + m.divide_ulps) * 0x1p-24;
  return u_w + acc + slack;
}

}  // namespace

void aggregate_tests(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const Ratios& X,
                     const Attribution& A, const CompareOptions& opt, CompareResult& R) {
  const size_t NE = R.experts.size();
  if (NE == 0) return;
  Sums S(NE);
  if (X.have_slots)
    accumulate_slots(p, J, obs, X, A, S);
  else
    accumulate_combined(p, J, obs, A, R, S);
  // Flip projections (§7): per slot the root sum of squares of dh_i |<W2[:, i], y>|, times w^2 for
  // the combined output; independent signs, so they add to the variance of beta (Hoeffding).
  if (!J.flip_projection.empty())
    for (const auto& [e, slots] : A.slots_of)
      for (int64_t s : slots) {
        const double c = (X.have_slots ? 1.0 : J.weights[s] * J.weights[s]) * J.flip_projection[s];
        S.flip_num[A.index.at(e)] += c * c;
      }

  // A tiny ridge keeps the joint fit solvable when two experts always share their tokens.
  Eigen::MatrixXd Mr = S.M;
  for (size_t x = 0; x < NE; ++x) Mr(x, x) += 1e-300 + 1e-12 * S.M(x, x);
  const Eigen::LDLT<Eigen::MatrixXd> ldlt(Mr);
  const Eigen::VectorXd beta = ldlt.solve(S.b);
  const Eigen::MatrixXd cov = ldlt.solve(Eigen::MatrixXd::Identity(NE, NE));
  const double allow = scale_allowance(p.config, opt.model);
  for (size_t x = 0; x < NE; ++x) {
    ExpertVerdict& v = R.experts[x];
    const bool fitted = S.M(x, x) > 0;
    v.beta = fitted ? beta(x) : 0.0;
    const double flip_var = S.z_sq[x] > 0 ? S.flip_num[x] / (S.z_sq[x] * S.z_sq[x]) : 0.0;
    v.beta_se = fitted ? std::sqrt(std::max(cov(x, x), 0.0) + flip_var) : 0.0;
    v.beta_allow = allow;
    v.bias_ok = !(std::fabs(v.beta) > v.beta_allow + opt.z * v.beta_se);
    v.energy_ratio = S.en_pred[x] > 0 ? S.en_obs[x] / S.en_pred[x] : 0.0;
    // The energy is dominated by the largest elements: its spread follows the effective count
    // n_eff = (sum var)^2 / sum var^2, not the element count.
    const double n_eff = S.var_sq[x] > 0 ? S.en_pred[x] * S.en_pred[x] / S.var_sq[x] : 1.0;
    v.energy_limit = 1 + opt.z * std::sqrt(2.0 / std::max(n_eff, 1.0));
    v.energy_ok = !(v.energy_ratio > v.energy_limit);
    v.rel_l2 = S.l2_r[x] > 0 ? std::sqrt(S.l2_d[x] / S.l2_r[x]) : 0.0;
    v.pass = !v.blamed && v.max_ratio <= 1.0 && v.bias_ok && v.energy_ok;
  }
}

}  // namespace moecheck::compare
