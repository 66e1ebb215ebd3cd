// Model presets for `moecheck make-case`: the MoE layer dimensions and routing of real models
// (each value cited in model_presets.cpp), plus tiny presets with the same routing structures
// so that tests cover every routing method in milliseconds.
//
// A preset fixes the global layer: num_experts, top_k, hidden_size, intermediate_size (the full,
// unsharded per-expert I), routing, n_group, topk_group, routed_scaling_factor, and whether the
// routing takes a bias. Everything else of the MoeConfig (gate/up layout, scale format,
// intermediate and routing-weight precision, TP / EP slicing) comes from make-case options.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "reference/moe_config.hpp"

namespace moecheck {

struct ModelPreset {
  std::string_view name;     // "deepseek-v3"
  std::string_view aliases;  // space-separated other names ("deepseek-r1"), may be empty
  std::string_view model;    // what it stands for ("DeepSeek-V3 / DeepSeek-R1 MoE layer")
  std::string_view source;   // where the values come from
  MoeConfig config;          // the global, unsharded layer (local_num_experts = -1)
  bool routing_bias = false; // the routing takes a per-expert bias (e_score_correction_bias)
  bool full_size = false;    // a real model's layer (GBs when every expert is stored)

  // Bytes of FP8 codes plus float32 block scales of one expert of the unsharded layer.
  int64_t expert_bytes() const;
};

// Every preset, real models first, then the tiny ones.
std::span<const ModelPreset> model_presets();
// The preset called `name` (or having it among its aliases); nullptr when there is none.
const ModelPreset* find_model_preset(std::string_view name);
// "deepseek-v3 (deepseek-r1), kimi-k2, ..." for error messages.
std::string model_preset_names();

}  // namespace moecheck
