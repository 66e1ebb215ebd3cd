// Known-answer tests of the float64 routing reference (reference/moe_routing.hpp).
//
// Organisation: one section per method (deepseek_v3, softmax methods, sigmoid_renormalize,
// llama4), then ties, routed_scaling_factor, weight rounding, judge_topk and bad input. Every
// expected value is derived in a comment and recomputed here independently with std::exp on
// the spot (sigmoid always as 1/(1+exp(-x)); softmax without the max subtraction).
//
// Tolerance kRel: the reference and the independent formula each evaluate at most 10 correctly
// rounded operations or exp calls (glibc exp: < 1 ulp) on positive terms, each with relative
// error <= u = 2^-53, so each is within 10u of the exact value and they agree to 20u relative.
// A difference x - y (a margin) is compared with an absolute tolerance 20u (|x| + |y|)
// (EXPECT_DIFF): cancellation does not amplify an absolute error. Exact comparisons (==) are
// used where both sides do the same operations on the same operands, or where the value is
// exactly representable.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "reference/fp8_formats.hpp"
#include "reference/moe_routing.hpp"

namespace moecheck {
namespace {

constexpr double kRel = 20 * 0x1p-53;
constexpr double kInf = std::numeric_limits<double>::infinity();

MoeConfig make_config(RoutingMethod m, int64_t E, int64_t k, int64_t n_group = 1, int64_t topk_group = 1,
                      double rsf = 1.0) {
  MoeConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.hidden_size = 128;
  c.intermediate_size = 128;
  c.routing = m;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = rsf;
  return c;
}

double sig(float x) { return 1.0 / (1.0 + std::exp(-double(x))); }

#define EXPECT_REL(actual, expected) EXPECT_NEAR(actual, expected, kRel * std::abs(double(expected)))
#define EXPECT_DIFF(actual, x, y) \
  EXPECT_NEAR(actual, (x) - (y), kRel * (std::abs(double(x)) + std::abs(double(y))))

// ---------------------------------------------------------------------------------------
// deepseek_v3

// E = 8, 4 groups of 2, keep 2 groups, top-3, rsf 2.5, zero bias.
// sel = sigmoid(l): e0 .982 e1 .018 | e2 .731 e3 .731 | e4 .881 e5 .5 | e6 .269 e7 .622
// group scores (sum of the two): g0 s(4)+s(-4) = 1.000, g1 2 s(1) = 1.462, g2 s(2)+.5 = 1.381,
// g3 s(-1)+s(.5) = .891 -> kept g1, g2; best excluded g0. e0 has the best single score but its
// group is excluded. Top-3 of {2,3,4,5}: e4, then e2 = e3 (tie, lower id first) -> [4, 2, 3].
// margin = s(1) - s(0) (e3 vs e5); group margin = g2 - g0.
TEST(MoeRoutingDeepseek, GroupedKnownAnswer) {
  const MoeConfig c = make_config(RoutingMethod::deepseek_v3, 8, 3, 4, 2, 2.5);
  const std::vector<float> l = {4, -4, 1, 1, 2, 0, -1, 0.5f};
  const std::vector<float> bias(8, 0.0f);
  const TokenRouting r = route_token(c, l.data(), bias.data());
  ASSERT_EQ(r.ids, (std::vector<int32_t>{4, 2, 3}));
  EXPECT_EQ(r.kept_groups, (std::vector<int32_t>{1, 2}));
  const double sum = sig(2) + sig(1) + sig(1);
  EXPECT_REL(r.weights[0], 2.5 * sig(2) / sum);
  EXPECT_REL(r.weights[1], 2.5 * sig(1) / sum);
  EXPECT_EQ(r.weights[1], r.weights[2]);
  EXPECT_DIFF(r.margin, sig(1), 0.5);
  EXPECT_REL(r.margin_scale, sig(1));
  const double g2 = sig(2) + 0.5, g0 = sig(4) + sig(-4);
  EXPECT_DIFF(r.group_margin, g2, g0);
  EXPECT_REL(r.group_margin_scale, g2);
}

// Negative bias, the case zero-masking (HF modeling_deepseek.py, docs/BUG-CLASSES.md #19) gets wrong.
// E = 4, groups {0,1} {2,3}, keep 1 group, top-2, all logits 0 (s = .5).
// bias [0, -.8, -.6, -.6] -> sel [.5, -.3, -.1, -.1]; g0 = .2, g1 = -.2 -> keep g0.
// Correct: both experts of g0, [0, 1] (e1's sel -.3 < 0). Zero-masking sets e2, e3 to 0 > -.3
// and picks [0, 2]. Weights use the unbiased s = .5 each: 0.5 and 0.5.
TEST(MoeRoutingDeepseek, NegativeBiasExcludedGroupNeverWins) {
  const MoeConfig c = make_config(RoutingMethod::deepseek_v3, 4, 2, 2, 1);
  const std::vector<float> l(4, 0.0f);
  const std::vector<float> bias = {0.0f, -0.8f, -0.6f, -0.6f};

  // Guard against a vacuous case: the zero-masked selection really picks expert 2.
  std::vector<double> zero_masked = {0.5 + bias[0], 0.5 + bias[1], 0.0, 0.0};
  ASSERT_GT(zero_masked[2], zero_masked[1]);

  const TokenRouting r = route_token(c, l.data(), bias.data());
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  for (int32_t id : r.ids) EXPECT_LT(id, 2) << "expert of the excluded group chosen";
  EXPECT_EQ(r.kept_groups, (std::vector<int32_t>{0}));
  EXPECT_EQ(r.weights[0], 0.5);
  EXPECT_EQ(r.weights[1], 0.5);
  EXPECT_EQ(r.margin, kInf);  // both candidates of the kept group are chosen
  EXPECT_EQ(r.margin_scale, 0.0);
  const double g0 = (0.5 + double(bias[0])) + (0.5 + double(bias[1]));
  const double g1 = (0.5 + double(bias[2])) + (0.5 + double(bias[3]));
  // Both group scores are sums of terms of magnitude <= 2.2 in all.
  EXPECT_NEAR(r.group_margin, g0 - g1, kRel * 4.4);
  // magnitude of a group score: |s| + |b| summed over its two experts.
  EXPECT_REL(r.group_margin_scale, std::max(0.5 + 0.5 + 0.8f, 0.5 + 0.6f + 0.5 + 0.6f));
}

// Equal group scores: the lower group index wins. Logits [1, -1 | -1, 1]: both groups score
// s(1) + s(-1) (the same two values, added in the same order: bitwise equal). Keep g0 ->
// expert 0 (sel s(1)), never expert 3 (equal sel, excluded group). group margin 0.
TEST(MoeRoutingDeepseek, GroupTieLowerGroupWins) {
  const MoeConfig c = make_config(RoutingMethod::deepseek_v3, 4, 1, 2, 1);
  const std::vector<float> l = {1, -1, -1, 1};
  const TokenRouting r = route_token(c, l.data(), nullptr);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0}));
  EXPECT_EQ(r.kept_groups, (std::vector<int32_t>{0}));
  EXPECT_EQ(r.group_margin, 0.0);
  EXPECT_DIFF(r.margin, sig(1), sig(-1));
  EXPECT_EQ(r.weights[0], 1.0);  // s / s
}

