// A layer over N tensor- or expert-parallel ranks on the emulated backend (CI's stand-in for a
// multi-GPU run; reference/moe_sharding.hpp, kernels/emulated/emulated_sharded.hpp), judged as one
// layer by compare_sharded: correct runs pass for N = 2, 4, 8 (and under a recipe that rounds per
// rank); each sharding fault is caught, with the rank named where one rank is at fault; the TP
// slice is the make-case generator's rank slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <fmt/format.h>
#include <iostream>

#include "golden/case_generator.hpp"
#include "golden/case_problem.hpp"
#include "kernels/emulated/emulated_sharded.hpp"
#include "reference/compare_sharded.hpp"
#include "reference/errors.hpp"
#include "tests/small_layer.hpp"

namespace moecheck {
namespace {

// I = 1024 splits into 8 tensor-parallel slices of one 128-wide block.
MoeConfig layer_config() { return testing::dsv3_small(1024); }

struct ShardedRun {
  ShardedOutput out;
  CompareResult result;  // the layer's judgement, result.sharded its ranks' and reduction's
  const ShardedVerdict& v() const { return *result.sharded; }
  std::string text() const {
    return fmt::format("layer: {} (max ratio {:.3g}; {} of {} checks failed)\n{}", verdict_label(result), result.max_ratio,
                       result.checks_failed, result.checks, v().text());
  }
};

ShardedRun run_and_judge(const testing::SmallLayer& L, ShardPlan plan, const ShardedOptions& so = {}) {
  ShardedRun r;
  const MoeProblem full = L.problem();
  r.out = run_emulated_sharded(full, plan, so);
  ShardedObservation obs;
  for (const BackendOutput& b : r.out.ranks) obs.ranks.push_back(testing::observe(b));
  obs.layer.name = "layer";
  obs.layer.output = r.out.output;
  obs.layer.topk_ids = r.out.ranks[0].topk_ids;
  const CompareOptions opt{};
  ForwardOptions fo;
  fo.tier = Tier::quantized, fo.budget = &opt.model;
  r.result = compare_sharded(full, plan, moe_forward(full, fo), obs, opt);
  return r;
}

std::string label(ShardPlan p) { return to_string(p); }

TEST(ShardedEmulated, CorrectRunsPassOnTwoFourAndEightRanks) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  for (ShardKind kind : {ShardKind::tp, ShardKind::ep})
    for (int64_t n : {2, 4, 8}) {
      const ShardPlan plan{kind, n};
      const ShardedRun r = run_and_judge(L, plan);
      if (n == 8) std::cout << label(plan) << ", correct: " << r.text();
      EXPECT_TRUE(r.result.pass) << label(plan) << "\n" << r.text();
      EXPECT_EQ(r.v().reduction_outside, 0) << label(plan);
      EXPECT_LE(r.result.max_ratio, 1.0) << label(plan);
      EXPECT_EQ(r.v().ranks.size(), size_t(n));
      // The layer's checks, one per rank and one for the reduction.
      EXPECT_EQ(r.result.checks, 3 * int64_t(r.result.experts.size()) + 4 + n + 1) << label(plan);
    }
}

TEST(ShardedEmulated, AnEngineRecipeWithPerRankRoundingsPasses) {
  // SGLang's recipe: bf16 slot outputs and bf16 per-slot values, rounded on each rank's partial
  // sums under TP (the whole-layer bound then takes the references' own difference).
  MoeConfig c = layer_config();
  c.recipe.combine = Combine::bf16_slots, c.recipe.expert_output_dtype = Precision::bf16;
  const testing::SmallLayer L = testing::make_small_layer(c, 24, 8, true);
  for (ShardKind kind : {ShardKind::tp, ShardKind::ep}) {
    const ShardPlan plan{kind, 4};
    const ShardedRun r = run_and_judge(L, plan);
    EXPECT_TRUE(r.result.pass) << label(plan) << "\n" << r.text();
  }
}

// The TP slice of shard_problem against the make-case generator's own slicing of the same layer
// (golden/: a rank's weights are rows / columns of the unsliced case), both gate_up layouts.
TEST(ShardedEmulated, TheTpSliceIsTheGeneratorsRankSlice) {
  for (GateUpLayout layout : {GateUpLayout::gate_up, GateUpLayout::up_gate}) {
    GeneratorOptions g;
    g.preset = "small-deepseek", g.tokens = 4, g.seed = 11, g.gate_up_layout = layout;
    const std::string full_path = ::testing::TempDir() + "sharded-full.h5";
    write_case(plan_case(g, full_path), full_path);
    const CaseProblem full(full_path);
    const ShardPlan plan{ShardKind::tp, 2};
    for (int64_t r = 0; r < 2; ++r) {
      GeneratorOptions gr = g;
      gr.tp = 2, gr.tp_rank = r;
      const std::string rank_path = ::testing::TempDir() + "sharded-rank.h5";
      write_case(plan_case(gr, rank_path), rank_path);
      const CaseProblem rank(rank_path);
      const MoeProblem mine = shard_problem(full.problem(), plan, r);
      ASSERT_EQ(mine.config.intermediate_size, rank.config().intermediate_size);
      const int64_t H = mine.config.hidden_size, I = mine.config.intermediate_size, B = mine.config.weight_block;
      const size_t n13 = size_t(2 * I * H), n2 = size_t(H * I), s13 = size_t(2 * I / B * ceil_div(H, B)),
                   s2 = size_t(ceil_div(H, B) * (I / B));
      int64_t compared = 0;
      for (int64_t e : rank.problem().stored_experts) {
        if (std::find(full.problem().stored_experts.begin(), full.problem().stored_experts.end(), e) ==
            full.problem().stored_experts.end())
          continue;
        const ExpertView a = mine.load_expert(e), b = rank.problem().load_expert(e);
        EXPECT_TRUE(std::equal(a.w13, a.w13 + n13, b.w13)) << "w13 of expert " << e << ", rank " << r;
        EXPECT_TRUE(std::equal(a.w2, a.w2 + n2, b.w2)) << "w2 of expert " << e << ", rank " << r;
        EXPECT_TRUE(std::equal(a.w13_scale, a.w13_scale + s13, b.w13_scale)) << "w13 scales, expert " << e;
        EXPECT_TRUE(std::equal(a.w2_scale, a.w2_scale + s2, b.w2_scale)) << "w2 scales, expert " << e;
        ++compared;
      }
      EXPECT_GT(compared, 0);
    }
  }
}

// One rank at fault: the layer fails, that rank fails, every other rank passes.
void expect_only_rank_fails(ShardPlan plan, const ShardedOptions& so, const char* what) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  const ShardedRun r = run_and_judge(L, plan, so);
  std::cout << label(plan) << ", " << what << ": " << r.text();
  EXPECT_FALSE(r.result.pass) << r.text();
  for (int64_t k = 0; k < plan.ranks; ++k)
    EXPECT_EQ(r.v().ranks[k].pass, k != so.fault_rank) << "rank " << k << "\n" << r.text();
  EXPECT_EQ(r.v().failing_ranks(), std::vector<int64_t>{so.fault_rank}) << r.text();
}

