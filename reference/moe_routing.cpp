// The float64 routing reference (contract and numerics: reference/moe_routing.hpp).
//
// Organisation: scores (sigmoid / softmax / logit, bias, group scores) -> ranking (one total
// order: descending score, ties to the lower index) -> selection and margins -> weights. The
// public entry points validate; the internal ones assume a valid config and well-sized scores.
#include "reference/moe_routing.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <stdexcept>

#include "reference/fp8_formats.hpp"

namespace moecheck {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool grouped(const MoeConfig& c) { return c.routing == RoutingMethod::deepseek_v3 && c.n_group > 1; }

bool renormalizes(RoutingMethod m) {
  return m == RoutingMethod::deepseek_v3 || m == RoutingMethod::renormalize || m == RoutingMethod::sigmoid_renormalize;
}

// sigmoid in double, in the form that never overflows: for x >= 0, exp(-x) <= 1; for x < 0
// the algebraically equal exp(x) / (1 + exp(x)) avoids exp(-x) = inf for very negative x.
double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

// The ranking order of scores v: a before b when v[a] > v[b], equal values by lower index.
// Scores are finite (checked on input), so this is a strict total order and every sort by it
// is deterministic.
struct Better {
  const std::vector<double>& v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

void check_scores(const MoeConfig& c, const TokenScores& s) {
  const auto E = static_cast<size_t>(c.num_experts);
  const size_t G = grouped(c) ? static_cast<size_t>(c.n_group) : 0;
  if (s.sel.size() != E || s.gate.size() != E || s.magnitude.size() != E || s.group_score.size() != G ||
      s.group_magnitude.size() != G)
    throw std::invalid_argument(fmt::format(
        "moe_routing: TokenScores sized for another config (sel {}, gate {}, magnitude {}, groups {}/{}; "
        "expected {} experts, {} groups)",
        s.sel.size(), s.gate.size(), s.magnitude.size(), s.group_score.size(), s.group_magnitude.size(), E, G));
}

// The k ids in rank order (the order the output stores them in).
std::vector<int32_t> rank_sorted(const TokenScores& s, std::span<const int32_t> ids) {
  std::vector<int32_t> r(ids.begin(), ids.end());
  std::sort(r.begin(), r.end(), Better{s.sel});
  return r;
}

// Weights of a well-formed id set. Renormalizing methods divide by the sum of the chosen gates,
// summed in rank order (so the result does not depend on the order ids are given in, and is
// equivariant under a relabelling of the experts); then one multiplication by rsf.
std::vector<double> weights_unchecked(const MoeConfig& c, const TokenScores& s, std::span<const int32_t> ids) {
  std::vector<double> w(ids.size());
  double denom = 1.0;
  if (renormalizes(c.routing)) {
    denom = 0.0;
    for (int32_t id : rank_sorted(s, ids)) denom += s.gate[id];
  }
  for (size_t i = 0; i < ids.size(); ++i)
    w[i] = renormalizes(c.routing) ? s.gate[ids[i]] / denom * c.routed_scaling_factor
                                   : s.gate[ids[i]] * c.routed_scaling_factor;
  return w;
}

void require_finite_scores_inputs(int64_t E, const float* logits, const float* bias) {
  for (int64_t e = 0; e < E; ++e) {
    if (!std::isfinite(logits[e]))
      throw std::invalid_argument(fmt::format("moe_routing: router logit of expert {} is {} (must be finite)", e,
                                              logits[e]));
    if (bias && !std::isfinite(bias[e]))
      throw std::invalid_argument(fmt::format("moe_routing: routing bias of expert {} is {} (must be finite)", e,
                                              bias[e]));
  }
}

// deepseek_v3 and sigmoid_renormalize: the bias moves the selection only; the weight keeps the
// unbiased sigmoid.
void sigmoid_scores(int64_t E, const float* logits, const float* bias, TokenScores& s) {
  for (int64_t e = 0; e < E; ++e) {
    const double b = bias ? double(bias[e]) : 0.0;
    s.gate[e] = sigmoid(double(logits[e]));
    s.sel[e] = s.gate[e] + b;
    s.magnitude[e] = std::abs(s.gate[e]) + std::abs(b);
  }
}

// renormalize and softmax_topk: softmax with the maximum subtracted: every exponent is <= 0, so no
// overflow, and the maximum's term is exactly 1, so the sum is >= 1. l - max of two floats is
// exact in double for any realistic logits (exponents less than 29 binades apart).
void softmax_scores(int64_t E, const float* logits, TokenScores& s) {
  double m = double(logits[0]);
  for (int64_t e = 1; e < E; ++e) m = std::max(m, double(logits[e]));
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    s.gate[e] = std::exp(double(logits[e]) - m);
    sum += s.gate[e];  // index order
  }
  for (int64_t e = 0; e < E; ++e) {
    s.gate[e] /= sum;
    s.sel[e] = s.gate[e];
    s.magnitude[e] = s.gate[e];
  }
}

// llama4: selection by the logit, the weight its sigmoid.
void llama4_scores(int64_t E, const float* logits, TokenScores& s) {
  for (int64_t e = 0; e < E; ++e) {
    s.sel[e] = double(logits[e]);
    s.gate[e] = sigmoid(double(logits[e]));
    s.magnitude[e] = std::abs(s.sel[e]);
  }
}

// Group score: sum of the two best sel of the group (by the ranking order, so tied values pick the
// lower ids and their magnitudes deterministically).
void group_scores(const MoeConfig& c, TokenScores& s) {
  const int64_t per = c.num_experts / c.n_group;
  const Better better{s.sel};
  s.group_score.resize(c.n_group);
  s.group_magnitude.resize(c.n_group);
  for (int64_t g = 0; g < c.n_group; ++g) {
    int32_t first = int32_t(g * per), second = -1;
    for (int32_t e = first + 1; e < int32_t((g + 1) * per); ++e) {
      if (better(e, first)) {
        second = first;
        first = e;
      } else if (second < 0 || better(e, second)) {
        second = e;
      }
    }
    s.group_score[g] = second < 0 ? s.sel[first] : s.sel[first] + s.sel[second];
    s.group_magnitude[g] = second < 0 ? s.magnitude[first] : s.magnitude[first] + s.magnitude[second];
  }
}

TokenScores scores_unchecked(const MoeConfig& c, const float* logits, const float* bias) {
  const int64_t E = c.num_experts;
  require_finite_scores_inputs(E, logits, bias);
  TokenScores s;
  s.sel.resize(E);
  s.gate.resize(E);
  s.magnitude.resize(E);
  switch (c.routing) {
    case RoutingMethod::deepseek_v3:
    case RoutingMethod::sigmoid_renormalize: sigmoid_scores(E, logits, bias, s); break;
    case RoutingMethod::renormalize:
    case RoutingMethod::softmax_topk: softmax_scores(E, logits, s); break;
    case RoutingMethod::llama4: llama4_scores(E, logits, s); break;
  }
  if (grouped(c)) group_scores(c, s);
  return s;
}

TokenRouting route_unchecked(const MoeConfig& c, const TokenScores& s) {
  TokenRouting r;
  const int64_t E = c.num_experts, k = c.top_k;

  // Group level: keep the topk_group best groups; only their experts are candidates.
  std::vector<int32_t> candidates;
  r.group_margin = kInf;
  r.group_margin_scale = 0;
  if (grouped(c)) {
    std::vector<int32_t> order(c.n_group);
    for (int32_t g = 0; g < int32_t(c.n_group); ++g) order[g] = g;
    std::sort(order.begin(), order.end(), Better{s.group_score});
    if (c.topk_group < c.n_group) {
      const int32_t last = order[c.topk_group - 1], best_out = order[c.topk_group];
      r.group_margin = s.group_score[last] - s.group_score[best_out];
      r.group_margin_scale = std::max(s.group_magnitude[last], s.group_magnitude[best_out]);
    }
    r.kept_groups.assign(order.begin(), order.begin() + c.topk_group);
    std::sort(r.kept_groups.begin(), r.kept_groups.end());
    const int64_t per = E / c.n_group;
    for (int32_t g : r.kept_groups)
      for (int64_t e = g * per; e < (g + 1) * per; ++e) candidates.push_back(int32_t(e));
  } else {
    candidates.resize(E);
    for (int32_t e = 0; e < int32_t(E); ++e) candidates[e] = e;
  }

  // Expert level: the k best candidates, plus the best rejected one for the margin.
  const int64_t n = int64_t(candidates.size());
  const int64_t need = std::min(n, k + 1);
  std::partial_sort(candidates.begin(), candidates.begin() + need, candidates.end(), Better{s.sel});
  r.ids.assign(candidates.begin(), candidates.begin() + k);
  if (n > k) {
    const int32_t last = candidates[k - 1], best_out = candidates[k];
    r.margin = s.sel[last] - s.sel[best_out];
    r.margin_scale = std::max(s.magnitude[last], s.magnitude[best_out]);
  } else {
    r.margin = kInf;
    r.margin_scale = 0;
  }
  r.weights = weights_unchecked(c, s, r.ids);
  return r;
}

// "" when ids is k distinct experts in [0, E), else what is wrong.
std::string id_set_problem(const MoeConfig& c, std::span<const int32_t> ids) {
  if (int64_t(ids.size()) != c.top_k) return fmt::format("{} ids proposed, top_k = {}", ids.size(), c.top_k);
  std::vector<char> seen(c.num_experts, 0);
  for (int32_t id : ids) {
    if (id < 0 || id >= c.num_experts) return fmt::format("expert id {} outside [0, {})", id, c.num_experts);
    if (seen[id]) return fmt::format("expert id {} proposed twice", id);
    seen[id] = 1;
  }
  return "";
}

}  // namespace

