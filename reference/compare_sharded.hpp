// Judging a layer run over N ranks (moe_sharding.hpp) as one layer, and naming the rank at fault:
//   ranks      each rank's partial output judged against the reference of its own shard
//              (compare_output on shard_problem(full, plan, r)): a wrong slice, a wrong expert
//              offset or any per-rank bug fails there, with the rank named;
//   reduction  the layer's output against the contract's reduction of the recorded partials
//              (reduction_interval): a bf16 accumulation, a partial added twice or left out fails
//              there; the rank whose partial best explains the residual is named when one does;
//   whole      the output against the unsharded reference: |out - o| <= sum_r budget_r + the
//              reduction's roundings + what the sharded recipe's own per-rank roundings change
//              (sharded_recipe_is_exact: then only the double evaluations', a 2^-10 share of the
//              budgets, so a slice that is wrong in the shard references too still fails here;
//              else |sum_r o_r - o| as the references compute it).
// Sizes that do not match the layer are InputError.
#pragma once

#include <string>
#include <vector>

#include "reference/moe_compare.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck {

struct ShardedObservation {
  std::vector<Observation> ranks;  // each rank's run: output = its partial (bf16 values)
  std::vector<float> output;       // [T, H] the reduced layer output
};

struct ShardedVerdict {
  bool pass = true;
  std::vector<CompareResult> ranks;
  int64_t reduction_outside = 0;  // elements outside the reduction interval of the recorded partials
  int64_t blamed_rank = -1;       // the rank whose partial explains the reduction's residual, or -1
  double blamed_beta = 0;         // the residual's coefficient on that partial (1: added twice)
  double blamed_share = 0;        // the share of the residual's energy it explains
  int64_t whole_outside = 0;      // elements outside the whole-layer bound
  double whole_max_ratio = 0;     // largest |out - o| / bound
  std::string text() const;
};

ShardedVerdict compare_sharded(const MoeProblem& full, const ShardPlan& plan, const ShardedObservation& obs,
                               const CompareOptions& opt);

}  // namespace moecheck
