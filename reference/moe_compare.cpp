// Judging a recorded output (contract: moe_compare.hpp; derivation: reference/BUDGETS.md).
//
// Organisation:
//   routing      expert sets vs the reference, near-tie acceptance (§6), re-run of those tokens
//   elementwise  ratios |observed - reference| / budget, per output element and per slot
//   attribution  which expert (or token) an elementwise failure belongs to
//   aggregates   bias (scale) and energy tests per expert (§7)
//   metrics      the familiar checks of engines' tests
#include "reference/moe_compare.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>

#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_routing.hpp"

namespace moecheck {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

double ratio_of(double obs, double ref, double budget) {
  if (!std::isfinite(obs)) return kInf;
  const double d = std::fabs(obs - ref);
  if (budget > 0) return d / budget;
  return d == 0 ? 0.0 : kInf;  // LAPACK convention: nothing may differ where the budget is 0
}

std::vector<int32_t> sorted_row(const int32_t* p, int64_t k) {
  std::vector<int32_t> v(p, p + k);
  std::sort(v.begin(), v.end());
  return v;
}

// The rows `tokens` of p as a problem of its own (storage owned by `keep`).
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
}  // namespace

FamiliarMetrics familiar_metrics(const std::vector<double>& ref, const std::vector<float>& obs) {
  FamiliarMetrics m;
  double sxx = 0, syy = 0, sxy = 0, sdd = 0, sad = 0, sar = 0, rmax = 0;
  int64_t close = 0;
  for (double r : ref) rmax = std::max(rmax, std::fabs(r));
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = ref[i], y = obs[i];
    if (!std::isfinite(y)) {
      ++m.nonfinite;
      continue;
    }
    const double d = y - x;
    sxx += x * x, syy += y * y, sxy += x * y, sdd += d * d, sad += std::fabs(d), sar += std::fabs(x);
    m.max_abs = std::max(m.max_abs, std::fabs(d));
    if (std::fabs(x) >= 1e-3 * rmax && x != 0) m.max_rel = std::max(m.max_rel, std::fabs(d) / std::fabs(x));
    close += std::fabs(d) <= 0.035 + 0.035 * std::fabs(x);
  }
  m.rel_l2 = sxx > 0 ? std::sqrt(sdd / sxx) : (sdd > 0 ? kInf : 0.0);
  m.nmse = sxx > 0 ? sdd / sxx : (sdd > 0 ? kInf : 0.0);
  m.sqnr_db = sdd > 0 ? 10 * std::log10(sxx / sdd) : kInf;
  m.cos_diff = (sxx + syy) > 0 ? 1 - 2 * sxy / (sxx + syy) : 0.0;
  m.mean_rel = sar > 0 ? sad / sar : (sad > 0 ? kInf : 0.0);
  m.allclose_fraction = ref.empty() ? 1.0 : double(close) / double(ref.size());
  // Thresholds of BUG-CLASSES.md §2: DeepGEMM calc_diff < 1e-3, SGLang fused-MoE mean-relative
  // < 0.02, vLLM assert_close(atol = rtol = 0.035) on every element, NMSE < 5e-3 (llama.cpp MoE).
  const bool finite = m.nonfinite == 0;
  m.deepgemm_pass = finite && m.cos_diff < 1e-3;
  m.sglang_pass = finite && m.mean_rel < 0.02;
  m.vllm_pass = finite && close == static_cast<int64_t>(ref.size());
  m.nmse_pass = finite && m.nmse < 5e-3;
  return m;
}

