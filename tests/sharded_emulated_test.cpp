// A layer over N tensor- or expert-parallel ranks on the emulated backend (CI's stand-in for a
// multi-GPU run; reference/moe_sharding.hpp, kernels/emulated/emulated_sharded.hpp), judged as one
// layer by compare_sharded: correct runs pass for N = 2, 4, 8; each sharding fault is caught, with
// the rank named where one rank is at fault.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <iostream>

#include "kernels/emulated/emulated_sharded.hpp"
#include "reference/compare_sharded.hpp"
#include "reference/errors.hpp"
#include "tests/small_layer.hpp"

namespace moecheck {
namespace {

// DeepSeek-V3-style routing; I = 1024 splits into 8 slices of one 128-wide block.
MoeConfig layer_config() {
  MoeConfig c;
  c.num_experts = 16, c.top_k = 4, c.hidden_size = 256, c.intermediate_size = 1024;
  c.routing = RoutingMethod::deepseek_v3, c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5;
  return c;
}

struct ShardedRun {
  ShardedOutput out;
  ShardedVerdict verdict;
};

ShardedRun run_and_judge(const testing::SmallLayer& L, ShardPlan plan, const ShardedOptions& so = {}) {
  ShardedRun r;
  const MoeProblem full = L.problem();
  r.out = run_emulated_sharded(full, plan, so);
  ShardedObservation obs;
  for (const BackendOutput& b : r.out.ranks) obs.ranks.push_back(testing::observe(b));
  obs.output = r.out.output;
  r.verdict = compare_sharded(full, plan, obs, CompareOptions{});
  return r;
}

std::string label(ShardPlan p) { return fmt::format("{} {}", to_string(p.kind), p.ranks); }

TEST(ShardedEmulated, CorrectRunsPassOnTwoFourAndEightRanks) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  for (ShardKind kind : {ShardKind::tp, ShardKind::ep})
    for (int64_t n : {2, 4, 8}) {
      const ShardPlan plan{kind, n};
      const ShardedRun r = run_and_judge(L, plan);
      if (n == 8) std::cout << label(plan) << ", correct: " << r.verdict.text();
      EXPECT_TRUE(r.verdict.pass) << label(plan) << "\n" << r.verdict.text();
      EXPECT_EQ(r.verdict.reduction_outside, 0) << label(plan);
      EXPECT_LE(r.verdict.whole_max_ratio, 1.0) << label(plan);
    }
}

TEST(ShardedEmulated, AMisplacedTpSliceFailsOnItsRank) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  ShardedOptions so;
  so.shard_fault = ShardFault::tp_slice_misplaced, so.fault_rank = 1;
  const ShardedRun r = run_and_judge(L, {ShardKind::tp, 4}, so);
  std::cout << "tp 4, rank 1's W2 slice misplaced: " << r.verdict.text();
  EXPECT_FALSE(r.verdict.pass) << r.verdict.text();
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(r.verdict.ranks[k].pass, k != 1) << "rank " << k << "\n" << r.verdict.text();
}

TEST(ShardedEmulated, AnIgnoredExpertOffsetFailsOnItsRank) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  ShardedOptions so;
  so.fault = Fault::ep_offset_ignored, so.fault_rank = 2;
  const ShardedRun r = run_and_judge(L, {ShardKind::ep, 4}, so);
  std::cout << "ep 4, rank 2 ignores its expert offset: " << r.verdict.text();
  EXPECT_FALSE(r.verdict.pass) << r.verdict.text();
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(r.verdict.ranks[k].pass, k != 2) << "rank " << k << "\n" << r.verdict.text();
}

TEST(ShardedEmulated, ABf16ReductionFailsTheReduction) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  ShardedOptions so;
  so.shard_fault = ShardFault::reduce_bf16;
  for (ShardKind kind : {ShardKind::tp, ShardKind::ep}) {
    const ShardedRun r = run_and_judge(L, {kind, 8}, so);
    std::cout << to_string(kind) << " 8, bf16 reduction: " << r.verdict.text();
    EXPECT_FALSE(r.verdict.pass) << r.verdict.text();
    EXPECT_GT(r.verdict.reduction_outside, 0) << r.verdict.text();
    for (const CompareResult& c : r.verdict.ranks) EXPECT_TRUE(c.pass) << c.name;
  }
}

TEST(ShardedEmulated, ARankAddedTwiceIsNamed) {
  const testing::SmallLayer L = testing::make_small_layer(layer_config(), 24, 7, true);
  ShardedOptions so;
  so.shard_fault = ShardFault::rank_added_twice, so.fault_rank = 3;
  for (ShardKind kind : {ShardKind::tp, ShardKind::ep}) {
    const ShardedRun r = run_and_judge(L, {kind, 4}, so);
    std::cout << to_string(kind) << " 4, rank 3 added twice: " << r.verdict.text();
    EXPECT_FALSE(r.verdict.pass) << r.verdict.text();
    EXPECT_EQ(r.verdict.blamed_rank, 3) << r.verdict.text();
    EXPECT_NEAR(r.verdict.blamed_beta, 1.0, 0.05) << r.verdict.text();
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
