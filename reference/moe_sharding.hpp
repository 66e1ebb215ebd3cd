// A layer split over N ranks and summed back (tensor parallel: I split; expert parallel: the
// experts split), what each rank computes, and how the ranks' partial outputs are reduced.
//
// Contract (docs/DEVICE-ALGORITHM.md §8):
//   tp N   rank r holds the gate and up rows [r I/N, (r+1) I/N) of W13 (in the case's
//          gate_up_layout) and the same columns of W2, I/N a multiple of the weight block and of
//          the group size (no block or quantization group straddles two ranks); every rank
//          routes every token; its partial output is the recipe on its slice, rounded to bf16.
//   ep N   rank r holds the experts [r E/N, (r+1) E/N) (local_expert_offset = r E/N); every rank
//          routes every token; slots of other ranks' experts add nothing; partial output bf16.
//   reduce the partials summed in float32 (any order: an all-reduce), the sum rounded to bf16.
// The full layer must be unsharded (local_expert_offset 0, every expert local).
//
// This file owns the split rule: make-case --tp/--ep (golden/case_generator), dump --tp/--ep
// (tools/checkpoint/layer_dump) and bench --tp take a rank's slice by shard_split_rule and
// shard_range, so that a rank's case and the emulated rank hold the same weights.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reference/moe_forward.hpp"

namespace moecheck {

enum class ShardKind { tp, ep };
std::string_view to_string(ShardKind k);

struct ShardPlan {
  ShardKind kind = ShardKind::tp;
  int64_t ranks = 1;
};

// "tp 4" / "ep 8" (the case file's /outputs/<name>/ranks@shard), and back: nullopt unless s is
// "tp N" or "ep N" with N a decimal in [1, kMaxShardRanks].
inline constexpr int64_t kMaxShardRanks = 4096;
std::string to_string(const ShardPlan& s);
std::optional<ShardPlan> parse_shard_plan(std::string_view s);

// The rule that splitting a layer of config c over s.ranks breaks, "" when it splits (always for
// one rank): TP needs I/N to be a whole multiple of the weight block and of the group size, EP
// needs N to divide E. Not the whole-layer condition of require_shardable.
std::string shard_split_rule(const MoeConfig& c, const ShardPlan& s);

// What rank `rank` of a split that shard_split_rule accepts holds: TP the rows [begin, begin +
// size) of each W13 half (and columns of W2), EP the global experts [begin, begin + size).
struct ShardRange {
  int64_t begin = 0, size = 0;
};
ShardRange shard_range(const MoeConfig& c, const ShardPlan& s, int64_t rank);

// Throws InputError(source, "tp N" or "ep N", rule) when the layer cannot be split so: fewer
// than one rank, a case that is itself a shard, or shard_split_rule's rule.
void require_shardable(const MoeConfig& c, const ShardPlan& s, const std::string& source = "");

// The problem rank `rank` runs: its config (TP: intermediate_size I/N; EP: its expert range) and
// a loader that returns its slice of each expert's weights (TP: copied out of the full expert's;
// EP: the full expert's). The full problem must outlive it.
MoeProblem shard_problem(const MoeProblem& full, const ShardPlan& s, int64_t rank);

// Whether the sharded recipe computes the unsharded layer's value in exact arithmetic: no rounding
// of a per-rank partial sum inside the recipe (TP: expert_output_dtype bf16 rounds each rank's
// partial slot output, the bf16 combines round per-rank partial sums; EP: bf16_expert_order's
// running sum restarts on every rank). Then the sharded and unsharded references differ by their
// double evaluations only.
bool sharded_recipe_is_exact(const MoeConfig& c, ShardKind kind);

// The contract's reduction: bf16(float32 sum of the partials in rank order), [T * H].
std::vector<float> reduce_partials(const std::vector<std::vector<float>>& partials);

// Where a correct all-reduce's output may lie given the recorded partials: [lo, hi] per element,
// the bf16 roundings of S -+ e with S the exact sum and e = gamma_{N-1}(2^-24) sum |p| (any
// float32 summation order; RNE to bf16 is monotone).
void reduction_interval(const std::vector<std::vector<float>>& partials, std::vector<double>& lo,
                        std::vector<double>& hi);

}  // namespace moecheck