// All-zero row: every sel is .5, every group scores 1.0 -> the lowest groups and ids win.
TEST(MoeRoutingDeepseek, AllZeroRowPicksLowestIds) {
  const MoeConfig c = make_config(RoutingMethod::deepseek_v3, 8, 3, 4, 2);
  const std::vector<float> l(8, 0.0f);
  const TokenRouting r = route_token(c, l.data(), nullptr);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r.kept_groups, (std::vector<int32_t>{0, 1}));
  for (double w : r.weights) EXPECT_EQ(w, 0.5 / 1.5);  // the reference sums .5+.5+.5 = 1.5 exactly
  EXPECT_EQ(r.margin, 0.0);
  EXPECT_EQ(r.margin_scale, 0.5);
  EXPECT_EQ(r.group_margin, 0.0);
}

// n_group == topk_group keeps every group: the same routing as without groups, group margin +inf.
TEST(MoeRoutingDeepseek, AllGroupsKeptEqualsUngrouped) {
  const std::vector<float> l = {0.3f, -1.2f, 2.5f, 0.9f, -0.4f, 1.7f, 0.0f, -2.2f};
  const std::vector<float> bias = {0.1f, 0.05f, -0.6f, 0.2f, 0.0f, -0.3f, 0.4f, 0.9f};
  const TokenRouting g = route_token(make_config(RoutingMethod::deepseek_v3, 8, 3, 4, 4, 2.5), l.data(), bias.data());
  const TokenRouting u = route_token(make_config(RoutingMethod::deepseek_v3, 8, 3, 1, 1, 2.5), l.data(), bias.data());
  EXPECT_EQ(g.ids, u.ids);
  EXPECT_EQ(g.weights, u.weights);
  EXPECT_EQ(g.margin, u.margin);
  EXPECT_EQ(g.group_margin, kInf);
  EXPECT_EQ(u.group_margin, kInf);
  EXPECT_EQ(g.group_margin_scale, 0.0);
  EXPECT_EQ(g.kept_groups, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(u.kept_groups.empty());
  // sel = s + b: e2 .924-.6 = .324, e3 .711+.2 = .911, e5 .846-.3 = .546, e7 .100+.9 = 1.000,
  // e6 .5+.4 = .9, e0 .574+.1 = .674 -> [7, 3, 6], best rejected e0.
  EXPECT_EQ(u.ids, (std::vector<int32_t>{7, 3, 6}));
  EXPECT_DIFF(u.margin, sig(0.0f) + double(bias[6]), sig(0.3f) + double(bias[0]));
}

// ---------------------------------------------------------------------------------------
// Softmax methods

// renormalize, logits [.25, 1.5, -2, .75], top-2 -> [1, 3]. Renormalized weights of two experts
// depend only on their logit difference: w1 = 1/(1+exp(.75-1.5)), w3 = exp(-.75)/(1+exp(-.75)).
// margin = p3 - p0 = (e^.75 - e^.25) / sum e^l (probabilities: what float32 top-k compares).
TEST(MoeRoutingSoftmax, RenormalizeKnownAnswer) {
  const MoeConfig c = make_config(RoutingMethod::renormalize, 4, 2);
  const std::vector<float> l = {0.25f, 1.5f, -2.0f, 0.75f};
  const TokenRouting r = route_token(c, l.data(), nullptr);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_REL(r.weights[0], 1.0 / (1.0 + std::exp(-0.75)));
  EXPECT_REL(r.weights[1], std::exp(-0.75) / (1.0 + std::exp(-0.75)));
  const double z = std::exp(0.25) + std::exp(1.5) + std::exp(-2.0) + std::exp(0.75);
  EXPECT_DIFF(r.margin, std::exp(0.75) / z, std::exp(0.25) / z);
  EXPECT_REL(r.margin_scale, std::exp(0.75) / z);
  EXPECT_EQ(r.group_margin, kInf);
}

// softmax_topk: no renormalization, rsf 1.5: w = 1.5 * e^l / sum e^l. Logits [0,1,2,3,-1],
// top-2 -> [3, 2]; margin p2 - p1.
TEST(MoeRoutingSoftmax, SoftmaxTopkKnownAnswer) {
  const MoeConfig c = make_config(RoutingMethod::softmax_topk, 5, 2, 1, 1, 1.5);
  const std::vector<float> l = {0, 1, 2, 3, -1};
  const TokenRouting r = route_token(c, l.data(), nullptr);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{3, 2}));
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  EXPECT_REL(r.weights[0], 1.5 * std::exp(3.0) / z);
  EXPECT_REL(r.weights[1], 1.5 * std::exp(2.0) / z);
  EXPECT_DIFF(r.margin, std::exp(2.0) / z, std::exp(1.0) / z);
}

