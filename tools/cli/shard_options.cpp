// --tp / --ep and the sharding faults on the command line (shard_options.hpp).
#include "tools/cli/shard_options.hpp"

#include <fmt/format.h>

#include "tools/cli/cli_common.hpp"

namespace moecheck::cli {

void add_shard_options(CLI::App* sub, ShardOptions& o) {
  auto* tp = sub->add_option("--tp", o.tp,
                             "run over N tensor-parallel ranks (each holds I/N of every expert) and their float32 "
                             "all-reduce, on the emulated backends; the ranks' partials are recorded and judged "
                             "(docs/DEVICE-ALGORITHM.md §8)")
                 ->check(CLI::Range(int64_t(1), kMaxShardRanks));
  sub->add_option("--ep", o.ep, "run over N expert-parallel ranks (each holds E/N experts), as --tp")
      ->check(CLI::Range(int64_t(1), kMaxShardRanks))
      ->excludes(tp);
  sub->add_option("--shard-fault", o.shard_fault,
                  "a sharding bug of the emulated run: tp_slice_misplaced (--tp: the fault rank multiplies its h "
                  "with the next rank's W2 slice), reduce_bf16 (the all-reduce accumulates in bf16, not float32; it "
                  "shows where three or more ranks contribute: two bf16 partials sum exactly), "
                  "rank_added_twice (the fault rank's partial is summed twice)")
      ->check(CLI::IsMember({"tp_slice_misplaced", "reduce_bf16", "rank_added_twice"}));
  sub->add_option("--fault-rank", o.fault_rank,
                  "the one rank a faulty:<fault> backend's fault, tp_slice_misplaced and rank_added_twice apply on "
                  "(default: the last rank, N-1; on rank 0, whose expert offset is 0, ep_offset_ignored changes "
                  "nothing); every other rank runs correctly")
      ->check(at_least(0));
}

judge::ShardRequest shard_request(const ShardOptions& o) {
  judge::ShardRequest s;
  if (o.tp > 0) s.plan = ShardPlan{ShardKind::tp, o.tp};
  if (o.ep > 0) s.plan = ShardPlan{ShardKind::ep, o.ep};
  if (!o.shard_fault.empty()) s.fault = *parse_shard_fault(o.shard_fault);  // IsMember checked the name
  s.fault_rank = o.fault_rank;
  return s;
}

}  // namespace moecheck::cli
