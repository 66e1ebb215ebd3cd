// A backend run over N tensor- or expert-parallel ranks and summed back (reference/moe_sharding.hpp,
// docs/DEVICE-ALGORITHM.md §8), as `run --tp N` / `--ep N` records it and gate judges it: the
// emulated backends run the N ranks and the reduction in one process
// (kernels/emulated/emulated_sharded.hpp), with the sharding faults it injects. Multi-GPU runs
// through NCCL are not built: cuda, cublaslt and exec:CMD backends are refused (--backend).
//
// Where a fault goes: faulty:<fault> runs its fault on `fault_rank` only (default the last rank:
// rank 0 has expert offset 0, where ep_offset_ignored changes nothing); the sharding faults are
// tp_slice_misplaced (fault_rank's W2 columns are the next rank's slice), reduce_bf16 (the
// all-reduce accumulates in bf16) and rank_added_twice (fault_rank's partial enters the sum twice).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "golden/case_file.hpp"
#include "golden/case_problem.hpp"
#include "kernels/backend_output.hpp"
#include "kernels/emulated/emulated_sharded.hpp"
#include "reference/compare_sharded.hpp"

namespace moecheck::judge {

struct ShardRequest {
  std::optional<ShardPlan> plan;  // none: a one-device run
  ShardFault fault = ShardFault::none;
  int64_t fault_rank = -1;        // -1: the last rank
  int64_t resolved_fault_rank() const { return fault_rank >= 0 ? fault_rank : plan ? plan->ranks - 1 : 0; }
  bool faulty() const { return fault != ShardFault::none; }
};

// The request against the backend: InputError naming --backend for a backend that cannot run over
// ranks, --fault-rank for a rank outside [0, N) or without a fault that uses it, --shard-fault for
// tp_slice_misplaced without --tp or a sharding fault without --tp/--ep.
void check_shard_request(const std::string& backend, const ShardRequest& s);

// Runs `backend` over the request's ranks. A case the split does not fit (require_shardable) is
// BackendUnsupported (backend_run.hpp) with moe_sharding's rule: `run` exits 2 with it, gate
// counts the case as not judged.
BackendOutput run_sharded_backend(const CaseProblem& cp, const std::string& backend, const ShardRequest& s,
                                  int64_t int32_threshold = 0);

// A sharded run, or a recorded output with ranks, as compare_sharded takes it (the layer's
// topk_ids stand for every rank's: every rank routes every token).
ShardedObservation sharded_observation_of(const BackendOutput& b);
ShardedObservation sharded_observation_of(const std::string& name, OutputData&& d);

// " --tp 4 --shard-fault rank_added_twice --fault-rank 3": the command-line options that ask for
// the request ("" for none); the fault rank only where a fault uses it.
std::string shard_arguments(const ShardRequest& s, bool backend_faulty);
// The output name `run` records a sharded run under by default: the backend's, then ".tp4" and
// the sharding fault (".tp4.rank_added_twice").
std::string sharded_output_name(const std::string& backend, const ShardRequest& s);

}  // namespace moecheck::judge
