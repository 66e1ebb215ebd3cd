// The emulated backend over N ranks (reference/moe_sharding.hpp's contract): each rank's slice
// of the layer run by run_emulated, each rank's bf16 partial output kept, then the reduction. CI's
// stand-in for a multi-GPU run, with the sharding bugs it can inject.
//
// Sharding faults (each one real way a sharded layer goes wrong):
//   tp_slice_misplaced   rank `fault_rank` multiplies its h with the W2 columns of the next
//                        rank's I-slice (its W13 slice is right)
//   reduce_bf16          the reduction accumulates in bf16 (acc = bf16(acc + p_r), rank order)
//                        where the contract says float32
//   rank_added_twice     rank `fault_rank`'s partial enters the reduction twice
// and any Fault of emulated_moe.hpp applied on rank `fault_rank` alone (ep_offset_ignored: that
// rank indexes its experts as if local_expert_offset were 0).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kernels/emulated/emulated_moe.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck {

enum class ShardFault { none, tp_slice_misplaced, reduce_bf16, rank_added_twice };
std::string_view to_string(ShardFault f);
std::optional<ShardFault> parse_shard_fault(std::string_view s);

struct ShardedOptions {
  ShardFault shard_fault = ShardFault::none;
  Fault fault = Fault::none;  // applied on fault_rank only
  int64_t fault_rank = 0;
  bool expert_outputs = false;
  // Every rank's as in EmulatedOptions: its block sums (emulated@hopper) and int32_overflow's wrap.
  const TensorCoreModel* tensor_core = nullptr;
  int64_t int32_overflow_threshold = int64_t(1) << 31;
};

struct ShardedOutput {
  std::vector<BackendOutput> ranks;  // each rank's run: output_bf16 is its partial
  std::vector<float> output;         // [T, H] the reduced output (bf16 values)
};

ShardedOutput run_emulated_sharded(const MoeProblem& full, const ShardPlan& plan, const ShardedOptions& opt = {});

}  // namespace moecheck