// top_k = num_experts: everything chosen, in descending order; nothing rejected -> margin +inf.
TEST(MoeRoutingSoftmax, TopKEqualsNumExperts) {
  const MoeConfig c = make_config(RoutingMethod::renormalize, 4, 4);
  const std::vector<float> l = {1, -2, 0.5f, 3};
  const TokenRouting r = route_token(c, l.data(), nullptr);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{3, 0, 2, 1}));
  EXPECT_EQ(r.margin, kInf);
  EXPECT_EQ(r.margin_scale, 0.0);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  for (size_t i = 0; i < 4; ++i) EXPECT_REL(r.weights[i], std::exp(double(l[r.ids[i]])) / z);
}

// All-zero row: p = 1/8 each (exact), top-3 = [0, 1, 2], w = .125/.375 = fl(1/3), margin 0.
TEST(MoeRoutingSoftmax, AllZeroRowPicksLowestIds) {
  const MoeConfig c = make_config(RoutingMethod::renormalize, 8, 3);
  const std::vector<float> l(8, 0.0f);
  const TokenRouting r = route_token(c, l.data(), nullptr);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  for (double w : r.weights) EXPECT_EQ(w, 1.0 / 3.0);
  EXPECT_EQ(r.margin, 0.0);
  EXPECT_EQ(r.margin_scale, 0.125);
}

