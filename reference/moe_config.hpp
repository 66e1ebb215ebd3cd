// The MoE layer configuration: one struct shared by the case format (golden/), the
// reference (reference/), the backends (kernels/, emulated) and the CLI.
//
// Field names and defaults are those of the case format's /config group (golden/FORMAT.md).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace moecheck {

// How router logits become (expert ids, weights); see reference/moe_routing.hpp for the math.
enum class RoutingMethod { deepseek_v3, renormalize, softmax_topk, sigmoid_renormalize, llama4 };
// Which half of w13's 2I rows is the gate (the SiLU input). gate_up: rows [0, I) are the gate
// (vLLM/SGLang checkpoint order, w1 then w3); up_gate: rows [0, I) are up (FlashInfer "w31").
enum class GateUpLayout { gate_up, up_gate };
// Scale bytes: f32 = any positive float32; ue8m0 = powers of two (2^ceil(log2(amax/448))).
enum class ScaleFormat { f32, ue8m0 };
// Precision a tensor is held in between two steps (GEMM1 output, SiLU*up, routing weights).
enum class Precision { f32, bf16 };

// Engine recipes: where real engines round differently from the contract's defaults
// (golden/FORMAT.md "Engine recipes", reference/BUDGETS.md §9). Every default is the behaviour
// moecheck had before these attributes existed, so older cases keep their meaning.
//
// How the routing-weighted slot outputs become the layer output:
//   f32                out = bf16(sum over slots 0..k-1 of fl32(w_j y_j)), one float32 sum
//                      (FlashInfer / TRT-LLM finalize, DeepGEMM-based paths);
//   bf16_slots         v_j = bf16(fl32(w_j y_j)) per slot, out = bf16(float32 sum of the v_j in
//                      slot order) (SGLang's Triton fused MoE: GEMM2 epilogue multiplies by the
//                      weight and stores bf16, moe_sum_reduce sums in float32);
//   bf16_expert_order  acc = 0 (bf16); for the token's experts in ascending global id:
//                      acc = bf16(fl32(acc + v_j)), v_j as above (transformers' eager experts:
//                      index_add_ into a bf16 buffer, one expert after the other).
enum class Combine { f32, bf16_slots, bf16_expert_order };
// Floor of the amax in the activation / intermediate scale rule: eps: s = max(amax, act_eps)/448;
// none: s = amax/448 (DeepSeek's reference act_quant kernel; a zero group has s = 0, see
// fp8_quant.hpp for what the reference makes of it).
enum class ActScaleFloor { eps, none };
// The FP8 quotient: divide: fl32(x / s); reciprocal: fl32(x * fl32(1 / s)).
enum class QuantDivide { divide, reciprocal };

struct EngineRecipe {
  Combine combine = Combine::f32;
  ActScaleFloor act_scale_floor = ActScaleFloor::eps;
  QuantDivide quant_divide = QuantDivide::divide;
  // GEMM2 output per slot before the routing-weight multiply (bf16: an FP8 linear that returns
  // bf16, as transformers' FP8 experts do).
  Precision expert_output_dtype = Precision::f32;
  // silu(gate) before the product with up (bf16: `act_fn(gate) * up` on bf16 tensors rounds the
  // SiLU once more; f32: silu and the product in float32, one rounding of h).
  Precision silu_dtype = Precision::f32;
  // Written out (not "= default"): nvcc compiles this header as C++17 too.
  bool operator==(const EngineRecipe& o) const {
    return combine == o.combine && act_scale_floor == o.act_scale_floor && quant_divide == o.quant_divide &&
           expert_output_dtype == o.expert_output_dtype && silu_dtype == o.silu_dtype;
  }
  bool is_default() const { return *this == EngineRecipe{}; }
};

struct MoeConfig {
  int64_t num_experts = 0;        // E: global routed experts (router_logits columns)
  int64_t top_k = 0;
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I: per expert, this shard
  RoutingMethod routing = RoutingMethod::renormalize;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  GateUpLayout gate_up_layout = GateUpLayout::gate_up;
  ScaleFormat scale_format = ScaleFormat::f32;
  Precision intermediate_dtype = Precision::f32;
  Precision routing_weight_dtype = Precision::f32;
  int64_t group_size = 128;       // activation quantization group along H and along I
  int64_t weight_block = 128;     // weight blocks are weight_block x weight_block
  double act_eps = 1e-10;         // amax floor of activation group quantization
  int64_t local_expert_offset = 0;
  int64_t local_num_experts = -1; // -1 until resolved: defaults to num_experts
  EngineRecipe recipe;            // /config combine, act_scale_floor, quant_divide, ...

  int64_t local_experts() const { return local_num_experts < 0 ? num_experts : local_num_experts; }
  bool is_local(int64_t global_expert) const {
    return global_expert >= local_expert_offset && global_expert < local_expert_offset + local_experts();
  }
};

// Every rule of a config that does not hold, as "<attribute>: <rule>" (empty when valid).
std::vector<std::string> config_problems(const MoeConfig& c);

std::string_view to_string(RoutingMethod m);
std::string_view to_string(GateUpLayout l);
std::string_view to_string(ScaleFormat f);
std::string_view to_string(Precision p);
std::optional<RoutingMethod> parse_routing_method(std::string_view s);
std::optional<GateUpLayout> parse_gate_up_layout(std::string_view s);
std::optional<ScaleFormat> parse_scale_format(std::string_view s);
std::optional<Precision> parse_precision(std::string_view s);
std::string_view to_string(Combine v);
std::string_view to_string(ActScaleFloor v);
std::string_view to_string(QuantDivide v);
std::optional<Combine> parse_combine(std::string_view s);
std::optional<ActScaleFloor> parse_act_scale_floor(std::string_view s);
std::optional<QuantDivide> parse_quant_divide(std::string_view s);

// Printing (test failure messages, RapidCheck counterexamples).
inline std::ostream& operator<<(std::ostream& os, RoutingMethod v) { return os << to_string(v); }
inline std::ostream& operator<<(std::ostream& os, GateUpLayout v) { return os << to_string(v); }
inline std::ostream& operator<<(std::ostream& os, ScaleFormat v) { return os << to_string(v); }
inline std::ostream& operator<<(std::ostream& os, Precision v) { return os << to_string(v); }
inline std::ostream& operator<<(std::ostream& os, Combine v) { return os << to_string(v); }
inline std::ostream& operator<<(std::ostream& os, ActScaleFloor v) { return os << to_string(v); }
inline std::ostream& operator<<(std::ostream& os, QuantDivide v) { return os << to_string(v); }

// Accepted spellings, for error messages ("deepseek_v3 | renormalize | ...").
std::string_view routing_method_names();

}  // namespace moecheck