TEST(ShardedEmulated, AMisplacedTpSliceFailsOnItsRank) {
  ShardedOptions so;
  so.shard_fault = ShardFault::tp_slice_misplaced, so.fault_rank = 1;
  expect_only_rank_fails({ShardKind::tp, 4}, so, "rank 1's W2 slice misplaced");
}

TEST(ShardedEmulated, AnIgnoredExpertOffsetFailsOnItsRank) {
  ShardedOptions so;
  so.fault = Fault::ep_offset_ignored, so.fault_rank = 2;
  expect_only_rank_fails({ShardKind::ep, 4}, so, "rank 2 ignores its expert offset");
}

TEST(ShardedEmulated, ABf16ReductionFailsTheReduction) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  ShardedOptions so;
  so.shard_fault = ShardFault::reduce_bf16;
  for (ShardKind kind : {ShardKind::tp, ShardKind::ep}) {
    const ShardedRun r = run_and_judge(L, {kind, 8}, so);
    std::cout << to_string(kind) << " 8, bf16 reduction: " << r.text();
    EXPECT_FALSE(r.result.pass) << r.text();
    EXPECT_GT(r.v().reduction_outside, 0) << r.text();
    for (const CompareResult& c : r.v().ranks) EXPECT_TRUE(c.pass) << c.name;
  }
}

