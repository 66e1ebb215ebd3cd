// The synthetic case generator (golden/case_generator.*, golden/GENERATOR.md) through its library
// API: presets, determinism, TP / EP slicing, routed-only, validity of every preset and
// distribution, and the planted features each distribution promises. Every case is read back
// with CaseReader; seeds are fixed and printed in the failure messages.
//
// Big presets: a full DeepSeek-V3 routed-only case is hundreds of MB, so here the big presets
// are planned (config, shapes, stored experts; nothing written) and two are written with
// --experts-limit 1 (one real-size expert each) and validated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "golden/case_generator.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "tests/generator_test_support.hpp"

namespace moecheck {
namespace {

using testing::CaseData;
using testing::read_case;

GeneratorOptions opts(const std::string& preset, int64_t T, uint64_t seed) {
  GeneratorOptions o;
  o.preset = preset;
  o.tokens = T;
  o.seed = seed;
  return o;
}

CaseData generate(const testing::ScratchDir& dir, const std::string& name, const GeneratorOptions& o) {
  const std::string path = dir.file(name);
  write_case(plan_case(o, path), path);
  return read_case(path);
}

// InputError naming `where` (and containing `text`) from plan_case(o).
void expect_option_error(const GeneratorOptions& o, const std::string& where, const std::string& text) {
  try {
    plan_case(o, "unused.h5");
    ADD_FAILURE() << "no InputError for " << make_case_command(o, "");
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), where) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// --- Building blocks ----------------------------------------------------------------------
TEST(CaseGenerator, FillNormalsMatchesCounterRngBitForBit) {
  for (uint64_t seed : {0ull, 1ull, 0xDEADBEEFCAFEull})
    for (uint64_t first : {0ull, 1ull, 2ull, 7ull, (1ull << 40) + 3})
      for (size_t n : {1u, 2u, 3u, 8u, 129u}) {
        const CounterRng rng{seed, 21};
        std::vector<double> got(n);
        fill_normals(rng, first, n, got.data());
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(std::bit_cast<uint64_t>(got[i]), std::bit_cast<uint64_t>(rng.normal(first + i)))
              << "seed " << seed << " index " << first + i;
      }
}

TEST(CaseGenerator, RealModelPresetsHaveThePublishedValues) {
  struct Want {
    const char* name;
    int64_t E, H, I, k, n_group, topk_group;
    double rsf;
    RoutingMethod routing;
    bool bias;
  };
  // HF config.json values (citations in golden/model_presets.cpp).
  const Want want[] = {
      {"deepseek-v3", 256, 7168, 2048, 8, 8, 4, 2.5, RoutingMethod::deepseek_v3, true},
      {"deepseek-r1", 256, 7168, 2048, 8, 8, 4, 2.5, RoutingMethod::deepseek_v3, true},
      {"kimi-k2", 384, 7168, 2048, 8, 1, 1, 2.827, RoutingMethod::deepseek_v3, true},
      {"glm-4.5", 160, 5120, 1536, 8, 1, 1, 2.5, RoutingMethod::deepseek_v3, true},
      {"qwen3-30b-a3b", 128, 2048, 768, 8, 1, 1, 1.0, RoutingMethod::renormalize, false},
      {"qwen3-235b-a22b", 128, 4096, 1536, 8, 1, 1, 1.0, RoutingMethod::renormalize, false},
  };
  for (const Want& w : want) {
    const ModelPreset* p = find_model_preset(w.name);
    ASSERT_NE(p, nullptr) << w.name;
    const MoeConfig& c = p->config;
    EXPECT_EQ(c.num_experts, w.E) << w.name;
    EXPECT_EQ(c.hidden_size, w.H) << w.name;
    EXPECT_EQ(c.intermediate_size, w.I) << w.name;
    EXPECT_EQ(c.top_k, w.k) << w.name;
    EXPECT_EQ(c.n_group, w.n_group) << w.name;
    EXPECT_EQ(c.topk_group, w.topk_group) << w.name;
    EXPECT_EQ(c.routed_scaling_factor, w.rsf) << w.name;
    EXPECT_EQ(c.routing, w.routing) << w.name;
    EXPECT_EQ(p->routing_bias, w.bias) << w.name;
    EXPECT_TRUE(p->full_size) << w.name;
  }
  EXPECT_EQ(find_model_preset("deepseek-r1"), find_model_preset("deepseek-v3"));
  EXPECT_EQ(find_model_preset("deepseek"), nullptr);
  EXPECT_EQ(find_model_preset(""), nullptr);
  // One DeepSeek-V3 expert: 3 * 2048 * 7168 FP8 codes + (32*56 + 56*16) float32 scales.
  EXPECT_EQ(find_model_preset("deepseek-v3")->expert_bytes(), 3 * 2048 * 7168 + 4 * (32 * 56 + 56 * 16));
}

TEST(CaseGenerator, TinyPresetsCoverEveryRoutingMethod) {
  std::set<RoutingMethod> methods;
  bool grouped = false, ragged = false;
  for (const ModelPreset& p : model_presets()) {
    EXPECT_TRUE(config_problems(p.config).empty()) << p.name;
    EXPECT_EQ(p.routing_bias, p.config.routing == RoutingMethod::deepseek_v3 ||
                                  p.config.routing == RoutingMethod::sigmoid_renormalize)
        << p.name;
    if (p.full_size) continue;
    methods.insert(p.config.routing);
    grouped |= p.config.n_group > 1 && p.config.topk_group < p.config.n_group;
    ragged |= p.config.hidden_size % 128 != 0 && p.config.intermediate_size % 128 != 0;
  }
  EXPECT_EQ(methods.size(), 5u);
  EXPECT_TRUE(grouped);
  EXPECT_TRUE(ragged);
}

// --- Determinism ----------------------------------------------------------------------------
TEST(CaseGenerator, SameOptionsGiveBitIdenticalDatasets) {
  const testing::ScratchDir dir("gen-determinism");
  for (const Distribution d : {Distribution::realistic, Distribution::uniform, Distribution::adversarial}) {
    GeneratorOptions o = opts("tiny-deepseek", 9, 7);
    o.dist = d;
    o.scale_format = d == Distribution::uniform ? ScaleFormat::ue8m0 : ScaleFormat::f32;
    SCOPED_TRACE(make_case_command(o, ""));
    const CaseData a = generate(dir, "a.h5", o), b = generate(dir, "b.h5", o);
    testing::expect_same_data(a, b);
    EXPECT_EQ(a.source, make_case_command(o, dir.file("a.h5")));
    // Guard against a vacuous pass: another seed changes every tensor.
    o.seed = 8;
    const CaseData c = generate(dir, "c.h5", o);
    EXPECT_FALSE(testing::same_bits(a.hidden, c.hidden));
    EXPECT_FALSE(testing::same_bits(a.logits, c.logits));
    EXPECT_FALSE(testing::same_expert(a.experts[0], c.experts[0]));
  }
}

TEST(CaseGenerator, TokenRowsDoNotDependOnTheTokenCount) {
  const testing::ScratchDir dir("gen-prefix");
  const CaseData a = generate(dir, "a.h5", opts("tiny-deepseek", 4, 11)), b = generate(dir, "b.h5", opts("tiny-deepseek", 9, 11));
  const int64_t H = a.config.hidden_size, E = a.config.num_experts;
  EXPECT_TRUE(testing::same_bits(a.hidden, std::vector<float>(b.hidden.begin(), b.hidden.begin() + 4 * H)));
  EXPECT_TRUE(testing::same_bits(a.logits, std::vector<float>(b.logits.begin(), b.logits.begin() + 4 * E)));
  for (size_t s = 0; s < a.experts.size(); ++s) EXPECT_TRUE(testing::same_expert(a.experts[s], b.experts[s])) << s;
}

// --- Tensor parallelism -----------------------------------------------------------------------
// Rank r's w13 rows are rows [r*Il, (r+1)*Il) of each half of the full w13, its w2 columns
// [r*Il, (r+1)*Il) of the full w2, and the block scales the matching whole blocks.
void expect_tp_slice(const ExpertWeights& full, const ExpertWeights& part, int64_t H, int64_t I, int64_t tp, int64_t r) {
  const int64_t Il = I / tp, B = 128, bh = ceil_div(H, B), bi = I / B, bil = Il / B;
  for (int half = 0; half < 2; ++half)
    for (int64_t i = 0; i < Il; ++i)
      ASSERT_TRUE(std::equal(part.w13.begin() + (half * Il + i) * H, part.w13.begin() + (half * Il + i + 1) * H,
                             full.w13.begin() + (half * I + r * Il + i) * H))
          << "w13 half " << half << " row " << i;
  for (int half = 0; half < 2; ++half)
    for (int64_t br = 0; br < bil; ++br)
      for (int64_t bc = 0; bc < bh; ++bc)
        ASSERT_EQ(std::bit_cast<uint32_t>(part.w13_scale[size_t((half * bil + br) * bh + bc)]),
                  std::bit_cast<uint32_t>(full.w13_scale[size_t((half * bi + r * bil + br) * bh + bc)]));
  for (int64_t h = 0; h < H; ++h)
    ASSERT_TRUE(std::equal(part.w2.begin() + h * Il, part.w2.begin() + (h + 1) * Il, full.w2.begin() + h * I + r * Il))
        << "w2 row " << h;
  for (int64_t br = 0; br < bh; ++br)
    for (int64_t bc = 0; bc < bil; ++bc)
      ASSERT_EQ(std::bit_cast<uint32_t>(part.w2_scale[size_t(br * bil + bc)]),
                std::bit_cast<uint32_t>(full.w2_scale[size_t(br * bi + r * bil + bc)]));
}

TEST(CaseGenerator, TpSlicesAreBitIdenticalToTheUnslicedCase) {
  const testing::ScratchDir dir("gen-tp");
  for (const GateUpLayout layout : {GateUpLayout::gate_up, GateUpLayout::up_gate}) {
    GeneratorOptions o = opts("tiny-deepseek", 5, 3);
    o.gate_up_layout = layout;
    const CaseData full = generate(dir, "full.h5", o);
    for (int64_t r = 0; r < 2; ++r) {
      o.tp = 2;
      o.tp_rank = r;
      SCOPED_TRACE(make_case_command(o, ""));
      const CaseData part = generate(dir, "part.h5", o);
      EXPECT_TRUE(CaseReader(dir.file("part.h5")).validate().empty());
      EXPECT_EQ(part.config.intermediate_size, 128);
      EXPECT_EQ(part.config.gate_up_layout, layout);
      EXPECT_TRUE(testing::same_bits(full.hidden, part.hidden));
      EXPECT_TRUE(testing::same_bits(full.logits, part.logits));
      ASSERT_EQ(full.experts.size(), part.experts.size());
      for (size_t s = 0; s < full.experts.size(); ++s) expect_tp_slice(full.experts[s], part.experts[s], 256, 256, 2, r);
    }
    o.tp = 1;
    o.tp_rank = 0;
  }
}

TEST(CaseGenerator, TpSlicesOfARealModelExpert) {
  // Qwen3-30B-A3B: I = 768 = 6 blocks; --tp 2 gives 384 (3 blocks) per rank. Expert 0 only.
  const testing::ScratchDir dir("gen-tp-qwen");
  GeneratorOptions o = opts("qwen3-30b-a3b", 2, 5);
  o.experts_limit = 1;
  const CaseData full = generate(dir, "full.h5", o);
  o.tp = 2;
  o.tp_rank = 1;
  const CaseData part = generate(dir, "part.h5", o);
  ASSERT_EQ(full.experts.size(), 1u);
  ASSERT_EQ(part.expert_ids, full.expert_ids);
  expect_tp_slice(full.experts[0], part.experts[0], 2048, 768, 2, 1);
}

TEST(CaseGenerator, TpThatBreaksWeightBlocksIsAnOptionError) {
  GeneratorOptions o = opts("qwen3-30b-a3b", 2, 1);
  o.tp = 4;  // 768 / 4 = 192: not a multiple of 128 (768: Qwen3-30B-A3B's moe_intermediate_size)
  expect_option_error(o, "--tp", "multiple of the 128-wide weight block");
  o = opts("tiny-qwen", 2, 1);
  o.tp = 2;  // 128 / 2 = 64
  expect_option_error(o, "--tp", "multiple");
  o = opts("tiny-deepseek", 2, 1);
  o.tp = 3;  // 256 / 3 is not an integer
  expect_option_error(o, "--tp", "not an integer");
  o.tp = 2;
  o.tp_rank = 2;
  expect_option_error(o, "--tp-rank", "[0, --tp = 2)");
  o = opts("tiny-ragged", 2, 1);
  o.tp = 0;
  expect_option_error(o, "--tp", ">= 1");
}

// --- Expert parallelism and routed-only -------------------------------------------------------
TEST(CaseGenerator, EpRankHoldsItsExpertsExactlyAsTheFullCase) {
  const testing::ScratchDir dir("gen-ep");
  const CaseData full = generate(dir, "full.h5", opts("tiny-deepseek", 4, 21));
  GeneratorOptions o = opts("tiny-deepseek", 4, 21);
  o.ep = 4;
  o.ep_rank = 2;
  const CaseData part = generate(dir, "part.h5", o);
  EXPECT_TRUE(CaseReader(dir.file("part.h5")).validate().empty());
  EXPECT_EQ(part.config.local_expert_offset, 8);
  EXPECT_EQ(part.config.local_num_experts, 4);
  EXPECT_EQ(part.config.num_experts, 16);
  EXPECT_EQ(part.expert_ids, (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_FALSE(CaseReader(dir.file("part.h5")).experts_subset());
  EXPECT_TRUE(testing::same_bits(full.logits, part.logits));
  for (size_t s = 0; s < 4; ++s) EXPECT_TRUE(testing::same_expert(part.experts[s], full.experts[8 + s])) << s;

  o.ep = 3;
  expect_option_error(o, "--ep", "does not divide");
  o.ep = 4;
  o.ep_rank = 4;
  expect_option_error(o, "--ep-rank", "[0, --ep = 4)");
}

// The routed local experts, computed here from the stored inputs with the reference routing.
std::vector<int64_t> routed_local(const CaseData& d) {
  const Routing r = route(d.config, d.logits.data(), d.bias ? d.bias->data() : nullptr, d.tokens);
  std::set<int64_t> s;
  for (int32_t id : r.ids)
    if (d.config.is_local(id)) s.insert(id);
  return {s.begin(), s.end()};
}

TEST(CaseGenerator, RoutedOnlyStoresExactlyTheRoutedLocalExperts) {
  const testing::ScratchDir dir("gen-routed");
  const CaseData full = generate(dir, "full.h5", opts("tiny-deepseek", 3, 5));
  for (const int64_t ep : {1, 2}) {
    for (int64_t rank = 0; rank < ep; ++rank) {
      GeneratorOptions o = opts("tiny-deepseek", 3, 5);
      o.routed_only = true;
      o.ep = ep;
      o.ep_rank = rank;
      SCOPED_TRACE(make_case_command(o, ""));
      const CaseData d = generate(dir, "routed.h5", o);
      const CaseReader reader(dir.file("routed.h5"));
      EXPECT_TRUE(reader.validate().empty());
      const std::vector<int64_t> want = routed_local(d);
      ASSERT_FALSE(want.empty());
      EXPECT_EQ(d.expert_ids, want);
      EXPECT_LT(want.size(), size_t(d.config.local_experts()));  // 3 tokens x top-4 leave some out
      EXPECT_TRUE(reader.experts_subset());
      for (size_t s = 0; s < want.size(); ++s)
        EXPECT_TRUE(testing::same_expert(d.experts[s], full.experts[size_t(want[s])])) << "expert " << want[s];
    }
  }
}

TEST(CaseGenerator, RoutedOnlyWithNoLocalRoutingStoresOneStandIn) {
  // E = 16 over 16 EP ranks: one token (top-4) leaves 12 ranks without a routed expert.
  const testing::ScratchDir dir("gen-routed-empty");
  GeneratorOptions o = opts("tiny-deepseek", 1, 9);
  o.routed_only = true;
  o.ep = 16;
  const CasePlan full = plan_case(opts("tiny-deepseek", 1, 9), "x.h5");
  std::set<int64_t> used(full.routing.ids.begin(), full.routing.ids.end());
  int64_t rank = 0;
  while (used.count(rank)) ++rank;
  o.ep_rank = rank;
  const CaseData d = generate(dir, "empty.h5", o);
  EXPECT_EQ(d.expert_ids, std::vector<int64_t>{rank});
  EXPECT_TRUE(CaseReader(dir.file("empty.h5")).validate().empty());
}

}  // namespace
}  // namespace moecheck
