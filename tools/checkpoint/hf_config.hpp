// config.json of a Hugging Face FP8 MoE checkpoint -> the case's MoeConfig for one layer, and
// the tensor names of that layer per model family (tools/checkpoint/README.md has the tables).
//
// Families (detected by model_type, else by architectures[0]):
//   deepseek_v3 (DeepSeek-V3 / R1, DeepseekV3ForCausalLM), kimi_k2 (Kimi-K2, DeepSeek-V3
//   architecture), glm4_moe (GLM-4.5, Glm4MoeForCausalLM): sigmoid scores + e_score_correction_bias,
//   grouped top-k (n_group, topk_group), renormalized, times routed_scaling_factor: the case's
//   deepseek_v3 routing (reference/moe_routing.hpp).
//   qwen3_moe (Qwen3MoeForCausalLM): softmax, top-k, renormalized when norm_topk_prob (the case's
//   renormalize, mathematically the same as softmax -> top-k -> divide by the sum, as
//   transformers' modeling_qwen3_moe.py does) or not (softmax_topk). No bias, no groups, no
//   scaling factor.
// Every problem is InputError(config.json path, key, rule); a dense layer (no experts) is one.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "reference/moe_config.hpp"

namespace moecheck::ckpt {

enum class ModelFamily { deepseek_v3, kimi_k2, glm4_moe, qwen3_moe };
std::string_view to_string(ModelFamily f);

// What config.json says about one MoE layer.
struct HfMoeLayer {
  ModelFamily family = ModelFamily::deepseek_v3;
  std::string model_type;     // as written in config.json ("" when only architectures named it)
  int64_t layer = 0;
  // The global, unsharded layer: num_experts, top_k, hidden_size, intermediate_size
  // (moe_intermediate_size), routing, n_group, topk_group, routed_scaling_factor, scale_format
  // (quantization_config.scale_fmt), weight_block (quantization_config.weight_block_size).
  MoeConfig config;
  bool routing_bias = false;       // the layer has mlp.gate.e_score_correction_bias
  int64_t shared_experts = 0;      // n_shared_experts: not part of the case
  std::vector<std::string> notes;  // defaults taken for absent keys, for the dump's summary
};

HfMoeLayer hf_moe_layer(const nlohmann::json& config, const std::string& file, int64_t layer);
HfMoeLayer read_hf_moe_layer(const std::string& config_path, int64_t layer);

// The tensor names of one MoE layer. Every family listed uses the same module tree:
//   model.layers.L.mlp.gate.weight                              router [E, H]
//   model.layers.L.mlp.gate.e_score_correction_bias             [E] (deepseek_v3, kimi_k2, glm4_moe)
//   model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight     F8_E4M3 [out, in]
//   model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight_scale_inv   F32 [ceil(out/B), ceil(in/B)]
//   model.layers.L.mlp.shared_experts.*                          (deepseek family; not in the case)
struct LayerTensors {
  std::string prefix;         // "model.layers.L.mlp."
  std::string gate_weight;
  std::string gate_bias;      // empty when the family has none
  std::string shared_prefix;  // empty when the family has none
  std::string expert(int64_t e, std::string_view proj, bool scale) const;  // proj: gate_proj | up_proj | down_proj
};
LayerTensors layer_tensors(ModelFamily f, int64_t layer);

}  // namespace moecheck::ckpt