// Tie at the k-th place: [3, 2, 1, 2, 2], top-2 -> 0, then the lowest of the tied {1, 3, 4}.
// softmax_topk top-3 -> [0, 1, 3]. margin 0 in both.
TEST(MoeRoutingSoftmax, TieAtKthPlaceLowerIdWins) {
  const std::vector<float> l = {3, 2, 1, 2, 2};
  const TokenRouting a = route_token(make_config(RoutingMethod::renormalize, 5, 2), l.data(), nullptr);
  EXPECT_EQ(a.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(a.margin, 0.0);
  const TokenRouting b = route_token(make_config(RoutingMethod::softmax_topk, 5, 3), l.data(), nullptr);
  EXPECT_EQ(b.ids, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(b.margin, 0.0);
}

// ---------------------------------------------------------------------------------------
// sigmoid_renormalize and llama4

// Logits [0, 1, 2, -1], bias [1, 0, -2, 0]: sel [1.5, .731, -1.119, .269] -> top-2 [0, 1];
// weights from the unbiased s: s(0) / (s(0) + s(1)) and s(1) / (...). Without the bias the
// choice is [2, 1] (s(2) > s(1) > s(0)).
TEST(MoeRoutingSigmoid, BiasMovesSelectionNotWeights) {
  const MoeConfig c = make_config(RoutingMethod::sigmoid_renormalize, 4, 2);
  const std::vector<float> l = {0, 1, 2, -1};
  const std::vector<float> bias = {1, 0, -2, 0};
  const TokenRouting r = route_token(c, l.data(), bias.data());
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_REL(r.weights[0], 0.5 / (0.5 + sig(1)));
  EXPECT_REL(r.weights[1], sig(1) / (0.5 + sig(1)));
  EXPECT_DIFF(r.margin, sig(1), sig(-1));
  const TokenRouting n = route_token(c, l.data(), nullptr);
  ASSERT_EQ(n.ids, (std::vector<int32_t>{2, 1}));
  EXPECT_REL(n.weights[0], sig(2) / (sig(2) + sig(1)));
}

// llama4: top-1 by logit, w = rsf * sigmoid(logit). [.5, 2, -3, 1.25] -> [1], w = s(2),
// margin = 2 - 1.25 = .75 on the logits (exact), scale 2. Tie [.5, 2, -1, 2] -> [1], margin 0.
TEST(MoeRoutingLlama4, Top1ByLogit) {
  const MoeConfig c = make_config(RoutingMethod::llama4, 4, 1);
  const std::vector<float> l = {0.5f, 2, -3, 1.25f};
  const TokenRouting r = route_token(c, l.data(), nullptr);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{1}));
  EXPECT_REL(r.weights[0], sig(2));
  EXPECT_EQ(r.margin, 0.75);
  EXPECT_EQ(r.margin_scale, 2.0);
  const std::vector<float> t = {0.5f, 2, -1, 2};
  const TokenRouting rt = route_token(c, t.data(), nullptr);
  EXPECT_EQ(rt.ids, (std::vector<int32_t>{1}));
  EXPECT_EQ(rt.margin, 0.0);
}

