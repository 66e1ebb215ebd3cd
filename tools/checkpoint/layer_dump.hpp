// One MoE layer of a Hugging Face FP8 checkpoint -> a case: what `moecheck dump` writes
// (tools/README.md, tools/checkpoint/README.md).
//
// plan_layer_dump(), in order: opens the checkpoint, reads config.json (hf_config.hpp; a dense
// layer is an input error), checks the TP and EP split against the layer, reads the hidden
// states (a captured file, or make-case's synthetic distribution drawn from the layer's H), the
// router (mlp.gate.weight, + e_score_correction_bias for the DeepSeek family), computes the
// router logits in float32 and, for routed-only storage, routes the tokens with the reference
// routing to pick the experts. Only the router's shard is read by then.
//
// write_layer_dump() writes the case expert by expert through CaseWriter (atomic): each expert's
// six tensors are read from the memory-mapped shard, sliced for TP, packed into w13 in the
// case's gate_up_layout, written, and their pages released, so peak memory is one expert.
//
// Router logits: logits[t, e] = sum over h = 0, 1, ..., H-1 in that order of
// float(hidden[t, h]) * float(gate[e, h]), accumulated in one float32 (layer_dump.cpp is
// compiled with -ffp-contract=off: every product and sum is rounded separately). hidden is the
// value the case stores (after bf16 rounding when stored as bf16). An engine's GEMM sums in
// another order; the case records the logits it was given, so the order only has to be fixed,
// not the same.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "golden/case_file.hpp"
#include "golden/generator_data.hpp"
#include "tools/checkpoint/checkpoint.hpp"
#include "tools/checkpoint/hf_config.hpp"

namespace moecheck::ckpt {

// What to dump. The TP and EP checks name the command-line options (--tp, --ep, ...).
struct DumpRequest {
  std::string checkpoint;  // the directory
  int64_t layer = -1;      // model.layers.<layer>
  // Hidden states: from hidden_file (dataset hidden_dataset when HDF5), else synthetic.
  std::string hidden_file, hidden_dataset = "hidden_states";
  int64_t tokens = 0;  // synthetic: T tokens of make-case's distribution `dist` from `seed`
  uint64_t seed = 0;
  Distribution dist = Distribution::realistic;
  std::optional<Precision> hidden_dtype;  // storage of hidden_states; default the file's (synthetic: bf16)
  bool routed_only = false;               // store only the local experts some token routes to
  int64_t tp = 1, tp_rank = 0, ep = 1, ep_rank = 0;
  GateUpLayout gate_up_layout = GateUpLayout::gate_up;
  Precision intermediate_dtype = Precision::f32, routing_weight_dtype = Precision::f32;
  std::string source;  // the case's /source: the command that writes it
};

// Everything of the case except the experts' weights, which write_layer_dump() reads.
struct LayerDump {
  std::unique_ptr<Checkpoint> checkpoint;
  HfMoeLayer layer;             // config.json's view of the layer (config: the whole layer)
  LayerTensors names;           // its tensor names
  MoeConfig config;             // the case's: TP slice of I, EP local range, layouts and dtypes
  int64_t intermediate_offset = 0;  // the TP slice: rows [offset, offset + config.intermediate_size) of I
  int64_t tokens = 0;
  Precision hidden_dtype = Precision::bf16;  // as stored (and as the router saw it)
  std::vector<float> hidden, logits, bias;   // [T, H], [T, E], [E] (bias: empty when the layer has none)
  std::vector<int64_t> experts;              // the expert ids stored, ascending
  bool stand_in = false;  // routed-only storage and no token routes to a local expert: the lowest stands in
  std::vector<std::string> notes;  // config.json's notes and the shared experts left out
  int64_t expert_bytes = 0;        // bytes of one stored expert (weights and scales)
  CaseHeader header;
};

LayerDump plan_layer_dump(const DumpRequest& req);

// Writes the case to `path` (atomically); after_expert(i) is called once expert i of
// dump.experts is written.
void write_layer_dump(const LayerDump& dump, const std::string& path, const std::function<void(size_t)>& after_expert);

}  // namespace moecheck::ckpt
