// What one backend run of a case produces: the record a backend writes to /outputs/<name>.
// Shared by the backends (emulated, cuda, cublaslt, faulty:<fault>) so the CLI and the
// comparison against the budgets treat them alike. Plain C++ (no CUDA types).
//
// Contents (docs/DEVICE-ALGORITHM.md names the roundings):
//   output_bf16     [T, H]     bf16 bits of the finalized layer output (§6)
//   output_f32      [T, H]     instead of output_bf16: a float32 output (an exec:CMD backend's
//                              kernel that writes float32; empty for every built-in backend)
//   topk_ids        [T, k]     global expert ids, rank order (descending selection score,
//                              ties by ascending id)
//   topk_weights    [T, k]     routing weights with rsf applied, as rounded to
//                              routing_weight_dtype (held in float; bf16 values are exact)
//   expert_outputs  [T, k, H]  GEMM2 output of each slot in float32 (§5), 0 for slots whose
//                              expert is not local; empty unless the run was asked for them
//   shard, ranks               a run over N ranks (reference/moe_sharding.hpp, §8): the split
//                              ("tp 4", "ep 8") and each rank's own run, whose output_bf16 is
//                              the rank's partial; output_bf16 is then the reduced output.
//                              Empty for a one-device run
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecheck {

struct BackendOutput {
  int64_t tokens = 0, hidden = 0, top_k = 0;
  std::vector<uint16_t> output_bf16;
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_weights;
  std::vector<float> expert_outputs;
  bool expert_outputs_bf16 = false;  // the values are bf16 (exec:CMD outputs may store bf16)
  std::string backend;  // "emulated", "cuda", "cublaslt", "faulty:<fault>"
  std::string device;   // in words: "cpu (float32 emulation)", "NVIDIA H200 (sm_90a)", ...
  // Significand bits the budget should assume for the in-block accumulator: 24 for float32
  // round-to-nearest (the emulated backend), ~13-14 truncating for Hopper FP8 tensor cores.
  int accumulator_bits = 24;
  // The budget model the output asks to be judged with (an exec:CMD output's budget_model
  // attribute); empty: default_budget_model(backend).
  std::string budget_model;
  std::vector<float> output_f32;
  std::string shard;
  std::vector<BackendOutput> ranks;
};

}  // namespace moecheck
