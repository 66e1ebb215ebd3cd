// The gate's property sweep (gate_sweep.hpp).
#include "tools/sweep/gate_sweep.hpp"

#include <fmt/format.h>

#include <numeric>

#include "golden/engine_recipes.hpp"
#include "golden/model_presets.hpp"
#include "reference/counter_rng.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck::sweep {

std::vector<std::string> default_sweep_presets(bool gpu) {
  std::vector<std::string> v = {"tiny-deepseek", "tiny-kimi", "tiny-qwen", "tiny-softmax", "tiny-sigmoid", "tiny-llama4"};
  if (!gpu) v.push_back("tiny-ragged");
  return v;
}

GeneratorOptions sweep_case(uint64_t seed, int64_t index, const std::vector<std::string>& presets) {
  const CounterRng r{seed, kSweepStream};
  const uint64_t base = uint64_t(index) * 32;
  auto pick = [&](uint64_t j, uint64_t n) { return int64_t(r.bits(base + j) % n); };
  auto chance = [&](uint64_t j, uint64_t num, uint64_t den) { return uint64_t(r.bits(base + j) % den) < num; };
  GeneratorOptions o;
  // Grouped routing holds the most conditions (group scores, group masks, the cold token and
  // group of GENERATOR.md): a grouped preset is drawn twice as often as another.
  auto weight = [](const std::string& name) { return find_model_preset(name)->config.n_group > 1 ? 2 : 1; };
  int64_t u = pick(0, std::accumulate(presets.begin(), presets.end(), uint64_t(0),
                                      [&](uint64_t acc, const std::string& n) { return acc + weight(n); }));
  for (const std::string& name : presets)
    if ((u -= weight(name)) < 0) {
      o.preset = name;
      break;
    }
  const ModelPreset* p = find_model_preset(o.preset);
  const MoeConfig& c = p->config;
  switch (pick(1, 8)) {
    case 0: o.tokens = 1; break;
    case 1: case 2: case 3: o.tokens = 2 + pick(2, 7); break;
    case 4: case 5: case 6: o.tokens = 9 + pick(2, 32); break;
    default: o.tokens = 64 + pick(2, 97); break;
  }
  o.seed = r.bits(base + 3);
  const int64_t d = pick(4, 4);
  o.dist = d < 2 ? Distribution::realistic : d == 2 ? Distribution::uniform : Distribution::adversarial;
  o.near_ties = chance(5, 1, 4);
  o.scale_format = chance(6, 1, 2) ? ScaleFormat::ue8m0 : ScaleFormat::f32;
  o.intermediate_dtype = chance(7, 1, 2) ? Precision::bf16 : Precision::f32;
  o.routing_weight_dtype = chance(8, 1, 2) ? Precision::bf16 : Precision::f32;
  o.gate_up_layout = chance(9, 1, 2) ? GateUpLayout::up_gate : GateUpLayout::gate_up;
  o.hidden_dtype = chance(10, 1, 8) ? Precision::f32 : Precision::bf16;
  if (p->routing_bias && chance(11, 1, 8)) o.bias_dtype = Precision::bf16;
  if (chance(12, 1, 4) && shard_split_rule(c, {ShardKind::tp, 2}).empty()) {
    o.tp = 2;
    o.tp_rank = pick(13, 2);
  }
  if (chance(14, 1, 3)) {
    const int64_t n = chance(15, 1, 2) ? 2 : 4;
    if (shard_split_rule(c, {ShardKind::ep, n}).empty()) {
      o.ep = n;
      o.ep_rank = pick(16, uint64_t(n));
    }
  }
  o.routed_only = chance(17, 1, 3);
  return o;
}

std::vector<std::string> sweep_features(const GeneratorOptions& o) {
  std::vector<std::string> f;
  f.push_back("preset=" + o.preset);
  f.push_back(std::string("dist=") + std::string(to_string(o.dist)));
  f.push_back(o.tokens == 1 ? "tokens=1" : o.tokens <= 8 ? "tokens=2..8" : o.tokens <= 40 ? "tokens=9..40" : "tokens>=64");
  if (o.near_ties) f.push_back("near-ties");
  if (o.scale_format == ScaleFormat::ue8m0) f.push_back("ue8m0");
  if (o.intermediate_dtype == Precision::bf16) f.push_back("bf16-intermediate");
  if (o.routing_weight_dtype == Precision::bf16) f.push_back("bf16-weights");
  if (o.gate_up_layout == GateUpLayout::up_gate) f.push_back("up_gate");
  if (o.hidden_dtype == Precision::f32) f.push_back("f32-hidden");
  if (o.bias_dtype == Precision::bf16) f.push_back("bf16-bias");
  if (o.tp > 1) f.push_back("tp");
  if (o.ep > 1) f.push_back(o.ep_rank > 0 ? "ep-offset" : "ep-rank0");
  if (o.routed_only) f.push_back("routed-only");
  return f;
}

std::string apply_recipes(GeneratorOptions& g, const std::vector<std::string>& recipes) {
  MoeConfig rc;
  rc.intermediate_dtype = g.intermediate_dtype, rc.routing_weight_dtype = g.routing_weight_dtype;
  rc.recipe = g.recipe;
  for (const std::string& r : recipes)
    if (std::string rule = apply_recipe_setting(r, rc); !rule.empty()) return rule;
  g.intermediate_dtype = rc.intermediate_dtype, g.routing_weight_dtype = rc.routing_weight_dtype;
  g.recipe = rc.recipe;
  return "";
}

}  // namespace moecheck::sweep