CompareResult compare_output(const MoeProblem& p, const ForwardResult& ref, const Observation& obs,
                             const CompareOptions& opt) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, k = c.top_k;
  if (ref.budget.size() != size_t(T * H) || ref.expert_outputs.size() != size_t(T * k * H))
    throw std::invalid_argument("compare_output: the reference was not computed with a budget");
  if (obs.output.size() != size_t(T * H)) throw std::invalid_argument("compare_output: output has the wrong size");
  if (!obs.topk_ids.empty() && obs.topk_ids.size() != size_t(T * k))
    throw std::invalid_argument("compare_output: topk_ids has the wrong size");
  if (!obs.expert_outputs.empty() && obs.expert_outputs.size() != size_t(T * k * H))
    throw std::invalid_argument("compare_output: expert_outputs has the wrong size");

  CompareResult R;
  R.name = obs.name, R.tokens = T, R.hidden = H, R.top_k = k, R.elements = T * H;
  std::vector<double> ro = ref.output, rb = ref.budget, ry = ref.expert_outputs, rdy = ref.slot_budget;
  std::vector<double> rv = ref.noise_var;
  if (rv.size() != ro.size()) {  // a stored reference without the noise model: derive it from the budget
    rv.resize(ro.size());
    for (size_t i = 0; i < ro.size(); ++i) rv[i] = rb[i] * rb[i];
  }
  std::vector<int32_t> ids = ref.routing.ids;
  std::vector<double> fs = ref.slot_flip_projection;
  std::vector<double> w = ref.routing.weights;

  // ---- routing ------------------------------------------------------------------------
  // Near-ties (§6): the backend's set is accepted when it is a valid top-k with every score moved
  // by up to delta; those tokens are re-run with the backend's experts. Without recorded ids, a
  // token near a tie is re-run with the single swap (last chosen <-> best rejected) and the
  // closer of the two choices is kept.
  std::vector<int64_t> rerun;
  std::vector<std::vector<int32_t>> rerun_ids;
  std::vector<std::vector<double>> rerun_w;
  for (int64_t t = 0; t < T; ++t) {
    const TokenScores s = selection_scores(c, p.logits + t * c.num_experts, p.bias);
    const double mag = *std::max_element(s.magnitude.begin(), s.magnitude.end());
    const double delta = opt.model.routing_ulps * 0x1p-24 * std::max(mag, 1e-30);
    if (!obs.topk_ids.empty()) {
      if (sorted_row(&obs.topk_ids[t * k], k) == sorted_row(&ids[t * k], k)) continue;
      const std::span<const int32_t> bid(&obs.topk_ids[t * k], k);
      const TopkJudgement j = judge_topk(c, s, bid, delta);
      if (j.valid) {
        R.ambiguous.push_back(t);
        rerun.push_back(t);
        rerun_ids.emplace_back(bid.begin(), bid.end());
        rerun_w.push_back(j.weights);
      } else {
        R.mismatched.push_back(t);
      }
    } else if (k < c.num_experts && ref.routing.margin[t] <= 2 * delta) {
      // Candidate swap: the best rejected candidate replaces the last chosen expert.
      std::vector<int32_t> alt(&ids[t * k], &ids[t * k] + k);
      int32_t best = -1;
      for (int32_t e = 0; e < c.num_experts; ++e) {
        if (std::find(alt.begin(), alt.end(), e) != alt.end()) continue;
        const std::span<const int32_t> cand(alt.data(), k - 1);
        std::vector<int32_t> trial(cand.begin(), cand.end());
        trial.push_back(e);
        if (judge_topk(c, s, trial, delta).valid && (best < 0 || s.sel[e] > s.sel[best])) best = e;
      }
      if (best >= 0) {
        alt.back() = best;
        rerun.push_back(t);
        rerun_w.push_back(weights_for(c, s, alt));
        rerun_ids.push_back(alt);
      }
    }
  }
  if (!rerun.empty()) {
    SubProblem sp = subproblem(p, rerun);
    Routing ov;
    ov.tokens = static_cast<int64_t>(rerun.size()), ov.top_k = k;
    for (size_t i = 0; i < rerun.size(); ++i) {
      ov.ids.insert(ov.ids.end(), rerun_ids[i].begin(), rerun_ids[i].end());
      ov.weights.insert(ov.weights.end(), rerun_w[i].begin(), rerun_w[i].end());
    }
    ov.margin.assign(rerun.size(), 0.0), ov.margin_scale = ov.margin, ov.group_margin = ov.margin;
    ov.group_margin_scale = ov.margin;
    ForwardOptions fo;
    fo.tier = Tier::quantized, fo.budget = &opt.model, fo.routing_override = &ov;
    const ForwardResult alt = moe_forward(sp.problem, fo);
    for (size_t i = 0; i < rerun.size(); ++i) {
      const int64_t t = rerun[i];
      bool take = !obs.topk_ids.empty();
      if (!take) {  // keep the choice that explains the observation better
        double worst_a = 0, worst_r = 0;
        for (int64_t h = 0; h < H; ++h) {
          worst_r = std::max(worst_r, ratio_of(obs.output[t * H + h], ro[t * H + h], rb[t * H + h]));
          worst_a = std::max(worst_a, ratio_of(obs.output[t * H + h], alt.output[i * H + h], alt.budget[i * H + h]));
        }
        take = worst_a < worst_r;
        if (take) R.ambiguous.push_back(t);
      }
      if (!take) continue;
      std::copy_n(&alt.output[i * H], H, &ro[t * H]);
      std::copy_n(&alt.budget[i * H], H, &rb[t * H]);
      std::copy_n(&alt.noise_var[i * H], H, &rv[t * H]);
      std::copy_n(&alt.expert_outputs[i * k * H], k * H, &ry[t * k * H]);
      std::copy_n(&alt.slot_budget[i * k * H], k * H, &rdy[t * k * H]);
      if (fs.size() == size_t(T * k)) std::copy_n(&alt.slot_flip_projection[i * k], k, &fs[t * k]);
      std::copy_n(&alt.routing.ids[i * k], k, &ids[t * k]);
      std::copy_n(&alt.routing.weights[i * k], k, &w[t * k]);
    }
  }
  std::sort(R.ambiguous.begin(), R.ambiguous.end());
  R.ambiguous_tokens = static_cast<int64_t>(R.ambiguous.size());
  R.mismatched_tokens = static_cast<int64_t>(R.mismatched.size()) + R.ambiguous_tokens;

  // ---- elementwise --------------------------------------------------------------------
  if (opt.keep_ratios) R.ratio.assign(size_t(T * H), 0.0f);
  std::vector<double> token_max(T, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const double r = ratio_of(obs.output[t * H + h], ro[t * H + h], rb[t * H + h]);
      if (opt.keep_ratios) R.ratio[t * H + h] = static_cast<float>(r);
      R.elements_over += !(r <= 1.0);
      if (r > token_max[t]) token_max[t] = r;
      if (r > R.max_ratio || (R.worst_token < 0 && r >= R.max_ratio)) R.max_ratio = r, R.worst_token = t, R.worst_col = h;
    }
  const bool have_slots = !obs.expert_outputs.empty();
  // Slot order: a backend may record its slots in any order (sorted by expert id, say); row j of
  // its expert_outputs belongs to its topk_ids[t, j]. Where its expert set is the one judged
  // (the reference's, or its own after a near-tie re-run), its slots are put into that order.
  std::vector<float> slots_in_order;
  const std::vector<float>& oslots = [&]() -> const std::vector<float>& {
    if (!have_slots || obs.topk_ids.empty()) return obs.expert_outputs;
    slots_in_order = obs.expert_outputs;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t* bid = &obs.topk_ids[t * k];
        const int64_t jb = std::find(bid, bid + k, ids[t * k + j]) - bid;
        if (jb < k && jb != j)
          std::copy_n(&obs.expert_outputs[(t * k + jb) * H], H, &slots_in_order[(t * k + j) * H]);
      }
    return slots_in_order;
  }();
  std::vector<double> slot_max(size_t(T * k), 0.0);
  auto slot_budget = [&](int64_t s, int64_t h) {
    const double b = rdy[s * H + h];
    return obs.expert_outputs_bf16 ? output_budget_bf16(ry[s * H + h], b) : b;
  };
  if (have_slots)
    for (int64_t s = 0; s < T * k; ++s) {
      if (!c.is_local(ids[s])) continue;
      for (int64_t h = 0; h < H; ++h)
        slot_max[s] = std::max(slot_max[s], ratio_of(oslots[s * H + h], ry[s * H + h], slot_budget(s, h)));
    }

  // ---- attribution --------------------------------------------------------------------
  std::map<int32_t, std::vector<int64_t>> slots_of;  // local expert -> its slots t*k+j
  for (int64_t s = 0; s < T * k; ++s)
    if (c.is_local(ids[s])) slots_of[ids[s]].push_back(s);
  std::map<int32_t, size_t> index;
  for (const auto& [e, sl] : slots_of) {
    index[e] = R.experts.size();
    ExpertVerdict v;
    v.expert = e, v.slots = static_cast<int64_t>(sl.size());
    std::vector<int64_t> toks;
    for (int64_t s : sl) toks.push_back(s / k);
    toks.erase(std::unique(toks.begin(), toks.end()), toks.end());
    v.tokens = static_cast<int64_t>(toks.size());
    R.experts.push_back(v);
  }
  std::vector<int32_t> owner(T, -1);  // expert a failing token is attributed to
  if (have_slots) {
    for (auto& v : R.experts)
      for (int64_t s : slots_of[v.expert]) v.max_ratio = std::max(v.max_ratio, slot_max[s]);
    for (auto& v : R.experts) v.blamed = !(v.max_ratio <= 1.0);
    for (int64_t t = 0; t < T; ++t) {
      if (token_max[t] <= 1.0) continue;
      bool explained = false;
      for (int64_t j = 0; j < k; ++j)
        explained |= c.is_local(ids[t * k + j]) && !(slot_max[t * k + j] <= 1.0);
      if (!explained) R.failing_tokens_unexplained.push_back(t);
    }
  } else {
    std::vector<char> covered(T, 0);
    for (;;) {
      int best = -1;
      double best_frac = 0;
      int64_t best_count = 0;
      for (size_t x = 0; x < R.experts.size(); ++x) {
        int64_t fail = 0, n = 0, prev = -1;
        for (int64_t s : slots_of[R.experts[x].expert]) {
          const int64_t t = s / k;
          if (t == prev) continue;
          prev = t, ++n;
          fail += !(token_max[t] <= 1.0) && !covered[t];
        }
        // Greedy set cover over the failing tokens, among experts most of whose tokens fail:
        // the one that explains the most unexplained failing tokens first.
        const double frac = n ? double(fail) / double(n) : 0;
        if (frac >= 0.5 && (fail > best_count || (fail == best_count && frac > best_frac)))
          best = static_cast<int>(x), best_frac = frac, best_count = fail;
      }
      if (best < 0) break;
      R.experts[best].blamed = true;
      for (int64_t s : slots_of[R.experts[best].expert])
        if (!(token_max[s / k] <= 1.0)) covered[s / k] = 1, owner[s / k] = static_cast<int32_t>(R.experts[best].expert);
    }
    for (auto& v : R.experts)
      for (int64_t s : slots_of[v.expert]) {
        const int64_t t = s / k;
        // Failing tokens count for the expert they were attributed to; unexplained ones are
        // reported per token, not smeared over the token's experts.
        if (owner[t] == v.expert || token_max[t] <= 1.0) v.max_ratio = std::max(v.max_ratio, token_max[t]);
      }
    for (int64_t t = 0; t < T; ++t)
      if (!(token_max[t] <= 1.0) && owner[t] < 0) R.failing_tokens_unexplained.push_back(t);
  }

  // ---- aggregates ---------------------------------------------------------------------
  // Systematic scale a correct device may have (§7): a weight's rounding plus, for a truncating
  // accumulator, half of the two GEMMs' accumulation bounds.
  const double u_w = c.routing_weight_dtype == Precision::bf16 ? 0x1p-8 : double(c.num_experts + k + 8) * 0x1p-24;
  const double acc_allow = opt.model.acc.truncating
                               ? 0.5 * (dot_product_bound(opt.model.acc, H, c.weight_block, false) +
                                        dot_product_bound(opt.model.acc, c.intermediate_size, c.weight_block, false))
                               : 0.0;
  const size_t A = R.experts.size();
  Eigen::MatrixXd M = Eigen::MatrixXd::Zero(A, A);
  Eigen::VectorXd b = Eigen::VectorXd::Zero(A);
  std::vector<double> en_obs(A, 0.0), en_pred(A, 0.0), n_el(A, 0.0), l2_d(A, 0.0), l2_r(A, 0.0);
  // Re-quantization flips (§7): a flip moves a whole slot output along one column of W2, which
  // projects onto the slot's own output: not noise of the elements, but of beta.
  std::vector<double> sys_num(A, 0.0), sys_den(A, 0.0);
  if (have_slots) {
    for (size_t x = 0; x < A; ++x)
      for (int64_t s : slots_of[R.experts[x].expert])
        for (int64_t h = 0; h < H; ++h) {
          const double yo = oslots[s * H + h], yr = ry[s * H + h], bud = rdy[s * H + h];
          const double ulp = obs.expert_outputs_bf16 ? bf16_ulp(yr) : 0.0;
          const double var = bud * bud + ulp * ulp / 12, d = yo - yr;  // as ForwardResult::noise_var
          sys_den[x] += yr * yr;
          if (!std::isfinite(yo) || !(var > 0)) continue;
          M(x, x) += yr * yr / var, b(x) += d * yr / var;
          en_obs[x] += d * d, en_pred[x] += var, n_el[x] += var * var, l2_d[x] += d * d, l2_r[x] += yr * yr;
        }
  } else {
    std::vector<std::pair<size_t, int64_t>> present;  // (expert index, slot) of one token
    for (int64_t t = 0; t < T; ++t) {
      present.clear();
      for (int64_t j = 0; j < k; ++j)
        if (c.is_local(ids[t * k + j])) present.push_back({index[ids[t * k + j]], t * k + j});
      for (int64_t h = 0; h < H; ++h) {
        for (auto [xa, sa] : present) {
          const double za = w[sa] * ry[sa * H + h];
          sys_den[xa] += za * za;
        }
        const double o = obs.output[t * H + h], var = rv[t * H + h];
        if (!std::isfinite(o) || !(var > 0)) continue;
        const double d = o - ro[t * H + h];
        for (auto [xa, sa] : present) {
          const double za = w[sa] * ry[sa * H + h];
          b(xa) += d * za / var;
          for (auto [xb, sb] : present) M(xa, xb) += za * w[sb] * ry[sb * H + h] / var;
          const bool mine = owner[t] < 0 || owner[t] == R.experts[xa].expert;
          if (mine) en_obs[xa] += d * d, en_pred[xa] += var, n_el[xa] += var * var;
          l2_d[xa] += d * d, l2_r[xa] += ro[t * H + h] * ro[t * H + h];
        }
      }
    }
  }
  // Flip projections (§7): per slot the root sum of squares of dh_i |<W2[:, i], y>|, times w^2 for
  // the combined output; independent signs, so they add to the variance of beta (Hoeffding).
  if (fs.size() == size_t(T * k))
    for (size_t x = 0; x < A; ++x)
      for (int64_t s : slots_of[R.experts[x].expert]) {
        const double p = (have_slots ? 1.0 : w[s] * w[s]) * fs[s];
        sys_num[x] += p * p;
      }
  // The float32 scale and division slack moves every value of a group alike: a systematic
  // relative error of up to (scale_ulps + divide_ulps) 2^-24 per quantization, two of them.
  const double slack = 2.0 * (opt.model.scale_ulps + opt.model.divide_ulps) * 0x1p-24;
  if (A > 0) {
    // A tiny ridge keeps the joint fit solvable when two experts always share their tokens.
    Eigen::MatrixXd Mr = M;
    for (size_t x = 0; x < A; ++x) Mr(x, x) += 1e-300 + 1e-12 * M(x, x);
    const Eigen::LDLT<Eigen::MatrixXd> ldlt(Mr);
    const Eigen::VectorXd beta = ldlt.solve(b);
    const Eigen::MatrixXd cov = ldlt.solve(Eigen::MatrixXd::Identity(A, A));
    for (size_t x = 0; x < A; ++x) {
      ExpertVerdict& v = R.experts[x];
      v.beta = M(x, x) > 0 ? beta(x) : 0.0;
      const double flip_var = sys_den[x] > 0 ? sys_num[x] / (sys_den[x] * sys_den[x]) : 0.0;
      v.beta_se = M(x, x) > 0 ? std::sqrt(std::max(cov(x, x), 0.0) + flip_var) : 0.0;
      v.beta_allow = u_w + acc_allow + slack;
      v.bias_ok = !(std::fabs(v.beta) > v.beta_allow + opt.z * v.beta_se);
      v.energy_ratio = en_pred[x] > 0 ? en_obs[x] / en_pred[x] : 0.0;
      // The energy is dominated by the largest elements: its spread follows the effective count
      // n_eff = (sum var)^2 / sum var^2 (n_el holds sum var^2), not the element count.
      const double n_eff = n_el[x] > 0 ? en_pred[x] * en_pred[x] / n_el[x] : 1.0;
      v.energy_limit = 1 + opt.z * std::sqrt(2.0 / std::max(n_eff, 1.0));
      v.energy_ok = !(v.energy_ratio > v.energy_limit);
      v.rel_l2 = l2_r[x] > 0 ? std::sqrt(l2_d[x] / l2_r[x]) : 0.0;
      v.pass = !v.blamed && v.max_ratio <= 1.0 && v.bias_ok && v.energy_ok;
    }
  }
  auto severity = [&](const ExpertVerdict& v) {
    const double bias = v.beta_se > 0 ? (std::fabs(v.beta) - v.beta_allow) / (opt.z * v.beta_se) : 0.0;
    return std::max({v.max_ratio, bias, v.energy_limit > 0 ? v.energy_ratio / v.energy_limit : 0.0});
  };
  std::stable_sort(R.experts.begin(), R.experts.end(), [&](const ExpertVerdict& a, const ExpertVerdict& b) {
    if (a.pass != b.pass) return !a.pass;
    return severity(a) > severity(b);
  });

  // ---- verdict ------------------------------------------------------------------------
  R.checks = 3 * static_cast<int64_t>(A) + 2;  // per expert: elementwise, bias, energy; routing; token-local
  for (const auto& v : R.experts)
    R.checks_failed += (v.blamed || !(v.max_ratio <= 1.0)) + !v.bias_ok + !v.energy_ok;
  R.checks_failed += !R.mismatched.empty();
  R.checks_failed += !R.failing_tokens_unexplained.empty();
  R.pass = R.checks_failed == 0;
  R.metrics = familiar_metrics(ro, obs.output);
  R.reference_output = std::move(ro);
  return R;
}

}  // namespace moecheck
