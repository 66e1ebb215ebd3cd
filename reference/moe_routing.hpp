// The float64 routing reference: router logits [T, E] (+ optional bias [E]) -> per token the
// top_k expert ids, their weights, and how close the choice came to going another way.
//
// Methods (FlashInfer's RoutingMethodType, flashinfer/tllm_enums.py; deepseek_v3: DeepSeek-V3
// report arXiv 2412.19437 §2.1.2). "sel" is the selection score that top-k ranks,
// "gate" the unbiased score that becomes the weight; rsf = routed_scaling_factor, applied
// exactly once, in every method.
//   deepseek_v3         gate = sigmoid(l), sel = gate + bias (bias absent = 0). With n_group > 1
//                       the E experts form n_group contiguous groups (g holds experts
//                       [g*E/n_group, (g+1)*E/n_group)); group score = sum of the two largest
//                       sel of the group (the one sel if the group has one expert); the
//                       topk_group best groups are kept, the others are excluded entirely
//                       (treated as -inf, never as 0: HF's zero mask, docs/BUG-CLASSES.md #19); top_k by
//                       sel among the kept groups' experts. w = rsf * gate_i / sum_chosen gate.
//   renormalize         gate = sel = softmax(l) (max subtracted); top_k; w = rsf * p_i / sum_chosen p.
//   softmax_topk        gate = sel = softmax(l); top_k; w = rsf * p_i (no renormalization).
//   sigmoid_renormalize gate = sigmoid(l), sel = gate + bias (if given); top_k;
//                       w = rsf * gate_i / sum_chosen gate.
//   llama4              sel = l (the logit itself), gate = sigmoid(l); top-1; w = rsf * gate.
// A bias is only accepted for deepseek_v3 and sigmoid_renormalize (std::invalid_argument
// otherwise: silently ignoring a bias is docs/BUG-CLASSES.md #17's failure mode).
//
// Numerics: every score, sum and weight is computed in double from the float inputs
// (sigmoid(x) = 1/(1+exp(-x)) for x >= 0, exp(x)/(1+exp(x)) for x < 0; softmax = exp(l - max)
// / sum over experts in index order). No epsilon in any denominator (HF's +1e-20 is a guard of
// the float implementations, not part of the math). The "ideal tier" keeps the weights in
// double; the "quantized tier" rounds them with round_weights() to routing_weight_dtype.
//
// Ranking rule: top-k (and top-topk_group of groups) ranks by sel in double, descending; equal
// sel -> the lower expert index wins (equal group score -> the lower group index), as
// FlashInfer's packed-index reduction does (RoutingKernelTopK.cuh). The k ids of a token are stored
// in this rank order: descending sel, ties by ascending id. Softmax methods rank on the double
// probabilities (monotone in the logit); two distinct logits whose double probabilities are
// equal count as tied (margin 0, flagged as a near-tie).
//
// Margins (what later parts use to recognise near-ties a float32 implementation may resolve
// the other way):
//   margin        sel(last chosen) - sel(best rejected candidate), >= 0. Candidates are the
//                 experts of the kept groups (all experts without grouping). The compared
//                 quantity is sel: the biased sigmoid for deepseek_v3 / sigmoid_renormalize,
//                 the softmax probability for renormalize / softmax_topk (what a float32
//                 implementation compares), the logit for llama4. +inf when nothing is
//                 rejected (top_k == number of candidates).
//   group_margin  group score(last kept) - group score(best excluded), >= 0; +inf without
//                 grouping (n_group == 1, methods other than deepseek_v3) or n_group == topk_group.
//   margin_scale, group_margin_scale
//                 max of the magnitudes of the two compared scores, where the magnitude of a
//                 score is the sum of the absolute values of the terms it is made of: |gate| +
//                 |bias| for a biased sigmoid, |p| for a probability, |l| for a logit, and the
//                 sum of its two terms' magnitudes for a group score. A float32 evaluation of a
//                 score errs by a few units of roundoff of this magnitude (not of |score|, which
//                 can be ~0 when gate ~ -bias). 0 when the margin is +inf (nothing compared).
//
// Inputs must be finite: a NaN or infinite logit or bias is a programming error here
// (std::invalid_argument; the case reader rejects such files earlier with an InputError). An
// invalid MoeConfig (config_problems() non-empty) is std::invalid_argument listing the problems.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "reference/moe_config.hpp"

