// The version-1 case layout: /config attribute table and dataset specs (see case_layout.hpp).
#include "golden/case_layout.hpp"

#include <fmt/format.h>

#include "golden/hdf5_io.hpp"
#include "reference/tail_bound.hpp"
#include "reference/fp8_quant.hpp"

namespace moecheck::layout {

namespace {

constexpr ConfigAttr kConfigAttrs[] = {
    {"num_experts", AttrKind::integer, true},
    {"top_k", AttrKind::integer, true},
    {"hidden_size", AttrKind::integer, true},
    {"intermediate_size", AttrKind::integer, true},
    {"routing", AttrKind::text, true},
    {"n_group", AttrKind::integer, false},
    {"topk_group", AttrKind::integer, false},
    {"routed_scaling_factor", AttrKind::real, false},
    {"gate_up_layout", AttrKind::text, false},
    {"scale_format", AttrKind::text, false},
    {"intermediate_dtype", AttrKind::text, false},
    {"routing_weight_dtype", AttrKind::text, false},
    {"group_size", AttrKind::integer, false},
    {"weight_block", AttrKind::integer, false},
    {"act_eps", AttrKind::real, false},
    {"local_expert_offset", AttrKind::integer, false},
    {"local_num_experts", AttrKind::integer, false},
    {"combine", AttrKind::text, false},
    {"act_scale_floor", AttrKind::text, false},
    {"quant_divide", AttrKind::text, false},
    {"expert_output_dtype", AttrKind::text, false},
    {"silu_dtype", AttrKind::text, false},
};

int64_t* int_field(MoeConfig& c, std::string_view n) {
  if (n == "num_experts") return &c.num_experts;
  if (n == "top_k") return &c.top_k;
  if (n == "hidden_size") return &c.hidden_size;
  if (n == "intermediate_size") return &c.intermediate_size;
  if (n == "n_group") return &c.n_group;
  if (n == "topk_group") return &c.topk_group;
  if (n == "group_size") return &c.group_size;
  if (n == "weight_block") return &c.weight_block;
  if (n == "local_expert_offset") return &c.local_expert_offset;
  if (n == "local_num_experts") return &c.local_num_experts;
  return nullptr;
}

double* real_field(MoeConfig& c, std::string_view n) {
  if (n == "routed_scaling_factor") return &c.routed_scaling_factor;
  if (n == "act_eps") return &c.act_eps;
  return nullptr;
}

template <class E>
std::string set_enum(E& field, std::optional<E> parsed, std::string_view names, const std::string& v) {
  if (!parsed) return fmt::format("must be one of {}, got \"{}\"", names, v);
  field = *parsed;
  return "";
}

Dim known(int64_t v, std::string symbol, bool ok) { return {ok ? v : -1, std::move(symbol)}; }

}  // namespace

std::span<const ConfigAttr> config_attrs() { return kConfigAttrs; }

std::string config_value_text(const MoeConfig& c, std::string_view n) {
  MoeConfig copy = c;
  if (int64_t* p = int_field(copy, n)) return std::to_string(n == "local_num_experts" ? c.local_experts() : *p);
  if (double* p = real_field(copy, n)) return fmt::format("{}", *p);
  if (n == "routing") return std::string(to_string(c.routing));
  if (n == "gate_up_layout") return std::string(to_string(c.gate_up_layout));
  if (n == "scale_format") return std::string(to_string(c.scale_format));
  if (n == "intermediate_dtype") return std::string(to_string(c.intermediate_dtype));
  if (n == "routing_weight_dtype") return std::string(to_string(c.routing_weight_dtype));
  if (n == "combine") return std::string(to_string(c.recipe.combine));
  if (n == "act_scale_floor") return std::string(to_string(c.recipe.act_scale_floor));
  if (n == "quant_divide") return std::string(to_string(c.recipe.quant_divide));
  if (n == "expert_output_dtype") return std::string(to_string(c.recipe.expert_output_dtype));
  if (n == "silu_dtype") return std::string(to_string(c.recipe.silu_dtype));
  return "?";
}

std::string set_config_int(MoeConfig& c, std::string_view n, int64_t v) {
  int64_t* p = int_field(c, n);
  if (!p) return "not an integer attribute";
  *p = v;
  return "";
}

std::string set_config_real(MoeConfig& c, std::string_view n, double v) {
  double* p = real_field(c, n);
  if (!p) return "not a real attribute";
  *p = v;
  return "";
}

std::string set_config_text(MoeConfig& c, std::string_view n, const std::string& v) {
  if (n == "routing") return set_enum(c.routing, parse_routing_method(v), routing_method_names(), v);
  if (n == "gate_up_layout") return set_enum(c.gate_up_layout, parse_gate_up_layout(v), "gate_up | up_gate", v);
  if (n == "scale_format") return set_enum(c.scale_format, parse_scale_format(v), "f32 | ue8m0", v);
  if (n == "intermediate_dtype") return set_enum(c.intermediate_dtype, parse_precision(v), "f32 | bf16", v);
  if (n == "routing_weight_dtype") return set_enum(c.routing_weight_dtype, parse_precision(v), "f32 | bf16", v);
  EngineRecipe& r = c.recipe;
  if (n == "combine") return set_enum(r.combine, parse_combine(v), "f32 | bf16_slots | bf16_expert_order", v);
  if (n == "act_scale_floor") return set_enum(r.act_scale_floor, parse_act_scale_floor(v), "eps | none", v);
  if (n == "quant_divide") return set_enum(r.quant_divide, parse_quant_divide(v), "divide | reciprocal", v);
  if (n == "expert_output_dtype") return set_enum(r.expert_output_dtype, parse_precision(v), "f32 | bf16", v);
  if (n == "silu_dtype") return set_enum(r.silu_dtype, parse_precision(v), "f32 | bf16", v);
  return "not a text attribute";
}

std::string encoding_rule(Encoding e) {
  switch (e) {
    case Encoding::float_tensor: return "must be float32, or uint16 holding bfloat16 bits with attribute dtype = \"bfloat16\"";
    case Encoding::f32: return "must be float32";
    case Encoding::f64: return "must be float64";
    case Encoding::fp8_codes: return "must be uint8 holding float8_e4m3fn codes with attribute dtype = \"float8_e4m3fn\"";
    case Encoding::int_ids: return "must be an integer type (int32 preferred)";
    case Encoding::int32: return "must be int32";
    case Encoding::group: return "must be a group";
  }
  return "?";
}

std::vector<Spec> input_specs(const MoeConfig& c, bool ok, int64_t T) {
  const bool t_ok = T >= 1;
  const Dim t = known(T, "T", t_ok), h = known(c.hidden_size, "H", ok), e = known(c.num_experts, "E", ok);
  const Dim hg = known(ok ? ceil_div(c.hidden_size, c.group_size) : -1, fmt::format("ceil(H/{})", c.group_size), ok);
  std::vector<Spec> s = {
      {"hidden_states", Encoding::float_tensor, {t, h}},
      {"hidden_states_fp8", Encoding::fp8_codes, {t, h}, Presence::optional},
      {"hidden_states_scale", Encoding::f32, {t, hg}, Presence::optional},
      {"router_logits", Encoding::f32, {t, e}},
      {"routing_bias", Encoding::float_tensor, {e}, Presence::optional},
  };
  if (ok && c.routing == RoutingMethod::deepseek_v3) s.back().presence = Presence::required;
  if (ok && c.routing != RoutingMethod::deepseek_v3 && c.routing != RoutingMethod::sigmoid_renormalize) {
    s.back().presence = Presence::forbidden;
    s.back().forbidden_rule = fmt::format(
        "routing = {} does not use a routing bias; a stored bias would be silently ignored, so it is refused "
        "(only deepseek_v3 and sigmoid_renormalize take one)",
        to_string(c.routing));
  }
  return s;
}

std::vector<Spec> weight_specs(const MoeConfig& c, bool ok, int64_t stored) {
  const int64_t B = c.weight_block;
  const Dim s = known(stored, "E_stored", ok && stored >= 1);
  const Dim i2 = known(2 * c.intermediate_size, "2I", ok), h = known(c.hidden_size, "H", ok),
            i = known(c.intermediate_size, "I", ok);
  auto blocks = [&](int64_t n, const char* sym) {
    return known(ok ? ceil_div(n, B) : -1, fmt::format("ceil({}/{})", sym, B), ok);
  };
  return {
      {"w13", Encoding::fp8_codes, {s, i2, h}},
      {"w13_scale", Encoding::f32, {s, blocks(2 * c.intermediate_size, "2I"), blocks(c.hidden_size, "H")}},
      {"w2", Encoding::fp8_codes, {s, h, i}},
      {"w2_scale", Encoding::f32, {s, blocks(c.hidden_size, "H"), blocks(c.intermediate_size, "I")}},
      {"expert_ids", Encoding::int_ids, {Dim{-1, "E_stored"}}, Presence::optional},
  };
}

std::vector<Spec> output_specs(const MoeConfig& c, bool ok, int64_t T) {
  const Dim t = known(T, "T", T >= 1), h = known(c.hidden_size, "H", ok), k = known(c.top_k, "k", ok);
  return {
      {"output", Encoding::float_tensor, {t, h}},
      {"topk_ids", Encoding::int_ids, {t, k}, Presence::optional},
      {"topk_weights", Encoding::float_tensor, {t, k}, Presence::optional},
      {"expert_outputs", Encoding::float_tensor, {t, k, h}, Presence::optional},
  };
}

std::vector<Spec> reference_specs(const MoeConfig& c, bool ok, int64_t T) {
  const Dim t = known(T, "T", T >= 1), h = known(c.hidden_size, "H", ok), k = known(c.top_k, "k", ok);
  return {
      {"output", Encoding::f64, {t, h}},
      {"topk_ids", Encoding::int32, {t, k}},
      {"topk_weights", Encoding::f64, {t, k}},
      {"selection_margin", Encoding::f64, {t}},
      {"expert_outputs", Encoding::f64, {t, k, h}, Presence::optional},
      // Quantized tier written with a budget model (attribute budget_model; reference/BUDGETS.md).
      {"budget", Encoding::f64, {t, h}, Presence::optional},
      {"slot_budget", Encoding::f64, {t, k, h}, Presence::optional},
      {"noise_var", Encoding::f64, {t, h}, Presence::optional},
      {"slot_flip_projection", Encoding::f64, {t, k}, Presence::optional},
      {"slot_flip_tail", Encoding::f64, {t, k, known(kFlipTailWidth, "65", true)}, Presence::optional},
      {"slot_energy_tail", Encoding::f64, {t, k, known(kEnergyTailWidth, "66", true)}, Presence::optional},
      {"slot_noise_var", Encoding::f64, {t, k, h}, Presence::optional},
      {"requant_direction", Encoding::f64, {t, h}, Presence::optional},
      {"requant_terms", Encoding::f64, {t, known(4, "4", true)}, Presence::optional},
      {"requant_flip_tail", Encoding::f64, {t, k, known(kFlipTailWidth, "65", true)}, Presence::optional},
  };
}

Spec ranks_spec() { return {"ranks", Encoding::group, {}, Presence::optional}; }

std::vector<Spec> rank_specs(const MoeConfig& c, bool ok, int64_t T, int64_t ranks) {
  const Dim t = known(T, "T", T >= 1), h = known(c.hidden_size, "H", ok);
  std::vector<Spec> s;
  for (int64_t r = 0; r < ranks; ++r) s.push_back({std::to_string(r), Encoding::float_tensor, {t, h}});
  return s;
}

const Spec* find_spec(const std::vector<Spec>& specs, std::string_view name) {
  for (const Spec& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

std::string spec_names(const std::vector<Spec>& specs) {
  std::vector<std::string> n;
  for (const Spec& s : specs) n.push_back(s.name);
  if (n.size() > 8) n.erase(n.begin() + 3, n.end() - 1), n.insert(n.end() - 1, "...");  // a group of many ranks
  return fmt::format("{}", fmt::join(n, ", "));
}

std::string shape_text(const std::vector<Dim>& shape) {
  std::vector<std::string> sym, val;
  for (const Dim& d : shape) {
    sym.push_back(d.symbol);
    val.push_back(d.value >= 0 ? std::to_string(d.value) : "?");
  }
  return fmt::format("[{}] = [{}]", fmt::join(sym, ", "), fmt::join(val, ", "));
}

std::string check_encoding(const H5::DataSet& ds, Encoding enc, const std::string& file, const std::string& path) {
  const h5::TypeInfo t = h5::guard(file, path, [&] { return h5::type_info(ds.getDataType()); });
  const std::string where_attr = path + "@dtype";
  std::optional<std::string> attr;
  if (h5::guard(file, path, [&] { return ds.attrExists("dtype"); }))
    attr = h5::read_string_attr(h5::guard(file, path, [&] { return ds.openAttribute("dtype"); }), file, where_attr);
  auto refuse = [&] { throw InputError(file, path, encoding_rule(enc) + "; got " + t.name()); };

  std::string dtype;
  switch (enc) {
    case Encoding::float_tensor:
      if (h5::is_f32(t)) {
        dtype = "float32";
      } else if (h5::is_uint(t, 2)) {
        if (!attr) throw InputError(file, path, "uint16 data needs attribute dtype = \"bfloat16\" (bfloat16 bits)");
        dtype = "bfloat16";
      } else {
        refuse();
      }
      break;
    case Encoding::f32:
      if (!h5::is_f32(t)) refuse();
      dtype = "float32";
      break;
    case Encoding::f64:
      if (!h5::is_f64(t)) refuse();
      dtype = "float64";
      break;
    case Encoding::fp8_codes:
      if (!h5::is_uint(t, 1)) refuse();
      if (!attr) throw InputError(file, path, "uint8 FP8 codes need attribute dtype = \"float8_e4m3fn\"");
      dtype = "float8_e4m3fn";
      break;
    case Encoding::int_ids:
      if (t.cls != h5::TypeClass::integer || t.size > 8) refuse();
      dtype = t.name();
      break;
    case Encoding::int32:
      if (!(t.cls == h5::TypeClass::integer && t.is_signed && t.size == 4)) refuse();
      dtype = "int32";
      break;
    case Encoding::group:
      refuse();
  }
  // A dtype attribute, when present, must say what the data is: a float32 dataset tagged
  // "bfloat16" (or uint8 codes tagged "float8_e5m2") is a writer bug we must not guess around.
  if (attr && *attr != dtype)
    throw InputError(file, where_attr,
                     fmt::format("must be \"{}\" for {} data, got \"{}\"", dtype, t.name(), *attr));
  return dtype;
}

}  // namespace moecheck::layout
