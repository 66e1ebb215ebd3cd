// Stage "aggregates" of compare_output (compare_stages.hpp; derivation BUDGETS.md §7): per expert,
// a bias (scale) test and an energy test, which catch systematic errors every element of which
// is inside its worst-case budget.
//
// Bias: fit observed - center = beta_e z + noise by weighted least squares, z = w_j y_j the
// expert's reference contributions (per slot output y when slots are recorded), weights 1 /
// sigma^2 from the noise model (BUDGETS.md §10; center: the reference as the device rounds it,
// JudgedReference::center). With only the combined output the
// experts of a token share its elements, so all experts are fitted jointly (normal equations
// M beta = b). beta's noise adds the re-quantization flips' projections, the one error
// correlated across a slot's elements, their code crossings as rare bounded terms (§10.8). The
// test fails when |beta| > allow + the threshold of that noise at the false-alarm level
// (aggregate_z; z SE where no rare crossing dominates).
// Energy: observed sum d^2 against the predicted sum sigma^2, limit from Bernstein's inequality
// with each d^2 in [0, b^2], b the worst-case budget, and the expert's large code crossings,
// which move a whole slot at once, bounded apart by their own sizes (energy_limit, §10.8).
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "reference/compare_stages.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_budget.hpp"
#include "reference/noise_model.hpp"

