// The distributions of `moecheck make-case` (golden/GENERATOR.md, "Distributions"): internal to
// golden/case_generator.cpp. Every function is a pure function of its arguments: values come
// from CounterRng(seed, stream) at indices of the full, unsharded layer.
#pragma once

#include <cstdint>
#include <vector>

#include "golden/case_file.hpp"
#include "golden/case_generator.hpp"
#include "reference/moe_routing.hpp"

namespace moecheck::gen {

// One stream per kind of draw (GENERATOR.md lists them); a stream serves either uniforms/bits
// or normals, never both at overlapping indices.
enum Stream : uint64_t {
  kHiddenBase = 1,     // normal   [t*H + h]
  kHiddenTail = 2,     // normal   [3*(t*H + h) + j], j < 3: the chi-square of the t3 tail
  kHiddenPick = 3,     // uniform  [t*H + h]: which elements get the heavy tail
  kOutlierChannel = 4, // bits [2j]: channel of outlier j; uniform [2j+1]: its factor
  kTokenRole = 5,      // uniform  [t]: tiny / huge token
  kZeroGroup = 6,      // bits [0]: the zero group of token 1; uniform [1 + t*G + g]
  kMidpoint = 7,       // bits     [t*H + h]: adversarial rounding-midpoint token
  kLogits = 10,        // normal   [t*E + e]
  kExpertOffset = 11,  // normal   [e]
  kBias = 12,          // normal   [e]
  kBiasClass = 13,     // uniform  [e]; bits [2^40], [2^40 + 1], [2^40 + 2]
  kGate = 20,          // normal   [(e*I + i)*H + h]  (i: full-layer gate row)
  kUp = 21,            // normal   [(e*I + i)*H + h]
  kDown = 22,          // normal   [(e*H + h)*I + i]  (i: full-layer column)
  kBlockSigma = 23,    // bits/uniform [4*block + j], block = ((e*3 + tensor)*NB + br)*NB + bc
};

// What the distributions depend on: never T, TP or EP.
struct DataSpec {
  uint64_t seed = 0;
  Distribution dist = Distribution::realistic;
  bool near_ties = false;      // effective (adversarial turns it on)
  MoeConfig layer;             // the global, unsharded layer of the preset
  bool routing_bias = false;
  Precision bias_dtype = Precision::f32;
};

// [T, H] hidden states (float, not yet rounded to the storage type).
std::vector<float> hidden_states(const DataSpec& s, int64_t T);
// [E] routing bias, rounded to bias_dtype (the values routing and the case both see).
std::vector<float> routing_bias(const DataSpec& s);
// [T, E] router logits with the planted ties; bias: routing_bias(s) or empty.
std::vector<float> router_logits(const DataSpec& s, int64_t T, const std::vector<float>& bias);
// Global ids of the dead experts, chosen among token 0's experts (so that they matter).
std::vector<int64_t> dead_experts(const DataSpec& s, const TokenRouting& token0);

// Which part of the full intermediate dimension a case holds.
struct WeightSlice {
  int64_t full_intermediate = 0, offset = 0, local_intermediate = 0;
  GateUpLayout layout = GateUpLayout::gate_up;
  ScaleFormat scale_format = ScaleFormat::f32;
};
ExpertWeights expert_weights(const DataSpec& s, const WeightSlice& w, int64_t expert, bool dead);

}  // namespace moecheck::gen