namespace moecheck {

// The scores of one token, everything routing derives from them.
struct TokenScores {
  std::vector<double> sel;        // [E] selection score ranked by top-k
  std::vector<double> gate;       // [E] unbiased score that becomes the weight
  std::vector<double> magnitude;  // [E] magnitude of sel (see "margin_scale" above)
  // Grouped deepseek_v3 only (n_group > 1), else empty:
  std::vector<double> group_score;      // [n_group] sum of the two largest sel of the group
  std::vector<double> group_magnitude;  // [n_group] sum of those two experts' magnitudes
};

// The routing of one token.
struct TokenRouting {
  std::vector<int32_t> ids;         // [k] rank order: descending sel, ties by ascending id
  std::vector<double> weights;      // [k] matching ids, in double
  std::vector<int32_t> kept_groups; // [topk_group] ascending; empty without grouping
  double margin = 0, margin_scale = 0;
  double group_margin = 0, group_margin_scale = 0;
};

// The routing of T tokens; row t of ids/weights is token t's TokenRouting.
struct Routing {
  int64_t tokens = 0, top_k = 0;
  std::vector<int32_t> ids;      // [T, k]
  std::vector<double> weights;   // [T, k]
  std::vector<double> margin, margin_scale, group_margin, group_margin_scale;  // [T]
};

// Throws std::invalid_argument listing config_problems(c) when c is not valid.
void require_valid_config(const MoeConfig& c);

// Scores of one token: logits_row [E], bias_or_null [E] or nullptr.
TokenScores selection_scores(const MoeConfig& c, const float* logits_row, const float* bias_or_null);

// Routing of one token from its scores (or from its logits).
TokenRouting route_token(const MoeConfig& c, const TokenScores& s);
TokenRouting route_token(const MoeConfig& c, const float* logits_row, const float* bias_or_null);

// Routing of T tokens: logits [T, E] row-major; bias [E] or nullptr.
Routing route(const MoeConfig& c, const float* logits, const float* bias_or_null, int64_t tokens);

// Weights (double, times rsf) a method gives to the proposed expert set `ids` (any order, k
// distinct ids in [0, E)); result[i] belongs to ids[i]. std::invalid_argument on a bad set.
std::vector<double> weights_for(const MoeConfig& c, const TokenScores& s, std::span<const int32_t> ids);

// Is `ids` (a backend's choice for this token) a valid top-k once every sel may be off by up to
// delta and every group score by up to group_delta (default 2*delta: a group score is a sum of
// two sel)? Valid means: k distinct ids in [0, E) (any order), and, with grouping, some set K of
// topk_group groups contains every chosen expert's group with
//   min over K of group_score >= max over the other groups of group_score - 2*group_delta,
// and every chosen expert's sel >= every rejected candidate's sel - 2*delta, the candidates
// being the experts of K (all experts without grouping). The two levels are judged
// independently (a relaxation: it never rejects a set that a delta-perturbation could produce).
struct TopkJudgement {
  bool valid = false;
  std::string why;              // empty when valid, else the first rule broken
  std::vector<double> weights;  // weights_for(ids) when the ids are well formed, else empty
};
TopkJudgement judge_topk(const MoeConfig& c, const TokenScores& s, std::span<const int32_t> ids, double delta,
                         std::optional<double> group_delta = std::nullopt);

// The quantized tier's rounding of a weight to routing_weight_dtype: f32 -> fl32 (RNE),
// bf16 -> bf16 RNE of the exact double (no float32 step in between).
double round_weight(double w, Precision p);
void round_weights(Routing& r, Precision p);

}  // namespace moecheck
