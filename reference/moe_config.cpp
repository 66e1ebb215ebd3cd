// Names and validation rules of MoeConfig (the case format's /config group).
#include "reference/moe_config.hpp"

#include <cmath>
#include <fmt/format.h>

namespace moecheck {

namespace {
template <class E, size_t N>
std::optional<E> lookup(std::string_view s, const std::pair<E, std::string_view> (&table)[N]) {
  for (const auto& [value, name] : table)
    if (name == s) return value;
  return std::nullopt;
}
template <class E, size_t N>
std::string_view name_of(E v, const std::pair<E, std::string_view> (&table)[N]) {
  for (const auto& [value, name] : table)
    if (value == v) return name;
  return "?";
}

constexpr std::pair<RoutingMethod, std::string_view> kRouting[] = {
    {RoutingMethod::deepseek_v3, "deepseek_v3"},
    {RoutingMethod::renormalize, "renormalize"},
    {RoutingMethod::softmax_topk, "softmax_topk"},
    {RoutingMethod::sigmoid_renormalize, "sigmoid_renormalize"},
    {RoutingMethod::llama4, "llama4"},
};
constexpr std::pair<GateUpLayout, std::string_view> kLayout[] = {
    {GateUpLayout::gate_up, "gate_up"}, {GateUpLayout::up_gate, "up_gate"}};
constexpr std::pair<ScaleFormat, std::string_view> kScale[] = {
    {ScaleFormat::f32, "f32"}, {ScaleFormat::ue8m0, "ue8m0"}};
constexpr std::pair<Precision, std::string_view> kPrecision[] = {
    {Precision::f32, "f32"}, {Precision::bf16, "bf16"}};
constexpr std::pair<Combine, std::string_view> kCombine[] = {
    {Combine::f32, "f32"}, {Combine::bf16_slots, "bf16_slots"}, {Combine::bf16_expert_order, "bf16_expert_order"}};
constexpr std::pair<ActScaleFloor, std::string_view> kFloor[] = {
    {ActScaleFloor::eps, "eps"}, {ActScaleFloor::none, "none"}};
constexpr std::pair<QuantDivide, std::string_view> kDivide[] = {
    {QuantDivide::divide, "divide"}, {QuantDivide::reciprocal, "reciprocal"}};
}  // namespace

std::string_view to_string(RoutingMethod m) { return name_of(m, kRouting); }
std::string_view to_string(GateUpLayout l) { return name_of(l, kLayout); }
std::string_view to_string(ScaleFormat f) { return name_of(f, kScale); }
std::string_view to_string(Precision p) { return name_of(p, kPrecision); }
std::optional<RoutingMethod> parse_routing_method(std::string_view s) { return lookup(s, kRouting); }
std::optional<GateUpLayout> parse_gate_up_layout(std::string_view s) { return lookup(s, kLayout); }
std::optional<ScaleFormat> parse_scale_format(std::string_view s) { return lookup(s, kScale); }
std::optional<Precision> parse_precision(std::string_view s) { return lookup(s, kPrecision); }
std::string_view to_string(Combine v) { return name_of(v, kCombine); }
std::string_view to_string(ActScaleFloor v) { return name_of(v, kFloor); }
std::string_view to_string(QuantDivide v) { return name_of(v, kDivide); }
std::optional<Combine> parse_combine(std::string_view s) { return lookup(s, kCombine); }
std::optional<ActScaleFloor> parse_act_scale_floor(std::string_view s) { return lookup(s, kFloor); }
std::optional<QuantDivide> parse_quant_divide(std::string_view s) { return lookup(s, kDivide); }
std::string_view routing_method_names() {
  return "deepseek_v3 | renormalize | softmax_topk | sigmoid_renormalize | llama4";
}

std::vector<std::string> config_problems(const MoeConfig& c) {
  std::vector<std::string> p;
  auto need = [&](bool ok, std::string msg) {
    if (!ok) p.push_back(std::move(msg));
  };
  // Sizes are bounded so that every derived byte count fits comfortably in 64 bits and a
  // hostile file cannot make us allocate absurd buffers before a shape check fails.
  constexpr int64_t kMaxDim = int64_t(1) << 24;
  need(c.num_experts >= 1 && c.num_experts <= 65536, fmt::format("num_experts: must be in [1, 65536], got {}", c.num_experts));
  need(c.hidden_size >= 1 && c.hidden_size <= kMaxDim, fmt::format("hidden_size: must be in [1, 2^24], got {}", c.hidden_size));
  need(c.intermediate_size >= 1 && c.intermediate_size <= kMaxDim,
       fmt::format("intermediate_size: must be in [1, 2^24], got {}", c.intermediate_size));
  need(c.top_k >= 1 && c.top_k <= c.num_experts,
       fmt::format("top_k: must be in [1, num_experts = {}], got {}", c.num_experts, c.top_k));
  need(c.n_group >= 1, fmt::format("n_group: must be >= 1, got {}", c.n_group));
  if (c.n_group >= 1 && c.num_experts >= 1) {
    need(c.num_experts % c.n_group == 0,
         fmt::format("n_group: num_experts = {} must be divisible by n_group = {}", c.num_experts, c.n_group));
    need(c.topk_group >= 1 && c.topk_group <= c.n_group,
         fmt::format("topk_group: must be in [1, n_group = {}], got {}", c.n_group, c.topk_group));
    if (c.num_experts % c.n_group == 0 && c.topk_group >= 1 && c.topk_group <= c.n_group)
      need(c.top_k <= c.topk_group * (c.num_experts / c.n_group),
           fmt::format("top_k: {} exceeds the {} experts of the topk_group = {} kept groups", c.top_k,
                       c.topk_group * (c.num_experts / c.n_group), c.topk_group));
  }
  if (c.routing != RoutingMethod::deepseek_v3)
    need(c.n_group == 1 && c.topk_group == 1,
         fmt::format("n_group: grouped top-k (n_group = {}, topk_group = {}) is only defined for deepseek_v3 routing",
                     c.n_group, c.topk_group));
  if (c.routing == RoutingMethod::llama4) need(c.top_k == 1, fmt::format("top_k: llama4 routing is top-1, got {}", c.top_k));
  need(std::isfinite(c.routed_scaling_factor) && c.routed_scaling_factor > 0,
       fmt::format("routed_scaling_factor: must be finite and > 0, got {}", c.routed_scaling_factor));
  need(c.group_size >= 1 && c.group_size <= 4096, fmt::format("group_size: must be in [1, 4096], got {}", c.group_size));
  need(c.weight_block >= 1 && c.weight_block <= 4096, fmt::format("weight_block: must be in [1, 4096], got {}", c.weight_block));
  // eps keeps every activation scale finite and > 0 (fl32(eps/448) must not underflow to 0).
  need(std::isfinite(c.act_eps) && c.act_eps >= 448 * 0x1p-149 && c.act_eps <= 1.0,
       fmt::format("act_eps: must be in [448 * 2^-149, 1], got {}", c.act_eps));
  // Without a floor a tiny nonzero group has a scale below 2^-126 whose float32 reciprocal is
  // infinite, and 0 * inf = NaN: no engine we model combines the two, so it is refused.
  need(!(c.recipe.act_scale_floor == ActScaleFloor::none && c.recipe.quant_divide == QuantDivide::reciprocal),
       "quant_divide: reciprocal needs act_scale_floor = eps (without a floor 1/s overflows for tiny groups)");
  need(c.recipe.quant_divide != QuantDivide::reciprocal || c.act_eps >= 448 * 0x1p-126,
       fmt::format("act_eps: quant_divide = reciprocal needs act_eps >= 448 * 2^-126 (so that 1/s is finite), got {}",
                   c.act_eps));
  need(c.local_expert_offset >= 0, fmt::format("local_expert_offset: must be >= 0, got {}", c.local_expert_offset));
  const int64_t local = c.local_experts();
  need(local >= 1, fmt::format("local_num_experts: must be >= 1, got {}", local));
  need(c.local_expert_offset + local <= c.num_experts,
       fmt::format("local_num_experts: local_expert_offset + local_num_experts = {} exceeds num_experts = {}",
                   c.local_expert_offset + local, c.num_experts));
  return p;
}

}  // namespace moecheck
