// Named engine recipes and "key=value" recipe settings (golden/FORMAT.md "Engine recipes"):
// what `moecheck make-case --recipe` and tools/capture accept.
//
//   sglang        SGLang's Triton fused MoE (fused_moe.py): GEMM1 output stored bf16
//                 (intermediate_cache1), silu_and_mul in float32 rounded to bf16, per-token-group
//                 quantization with eps and a division, GEMM2 epilogue w * acc stored bf16 per
//                 slot (intermediate_cache3), moe_sum_reduce summing the k slots in float32 and
//                 storing bf16: intermediate_dtype = bf16, combine = bf16_slots.
//   transformers  transformers' eager FP8 experts (integrations/finegrained_fp8.py FP8Expert):
//                 DeepSeek's act_quant (s = amax / 448, no eps, x / s), FP8 linears returning
//                 bf16, act_fn(gate) * up on bf16 tensors, weights cast to bf16, index_add_ into
//                 a bf16 buffer expert by expert: intermediate_dtype = silu_dtype =
//                 expert_output_dtype = routing_weight_dtype = bf16, act_scale_floor = none,
//                 combine = bf16_expert_order.
//   default       every recipe attribute at its default (and the two dtypes f32).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "reference/moe_config.hpp"

namespace moecheck {

// Applies a preset name or one "key=value" (key: a recipe attribute of /config, or
// intermediate_dtype / routing_weight_dtype) to c. Returns "" or the rule broken.
std::string apply_recipe_setting(std::string_view setting, MoeConfig& c);
// "sglang | transformers | default | key=value with key one of ...", for messages.
std::string_view recipe_setting_names();
// The non-default recipe attributes of r as "key=value" settings (empty when all are default):
// what regenerates them.
std::vector<std::string> recipe_settings(const EngineRecipe& r);

}  // namespace moecheck