// ---------------------------------------------------------------------------------------
// routed_scaling_factor: one multiplication after normalization, in every method. With rsf = 1
// the reference computes w1 = g / d; with rsf = 2.5, w = fl(w1 * 2.5): bitwise w1 * 2.5. A
// second application would give 6.25 * w1, a missing one w1; renormalized sums are 2.5.
TEST(MoeRoutingScaling, RoutedScalingFactorAppliedExactlyOnce) {
  const std::vector<float> l = {0.3f, -1.2f, 2.5f, 0.9f, -0.4f, 1.7f, 0.0f, -2.2f};
  const std::vector<float> bias = {0.1f, 0.05f, -0.6f, 0.2f, 0.0f, -0.3f, 0.4f, 0.9f};
  struct M { RoutingMethod m; int64_t k, ng, kg; bool bias, renorm; };
  for (const M m : {M{RoutingMethod::deepseek_v3, 3, 4, 2, true, true}, M{RoutingMethod::renormalize, 3, 1, 1, false, true},
                    M{RoutingMethod::softmax_topk, 3, 1, 1, false, false},
                    M{RoutingMethod::sigmoid_renormalize, 3, 1, 1, true, true}, M{RoutingMethod::llama4, 1, 1, 1, false, false}}) {
    SCOPED_TRACE(std::string(to_string(m.m)));
    const float* b = m.bias ? bias.data() : nullptr;
    const Routing one = route(make_config(m.m, 8, m.k, m.ng, m.kg, 1.0), l.data(), b, 1);
    const Routing rsf = route(make_config(m.m, 8, m.k, m.ng, m.kg, 2.5), l.data(), b, 1);
    ASSERT_EQ(one.ids, rsf.ids);
    double sum = 0;
    for (size_t i = 0; i < one.weights.size(); ++i) {
      EXPECT_EQ(rsf.weights[i], one.weights[i] * 2.5);
      sum += rsf.weights[i];
    }
    // Renormalized: |sum - rsf| <= rsf * gamma_{2k+1} (k-1 roundings in the reference's
    // denominator, 2 per weight, k-1 in this sum), gamma_n = n u / (1 - n u).
    const double n = 2.0 * double(m.k) + 1.0, gamma = n * 0x1p-53 / (1 - n * 0x1p-53);
    if (m.renorm) {
      EXPECT_NEAR(sum, 2.5, 2.5 * gamma);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Weight rounding (quantized tier).
// bf16 keeps 8 significant bits. 1/3 = 1.0101010|1010...b x 2^-2: the rest is > half an ulp
// -> up to 1.0101011b x 2^-2 = 171/512. 1 + 2^-8 is the midpoint of 1 and 1 + 2^-7: ties to
// even -> 1. 1 + 3*2^-8 is the midpoint of 1 + 2^-7 (odd) and 1 + 2^-6 (even) -> 1 + 2^-6.
// 1 + 2^-8 + 2^-40 is just above a midpoint -> 1 + 2^-7; rounding it to float32 first would
// lose the 2^-40 and then tie to 1: the rounding must be from the exact double.
TEST(MoeRoutingRounding, Bf16AndF32) {
  EXPECT_EQ(round_weight(1.0 / 3.0, Precision::bf16), 171.0 / 512.0);
  EXPECT_EQ(round_weight(1.0 + 0x1p-8, Precision::bf16), 1.0);
  EXPECT_EQ(round_weight(1.0 + 3 * 0x1p-8, Precision::bf16), 1.0 + 0x1p-6);
  EXPECT_EQ(round_weight(1.0 + 0x1p-8 + 0x1p-40, Precision::bf16), 1.0 + 0x1p-7);
  EXPECT_EQ(round_weight(1.0 / 3.0, Precision::f32), double(1.0f / 3.0f));
  EXPECT_EQ(round_weight(2.5, Precision::bf16), 2.5);

  const MoeConfig c = make_config(RoutingMethod::renormalize, 8, 3, 1, 1, 1.0);
  const std::vector<float> l(8, 0.0f);
  Routing r = route(c, l.data(), nullptr, 1);
  round_weights(r, Precision::bf16);
  for (double w : r.weights) EXPECT_EQ(w, 171.0 / 512.0);
}

// ---------------------------------------------------------------------------------------
// judge_topk on the grouped known-answer case (sel: e2 = e3 = s(1), e4 = s(2), e5 = .5;
// kept g1 = 2 s(1), g2 = s(2) + .5; excluded g0 = s(4) + s(-4) ~ 1.0).
TEST(MoeRoutingJudge, GroupedProposals) {
  const MoeConfig c = make_config(RoutingMethod::deepseek_v3, 8, 3, 4, 2, 2.5);
  const std::vector<float> l = {4, -4, 1, 1, 2, 0, -1, 0.5f};
  const TokenScores s = selection_scores(c, l.data(), nullptr);
  const TokenRouting r = route_token(c, s);

  TopkJudgement j = judge_topk(c, s, r.ids, 0.0);
  EXPECT_TRUE(j.valid) << j.why;
  EXPECT_EQ(j.weights, r.weights);

  // e5 instead of e3: e3 (s(1)) beats the weakest chosen (.5) by m = s(1) - .5 = the margin.
  // Valid iff 2 delta >= m; at delta = m/2, .5 + m == s(1) exactly (Sterbenz).
  const std::vector<int32_t> swap = {4, 2, 5};
  EXPECT_FALSE(judge_topk(c, s, swap, r.margin / 4).valid);
  EXPECT_TRUE(judge_topk(c, s, swap, r.margin / 2).valid);

  // An expert of a third group: three groups > topk_group = 2, never valid.
  const std::vector<int32_t> three_groups = {4, 2, 0};
  j = judge_topk(c, s, three_groups, 1.0);
  EXPECT_FALSE(j.valid);
  EXPECT_NE(j.why.find("groups"), std::string::npos) << j.why;

  // Keep g0 instead of g1: g1 (1.462) must be within 2 group_delta of g0 (1.000), i.e.
  // group_delta >= .231 (default 2 delta: delta >= .116). e2, e3 (.731 > .5) do not count:
  // g1 is excluded, so they are not candidates. The kept g0's e1 (.018) is below every chosen.
  const std::vector<int32_t> g0 = {0, 4, 5};
  EXPECT_FALSE(judge_topk(c, s, g0, 0.11).valid);
  EXPECT_TRUE(judge_topk(c, s, g0, 0.12).valid);
  EXPECT_TRUE(judge_topk(c, s, g0, 0.3).valid);
  EXPECT_FALSE(judge_topk(c, s, g0, 0.3, 0.0).valid);

  // Malformed sets.
  EXPECT_FALSE(judge_topk(c, s, std::vector<int32_t>{4, 2}, 1.0).valid);
  EXPECT_FALSE(judge_topk(c, s, std::vector<int32_t>{4, 4, 2}, 1.0).valid);
  EXPECT_FALSE(judge_topk(c, s, std::vector<int32_t>{4, 2, 8}, 1.0).valid);
  EXPECT_TRUE(judge_topk(c, s, std::vector<int32_t>{4, 2, 8}, 1.0).weights.empty());

  // weights_for does not depend on the order the ids are given in.
  const std::vector<int32_t> rev = {3, 2, 4};
  const std::vector<double> w = weights_for(c, s, rev);
  EXPECT_EQ(w[0], r.weights[2]);
  EXPECT_EQ(w[2], r.weights[0]);
}

TEST(MoeRoutingJudge, UngroupedSwap) {
  const MoeConfig c = make_config(RoutingMethod::renormalize, 4, 2);
  const std::vector<float> l = {0.25f, 1.5f, -2.0f, 0.75f};
  const TokenScores s = selection_scores(c, l.data(), nullptr);
  const TokenRouting r = route_token(c, s);
  EXPECT_TRUE(judge_topk(c, s, r.ids, 0.0).valid);
  const std::vector<int32_t> swap = {1, 0};  // e0 instead of e3
  EXPECT_FALSE(judge_topk(c, s, swap, r.margin * 0.49).valid);
  EXPECT_TRUE(judge_topk(c, s, swap, r.margin * 0.51).valid);
  // Its weights are the renormalized probabilities of {1, 0}: w1 = 1/(1+exp(.25-1.5)).
  EXPECT_REL(judge_topk(c, s, swap, 1.0).weights[0], 1.0 / (1.0 + std::exp(-1.25)));
}

// ---------------------------------------------------------------------------------------
// Bad input: programming errors are std::invalid_argument (the case reader reports InputError
// for bad files before routing runs).
TEST(MoeRoutingErrors, RejectsNonFiniteInputsBadConfigAndStrayBias) {
  const MoeConfig c = make_config(RoutingMethod::deepseek_v3, 4, 2, 2, 1);
  std::vector<float> l = {0, 1, 2, 3};
  std::vector<float> bias = {0, 0, 0, 0};
  l[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(route(c, l.data(), nullptr, 1), std::invalid_argument);
  l[2] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(route_token(c, l.data(), nullptr), std::invalid_argument);
  l[2] = 2;
  bias[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(route(c, l.data(), bias.data(), 1), std::invalid_argument);

  MoeConfig bad = c;
  bad.top_k = 5;
  try {
    route(bad, l.data(), nullptr, 1);
    ADD_FAILURE() << "top_k > num_experts accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("top_k"), std::string::npos) << e.what();
  }
  // A bias for a method that has none is refused, not silently ignored.
  bias[1] = 0;
  EXPECT_THROW(route(make_config(RoutingMethod::renormalize, 4, 2), l.data(), bias.data(), 1), std::invalid_argument);
  EXPECT_THROW(route(c, l.data(), nullptr, -1), std::invalid_argument);
  // Empty batch is fine.
  const Routing empty = route(c, l.data(), nullptr, 0);
  EXPECT_TRUE(empty.ids.empty());
}

}  // namespace
}  // namespace moecheck
