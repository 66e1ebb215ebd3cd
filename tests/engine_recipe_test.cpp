// Engine recipes (golden/FORMAT.md "Engine recipes", reference/BUDGETS.md §9): a correct device
// with a recipe passes the reference that follows the recipe, on every case of a sweep (zero
// false alarms), and where the recipe's rounding is larger than the default budget the default
// recipe's reference fails that same output (and the recipe's reference fails a default
// device). quant_divide is the exception by design: §1's divide slack already admits it.
//
// Cases are small layers from fixed seeds (tests/small_layer.hpp); MOECHECK_CASES=<n> changes
// the sweep length (default 100 per recipe).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fmt/format.h>

#include "golden/engine_recipes.hpp"
#include "kernels/emulated/emulated_internal.hpp"
#include "kernels/emulated/emulated_moe.hpp"
#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_compare.hpp"
#include "tests/small_layer.hpp"

namespace moecheck {
namespace {

using testing::make_small_layer;
using testing::observe;
using testing::SmallLayer;

MoeConfig with(MoeConfig c, std::initializer_list<const char*> settings) {
  for (const char* s : settings) {
    const std::string rule = apply_recipe_setting(s, c);
    if (!rule.empty()) throw std::invalid_argument(rule);
  }
  return c;
}

// Random layer shape from a seed: deepseek_v3 or renormalize routing, k up to 8 (the combine
// recipes differ most when many slots add up), EP shards on a third of the cases.
MoeConfig random_config(uint64_t seed) {
  const CounterRng r{seed, 91};
  auto pick = [&](uint64_t i, uint64_t n) { return static_cast<int64_t>(r.bits(i) % n); };
  MoeConfig c;
  c.routing = pick(0, 2) ? RoutingMethod::deepseek_v3 : RoutingMethod::renormalize;
  c.num_experts = 16;
  c.top_k = 2 + pick(1, 7);
  c.hidden_size = 128 * (1 + pick(2, 2));
  c.intermediate_size = 128 * (1 + pick(3, 2));
  c.routed_scaling_factor = c.routing == RoutingMethod::deepseek_v3 ? 2.5 : 1.0;
  c.scale_format = pick(4, 2) ? ScaleFormat::ue8m0 : ScaleFormat::f32;
  if (pick(5, 3) == 0) c.local_num_experts = 8, c.local_expert_offset = 8 * pick(6, 2);
  return c;
}

struct Sweep {
  int64_t cases = 0, recipe_failed = 0, default_ref_failed = 0, default_dev_failed = 0;
  std::string first_false_alarm;
};

// One recipe over the sweep: emulated(recipe) vs reference(recipe) must pass; counts how often
// reference(default) fails emulated(recipe) and reference(recipe) fails emulated(default).
// tweak: changes the layer (e.g. tiny tokens for act_scale_floor).
template <class Tweak>
Sweep sweep(std::initializer_list<const char*> recipe, Tweak tweak) {
  const char* env = std::getenv("MOECHECK_CASES");
  const uint64_t n = env ? std::strtoull(env, nullptr, 10) : 100;
  Sweep s;
  for (uint64_t seed = 1; seed <= n; ++seed) {
    const MoeConfig base = random_config(seed);
    const MoeConfig rc = with(base, recipe);
    SmallLayer L = make_small_layer(rc, 4 + int64_t(seed % 9), seed, rc.routing == RoutingMethod::deepseek_v3);
    tweak(L);
    SmallLayer D = L;
    D.config = base;
    CompareOptions opt;
    ForwardOptions fo;
    fo.budget = &opt.model;
    EmulatedOptions eo;
    eo.expert_outputs = seed % 2 == 0;
    const Observation dev = observe(run_emulated(L.problem(), eo));
    const Observation dev_default = observe(run_emulated(D.problem(), eo));
    const CompareResult ok = compare_output(L.problem(), moe_forward(L.problem(), fo), dev, opt);
    const ForwardResult ref_default = moe_forward(D.problem(), fo);
    ++s.cases;
    if (!ok.pass) {
      ++s.recipe_failed;
      if (s.first_false_alarm.empty())
        s.first_false_alarm = fmt::format("seed {}: max ratio {} at token {} col {}, {} of {} checks failed", seed,
                                          ok.max_ratio, ok.worst_token, ok.worst_col, ok.checks_failed, ok.checks);
    }
    if (!compare_output(D.problem(), ref_default, dev, opt).pass) ++s.default_ref_failed;
    if (!compare_output(L.problem(), moe_forward(L.problem(), fo), dev_default, opt).pass) ++s.default_dev_failed;
  }
  std::cout << fmt::format("[ recipe   ] {} cases: recipe reference failed {}, default reference failed the recipe's "
                           "output on {}, recipe reference failed the default output on {}\n",
                           s.cases, s.recipe_failed, s.default_ref_failed, s.default_dev_failed);
  return s;
}

void no_tweak(SmallLayer&) {}

TEST(EngineRecipe, SglangCombineIsJudgedByItsOwnArithmetic) {
  const Sweep s = sweep({"sglang"}, no_tweak);
  EXPECT_EQ(s.recipe_failed, 0) << s.first_false_alarm;
  // Per-slot bf16 rounding moves the sum by up to k/2 slot ulps: beyond the default budget's
  // half output ulp on part of the cases, both ways round.
  EXPECT_GT(s.default_ref_failed, s.cases / 10);
  EXPECT_GT(s.default_dev_failed, s.cases / 10);
}

TEST(EngineRecipe, TransformersRecipeIsJudgedByItsOwnArithmetic) {
  const Sweep s = sweep({"transformers"}, no_tweak);
  EXPECT_EQ(s.recipe_failed, 0) << s.first_false_alarm;
  EXPECT_GT(s.default_ref_failed, s.cases / 2);
  EXPECT_GT(s.default_dev_failed, s.cases / 4);
}

TEST(EngineRecipe, EachBf16RoundingAloneIsJudgedByItsOwnArithmetic) {
  for (const char* r : {"combine=bf16_slots", "combine=bf16_expert_order", "expert_output_dtype=bf16",
                        "silu_dtype=bf16"}) {
    SCOPED_TRACE(r);
    const Sweep s = sweep({r}, no_tweak);
    EXPECT_EQ(s.recipe_failed, 0) << s.first_false_alarm;
    EXPECT_GT(s.default_ref_failed, 0);
  }
}

// Tokens far below act_eps = 1e-10: with the floor their scale is fl32(eps / 448) and their
// codes keep only a few bits; without it they quantize at full e4m3 precision.
void tiny_tokens(SmallLayer& L) {
  const int64_t H = L.config.hidden_size;
  for (int64_t t = 0; t < L.tokens; t += 2)
    for (int64_t i = 0; i < H; ++i) L.hidden[t * H + i] = static_cast<float>(double(L.hidden[t * H + i]) * 0x1p-40);
  // and one all-zero group: scale 0 under act_scale_floor = none, which must code 0, not NaN
  for (int64_t i = 0; i < 128; ++i) L.hidden[1 * H + i] = 0.0f;
}

TEST(EngineRecipe, NoScaleFloorIsJudgedByItsOwnArithmetic) {
  const Sweep s = sweep({"act_scale_floor=none"}, tiny_tokens);
  EXPECT_EQ(s.recipe_failed, 0) << s.first_false_alarm;
  EXPECT_GT(s.default_ref_failed, s.cases / 2);
  EXPECT_GT(s.default_dev_failed, s.cases / 2);
}

TEST(EngineRecipe, NoScaleFloorCodesAZeroGroupZeroWhereTheFaultGivesNaN) {
  MoeConfig c = with(random_config(3), {"act_scale_floor=none"});
  SmallLayer L = make_small_layer(c, 4, 3, c.routing == RoutingMethod::deepseek_v3);
  tiny_tokens(L);
  const float zeros[128] = {};
  uint8_t codes[128];
  float scale = -1;
  group_quantize_row(zeros, 128, 128, act_quant_rule(c), codes, &scale);
  EXPECT_EQ(scale, 0.0f);
  for (uint8_t q : codes) ASSERT_EQ(q, 0);
  EmulatedOptions eo;
  const BackendOutput good = run_emulated(L.problem(), eo);
  for (uint16_t v : good.output_bf16) ASSERT_FALSE(std::isnan(bf16_decode(v)));
  eo.fault = Fault::zero_group_nan;
  const BackendOutput bad = run_emulated(L.problem(), eo);
  int64_t nan = 0;
  for (uint16_t v : bad.output_bf16) nan += std::isnan(bf16_decode(v));
  EXPECT_GT(nan, 0);
}

// quant_divide = reciprocal: the reference and the emulated quantizers agree code for code; the
// codes differ from the division's on some inputs; the difference is inside §1's divide slack,
// so the default reference accepts a reciprocal device (not detectable by design) and the
// recipe's reference passes it too.
TEST(EngineRecipe, ReciprocalQuantizationMatchesCodeForCode) {
  // Random data almost never brings x / s within a float32 ulp of an e4m3 rounding midpoint, so
  // the groups are built for it: group g has amax = 448 s_g with s_g = 1 + g / 512 (not a power of
  // two), and its other elements are fl32(m s_g) for the e4m3 midpoints m in [1, 448).
  std::vector<float> mid;
  for (int c = 0x08; c < 0x7E; ++c)
    mid.push_back(float((fp8_decode(uint8_t(c), Fp8Format::e4m3fn) + fp8_decode(uint8_t(c + 1), Fp8Format::e4m3fn)) / 2));
  std::vector<float> x(128 * 512);
  for (size_t g = 0; g < 512; ++g) {
    const double sg = 1 + double(g) / 512;
    x[g * 128] = float(448 * sg);
    for (size_t i = 1; i < 128; ++i) x[g * 128 + i] = float(mid[(i + g) % mid.size()] * sg);
  }
  ActQuantRule div{ScaleFormat::f32, 1e-10}, rec = div;
  rec.divide = QuantDivide::reciprocal;
  std::vector<uint8_t> qd(x.size()), qr(x.size()), qe(x.size());
  std::vector<float> sd(x.size() / 128), sr(sd.size()), se(sd.size());
  group_quantize_row(x.data(), int64_t(x.size()), 128, div, qd.data(), sd.data());
  group_quantize_row(x.data(), int64_t(x.size()), 128, rec, qr.data(), sr.data());
  emulated::QuantRule er;
  er.reciprocal = true;
  emulated::quantize_row(x.data(), int64_t(x.size()), 128, er, qe.data(), se.data());
  EXPECT_EQ(qr, qe);
  EXPECT_EQ(sr, se);
  int64_t differ = 0;
  for (size_t i = 0; i < x.size(); ++i) differ += qd[i] != qr[i];
  EXPECT_GT(differ, 0) << "x * (1/s) never moved a code: the test data do not exercise the recipe";
  std::cout << fmt::format("[ recipe   ] reciprocal vs division: {} of {} codes differ\n", differ, x.size());

  const Sweep s = sweep({"quant_divide=reciprocal"}, no_tweak);
  EXPECT_EQ(s.recipe_failed, 0) << s.first_false_alarm;
  EXPECT_EQ(s.default_ref_failed, 0) << "the divide slack of BUDGETS.md §1 should admit x * (1/s)";
}

}  // namespace
}  // namespace moecheck