TEST(ShardedEmulated, ARankAddedTwiceIsNamed) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  ShardedOptions so;
  so.shard_fault = ShardFault::rank_added_twice, so.fault_rank = 3;
  for (ShardKind kind : {ShardKind::tp, ShardKind::ep}) {
    const ShardedRun r = run_and_judge(L, {kind, 4}, so);
    std::cout << to_string(kind) << " 4, rank 3 added twice: " << r.text();
    EXPECT_FALSE(r.result.pass) << r.text();
    EXPECT_EQ(r.v().blamed_rank, 3) << r.text();
    EXPECT_NEAR(r.v().blamed_beta, 1.0, 0.05) << r.text();
  }
}

// An exact tie at the k-th place, the ranks choosing the expert the reference rejects: every rank
// and the layer accept it as a near-tie and judge it against the re-run for that choice (the
// layer's through the sharded reference), so the correct sharded run passes.
TEST(ShardedEmulated, ANearTieChoiceIsAcceptedOnEveryRankAndTheLayer) {
  MoeConfig c;
  c.num_experts = 8, c.top_k = 2, c.hidden_size = 256, c.intermediate_size = 512;
  c.routing = RoutingMethod::renormalize;
  testing::SmallLayer L = testing::make_small_layer(c, 4, 11, false);
  for (int e = 0; e < 8; ++e) L.logits[1 * 8 + e] = -2.0f;  // token 1: experts 2 and 5 tie behind 0
  L.logits[1 * 8 + 0] = 1.0f, L.logits[1 * 8 + 2] = 0.5f, L.logits[1 * 8 + 5] = 0.5f;
  const MoeProblem full = L.problem();
  const CompareOptions opt{};
  ForwardOptions fo;
  fo.budget = &opt.model;
  const ForwardResult ref = moe_forward(full, fo);
  ASSERT_EQ(ref.routing.ids[1 * 2 + 1], 2);
  Routing alt = ref.routing;
  alt.ids[1 * 2 + 1] = 5;
  for (ShardPlan plan : {ShardPlan{ShardKind::ep, 2}, ShardPlan{ShardKind::tp, 4}}) {
    // Each rank's exact partial for the other choice, rounded to bf16 as a device's; their reduction.
    ShardedObservation obs;
    std::vector<std::vector<float>> partials;
    ForwardOptions fa;
    fa.routing_override = &alt;
    for (int64_t r = 0; r < plan.ranks; ++r) {
      Observation o;
      o.name = fmt::format("rank {}", r);
      for (double v : moe_forward(shard_problem(full, plan, r), fa).output) o.output.push_back(bf16_round(v));
      o.topk_ids = alt.ids;
      partials.push_back(o.output);
      obs.ranks.push_back(std::move(o));
    }
    obs.layer.name = "layer";
    obs.layer.output = reduce_partials(partials);
    obs.layer.topk_ids = alt.ids;
    const CompareResult R = compare_sharded(full, plan, ref, obs, opt);
    EXPECT_TRUE(R.pass) << label(plan) << ": " << R.checks_failed << "\n" << R.sharded->text();
    EXPECT_EQ(R.ambiguous, std::vector<int64_t>{1}) << label(plan);
    for (const CompareResult& rank : R.sharded->ranks) EXPECT_EQ(rank.ambiguous, std::vector<int64_t>{1}) << rank.name;
  }
}

TEST(ShardedEmulated, LayersThatCannotSplitSoAreRefused) {
  MoeConfig c = layer_config();
  EXPECT_THROW(require_shardable(c, {ShardKind::tp, 16}), InputError);  // 1024 / 16 = 64: half a block
  EXPECT_THROW(require_shardable(c, {ShardKind::ep, 3}), InputError);   // 16 experts over 3 ranks
  c.local_expert_offset = 8, c.local_num_experts = 8;
  EXPECT_THROW(require_shardable(c, {ShardKind::ep, 2}), InputError);   // already a shard
}

}  // namespace
}  // namespace moecheck
