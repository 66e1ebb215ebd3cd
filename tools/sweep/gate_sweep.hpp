// The property sweep of `moecheck gate`: case i of seed S is a pure function of (S, i, presets),
// drawn with CounterRng (reference/counter_rng.hpp; never std:: distributions), so
// `moecheck gate --seed S --case i` rebuilds exactly the case a long run failed on, on any machine.
//
// What a case varies (each choice one Philox draw of stream kSweepStream at index 32 i + j):
//   preset     one of the tiny presets (every routing method, ragged blocks) or --presets;
//              grouped presets (n_group > 1) weigh 2, the others 1
//   tokens     1 (1/8), 2..8 (3/8), 9..40 (3/8), 64..160: several 128-token tiles (1/8)
//   dist       realistic (1/2: zero groups, outliers, tiny and dead scales), uniform (1/4),
//              adversarial (1/4: near-ties, rounding midpoints, all-zero logit rows)
//   near_ties  1/4 (always with adversarial)
//   scale_format ue8m0 1/2; intermediate_dtype bf16 1/2; routing_weight_dtype bf16 1/2;
//   gate_up_layout up_gate 1/2; hidden_dtype f32 1/8; bias_dtype bf16 1/8 (presets with a bias)
//   TP         1/4: 2 ranks where I/2 is a multiple of the 128 weight block, random rank
//   EP         1/3: 2 or 4 ranks dividing E, random rank (local_expert_offset > 0 on rank > 0)
//   routed_only 1/3 (zero-token experts are then absent; otherwise stored experts without tokens)
//   seed       64 random bits
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "golden/case_generator.hpp"

namespace moecheck::sweep {

inline constexpr uint64_t kSweepStream = 0x6a7e;

// The default presets: every tiny preset (tiny-glm is tiny-kimi's alias). gpu: without
// tiny-ragged (the GPU backends take H and I in whole 128-blocks).
std::vector<std::string> default_sweep_presets(bool gpu);

GeneratorOptions sweep_case(uint64_t seed, int64_t index, const std::vector<std::string>& presets);

// Pins a sweep case to engine recipes (golden/FORMAT.md "Engine recipes"; `gate --recipe`, for a
// kernel of one recipe): each setting, in order, overrides what the sweep drew for the attributes
// it names (intermediate_dtype, routing_weight_dtype and the recipe attributes); the rest of the
// draw is kept, so case i of seed S under the same recipes is always the same case. Returns the
// first setting's rule when one is not a recipe ("" when all applied).
std::string apply_recipes(GeneratorOptions& g, const std::vector<std::string>& recipes);

// The features a case exercises, as short labels ("preset=tiny-qwen", "dist=uniform", "ue8m0",
// "ep", "tokens=1", ...), for the gate's per-feature counts.
std::vector<std::string> sweep_features(const GeneratorOptions& o);

}  // namespace moecheck::sweep
