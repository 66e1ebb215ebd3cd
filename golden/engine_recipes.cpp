// Engine recipe presets and settings (engine_recipes.hpp).
#include "golden/engine_recipes.hpp"

#include <fmt/format.h>

#include "golden/case_layout.hpp"

namespace moecheck {

namespace {
constexpr std::string_view kRecipeKeys[] = {"combine", "act_scale_floor", "quant_divide", "expert_output_dtype",
                                            "silu_dtype"};
}  // namespace

std::string_view recipe_setting_names() {
  return "sglang | transformers | default | KEY=VALUE with KEY one of combine, act_scale_floor, quant_divide, "
         "expert_output_dtype, silu_dtype, intermediate_dtype, routing_weight_dtype";
}

std::string apply_recipe_setting(std::string_view setting, MoeConfig& c) {
  if (setting == "default") {
    c.recipe = EngineRecipe{};
    c.intermediate_dtype = c.routing_weight_dtype = Precision::f32;
    return "";
  }
  if (setting == "sglang") {
    c.recipe = EngineRecipe{};
    c.recipe.combine = Combine::bf16_slots;
    c.intermediate_dtype = Precision::bf16;
    return "";
  }
  if (setting == "transformers") {
    c.recipe = EngineRecipe{};
    c.recipe.combine = Combine::bf16_expert_order;
    c.recipe.act_scale_floor = ActScaleFloor::none;
    c.recipe.expert_output_dtype = c.recipe.silu_dtype = Precision::bf16;
    c.intermediate_dtype = c.routing_weight_dtype = Precision::bf16;
    return "";
  }
  const size_t eq = setting.find('=');
  if (eq == std::string_view::npos) return fmt::format("must be one of {}, got \"{}\"", recipe_setting_names(), setting);
  const std::string key(setting.substr(0, eq)), value(setting.substr(eq + 1));
  bool known = key == "intermediate_dtype" || key == "routing_weight_dtype";
  for (std::string_view k : kRecipeKeys) known |= key == k;
  if (!known) return fmt::format("unknown key \"{}\" (must be one of {})", key, recipe_setting_names());
  const std::string rule = layout::set_config_text(c, key, value);
  return rule.empty() ? "" : fmt::format("{}: {}", key, rule);
}

std::vector<std::string> recipe_settings(const EngineRecipe& r) {
  MoeConfig c, d;
  c.recipe = r;
  std::vector<std::string> s;
  for (std::string_view k : kRecipeKeys) {
    const std::string v = layout::config_value_text(c, k);
    if (v != layout::config_value_text(d, k)) s.push_back(fmt::format("{}={}", k, v));
  }
  return s;
}

}  // namespace moecheck
