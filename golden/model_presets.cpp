// The preset table of `moecheck make-case` (model_presets.hpp). Each real-model value is the
// field named in the comment, read from the config.json of the Hugging Face repository named
// there (huggingface.co/<repo>/blob/main/config.json).
#include "golden/model_presets.hpp"

#include <vector>

#include "reference/fp8_quant.hpp"

namespace moecheck {

namespace {

MoeConfig layer(int64_t E, int64_t H, int64_t I, int64_t k, RoutingMethod m, int64_t n_group, int64_t topk_group,
                double rsf) {
  MoeConfig c;
  c.num_experts = E;
  c.hidden_size = H;
  c.intermediate_size = I;
  c.top_k = k;
  c.routing = m;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = rsf;
  return c;
}

const std::vector<ModelPreset>& table() {
  using R = RoutingMethod;
  static const std::vector<ModelPreset> t = {
      // deepseek-ai/DeepSeek-V3 config.json (R1: same values, deepseek-ai/DeepSeek-R1 config.json):
      // n_routed_experts 256, hidden_size 7168, moe_intermediate_size 2048, num_experts_per_tok 8,
      // scoring_func sigmoid + topk_method noaux_tc (= deepseek_v3 routing with
      // e_score_correction_bias), n_group 8, topk_group 4, routed_scaling_factor 2.5.
      {"deepseek-v3", "deepseek-r1", "DeepSeek-V3 / DeepSeek-R1 MoE layer",
       "HF deepseek-ai/DeepSeek-V3 config.json",
       layer(256, 7168, 2048, 8, R::deepseek_v3, 8, 4, 2.5), true, true},
      // moonshotai/Kimi-K2-Instruct config.json (DeepSeek-V3 architecture, model_type kimi_k2):
      // n_routed_experts 384, hidden_size 7168, moe_intermediate_size 2048, num_experts_per_tok 8,
      // scoring_func sigmoid, topk_method noaux_tc, n_group 1, topk_group 1,
      // routed_scaling_factor 2.827 (FlashInfer's kimi_k2 test config: 384 experts, 1 group;
      // flashinfer-ai/flashinfer tests/moe/test_dpsk_fused_moe_fp8.py).
      {"kimi-k2", "", "Kimi-K2 MoE layer", "HF moonshotai/Kimi-K2-Instruct config.json",
       layer(384, 7168, 2048, 8, R::deepseek_v3, 1, 1, 2.827), true, true},
      // zai-org/GLM-4.5 config.json (model_type glm4_moe): n_routed_experts 160, hidden_size 5120,
      // moe_intermediate_size 1536, num_experts_per_tok 8, sigmoid scores + e_score_correction_bias
      // with n_group 1, topk_group 1, routed_scaling_factor 2.5 (THUDM slime's GLM-4.5 launch
      // script gives the same: --num-experts 160 --moe-ffn-hidden-size 1536 --hidden-size 5120
      // --moe-router-topk 8 --moe-router-topk-scaling-factor 2.5, sigmoid + expert bias).
      {"glm-4.5", "glm4.5", "GLM-4.5 (355B-A32B) MoE layer", "HF zai-org/GLM-4.5 config.json",
       layer(160, 5120, 1536, 8, R::deepseek_v3, 1, 1, 2.5), true, true},
      // Qwen/Qwen3-30B-A3B config.json: num_experts 128, hidden_size 2048,
      // moe_intermediate_size 768, num_experts_per_tok 8, norm_topk_prob true (softmax -> top-k
      // -> renormalize = our renormalize, as transformers' modeling_qwen3_moe.py routes), no
      // bias, no groups, no scaling factor.
      {"qwen3-30b-a3b", "", "Qwen3-30B-A3B MoE layer", "HF Qwen/Qwen3-30B-A3B config.json",
       layer(128, 2048, 768, 8, R::renormalize, 1, 1, 1.0), false, true},
      // Qwen/Qwen3-235B-A22B config.json: num_experts 128, hidden_size 4096,
      // moe_intermediate_size 1536, num_experts_per_tok 8, norm_topk_prob true.
      {"qwen3-235b-a22b", "", "Qwen3-235B-A22B MoE layer", "HF Qwen/Qwen3-235B-A22B config.json",
       layer(128, 4096, 1536, 8, R::renormalize, 1, 1, 1.0), false, true},

      // Tiny presets: made-up sizes with the routing structure of a real model; H and I are
      // multiples of 128 (two weight blocks where it matters) except tiny-ragged.
      {"tiny-deepseek", "", "small DeepSeek-V3-style layer (grouped sigmoid + bias routing)", "made up",
       layer(16, 256, 256, 4, R::deepseek_v3, 4, 2, 2.5), true, false},
      // The shape of the FP8 tensor-core validation matrix (BUDGETS.md §10.6): eight 128-wide
      // blocks of H, two of I, DeepSeek-V3's top-8 of 8 groups / 4.
      {"small-deepseek", "", "DeepSeek-V3-style layer of the validation matrix (E=32, H=1024, I=256, top-8)",
       "made up", layer(32, 1024, 256, 8, R::deepseek_v3, 8, 4, 2.5), true, false},
      {"tiny-kimi", "tiny-glm", "small Kimi-K2 / GLM-4.5-style layer (ungrouped sigmoid + bias routing)", "made up",
       layer(16, 256, 128, 4, R::deepseek_v3, 1, 1, 2.827), true, false},
      {"tiny-qwen", "", "small Qwen3-style layer (softmax, top-k, renormalize)", "made up",
       layer(8, 256, 128, 2, R::renormalize, 1, 1, 1.0), false, false},
      {"tiny-softmax", "", "small layer with softmax top-k without renormalization", "made up",
       layer(8, 256, 128, 2, R::softmax_topk, 1, 1, 1.0), false, false},
      {"tiny-sigmoid", "", "small layer with sigmoid + bias, top-k, renormalize", "made up",
       layer(8, 256, 128, 2, R::sigmoid_renormalize, 1, 1, 1.0), true, false},
      {"tiny-llama4", "", "small Llama-4-style layer (top-1 on the logit, sigmoid weight)", "made up",
       layer(8, 256, 128, 1, R::llama4, 1, 1, 1.0), false, false},
      // H = 320 and I = 192 are not multiples of 128: ragged edge blocks everywhere, and the
      // middle 128-row block of w13 holds the last 64 gate rows and the first 64 up rows
      // (docs/BUG-CLASSES.md #15, #25).
      {"tiny-ragged", "", "small layer with dimensions that are not multiples of 128 (ragged blocks)", "made up",
       layer(8, 320, 192, 2, R::renormalize, 1, 1, 1.0), false, false},
  };
  return t;
}

bool has_alias(std::string_view aliases, std::string_view name) {
  while (!aliases.empty()) {
    const size_t sp = aliases.find(' ');
    if (aliases.substr(0, sp) == name) return true;
    if (sp == std::string_view::npos) break;
    aliases.remove_prefix(sp + 1);
  }
  return false;
}

}  // namespace

int64_t ModelPreset::expert_bytes() const {
  const MoeConfig& c = config;
  const int64_t B = c.weight_block, H = c.hidden_size, I = c.intermediate_size;
  const int64_t codes = 2 * I * H + H * I;
  const int64_t scales = ceil_div(2 * I, B) * ceil_div(H, B) + ceil_div(H, B) * ceil_div(I, B);
  return codes + 4 * scales;
}

std::span<const ModelPreset> model_presets() { return table(); }

const ModelPreset* find_model_preset(std::string_view name) {
  for (const ModelPreset& p : table())
    if (p.name == name || has_alias(p.aliases, name)) return &p;
  return nullptr;
}

std::string model_preset_names() {
  std::string s;
  for (const ModelPreset& p : table()) {
    if (!s.empty()) s += ", ";
    s += p.name;
    if (!p.aliases.empty()) s += " (" + std::string(p.aliases) + ")";
  }
  return s;
}

}  // namespace moecheck
