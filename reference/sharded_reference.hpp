// The reference a layer run over N ranks (moe_sharding.hpp) is judged against as one layer: the
// unsharded layer's quantized reference o, with the budget and the noise variance of a correct
// sharded run, and each rank's shard reference o_r with its own budget B_r (reference/BUDGETS.md
// §12).
//
// A correct run's output is bf16(fl32 sum of the partials p_r), each p_r within B_r of o_r, so
// per output element
//   |out - o| <= sum_r B_r                 the ranks' own budgets (each holds its bf16 rounding)
//              + R                         the sharded recipe against the unsharded one
//              + e + 2^-8 (m + e) + 2^-133  the float32 all-reduce, then its bf16 rounding
// with m = sum_r (|o_r| + B_r) >= sum_r |p_r|, e = N 2^-24 m (any summation order: gamma_{N-1}
// < N 2^-24), and R = |sum_r o_r - o| where the recipe rounds per-rank partial sums
// (sharded_recipe_is_exact false: TP with bf16 slot outputs or a bf16 combine, EP with
// bf16_expert_order), else 2^-10 sum_r B_r: there the two references differ by their double
// evaluations only (K 2^-52 of the magnitudes), so a slice that is wrong in the shard references
// too still fails against o.
// Noise variance (§10): sum_r (max(V_r, ulp_r^2 / 12) + ulp_r^2 / 12), ulp_r that of bf16(o_r)
// (each rank's deviation from its centre, then its centre's own rounding residual), plus
// e^2 / 3 for the all-reduce, ulp^2 / 6 for the final rounding against the centre bf16(o) and
// R^2 (the recipe's difference, systematic: its worst case as the variance).
// The slot arrays, routing and re-quantization terms are the unsharded reference's.
#pragma once

#include <vector>

#include "reference/moe_forward.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck {

struct ShardedReference {
  ShardPlan plan;
  ForwardResult whole;               // o with the sharded budget and noise variance
  std::vector<ForwardResult> ranks;  // o_r with B_r, rank order
};

// whole: moe_forward(full, fo) of the quantized tier with fo.budget set (a caller that has the
// layer's reference passes it rather than computing it again). The ranks are computed with fo's
// budget model and routing override (a near-tie re-run routes every rank alike).
ShardedReference sharded_reference(const MoeProblem& full, const ShardPlan& plan, ForwardResult whole,
                                   const ForwardOptions& fo);

}  // namespace moecheck
