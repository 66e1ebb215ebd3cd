// What golden/GENERATOR.md promises about the generated data: every preset and distribution
// gives a valid case; the big presets plan the right shapes (and one real-size expert of two
// of them is written and validated); the realistic distribution plants outlier channels, zero
// groups, tiny / huge tokens, spread and tiny block scales, dead experts that token 0 routes
// to, and a negative-mean gate half; near-ties put exact and 1-ulp ties at the k-th place;
// adversarial adds rounding midpoints, an all-zero logit row and extreme biases.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include "golden/case_generator.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_budget.hpp"
#include "reference/moe_routing.hpp"
#include "tests/generator_test_support.hpp"

namespace moecheck {
namespace {

using testing::CaseData;

GeneratorOptions opts(const std::string& preset, int64_t T, uint64_t seed, Distribution d = Distribution::realistic) {
  GeneratorOptions o;
  o.preset = preset;
  o.tokens = T;
  o.seed = seed;
  o.dist = d;
  return o;
}

CaseData generate(const testing::ScratchDir& dir, const GeneratorOptions& o) {
  const std::string path = dir.file("case.h5");
  write_case(plan_case(o, path), path);
  const std::vector<Problem> problems = CaseReader(path).validate();
  EXPECT_TRUE(problems.empty()) << make_case_command(o, "") << ": " << (problems.empty() ? "" : problems[0].where + ": " + problems[0].rule);
  return testing::read_case(path);
}

bool is_power_of_two(float s) {
  int e = 0;
  return std::frexp(s, &e) == 0.5f;
}

float max_abs(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// --- Validity -------------------------------------------------------------------------------
TEST(CaseGeneratorFeatures, EveryTinyPresetAndDistributionGivesAValidCase) {
  const testing::ScratchDir dir("gen-valid");
  for (const ModelPreset& p : model_presets()) {
    if (p.full_size) continue;
    for (const Distribution d : {Distribution::realistic, Distribution::uniform, Distribution::adversarial})
      for (const bool ties : {false, true}) {
        GeneratorOptions o = opts(std::string(p.name), 7, 2, d);
        o.near_ties = ties;
        o.scale_format = ties ? ScaleFormat::ue8m0 : ScaleFormat::f32;
        o.hidden_dtype = ties ? Precision::f32 : Precision::bf16;
        SCOPED_TRACE(make_case_command(o, ""));
        const CaseData c = generate(dir, o);
        EXPECT_EQ(c.config.num_experts, p.config.num_experts);
        EXPECT_EQ(c.config.routing, p.config.routing);
        EXPECT_EQ(c.config.scale_format, o.scale_format);
        EXPECT_EQ(c.bias.has_value(), p.routing_bias);
        EXPECT_EQ(int64_t(c.experts.size()), p.config.num_experts);
        if (o.scale_format == ScaleFormat::ue8m0) {  // every scale an exact power of two
          for (float s : c.experts[0].w13_scale) EXPECT_TRUE(is_power_of_two(s)) << s;
        }
      }
  }
}

TEST(CaseGeneratorFeatures, BigPresetsPlanRealShapes) {
  for (const ModelPreset& p : model_presets()) {
    if (!p.full_size) continue;
    GeneratorOptions o = opts(std::string(p.name), 2, 1);
    o.routed_only = true;
    const CasePlan plan = plan_case(o, "unused.h5");
    const MoeConfig& c = plan.header.config;
    SCOPED_TRACE(p.name);
    EXPECT_EQ(c.hidden_size, p.config.hidden_size);
    EXPECT_EQ(c.intermediate_size, p.config.intermediate_size);
    EXPECT_EQ(c.num_experts, p.config.num_experts);
    EXPECT_EQ(plan.hidden.size(), size_t(2 * c.hidden_size));
    EXPECT_EQ(plan.logits.size(), size_t(2 * c.num_experts));
    EXPECT_EQ(plan.bias.size(), p.routing_bias ? size_t(c.num_experts) : 0u);
    EXPECT_GE(plan.stored.size(), size_t(c.top_k));      // token 0 alone routes to k experts
    EXPECT_LE(plan.stored.size(), size_t(2 * c.top_k));
    EXPECT_EQ(plan.expert_bytes(), p.expert_bytes());
    EXPECT_TRUE(std::is_sorted(plan.stored.begin(), plan.stored.end()));
  }
}

// A routed-only case must also store the experts a correct backend may pick at a near-tie
// (compare re-runs such a token with the backend's experts): every expert that a single swap
// brings into a top-k that judge_topk accepts under the default budget's score uncertainty.
TEST(CaseGeneratorFeatures, RoutedOnlyStoresNearTiePartners) {
  int64_t partners = 0;
  for (const char* name : {"deepseek-v3", "kimi-k2", "glm-4.5"}) {
    GeneratorOptions o = opts(name, 8, 5);
    o.routed_only = true;
    o.near_ties = true;
    const CasePlan plan = plan_case(o, "unused.h5");
    const MoeConfig& c = plan.header.config;
    SCOPED_TRACE(name);
    const std::set<int64_t> stored(plan.stored.begin(), plan.stored.end());
    std::set<int64_t> routed;
    for (int32_t id : plan.routing.ids) routed.insert(id);
    for (int64_t t = 0; t < o.tokens; ++t) {
      const TokenScores s =
          selection_scores(c, &plan.logits[size_t(t * c.num_experts)], plan.bias.empty() ? nullptr : plan.bias.data());
      const double mag = *std::max_element(s.magnitude.begin(), s.magnitude.end());
      const double delta = BudgetModel{}.routing_ulps * 0x1p-24 * std::max(mag, 1e-30);
      const std::vector<int32_t> ids(&plan.routing.ids[size_t(t * c.top_k)], &plan.routing.ids[size_t((t + 1) * c.top_k)]);
      for (int32_t e = 0; e < c.num_experts; ++e) {
        if (std::find(ids.begin(), ids.end(), e) != ids.end()) continue;
        for (int64_t j = 0; j < c.top_k; ++j) {
          std::vector<int32_t> trial = ids;
          trial[size_t(j)] = e;
          if (!judge_topk(c, s, trial, delta).valid) continue;
          EXPECT_TRUE(stored.count(e)) << "token " << t << ": expert " << e << " may replace " << ids[size_t(j)];
          partners += !routed.count(e);
          break;
        }
      }
    }
  }
  std::printf("[ info ] %lld near-tie partners stored beside the routed experts\n", static_cast<long long>(partners));
  EXPECT_GT(partners, 0);  // the planted near-ties produce some: the check above is not vacuous
}

TEST(CaseGeneratorFeatures, OneRealSizeExpertOfBigPresetsIsValid) {
  const testing::ScratchDir dir("gen-big");
  for (const char* name : {"qwen3-30b-a3b", "deepseek-v3"}) {
    GeneratorOptions o = opts(name, 2, 1);
    o.routed_only = true;
    o.experts_limit = 1;
    const auto t0 = std::chrono::steady_clock::now();
    const CaseData c = generate(dir, o);
    std::printf("[ info ] %s: one expert generated, written and validated in %.2f s\n", name,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    ASSERT_EQ(c.experts.size(), 1u);
    EXPECT_EQ(int64_t(c.experts[0].w13.size()), 2 * c.config.intermediate_size * c.config.hidden_size);
  }
}

// --- Realistic features --------------------------------------------------------------------
TEST(CaseGeneratorFeatures, RealisticPlantsTheDocumentedFeatures) {
  const testing::ScratchDir dir("gen-realistic");
  const uint64_t seed = 3;
  const CaseData c = generate(dir, opts("tiny-deepseek", 8, seed));
  const MoeConfig& cfg = c.config;
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size;
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Token 1 has an all-zero 128-group; token 2 is tiny (1e-6), token 3 huge (1e3).
  bool zero_group = false;
  for (int64_t g = 0; g < H / 128; ++g) zero_group |= max_abs(&c.hidden[size_t(H + g * 128)], 128) == 0.0f;
  EXPECT_TRUE(zero_group);
  EXPECT_LT(max_abs(&c.hidden[size_t(2 * H)], H), 1e-3f);
  EXPECT_GT(max_abs(&c.hidden[size_t(3 * H)], H), 1e3f);
  // Outlier channels: some channel's mean |x| over normal tokens is >= 10x the median channel's.
  std::vector<double> col(size_t(H), 0.0);
  for (int64_t t : {0, 4, 5, 6, 7})
    for (int64_t h = 0; h < H; ++h) col[size_t(h)] += std::fabs(c.hidden[size_t(t * H + h)]);
  std::vector<double> sorted = col;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GT(sorted.back(), 10 * sorted[size_t(H / 2)]);

  // Dead experts: among token 0's experts, every block scale <= 1e-21. Live experts: scales
  // all distinct within an expert, each with a tiny-scale (~1e-8) block, and the other blocks'
  // scales spread over more than two decades across the case.
  const Routing r = route(cfg, c.logits.data(), c.bias->data(), 1);
  std::set<int64_t> dead;
  std::vector<float> normal_scales;
  for (size_t e = 0; e < c.experts.size(); ++e) {
    const ExpertWeights& w = c.experts[e];
    std::vector<float> s = w.w13_scale;
    s.insert(s.end(), w.w2_scale.begin(), w.w2_scale.end());
    if (*std::max_element(s.begin(), s.end()) <= 1e-21f) {
      dead.insert(int64_t(e));
      continue;
    }
    EXPECT_EQ(std::set<float>(s.begin(), s.end()).size(), s.size()) << "expert " << e;
    EXPECT_TRUE(std::any_of(s.begin(), s.end(), [](float v) { return v > 1e-9f && v < 1e-7f; })) << "expert " << e;
    for (float v : s)
      if (v > 1e-7f) normal_scales.push_back(v);
  }
  EXPECT_GT(*std::max_element(normal_scales.begin(), normal_scales.end()) /
                *std::min_element(normal_scales.begin(), normal_scales.end()),
            100.0f);
  EXPECT_EQ(dead.size(), 2u);
  for (int64_t e : dead) EXPECT_NE(std::find(r.ids.begin(), r.ids.end(), int32_t(e)), r.ids.end()) << e;
  EXPECT_NE(c.description.find("dead experts"), std::string::npos);

  // Gate half (rows [0, I) with gate_up) has a negative mean, up does not: per 128x128 block of
  // the dequantized halves, mean / RMS (gate ~ N(-0.5, 1) sigma: -0.447), averaged over blocks.
  double gate = 0, up = 0;
  int blocks = 0;
  for (size_t e = 0; e < c.experts.size(); ++e) {
    if (dead.count(int64_t(e))) continue;
    std::vector<double> w(size_t(2 * I * H));
    block_dequantize(c.experts[e].w13.data(), c.experts[e].w13_scale.data(), 2 * I, H, 128, w.data());
    auto mean_over_rms = [&](int64_t r0, int64_t c0) {
      double sum = 0, sq = 0;
      for (int64_t i = r0; i < r0 + 128; ++i)
        for (int64_t j = c0; j < c0 + 128; ++j) sum += w[size_t(i * H + j)], sq += w[size_t(i * H + j)] * w[size_t(i * H + j)];
      return (sum / 16384.0) / std::sqrt(sq / 16384.0);
    };
    for (int64_t br = 0; br < I / 128; ++br)
      for (int64_t bc = 0; bc < H / 128; ++bc, ++blocks) {
        gate += mean_over_rms(br * 128, bc * 128);
        up += mean_over_rms(I + br * 128, bc * 128);
      }
  }
  EXPECT_LT(gate / blocks, -0.35);
  EXPECT_LT(std::fabs(up / blocks), 0.05);
  // Routing bias: mostly N(0, 0.1), some experts <= -1 (biased scores below zero).
  EXPECT_TRUE(std::any_of(c.bias->begin(), c.bias->end(), [](float b) { return b <= -1.0f; }));
}

// --- Near-ties ------------------------------------------------------------------------------
TEST(CaseGeneratorFeatures, NearTiesPlantExactAndOneUlpTiesAtTheKthPlace) {
  const testing::ScratchDir dir("gen-ties");
  for (const ModelPreset& p : model_presets()) {
    if (p.full_size) continue;
    GeneratorOptions o = opts(std::string(p.name), 16, 4);
    o.near_ties = true;
    SCOPED_TRACE(make_case_command(o, ""));
    const CaseData c = generate(dir, o);
    const Routing r = route(c.config, c.logits.data(), c.bias ? c.bias->data() : nullptr, c.tokens);
    int exact = 0, ulp = 0;
    for (int64_t t = 1; t < c.tokens; t += 2) {
      const double m = r.margin[size_t(t)], scale = r.margin_scale[size_t(t)];
      if (t % 4 == 1 && m == 0.0) ++exact;
      if (t % 4 == 3 && m > 0.0 && m <= 1e-6 * scale) ++ulp;
    }
    // Without a bias any rejected expert can take the tie; with one, only the equal-bias partner.
    EXPECT_GE(exact, p.routing_bias ? 1 : 4);
    EXPECT_GE(ulp, p.routing_bias ? 1 : 4);
    // Without --near-ties the same seed has no such ties (the margins above are planted).
    o.near_ties = false;
    const CaseData plain = generate(dir, o);
    const Routing rp = route(plain.config, plain.logits.data(), plain.bias ? plain.bias->data() : nullptr, plain.tokens);
    for (int64_t t = 0; t < plain.tokens; ++t) EXPECT_GT(rp.margin[size_t(t)], 1e-6 * rp.margin_scale[size_t(t)]) << t;
  }
}

// --- Adversarial ----------------------------------------------------------------------------
TEST(CaseGeneratorFeatures, AdversarialPlantsMidpointsZeroRowAndExtremeBiases) {
  const testing::ScratchDir dir("gen-adversarial");
  const CaseData c = generate(dir, opts("tiny-deepseek", 8, 6, Distribution::adversarial));
  const int64_t H = c.config.hidden_size, E = c.config.num_experts;
  // Token 4: per group one +-448 * 2^k and every other x / 2^k an exact midpoint of two
  // adjacent e4m3 values.
  for (int64_t g = 0; g < H / 128; ++g) {
    const float* x = &c.hidden[size_t(4 * H + g * 128)];
    const float amax = max_abs(x, 128);
    const float s = group_scale(amax, ScaleFormat::f32, c.config.act_eps);
    ASSERT_TRUE(is_power_of_two(s)) << "group scale " << s << " must be a power of two";
    for (int i = 1; i < 128; ++i) {
      const double v = std::fabs(double(x[i]) / s);
      const uint8_t lo = fp8_encode(v, Fp8Format::e4m3fn);
      const double a = fp8_decode(lo, Fp8Format::e4m3fn);
      const double b = fp8_decode(uint8_t(v > a ? lo + 1 : lo - 1), Fp8Format::e4m3fn);
      EXPECT_EQ(v, 0.5 * (a + b)) << "group " << g << " element " << i;
    }
  }
  EXPECT_EQ(max_abs(&c.logits[size_t(5 * E)], E), 0.0f);  // token 5: all-zero logits
  EXPECT_TRUE(std::any_of(c.bias->begin(), c.bias->end(), [](float b) { return b <= -1.0f; }));
  EXPECT_TRUE(std::any_of(c.bias->begin(), c.bias->end(), [](float b) { return b >= 11.0f; }));
  EXPECT_NE(c.description.find("dead experts"), std::string::npos);
}

// --- Cold token -------------------------------------------------------------------------------
// Token 6 of grouped, biased routing reaches negative selection scores inside the kept groups,
// so that excluded groups masked with 0 instead of -inf (docs/BUG-CLASSES.md #19) change its choice.
TEST(CaseGeneratorFeatures, ColdTokenChoosesANegativeScoreInsideTheKeptGroups) {
  const testing::ScratchDir dir("gen-cold");
  int triggered = 0, cases = 0;
  for (const char* preset : {"small-deepseek", "tiny-deepseek"})
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      const GeneratorOptions o = opts(preset, 8, seed);
      SCOPED_TRACE(make_case_command(o, ""));
      const CaseData c = generate(dir, o);
      ASSERT_TRUE(c.bias.has_value());
      const int64_t E = c.config.num_experts, per = E / c.config.n_group;
      const float* row = &c.logits[size_t(6 * E)];
      const TokenScores s = selection_scores(c.config, row, c.bias->data());
      const TokenRouting r = route_token(c.config, s);
      // Every logit is -4 except one +8 anchor in each kept group.
      for (int64_t e = 0; e < E; ++e) {
        const bool kept = std::count(r.kept_groups.begin(), r.kept_groups.end(), int32_t(e / per)) > 0;
        EXPECT_TRUE(row[e] == -4.0f || (row[e] == 8.0f && kept)) << "expert " << e << " logit " << row[e];
      }
      ++cases;
      triggered += s.sel[size_t(r.ids.back())] < 0;  // the k-th choice scores below an excluded group's 0
    }
  // The condition depends on the biases' signs (GENERATOR.md "Cold token"): most seeds reach it.
  EXPECT_GE(triggered, cases * 3 / 4) << triggered << " of " << cases;
}

}  // namespace
}  // namespace moecheck