namespace moecheck::compare {

namespace {

// The weighted least-squares system and the energy sums, per expert row of R.experts.
struct Sums {
  Eigen::MatrixXd M;          // normal matrix sum z_a z_b / sigma^2
  Eigen::VectorXd b;          // sum d z / sigma^2
  std::vector<double> en_obs, en_pred, var_sq;  // sum d^2, sum sigma^2, sum b^2 sigma^2 (attributed elements)
  std::vector<double> l2_d, l2_r;               // for rel_l2
  std::vector<double> z_sq;                     // sum z^2 (all elements)
  std::vector<double> var_max;                  // largest b^2 (attributed elements)
  explicit Sums(size_t A)
      : M(Eigen::MatrixXd::Zero(A, A)), b(Eigen::VectorXd::Zero(A)), en_obs(A), en_pred(A), var_sq(A), l2_d(A),
        l2_r(A), z_sq(A), var_max(A) {}
};

// Per slot: each recorded slot output against its own reference, one expert per row.
void accumulate_slots(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const Ratios& X,
                      const Attribution& A, Sums& S) {
  const int64_t H = p.config.hidden_size;
  for (const auto& [e, slots] : A.slots_of) {
    const size_t x = A.index.at(e);
    for (int64_t s : slots)
      for (int64_t h = 0; h < H; ++h) {
        const double yo = X.slots[s * H + h], yr = J.slot_output[s * H + h];
        // Slot outputs stored as bf16 when the recipe keeps them in float32: one more rounding.
        const double ulp = obs.expert_outputs_bf16 ? bf16_rounding_unit(yr) : 0.0;
        const double var = J.slot_noise_var[s * H + h] + ulp * ulp / 12, d = yo - yr;
        const double b2 = std::pow(J.slot_budget[s * H + h] + ulp / 2, 2);
        S.z_sq[x] += yr * yr;
        if (!std::isfinite(yo) || !(var > 0)) continue;
        S.M(x, x) += yr * yr / var, S.b(x) += d * yr / var;
        S.en_obs[x] += d * d, S.en_pred[x] += var, S.var_sq[x] += b2 * var;
        S.l2_d[x] += d * d, S.l2_r[x] += yr * yr;
        S.var_max[x] = std::max(S.var_max[x], b2);
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
      const double d = o - J.center[t * H + h];
      for (auto [xa, sa] : present) {
        const double za = J.weights[sa] * J.slot_output[sa * H + h];
        S.b(xa) += d * za / var;
        for (auto [xb, sb] : present) S.M(xa, xb) += za * J.weights[sb] * J.slot_output[sb * H + h] / var;
        const bool mine = A.owner[t] < 0 || A.owner[t] == R.experts[xa].expert;
        const double b2 = J.budget[t * H + h] * J.budget[t * H + h];
        if (mine) S.en_obs[xa] += d * d, S.en_pred[xa] += var, S.var_sq[xa] += b2 * var;
        if (mine) S.var_max[xa] = std::max(S.var_max[xa], b2);
        S.l2_d[xa] += d * d, S.l2_r[xa] += ref * ref;
      }
    }
  }
}

}  // namespace

// The largest systematic relative scale a correct device may have (BUDGETS.md §7, §10.4): a
// weight's rounding, the float32 scale and division slack of two quantizations, and for a
// truncating accumulator the mean shrink of truncation toward zero: each of the two GEMMs cuts
// its terms and its result below their top kept_bits bits, a relative shrink below 2^(1 - p)
// per cut, of which the noise model takes the part not cancelled by the products' symmetric
// signs (§10.4) to be at most one such step per GEMM: 2 * 2^(1 - p).
double scale_allowance(const MoeConfig& c, const BudgetModel& m) {
  const int64_t k = c.top_k;
  const double u_w = c.routing_weight_dtype == Precision::bf16 ? 0x1p-8 : double(c.num_experts + k + 8) * 0x1p-24;
  const double acc = m.acc.truncating ? 2 * std::ldexp(1.0, 1 - m.acc.kept_bits) : 0.0;
  const double slack = 2.0 * (m.scale_ulps + m.divide_ulps) * 0x1p-24;
  return u_w + acc + slack;
}

// The statistics one output is judged by: bias and energy per expert, one scale test per token,
// the whole-output scale test (and the re-quantization test when it runs: aggregate_z).
double aggregate_tests_count(const MoeProblem& p, size_t experts) {
  return 2.0 * double(experts) + double(p.tokens) + 1.0;
}

double aggregate_z(const MoeProblem& p, size_t experts, const CompareOptions& opt) {
  const double tests = aggregate_tests_count(p, experts) + (opt.requant_test ? 1.0 : 0.0);
  return opt.z > 0 ? opt.z : noise_z(tests, kFalseAlarmPerOutput * (1 - kRareCrossingShare));
}

double rare_crossing_cut(const std::vector<double>& flip_tail, const std::vector<double>& flip_projection) {
  std::vector<std::pair<double, double>> terms;  // (score, P)
  for (size_t s = 0; s < flip_projection.size() && (s + 1) * kFlipTailWidth <= flip_tail.size(); ++s)
    FlipTail::for_each(&flip_tail[s * kFlipTailWidth], [&](double, double P, double, double a) {
      const double score = TailBound::rare_score(P, a, flip_projection[s]);
      if (std::isfinite(score)) terms.push_back({score, P});  // never left out otherwise
    });
  std::sort(terms.begin(), terms.end());
  // Every term at or below the cut is left out, so the cut stops before a run of equal scores
  // that would not fit whole.
  const double budget = kRareCrossingShare * kFalseAlarmPerOutput;
  double sum = 0, cut = -1;
  for (size_t i = 0; i < terms.size();) {
    size_t j = i;
    double run = 0;
    for (; j < terms.size() && terms[j].first == terms[i].first; ++j) run += terms[j].second;
    if (sum + run > budget) break;
    sum += run, cut = terms[i].first, i = j;
  }
  return cut;
}

void add_slot_flips(const JudgedReference& J, int64_t s, double f, TailBound& tb) {
  if (J.flip_projection.empty()) return;
  const double c = J.flip_projection[size_t(s)];
  if (J.flip_tail.empty()) {
    tb.add_gaussian(f * f * c * c);
    return;
  }
  const double* tail = &J.flip_tail[size_t(s * kFlipTailWidth)];
  tb.add_gaussian(f * f * std::max(c * c - FlipTail::variance(tail), 0.0));
  tb.add_slot_tail(tail, f, J.rare_cut, c);
}

double aggregate_threshold(const TailBound& tb, double z) { return tb.threshold(z * z / 2); }

// Bernstein's inequality for X_i = d_i^2 in [0, b_i^2] (b the worst-case budget: a correct
// device never exceeds it), E X_i <= sigma_i^2 and Var X_i <= E X_i^2 <= b_i^2 sigma_i^2:
// P(sum X - sum sigma^2 >= t) <= exp(-t^2 / (2 (V + t M / 3))), V = sum b^2 sigma^2, M = max b^2.
// With x = z^2 / 2 the t where that is e^-x: t = x M / 3 + sqrt((x M / 3)^2 + 2 x V); the limit is
// the ratio 1 + t / sum sigma^2 (BUDGETS.md §10.5). Independence across elements is assumed; a
// chi-square limit (Laurent-Massart) or a clipped energy false-alarms where one re-quantization
// flip moves every element of a slot (measured: backend_compare_test seed 390).
//
// One crossing moves every element of its slot at once (a = step ||W2[:, i]||), so where one is
// large beside the predicted energy, the elements are not independent (gate seed 50 case 255: a
// crossing of p 0.117 made a one-slot expert's energy 1 / p = 8.5 times its prediction, against
// a limit of 5.9). Then the observation's root energy is at most the root of the rest's limit
// (Bernstein, as above, the crossings' variance still counted in it) plus their joint move,
// ||sum B_i v_i|| <= sum B_i a_i (large_crossings_move); each of the two at tail probability
// e^-x / 2 (x + ln 2).
double energy_limit(double sum_var, double sum_b2var, double b2_max, const MoeProblem& p, size_t experts,
                    const CompareOptions& opt, double move) {
  if (!(sum_var > 0)) return 1.0;
  const double z = aggregate_z(p, experts, opt), x = z * z / 2 + (move > 0 ? std::log(2.0) : 0.0);
  const double a = x * b2_max / 3, rest = sum_var + a + std::sqrt(a * a + 2 * x * sum_b2var);
  return (move > 0 ? std::pow(std::sqrt(rest) + move, 2) : rest) / sum_var;
}

// The slots whose crossings move what expert e's energy test sums: its own slots' outputs, or on
// the combined output every local slot of the tokens whose rows it counts (accumulate_combined:
// all of them unless the token is blamed on another expert).
std::vector<int64_t> energy_slots(const MoeProblem& p, const JudgedReference& J, const Attribution& A, int32_t e,
                                  const std::vector<int64_t>& slots, bool have_slots) {
  if (have_slots) return slots;
  const int64_t k = p.config.top_k;
  std::vector<int64_t> out;
  int64_t last = -1;
  for (const int64_t s : slots) {
    const int64_t t = s / k;
    if (t == last || (A.owner[size_t(t)] >= 0 && A.owner[size_t(t)] != e)) continue;
    last = t;
    for (int64_t j = 0; j < k; ++j)
      if (p.config.is_local(J.ids[size_t(t * k + j)])) out.push_back(t * k + j);
  }
  return out;
}

double large_crossings_move(const JudgedReference& J, const std::vector<int64_t>& slots, bool have_slots,
                            double en_pred, double x) {
  if (J.energy_tail.empty() || !(en_pred > 0)) return 0.0;
  const double a_min = 0.5 * std::sqrt(en_pred);
  TailBound tb;
  double mean = 0;  // sum p a of the crossings taken: the non-centred part
  bool any = false;
  for (const int64_t s : slots) {
    const double f = have_slots ? 1.0 : std::fabs(J.weights[size_t(s)]);
    const double* tail = &J.energy_tail[size_t(s * kEnergyTailWidth)];
    if (tail[kFlipTailWidth] * f > a_min) mean += tail[kFlipTailWidth] * f, any = true;  // p > 1/2: always
    FlipTail::for_each(tail, [&](double n, double P, double V, double a) {
      if (!(a * f > a_min)) return;
      any = true, mean += P * a * f;
      tb.add_crossings(n, P, f * f * V, a * f);
    });
  }
  return any ? mean + tb.threshold(x) : 0.0;
}

void aggregate_tests(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const Ratios& X,
                     const Attribution& A, const CompareOptions& opt, CompareResult& R) {
  const size_t NE = R.experts.size();
  if (NE == 0) return;
  Sums S(NE);
  if (X.have_slots)
    accumulate_slots(p, J, obs, X, A, S);
  else
    accumulate_combined(p, J, obs, A, R, S);

  // A tiny ridge keeps the joint fit solvable when two experts always share their tokens.
  Eigen::MatrixXd Mr = S.M;
  for (size_t x = 0; x < NE; ++x) Mr(x, x) += 1e-300 + 1e-12 * S.M(x, x);
  const Eigen::LDLT<Eigen::MatrixXd> ldlt(Mr);
  const Eigen::VectorXd beta = ldlt.solve(S.b);
  const Eigen::MatrixXd cov = ldlt.solve(Eigen::MatrixXd::Identity(NE, NE));
  const double allow = scale_allowance(p.config, opt.model);
  const double z = aggregate_z(p, NE, opt);
  for (const auto& [e, slots] : A.slots_of) {
    const size_t x = A.index.at(e);
    ExpertVerdict& v = R.experts[x];
    const bool fitted = S.M(x, x) > 0;
    v.beta = fitted ? beta(x) : 0.0;
    // beta's noise: the fit's own, and the slots' flip projections (§7), which move beta by
    // their size times w^2 (the combined output) / sum z^2; independent signs (§10.8).
    TailBound tb;
    tb.add_gaussian(std::max(cov(x, x), 0.0));
    if (S.z_sq[x] > 0)
      for (int64_t s : slots) add_slot_flips(J, s, (X.have_slots ? 1.0 : J.weights[s] * J.weights[s]) / S.z_sq[x], tb);
    v.beta_se = fitted ? std::sqrt(tb.variance()) : 0.0;
    v.beta_allow = allow;
    v.beta_detectable = fitted ? v.beta_allow + aggregate_threshold(tb, z) : 0.0;
    v.bias_ok = !(std::fabs(v.beta) > v.beta_detectable);
    v.energy_ratio = S.en_pred[x] > 0 ? S.en_obs[x] / S.en_pred[x] : 0.0;
    const double move = large_crossings_move(J, energy_slots(p, J, A, e, slots, X.have_slots), X.have_slots,
                                             S.en_pred[x], z * z / 2 + std::log(2.0));
    v.energy_limit = energy_limit(S.en_pred[x], S.var_sq[x], S.var_max[x], p, NE, opt, move);
    v.energy_ok = !(v.energy_ratio > v.energy_limit);
    v.rel_l2 = S.l2_r[x] > 0 ? std::sqrt(S.l2_d[x] / S.l2_r[x]) : 0.0;
    v.pass = !v.blamed && v.max_ratio <= 1.0 && v.bias_ok && v.energy_ok;
  }
}

}  // namespace moecheck::compare
