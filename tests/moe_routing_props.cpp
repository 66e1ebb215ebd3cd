// RapidCheck properties of the float64 routing reference (reference/moe_routing.hpp).
//
// Organisation: generators (configs, logits built from small integers so values are exact in
// float and ties are either impossible or frequent by choice), then one property per invariant:
// softmax shift invariance, relabelling (permutation) equivariance, renormalized weights sum to
// rsf, selected >= rejected with the documented margins, grouped selection lies in the kept
// groups, batch independence, judge_topk on the reference's own choice and a swap.
// Replay a failure with the RC_PARAMS="reproduce=..." string RapidCheck prints.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <ios>
#include <limits>
#include <ostream>
#include <vector>

#include "reference/moe_routing.hpp"
#include "tests/generators.hpp"

namespace moecheck {
namespace {

constexpr double kU = 0x1p-53;  // unit roundoff of double
double gamma(double n) { return n * kU / (1 - n * kU); }

// ---------------------------------------------------------------------------------------
// Generators

struct RoutingCase {
  MoeConfig cfg;
  int64_t tokens = 0;
  std::vector<float> logits;  // [tokens, E]
  std::vector<float> bias;    // [E] or empty (no bias)
  const float* bias_ptr() const { return bias.empty() ? nullptr : bias.data(); }
  const float* row(int64_t t) const { return logits.data() + t * cfg.num_experts; }
};

void showValue(const RoutingCase& c, std::ostream& os) {
  os << "RoutingCase(method=" << to_string(c.cfg.routing) << ", E=" << c.cfg.num_experts << ", top_k=" << c.cfg.top_k
     << ", n_group=" << c.cfg.n_group << ", topk_group=" << c.cfg.topk_group
     << ", rsf=" << c.cfg.routed_scaling_factor << ", tokens=" << c.tokens << ")\n  logits:";
  const auto old = os.precision(9);  // 9 significant digits identify a float exactly
  for (float x : c.logits) os << ' ' << x;
  os << "\n  bias:";
  for (float x : c.bias) os << ' ' << x;
  os.precision(old);
}

bool uses_bias(RoutingMethod m) { return m == RoutingMethod::deepseek_v3 || m == RoutingMethod::sigmoid_renormalize; }
bool is_softmax(RoutingMethod m) { return m == RoutingMethod::renormalize || m == RoutingMethod::softmax_topk; }
bool renormalizes(RoutingMethod m) { return m != RoutingMethod::softmax_topk && m != RoutingMethod::llama4; }

rc::Gen<MoeConfig> gen_config(std::vector<RoutingMethod> methods) {
  return rc::gen::exec([methods] {
    MoeConfig c;
    c.hidden_size = 128;
    c.intermediate_size = 128;
    c.routing = *rc::gen::elementOf(methods);
    if (c.routing == RoutingMethod::deepseek_v3) {
      c.n_group = *rc::gen::element<int64_t>(1, 2, 4, 8);
      const int64_t per = *rc::gen::inRange<int64_t>(1, 9);
      c.num_experts = c.n_group * per;
      c.topk_group = *rc::gen::inRange<int64_t>(1, c.n_group + 1);
      c.top_k = *rc::gen::inRange<int64_t>(1, c.topk_group * per + 1);
    } else {
      c.num_experts = *rc::gen::inRange<int64_t>(1, 65);
      c.top_k = c.routing == RoutingMethod::llama4 ? 1 : *rc::gen::inRange<int64_t>(1, std::min<int64_t>(c.num_experts, 16) + 1);
    }
    c.routed_scaling_factor = *rc::gen::element(1.0, 2.5, 0.5, 16.0, 1.0 / 3.0);
    return c;
  });
}

// How a case's logits are drawn:
//   distinct  each token's logits are distinct multiples of 1/8 in [-16, 16] (no exact ties in
//             logits, sigmoid or softmax);
//   coarse    multiples of 1/4 in [-4, 4] (ties are frequent, at the cut included);
//   mixed     per token either coarse or testgen::exactFloat magnitudes 2^-12 .. 2^5 of either
//             sign (full 24-bit mantissas, sigmoid values down to ~1e-14).
// Bias (deepseek_v3, sigmoid_renormalize, half of the cases), negative values included: multiples
// of 1/32 in [-2, 2]; in mixed cases also exactFloat magnitudes 2^-20 .. 2^4 (a bias of ~10 next
// to sigmoid values ~1e-8, the GLM-5.2 situation of docs/BUG-CLASSES.md #18).
enum class Logits { distinct, coarse, mixed };

rc::Gen<float> coarse_logit() { return rc::gen::map(rc::gen::inRange(-16, 17), [](int v) { return float(v) * 0.25f; }); }
rc::Gen<float> grid_bias() { return rc::gen::map(rc::gen::inRange(-64, 65), [](int v) { return float(v) / 32.0f; }); }

rc::Gen<RoutingCase> gen_case(std::vector<RoutingMethod> methods, Logits kind) {
  return rc::gen::exec([methods, kind] {
    RoutingCase rcase;
    rcase.cfg = *gen_config(methods);
    const size_t E = size_t(rcase.cfg.num_experts);
    rcase.tokens = *rc::gen::inRange<int64_t>(1, 6);
    for (int64_t t = 0; t < rcase.tokens; ++t) {
      std::vector<float> row;
      if (kind == Logits::distinct) {
        for (int v : *rc::gen::unique<std::vector<int>>(E, rc::gen::inRange(-128, 129))) row.push_back(float(v) * 0.125f);
      } else if (kind == Logits::coarse || *rc::gen::arbitrary<bool>()) {
        row = *rc::gen::container<std::vector<float>>(E, coarse_logit());
      } else {
        row = *rc::gen::container<std::vector<float>>(E, testgen::exactFloat(-12, 4));
      }
      rcase.logits.insert(rcase.logits.end(), row.begin(), row.end());
    }
    if (uses_bias(rcase.cfg.routing) && *rc::gen::arbitrary<bool>()) {
      rcase.bias = kind == Logits::mixed && *rc::gen::arbitrary<bool>()
                       ? *rc::gen::container<std::vector<float>>(E, testgen::exactFloat(-20, 3))
                       : *rc::gen::container<std::vector<float>>(E, grid_bias());
    }
    return rcase;
  });
}

const std::vector<RoutingMethod> kAll = {RoutingMethod::deepseek_v3, RoutingMethod::renormalize,
                                         RoutingMethod::softmax_topk, RoutingMethod::sigmoid_renormalize,
                                         RoutingMethod::llama4};

// The candidates of a token: experts of the kept groups (all experts without grouping).
std::vector<char> candidate_mask(const MoeConfig& c, const TokenRouting& r) {
  std::vector<char> m(c.num_experts, r.kept_groups.empty() ? 1 : 0);
  const int64_t per = c.num_experts / c.n_group;
  for (int32_t g : r.kept_groups)
    for (int64_t e = g * per; e < (g + 1) * per; ++e) m[e] = 1;
  return m;
}

bool ranks_before(const std::vector<double>& v, int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

// ---------------------------------------------------------------------------------------
// Properties

// Adding a constant c to a token's logits does not change softmax routing. Logits and c are
// multiples of 1/8 below 2^6 in magnitude, so l + c is exact in float and (l + c) - (max + c)
// = l - max exactly in double: every later operation sees the same operands, and ids, weights
// and margins are bitwise equal (tolerance 0, derived, not assumed).
RC_GTEST_PROP(MoeRoutingProps, SoftmaxInvariantToLogitShift, ()) {
  const RoutingCase rcase = *gen_case({RoutingMethod::renormalize, RoutingMethod::softmax_topk}, Logits::coarse);
  const float shift = float(*rc::gen::inRange(-256, 257)) * 0.125f;
  RoutingCase shifted = rcase;
  for (float& x : shifted.logits) x += shift;
  const Routing a = route(rcase.cfg, rcase.logits.data(), nullptr, rcase.tokens);
  const Routing b = route(shifted.cfg, shifted.logits.data(), nullptr, shifted.tokens);
  RC_ASSERT(a.ids == b.ids);
  RC_ASSERT(a.weights == b.weights);
  RC_ASSERT(a.margin == b.margin);
}

// Relabelling the experts relabels the choice. The new label of expert e is pi(e); for
// grouped deepseek_v3 pi permutes whole groups and experts within each group (groups are
// contiguous, so any other permutation changes the problem). Logits are distinct; cases where
// a relabelling could legitimately change the answer (an exact tie in sel, or at the group
// cut) are discarded (rare: only biased scores can tie).
// Weights: sigmoid methods do the same operations on the same operands (denominators are summed
// in rank order) -> bitwise equal. Softmax methods sum the normalizer over all E experts in
// index order, which the relabelling changes: the normalizer differs by <= 2 gamma_{E-1}
// relative; with the roundings of p, of the top-k sum (k-1, same order) and of the weight (2),
// the weights differ by <= 2 gamma_{E+k+3} relative, and margins (differences of two
// probabilities) by that times the sum of the two.
RC_GTEST_PROP(MoeRoutingProps, RelabellingExpertsRelabelsChoice, ()) {
  const RoutingCase rcase = *gen_case(kAll, Logits::distinct);
  const MoeConfig& c = rcase.cfg;
  RC_TAG(std::string(to_string(c.routing)));
  const int64_t E = c.num_experts;
  const int64_t groups = c.routing == RoutingMethod::deepseek_v3 ? c.n_group : 1, per = E / groups;
  // pi(e) = sigma(g) * per + tau_g(e - g * per) with random permutations sigma, tau_g.
  auto perm_of = [](int64_t n) {
    const auto keys = *rc::gen::unique<std::vector<int>>(size_t(n), rc::gen::inRange(0, 1 << 20));
    std::vector<int64_t> p(n);
    for (int64_t i = 0; i < n; ++i) p[i] = i;
    std::sort(p.begin(), p.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
    return p;
  };
  const std::vector<int64_t> sigma = perm_of(groups);
  std::vector<int64_t> pi(E);
  for (int64_t g = 0; g < groups; ++g) {
    const std::vector<int64_t> tau = perm_of(per);
    for (int64_t j = 0; j < per; ++j) pi[g * per + j] = sigma[g] * per + tau[j];
  }
  RoutingCase moved = rcase;
  for (int64_t t = 0; t < rcase.tokens; ++t)
    for (int64_t e = 0; e < E; ++e) moved.logits[t * E + pi[e]] = rcase.logits[t * E + e];
  for (int64_t e = 0; e < int64_t(rcase.bias.size()); ++e) moved.bias[pi[e]] = rcase.bias[e];

  for (int64_t t = 0; t < rcase.tokens; ++t) {
    const TokenScores s = selection_scores(c, rcase.row(t), rcase.bias_ptr());
    std::vector<double> sorted = s.sel;
    std::sort(sorted.begin(), sorted.end());
    RC_PRE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    const TokenRouting a = route_token(c, s);
    RC_PRE(a.group_margin > 0);
    const TokenRouting b = route_token(c, moved.row(t), moved.bias_ptr());
    RC_ASSERT(a.ids.size() == b.ids.size());
    for (size_t i = 0; i < a.ids.size(); ++i) RC_ASSERT(int64_t(b.ids[i]) == pi[a.ids[i]]);
    if (is_softmax(c.routing)) {
      const double tol = 2 * gamma(double(E + c.top_k + 3));
      for (size_t i = 0; i < a.weights.size(); ++i) RC_ASSERT(std::abs(a.weights[i] - b.weights[i]) <= tol * a.weights[i]);
      RC_ASSERT(a.margin == b.margin || std::abs(a.margin - b.margin) <= tol * 2 * a.margin_scale);
    } else {
      RC_ASSERT(a.weights == b.weights);
      RC_ASSERT(a.margin == b.margin);
      RC_ASSERT(a.group_margin == b.group_margin);
    }
  }
}

// Renormalizing methods: weights sum to rsf. The reference sums k gates (k-1 roundings), divides
// and scales each (2 roundings); this test sums k weights (k-1): |sum - rsf| <= rsf gamma_{2k+1}.
// Non-renormalizing methods: 0 < w <= rsf (1 + 2u) (a probability or a sigmoid, times rsf).
RC_GTEST_PROP(MoeRoutingProps, WeightsSumToScalingFactorWhenRenormalized, ()) {
  const RoutingCase rcase = *gen_case(kAll, Logits::mixed);
  const MoeConfig& c = rcase.cfg;
  RC_TAG(std::string(to_string(c.routing)));
  const Routing r = route(c, rcase.logits.data(), rcase.bias_ptr(), rcase.tokens);
  const double rsf = c.routed_scaling_factor;
  for (int64_t t = 0; t < r.tokens; ++t) {
    double sum = 0;
    for (int64_t i = 0; i < r.top_k; ++i) {
      const double w = r.weights[t * r.top_k + i];
      RC_ASSERT(w > 0);
      RC_ASSERT(w <= rsf * (1 + 2 * kU));
      sum += w;
    }
    if (renormalizes(c.routing)) RC_ASSERT(std::abs(sum - rsf) <= rsf * gamma(2.0 * double(c.top_k) + 1));
  }
}

// Every chosen expert outranks every rejected candidate (sel descending, ties to the lower id),
// ids are stored in rank order, and the margins are exactly the documented differences (the same
// single subtraction in double), hence >= 0; +inf with margin_scale 0 when nothing is rejected.
// Frequent ties (logits on a coarse grid) exercise the tie rule.
RC_GTEST_PROP(MoeRoutingProps, ChosenOutrankRejectedAndMarginsAsDocumented, ()) {
  const RoutingCase rcase = *gen_case(kAll, Logits::mixed);
  const MoeConfig& c = rcase.cfg;
  bool tie = false;
  for (int64_t t = 0; t < rcase.tokens; ++t) {
    const TokenScores s = selection_scores(c, rcase.row(t), rcase.bias_ptr());
    const TokenRouting r = route_token(c, s);
    tie = tie || r.margin == 0;
    RC_ASSERT(int64_t(r.ids.size()) == c.top_k);
    const std::vector<char> cand = candidate_mask(c, r);
    std::vector<char> chosen(c.num_experts, 0);
    for (size_t i = 0; i < r.ids.size(); ++i) {
      RC_ASSERT(cand[r.ids[i]] == 1);
      RC_ASSERT(chosen[r.ids[i]] == 0);
      chosen[r.ids[i]] = 1;
      if (i > 0) RC_ASSERT(ranks_before(s.sel, r.ids[i - 1], r.ids[i]));
    }
    int32_t best_rejected = -1;
    for (int32_t e = 0; e < int32_t(c.num_experts); ++e) {
      if (!cand[e] || chosen[e]) continue;
      for (int32_t id : r.ids) RC_ASSERT(ranks_before(s.sel, id, e));
      if (best_rejected < 0 || ranks_before(s.sel, e, best_rejected)) best_rejected = e;
    }
    RC_ASSERT(r.margin >= 0);
    RC_ASSERT(r.group_margin >= 0);
    if (best_rejected < 0) {
      RC_ASSERT(r.margin == std::numeric_limits<double>::infinity());
      RC_ASSERT(r.margin_scale == 0);
    } else {
      const int32_t last = r.ids.back();
      RC_ASSERT(r.margin == s.sel[last] - s.sel[best_rejected]);
      RC_ASSERT(r.margin_scale == std::max(s.magnitude[last], s.magnitude[best_rejected]));
    }
  }
  RC_CLASSIFY(tie, "tie at the cut");
}

// Grouped deepseek_v3: group scores are the sums of each group's two largest sel (recomputed
// here by sorting), the kept groups are the topk_group best (ties to the lower group index),
// every chosen expert lies in a kept group, and the group margin is last kept - best excluded.
RC_GTEST_PROP(MoeRoutingProps, DeepseekChoosesOnlyFromKeptGroups, ()) {
  const RoutingCase rcase = *gen_case({RoutingMethod::deepseek_v3}, Logits::mixed);
  const MoeConfig& c = rcase.cfg;
  RC_PRE(c.n_group > 1);
  const int64_t per = c.num_experts / c.n_group;
  for (int64_t t = 0; t < rcase.tokens; ++t) {
    const TokenScores s = selection_scores(c, rcase.row(t), rcase.bias_ptr());
    const TokenRouting r = route_token(c, s);
    std::vector<double> gs(c.n_group);
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<double> v(s.sel.begin() + g * per, s.sel.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs[g] = per == 1 ? v[0] : v[0] + v[1];
      RC_ASSERT(gs[g] == s.group_score[g]);
    }
    std::vector<int32_t> order(c.n_group);
    for (int32_t g = 0; g < int32_t(c.n_group); ++g) order[g] = g;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ranks_before(gs, a, b); });
    std::vector<int32_t> kept(order.begin(), order.begin() + c.topk_group);
    std::sort(kept.begin(), kept.end());
    RC_ASSERT(r.kept_groups == kept);
    for (int32_t id : r.ids) RC_ASSERT(std::binary_search(kept.begin(), kept.end(), int32_t(id / per)));
    if (c.topk_group < c.n_group)
      RC_ASSERT(r.group_margin == gs[order[c.topk_group - 1]] - gs[order[c.topk_group]]);
    else
      RC_ASSERT(r.group_margin == std::numeric_limits<double>::infinity());
  }
}

// A token's routing does not depend on the other tokens of the batch: each row of route() is
// bitwise the routing of that row alone, and reversing the batch reverses the rows.
RC_GTEST_PROP(MoeRoutingProps, TokensAreIndependent, ()) {
  const RoutingCase rcase = *gen_case(kAll, Logits::mixed);
  const MoeConfig& c = rcase.cfg;
  const int64_t T = rcase.tokens, E = c.num_experts, k = c.top_k;
  const Routing all = route(c, rcase.logits.data(), rcase.bias_ptr(), T);
  std::vector<float> reversed;
  for (int64_t t = T - 1; t >= 0; --t) reversed.insert(reversed.end(), rcase.row(t), rcase.row(t) + E);
  const Routing rev = route(c, reversed.data(), rcase.bias_ptr(), T);
  for (int64_t t = 0; t < T; ++t) {
    const TokenRouting one = route_token(c, rcase.row(t), rcase.bias_ptr());
    const int64_t u = T - 1 - t;
    RC_ASSERT(std::equal(one.ids.begin(), one.ids.end(), all.ids.begin() + t * k));
    RC_ASSERT(std::equal(one.weights.begin(), one.weights.end(), all.weights.begin() + t * k));
    RC_ASSERT(std::equal(one.ids.begin(), one.ids.end(), rev.ids.begin() + u * k));
    RC_ASSERT(std::equal(one.weights.begin(), one.weights.end(), rev.weights.begin() + u * k));
    RC_ASSERT(one.margin == all.margin[t] && one.margin == rev.margin[u]);
    RC_ASSERT(one.group_margin == all.group_margin[t] && one.margin_scale == all.margin_scale[t]);
  }
}

// judge_topk accepts the reference's own choice with delta = 0 and returns its weights; swapping
// the last chosen expert for the best rejected candidate is valid once delta >= margin (2 delta
// covers the gap with room for the rounding of sel + 2 delta) and, without grouping, invalid at
// delta = margin / 4 (the gap exceeds 2 delta = margin / 2 by far more than rounding when
// margin > 1e-9 * scale). With grouping a swap may be valid at small delta through a near-tie
// of groups, so only the first half is asserted there.
RC_GTEST_PROP(MoeRoutingProps, JudgeAcceptsOwnChoiceAndSwapsAtTheMargin, ()) {
  const RoutingCase rcase = *gen_case(kAll, Logits::mixed);
  const MoeConfig& c = rcase.cfg;
  bool judged_quarter = false;
  for (int64_t t = 0; t < rcase.tokens; ++t) {
    const TokenScores s = selection_scores(c, rcase.row(t), rcase.bias_ptr());
    const TokenRouting r = route_token(c, s);
    const TopkJudgement own = judge_topk(c, s, r.ids, 0.0);
    RC_ASSERT(own.valid);
    RC_ASSERT(own.weights == r.weights);
    if (!std::isfinite(r.margin)) continue;
    const std::vector<char> cand = candidate_mask(c, r);
    int32_t best_rejected = -1;
    for (int32_t e = 0; e < int32_t(c.num_experts); ++e)
      if (cand[e] && std::find(r.ids.begin(), r.ids.end(), e) == r.ids.end() &&
          (best_rejected < 0 || ranks_before(s.sel, e, best_rejected)))
        best_rejected = e;
    std::vector<int32_t> swapped = r.ids;
    swapped.back() = best_rejected;
    RC_ASSERT(judge_topk(c, s, swapped, r.margin).valid);
    if (r.kept_groups.empty() && r.margin > 1e-9 * r.margin_scale) {
      judged_quarter = true;
      RC_ASSERT(!judge_topk(c, s, swapped, r.margin / 4).valid);
    }
  }
  RC_CLASSIFY(judged_quarter, "swap judged at margin/4");
}

}  // namespace
}  // namespace moecheck
