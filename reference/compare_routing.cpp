// Stage "routing" of compare_output (compare_stages.hpp): does the backend's expert set per token
// agree with the reference's, and where it differs only by a near-tie (BUDGETS.md §6), which
// reference should the token be judged against.
//
// A near-tie is a set that is a valid top-k once every selection score may move by delta =
// routing_ulps 2^-24 of the token's largest score magnitude (the float32 evaluation of the
// scores). Accepted tokens are re-run through the reference with the backend's experts and their
// exact weights, and the re-run replaces the token's rows everywhere downstream. Without recorded
// ids the only evidence is the output: a token whose margin is within 2 delta is re-run with the
// single swap (last chosen <-> best admissible rejected expert), and the choice whose worst ratio
// is smaller is kept.
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include "reference/compare_stages.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_combine.hpp"
#include "reference/moe_routing.hpp"

namespace moecheck::compare {

double ratio_of(double obs, double ref, double budget) {
  if (!std::isfinite(obs)) return std::numeric_limits<double>::infinity();
  const double d = std::fabs(obs - ref);
  if (budget > 0) return d / budget;
  return d == 0 ? 0.0 : std::numeric_limits<double>::infinity();
}

namespace {

std::vector<int32_t> sorted_row(const int32_t* p, int64_t k) {
  std::vector<int32_t> v(p, p + k);
  std::sort(v.begin(), v.end());
  return v;
}

// The rows `tokens` of p as a problem of its own (the vectors own the storage).
struct SubProblem {
  MoeProblem problem;
  std::vector<float> hidden, logits, hscale;
  std::vector<uint8_t> hcodes;
};
SubProblem subproblem(const MoeProblem& p, const std::vector<int64_t>& tokens) {
  const MoeConfig& c = p.config;
  const int64_t H = c.hidden_size, E = c.num_experts, hg = ceil_div(H, c.group_size);
  SubProblem s;
  for (int64_t t : tokens) {
    s.hidden.insert(s.hidden.end(), p.hidden + t * H, p.hidden + (t + 1) * H);
    s.logits.insert(s.logits.end(), p.logits + t * E, p.logits + (t + 1) * E);
    if (p.hidden_fp8 && p.hidden_scale) {
      s.hcodes.insert(s.hcodes.end(), p.hidden_fp8 + t * H, p.hidden_fp8 + (t + 1) * H);
      s.hscale.insert(s.hscale.end(), p.hidden_scale + t * hg, p.hidden_scale + (t + 1) * hg);
    }
  }
  s.problem = p;
  s.problem.tokens = static_cast<int64_t>(tokens.size());
  s.problem.hidden = s.hidden.data();
  s.problem.logits = s.logits.data();
  s.problem.hidden_fp8 = s.hcodes.empty() ? nullptr : s.hcodes.data();
  s.problem.hidden_scale = s.hscale.empty() ? nullptr : s.hscale.data();
  return s;
}

// Tokens to re-run and the expert set and weights to re-run each with.
struct Reruns {
  std::vector<int64_t> tokens;
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<double>> weights;
  void add(int64_t t, std::vector<int32_t> i, std::vector<double> w) {
    tokens.push_back(t), ids.push_back(std::move(i)), weights.push_back(std::move(w));
  }
};

// Per token: accept, reject or propose a near-tie alternative.
Reruns find_near_ties(const MoeProblem& p, const ForwardResult& ref, const Observation& obs, const BudgetModel& model,
                      CompareResult& R) {
  const MoeConfig& c = p.config;
  const int64_t k = c.top_k;
  const std::vector<int32_t>& ids = ref.routing.ids;
  Reruns rr;
  for (int64_t t = 0; t < p.tokens; ++t) {
    const TokenScores s = selection_scores(c, p.logits + t * c.num_experts, p.bias);
    const double mag = *std::max_element(s.magnitude.begin(), s.magnitude.end());
    const double delta = model.routing_ulps * 0x1p-24 * std::max(mag, 1e-30);
    if (!obs.topk_ids.empty()) {
      if (sorted_row(&obs.topk_ids[t * k], k) == sorted_row(&ids[t * k], k)) continue;
      const std::span<const int32_t> bid(&obs.topk_ids[t * k], k);
      const TopkJudgement j = judge_topk(c, s, bid, delta);
      if (j.valid) {
        R.ambiguous.push_back(t);
        rr.add(t, std::vector<int32_t>(bid.begin(), bid.end()), j.weights);
      } else {
        R.mismatched.push_back(t);
      }
    } else if (k < c.num_experts && ref.routing.margin[t] <= 2 * delta) {
      // Candidate swap: the best admissible rejected expert replaces the last chosen one.
      std::vector<int32_t> alt(&ids[t * k], &ids[t * k] + k);
      int32_t best = -1;
      for (int32_t e = 0; e < c.num_experts; ++e) {
        if (std::find(alt.begin(), alt.end(), e) != alt.end()) continue;
        std::vector<int32_t> trial(alt.begin(), alt.end() - 1);
        trial.push_back(e);
        if (judge_topk(c, s, trial, delta).valid && (best < 0 || s.sel[e] > s.sel[best])) best = e;
      }
      if (best >= 0) {
        alt.back() = best;
        std::vector<double> w = weights_for(c, s, alt);
        rr.add(t, std::move(alt), std::move(w));
      }
    }
  }
  return rr;
}

// The reference of the re-run tokens alone, routed as `rr` says, with the re-quantization
// test's terms when the reference it replaces rows of has them.
ForwardResult rerun_reference(const MoeProblem& p, const Reruns& rr, const CompareOptions& opt, bool requant_terms) {
  const SubProblem sp = subproblem(p, rr.tokens);
  Routing ov;
  ov.tokens = static_cast<int64_t>(rr.tokens.size()), ov.top_k = p.config.top_k;
  for (size_t i = 0; i < rr.tokens.size(); ++i) {
    ov.ids.insert(ov.ids.end(), rr.ids[i].begin(), rr.ids[i].end());
    ov.weights.insert(ov.weights.end(), rr.weights[i].begin(), rr.weights[i].end());
  }
  ov.margin.assign(rr.tokens.size(), 0.0), ov.margin_scale = ov.margin, ov.group_margin = ov.margin;
  ov.group_margin_scale = ov.margin;
  ForwardOptions fo;
  fo.tier = Tier::quantized, fo.budget = &opt.model, fo.routing_override = &ov, fo.requant_terms = requant_terms;
  return opt.forward ? opt.forward(sp.problem, fo) : moe_forward(sp.problem, fo);
}

// The judged reference as the forward gave it, each optional array kept only when whole.
JudgedReference judged_from(const ForwardResult& ref, int64_t T, int64_t H, int64_t k) {
  JudgedReference J;
  J.output = ref.output, J.budget = ref.budget, J.noise_var = ref.noise_var;
  J.slot_output = ref.expert_outputs, J.slot_budget = ref.slot_budget, J.slot_noise_var = ref.slot_noise_var;
  J.flip_projection = ref.slot_flip_projection, J.ids = ref.routing.ids, J.weights = ref.routing.weights;
  // A reference without the noise model: the budget's square (the worst case as the noise).
  auto or_budget_squared = [](std::vector<double>& var, const std::vector<double>& budget) {
    if (var.size() == budget.size()) return;
    var.resize(budget.size());
    for (size_t i = 0; i < budget.size(); ++i) var[i] = budget[i] * budget[i];
  };
  or_budget_squared(J.noise_var, J.budget);
  or_budget_squared(J.slot_noise_var, J.slot_budget);
  if (J.flip_projection.size() != size_t(T * k)) J.flip_projection.clear();
  J.flip_tail = ref.slot_flip_tail;
  if (J.flip_projection.empty() || J.flip_tail.size() != size_t(T * k * kFlipTailWidth)) J.flip_tail.clear();
  J.energy_tail = ref.slot_energy_tail;
  if (J.energy_tail.size() != size_t(T * k * kEnergyTailWidth)) J.energy_tail.clear();
  J.requant = ref.requant;
  if (!J.requant.complete(T, H, k)) J.requant.clear();
  return J;
}

// Without the backend's ids, a near-tie token takes the alternative routing where it explains
// the observation better (its worst ratio is lower); the caller then counts the token as ambiguous.
bool alternative_explains_better(const Observation& obs, const JudgedReference& J, const ForwardResult& alt, size_t i,
                                 int64_t t, int64_t H) {
  double worst_a = 0, worst_r = 0;
  for (int64_t h = 0; h < H; ++h) {
    const double o = obs.output[t * H + h];
    worst_r = std::max(worst_r, ratio_of(o, J.output[t * H + h], J.budget[t * H + h]));
    worst_a = std::max(worst_a, ratio_of(o, alt.output[i * H + h], alt.budget[i * H + h]));
  }
  return worst_a < worst_r;
}

// Token t of the judged reference from token i of the re-run under the alternative routing.
void take_alternative(JudgedReference& J, const ForwardResult& alt, size_t n_rerun, size_t i, int64_t t, int64_t H,
                      int64_t k) {
  std::copy_n(&alt.output[i * H], H, &J.output[t * H]);
  std::copy_n(&alt.budget[i * H], H, &J.budget[t * H]);
  std::copy_n(&alt.noise_var[i * H], H, &J.noise_var[t * H]);
  std::copy_n(&alt.expert_outputs[i * k * H], k * H, &J.slot_output[t * k * H]);
  std::copy_n(&alt.slot_budget[i * k * H], k * H, &J.slot_budget[t * k * H]);
  std::copy_n(&alt.slot_noise_var[i * k * H], k * H, &J.slot_noise_var[t * k * H]);
  if (!J.flip_projection.empty()) std::copy_n(&alt.slot_flip_projection[i * k], k, &J.flip_projection[t * k]);
  // A re-run without tails (a forward hook that does not fill them): no tails at all.
  if (alt.slot_flip_tail.size() != n_rerun * size_t(k * kFlipTailWidth)) J.flip_tail.clear();
  if (!J.flip_tail.empty())
    std::copy_n(&alt.slot_flip_tail[i * k * kFlipTailWidth], k * kFlipTailWidth, &J.flip_tail[t * k * kFlipTailWidth]);
  if (alt.slot_energy_tail.size() != n_rerun * size_t(k * kEnergyTailWidth)) J.energy_tail.clear();
  if (!J.energy_tail.empty())
    std::copy_n(&alt.slot_energy_tail[i * k * kEnergyTailWidth], k * kEnergyTailWidth,
                &J.energy_tail[t * k * kEnergyTailWidth]);
  if (!J.requant.direction.empty()) J.requant.copy_token(alt.requant, int64_t(i), t, H, k);
  std::copy_n(&alt.routing.ids[i * k], k, &J.ids[t * k]);
  std::copy_n(&alt.routing.weights[i * k], k, &J.weights[t * k]);
}

// Centre and variance floor (BUDGETS.md §10.3): whatever a backend computed, its output is
// rounded to bf16, so an observation that is not the reference's own rounding carries a fresh
// rounding error: the fits never weight an element above 12 / ulp^2, with ulp at least bf16's
// subnormal step 2^-133 (a centre of 0, or of a tiny token's subnormal outputs, would otherwise
// weigh without limit: H200 gate case 3304, BUDGETS.md §10.6).
void centre_and_floor(JudgedReference& J) {
  J.center.resize(J.output.size());
  for (size_t i = 0; i < J.output.size(); ++i) {
    J.center[i] = bf16_of_f32(J.output[i]);
    const double ulp = bf16_rounding_unit(J.center[i]);
    J.noise_var[i] = std::max(J.noise_var[i], ulp * ulp / 12);
  }
}

}  // namespace

JudgedReference agree_routing(const MoeProblem& p, const ForwardResult& ref, const Observation& obs,
                              const CompareOptions& opt, CompareResult& R) {
  const int64_t T = p.tokens, H = p.config.hidden_size, k = p.config.top_k;
  JudgedReference J = judged_from(ref, T, H, k);
  const Reruns rr = find_near_ties(p, ref, obs, opt.model, R);
  if (!rr.tokens.empty()) {
    const ForwardResult alt = rerun_reference(p, rr, opt, !J.requant.direction.empty());
    // The re-run could not follow: no test rather than a partial one.
    if (!alt.requant.complete(int64_t(rr.tokens.size()), H, k)) J.requant.clear();
    for (size_t i = 0; i < rr.tokens.size(); ++i) {
      const int64_t t = rr.tokens[i];
      bool take = !obs.topk_ids.empty();
      if (!take) {  // keep the choice that explains the observation better
        take = alternative_explains_better(obs, J, alt, i, t, H);
        if (take) R.ambiguous.push_back(t);
      }
      if (take) take_alternative(J, alt, rr.tokens.size(), i, t, H, k);
    }
  }
  centre_and_floor(J);
  std::sort(R.ambiguous.begin(), R.ambiguous.end());
  R.ambiguous_tokens = static_cast<int64_t>(R.ambiguous.size());
  R.mismatched_tokens = static_cast<int64_t>(R.mismatched.size()) + R.ambiguous_tokens;
  J.rare_cut = rare_crossing_cut(J.flip_tail, J.flip_projection);
  return J;
}

}  // namespace moecheck::compare