void require_valid_config(const MoeConfig& c) {
  const auto problems = config_problems(c);
  if (!problems.empty()) throw std::invalid_argument(fmt::format("moe_routing: invalid config: {}", fmt::join(problems, "; ")));
}

TokenScores selection_scores(const MoeConfig& c, const float* logits_row, const float* bias_or_null) {
  require_valid_config(c);
  if (bias_or_null && c.routing != RoutingMethod::deepseek_v3 && c.routing != RoutingMethod::sigmoid_renormalize)
    throw std::invalid_argument(fmt::format(
        "moe_routing: a routing bias was given for {} routing; only deepseek_v3 and sigmoid_renormalize use one",
        to_string(c.routing)));
  return scores_unchecked(c, logits_row, bias_or_null);
}

TokenRouting route_token(const MoeConfig& c, const TokenScores& s) {
  require_valid_config(c);
  check_scores(c, s);
  return route_unchecked(c, s);
}

TokenRouting route_token(const MoeConfig& c, const float* logits_row, const float* bias_or_null) {
  return route_unchecked(c, selection_scores(c, logits_row, bias_or_null));
}

Routing route(const MoeConfig& c, const float* logits, const float* bias_or_null, int64_t tokens) {
  require_valid_config(c);
  if (tokens < 0) throw std::invalid_argument(fmt::format("moe_routing: token count {} < 0", tokens));
  if (bias_or_null && c.routing != RoutingMethod::deepseek_v3 && c.routing != RoutingMethod::sigmoid_renormalize)
    throw std::invalid_argument(fmt::format(
        "moe_routing: a routing bias was given for {} routing; only deepseek_v3 and sigmoid_renormalize use one",
        to_string(c.routing)));
  Routing r;
  r.tokens = tokens;
  r.top_k = c.top_k;
  r.ids.resize(size_t(tokens * c.top_k));
  r.weights.resize(size_t(tokens * c.top_k));
  r.margin.resize(size_t(tokens));
  r.margin_scale.resize(size_t(tokens));
  r.group_margin.resize(size_t(tokens));
  r.group_margin_scale.resize(size_t(tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    const TokenRouting tr = route_unchecked(c, scores_unchecked(c, logits + t * c.num_experts, bias_or_null));
    std::copy(tr.ids.begin(), tr.ids.end(), r.ids.begin() + t * c.top_k);
    std::copy(tr.weights.begin(), tr.weights.end(), r.weights.begin() + t * c.top_k);
    r.margin[t] = tr.margin;
    r.margin_scale[t] = tr.margin_scale;
    r.group_margin[t] = tr.group_margin;
    r.group_margin_scale[t] = tr.group_margin_scale;
  }
  return r;
}

std::vector<double> weights_for(const MoeConfig& c, const TokenScores& s, std::span<const int32_t> ids) {
  require_valid_config(c);
  check_scores(c, s);
  if (const std::string p = id_set_problem(c, ids); !p.empty())
    throw std::invalid_argument("moe_routing: weights_for: " + p);
  return weights_unchecked(c, s, ids);
}

namespace {

// The chosen experts of one token against the rejected ones: a rejected candidate may outrank a
// chosen expert by at most 2 delta (both may be off by delta in opposite directions).
struct ChosenSet {
  const TokenScores& s;
  double delta;
  std::vector<char> chosen;
  double min_chosen = kInf;
  ChosenSet(int64_t E, const TokenScores& scores, std::span<const int32_t> ids, double d)
      : s(scores), delta(d), chosen(static_cast<size_t>(E), 0) {
    for (int32_t id : ids) {
      chosen[id] = 1;
      min_chosen = std::min(min_chosen, s.sel[id]);
    }
  }
  bool too_good(int64_t e) const { return !chosen[e] && s.sel[e] > min_chosen + 2 * delta; }
  // Why expert e is too good ("of a kept group": where it lies).
  std::string beaten_by(int64_t e, const char* where) const {
    return fmt::format("rejected expert {} (sel {:.17g}){} beats chosen sel {:.17g} by more than 2*delta = {:.3g}", e,
                       s.sel[e], where, min_chosen, 2 * delta);
  }
};

// Ungrouped: no rejected expert too good; empty when none is.
std::string rejected_expert_problem(const MoeConfig& c, const ChosenSet& x) {
  for (int64_t e = 0; e < c.num_experts; ++e)
    if (x.too_good(e)) return x.beaten_by(e, "");
  return "";
}

// Grouped: the chosen experts' groups must be kept; the remaining kept slots are filled with
// groups none of whose experts is too good (else that expert would be a rejected candidate that
// beats a chosen one), best group score first. That greedy fill is optimal: it maximises the
// weakest kept group and minimises the strongest excluded one among admissible choices. Empty
// when the choice is valid.
std::string kept_groups_problem(const MoeConfig& c, const TokenScores& s, std::span<const int32_t> ids,
                                const ChosenSet& x, double gdelta) {
  const int64_t per = c.num_experts / c.n_group;
  std::vector<char> kept(c.n_group, 0);
  int64_t n_kept = 0;
  for (int32_t id : ids)
    if (!kept[id / per]) {
      kept[id / per] = 1;
      ++n_kept;
    }
  if (n_kept > c.topk_group) return fmt::format("chosen experts lie in {} groups, topk_group = {}", n_kept, c.topk_group);
  auto group_admissible = [&](int64_t g) {
    for (int64_t e = g * per; e < (g + 1) * per; ++e)
      if (x.too_good(e)) return false;
    return true;
  };
  for (int64_t g = 0; g < c.n_group; ++g)
    if (kept[g] && !group_admissible(g))
      for (int64_t e = g * per; e < (g + 1) * per; ++e)
        if (x.too_good(e)) return x.beaten_by(e, " of a kept group");
  std::vector<int32_t> order(c.n_group);
  for (int32_t g = 0; g < int32_t(c.n_group); ++g) order[g] = g;
  std::sort(order.begin(), order.end(), Better{s.group_score});
  for (int32_t g : order) {
    if (n_kept == c.topk_group) break;
    if (!kept[g] && group_admissible(g)) {
      kept[g] = 1;
      ++n_kept;
    }
  }
  if (n_kept < c.topk_group)
    return fmt::format("only {} groups can be kept without a rejected expert beating a chosen one, topk_group = {}",
                       n_kept, c.topk_group);
  double min_kept = kInf, max_out = -kInf;
  int64_t g_min = -1, g_max = -1;
  for (int64_t g = 0; g < c.n_group; ++g) {
    if (kept[g] && s.group_score[g] < min_kept) min_kept = s.group_score[g], g_min = g;
    if (!kept[g] && s.group_score[g] > max_out) max_out = s.group_score[g], g_max = g;
  }
  if (g_max >= 0 && max_out > min_kept + 2 * gdelta)
    return fmt::format("excluded group {} (score {:.17g}) beats kept group {} (score {:.17g}) by more than "
                       "2*group_delta = {:.3g}", g_max, max_out, g_min, min_kept, 2 * gdelta);
  return "";
}

}  // namespace

TopkJudgement judge_topk(const MoeConfig& c, const TokenScores& s, std::span<const int32_t> ids, double delta,
                         std::optional<double> group_delta) {
  require_valid_config(c);
  check_scores(c, s);
  if (!(delta >= 0) || (group_delta && !(*group_delta >= 0)))
    throw std::invalid_argument("moe_routing: judge_topk: delta and group_delta must be >= 0");
  const double gdelta = group_delta ? *group_delta : 2 * delta;
  TopkJudgement j;
  if (j.why = id_set_problem(c, ids); !j.why.empty()) return j;
  j.weights = weights_unchecked(c, s, ids);
  const ChosenSet x(c.num_experts, s, ids, delta);
  j.why = grouped(c) ? kept_groups_problem(c, s, ids, x, gdelta) : rejected_expert_problem(c, x);
  j.valid = j.why.empty();
  return j;
}

double round_weight(double w, Precision p) {
  return p == Precision::bf16 ? double(bf16_round(w)) : double(fl32(w));
}

void round_weights(Routing& r, Precision p) {
  for (double& w : r.weights) w = round_weight(w, p);
}

}  // namespace moecheck
