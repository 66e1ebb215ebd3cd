// Judging a layer run over N ranks (moe_sharding.hpp) as one layer, and naming the rank at fault:
//   layer      the reduced output by compare_output against the sharded reference
//              (sharded_reference.hpp: the unsharded reference o with a budget and noise that hold
//              the ranks' budgets, the float32 all-reduce and its bf16 rounding), so every check of
//              a one-device output (elementwise, routing, per-expert bias and energy, token and
//              output scale, power) judges the whole layer; near-tie tokens are re-run through
//              the sharded reference too;
//   ranks      each rank's partial output against the reference of its own shard (compare_output
//              on shard_problem(full, plan, r)): a wrong slice, a wrong expert offset or any
//              per-rank bug fails there, with the rank named;
//   reduction  the layer's output against the contract's reduction of the recorded partials
//              (reduction_interval): a bf16 accumulation, a partial added twice or left out fails
//              there; the rank whose partial best explains the residual is named when one does.
// The result is the layer's CompareResult with `sharded` set: its checks count one more per rank
// and one for the reduction, and it fails when any part fails. Sizes that do not match the layer
// are InputError.
#pragma once

#include <string>
#include <vector>

#include "reference/moe_compare.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck {

struct ShardedObservation {
  Observation layer;               // the reduced output; its slot outputs are not judged (a TP
                                   // rank's are partial sums: each rank's own are, in `ranks`)
  std::vector<Observation> ranks;  // each rank's run: output = its partial (bf16 values)
};

// What a sharded judgement adds to the layer's (CompareResult::sharded).
struct ShardedVerdict {
  ShardPlan plan;
  std::vector<CompareResult> ranks;  // named "rank r"
  int64_t reduction_outside = 0;     // elements outside the reduction interval of the recorded partials
  int64_t blamed_rank = -1;          // the rank whose partial explains the reduction's residual, or -1
  double blamed_beta = 0;            // the residual's coefficient on that partial (1: added twice, -1: left out)
  double blamed_share = 0;           // the share of the residual's energy it explains
  bool reduction_pass() const { return reduction_outside == 0; }
  std::vector<int64_t> failing_ranks() const;
  bool pass() const { return failing_ranks().empty() && reduction_pass(); }
  // A line per rank (verdict, worst ratio; its failing experts on the next) and one for the
  // reduction (the blamed rank on the next), indented by two spaces, none over 110 columns.
  std::string text() const;
};

// whole: the layer's quantized reference with the budget of opt.model (moe_forward(full, {quantized,
// budget = &opt.model}), optionally with requant_terms for opt.requant_test).
CompareResult compare_sharded(const MoeProblem& full, const ShardPlan& plan, ForwardResult whole,
                              const ShardedObservation& obs, const CompareOptions& opt);

}  // namespace moecheck
