// config.json -> HfMoeLayer (hf_config.hpp). Sources of the keys and their meaning: HF
// config.json files of deepseek-ai/DeepSeek-V3, moonshotai/Kimi-K2-Instruct, zai-org/GLM-4.5,
// Qwen/Qwen3-30B-A3B (key table: tools/checkpoint/README.md) and the transformers model code for
// which layers are sparse (deepseek_v3: layer >= first_k_dense_replace and layer % moe_layer_freq
// == 0; glm4_moe: layer >= first_k_dense_replace; qwen3_moe: layer not in mlp_only_layers and
// (layer + 1) % decoder_sparse_step == 0).
#include "tools/checkpoint/hf_config.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "reference/errors.hpp"
#include "tools/checkpoint/checkpoint.hpp"

namespace moecheck::ckpt {

namespace {

using nlohmann::json;

struct Keys {
  const json& j;
  const std::string& file;

  const json* find(const std::string& key) const {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const std::string& key) const {
    const json* v = find(key);
    if (!v) throw InputError(file, key, "required key missing");
    return as_int(*v, key);
  }
  int64_t integer_or(const std::string& key, int64_t def) const {
    const json* v = find(key);
    return v ? as_int(*v, key) : def;
  }
  int64_t as_int(const json& v, const std::string& key) const {
    if (!v.is_number_integer()) throw InputError(file, key, fmt::format("must be an integer, got {}", v.dump()));
    return v.get<int64_t>();
  }
  double real(const std::string& key) const {
    const json* v = find(key);
    if (!v) throw InputError(file, key, "required key missing");
    if (!v->is_number()) throw InputError(file, key, fmt::format("must be a number, got {}", v->dump()));
    return v->get<double>();
  }
  std::optional<bool> boolean(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw InputError(file, key, fmt::format("must be true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw InputError(file, key, fmt::format("must be a string, got {}", v->dump()));
    return v->get<std::string>();
  }
};

ModelFamily detect(const Keys& k, std::string& model_type) {
  const auto mt = k.string("model_type");
  model_type = mt.value_or("");
  if (mt == "deepseek_v3") return ModelFamily::deepseek_v3;
  if (mt == "kimi_k2") return ModelFamily::kimi_k2;
  if (mt == "glm4_moe") return ModelFamily::glm4_moe;
  if (mt == "qwen3_moe") return ModelFamily::qwen3_moe;
  std::string arch;
  if (const json* a = k.find("architectures"); a && a->is_array() && !a->empty() && (*a)[0].is_string())
    arch = (*a)[0].get<std::string>();
  if (arch == "DeepseekV3ForCausalLM") return ModelFamily::deepseek_v3;
  if (arch == "Glm4MoeForCausalLM") return ModelFamily::glm4_moe;
  if (arch == "Qwen3MoeForCausalLM") return ModelFamily::qwen3_moe;
  throw InputError(k.file, "model_type",
                   fmt::format("unsupported model \"{}\" (architectures \"{}\"): dump reads deepseek_v3, kimi_k2, "
                               "glm4_moe and qwen3_moe checkpoints",
                               model_type, arch));
}

void read_quantization(const Keys& top, MoeConfig& c) {
  const json* q = top.find("quantization_config");
  if (!q) throw InputError(top.file, "quantization_config", "required key missing: not an FP8 block-scale checkpoint");
  if (!q->is_object()) throw InputError(top.file, "quantization_config", "must be an object");
  const Keys k{*q, top.file};
  auto where = [](const char* key) { return std::string("quantization_config.") + key; };
  const auto method = k.string("quant_method");
  if (method != "fp8")
    throw InputError(top.file, where("quant_method"),
                     fmt::format("must be \"fp8\" (FP8 block-scale weights), got {}", method ? "\"" + *method + "\"" : "nothing"));
  if (const auto fmt_ = k.string("fmt"); fmt_ && *fmt_ != "e4m3")
    throw InputError(top.file, where("fmt"), fmt::format("must be \"e4m3\" (float8_e4m3fn weights), got \"{}\"", *fmt_));
  if (const auto act = k.string("activation_scheme"); act && *act != "dynamic")
    throw InputError(top.file, where("activation_scheme"),
                     fmt::format("must be \"dynamic\" (per-token-group activation scales computed at run time), got \"{}\"", *act));
  const json* wb = k.find("weight_block_size");
  if (!wb) throw InputError(top.file, where("weight_block_size"), "required key missing (the 128x128 weight blocks)");
  if (!wb->is_array() || wb->size() != 2 || !(*wb)[0].is_number_integer() || !(*wb)[1].is_number_integer())
    throw InputError(top.file, where("weight_block_size"), fmt::format("must be [rows, columns] integers, got {}", wb->dump()));
  const int64_t br = (*wb)[0].get<int64_t>(), bc = (*wb)[1].get<int64_t>();
  if (br != bc)
    throw InputError(top.file, where("weight_block_size"),
                     fmt::format("blocks must be square (the case has one weight_block), got [{}, {}]", br, bc));
  if (br < 1 || br > 4096) throw InputError(top.file, where("weight_block_size"), fmt::format("must be in [1, 4096], got {}", br));
  c.weight_block = br;
  const auto sf = k.string("scale_fmt");
  if (!sf) c.scale_format = ScaleFormat::f32;
  else if (*sf == "ue8m0") c.scale_format = ScaleFormat::ue8m0;
  else throw InputError(top.file, where("scale_fmt"), fmt::format("must be \"ue8m0\" or absent (float32 scales), got \"{}\"", *sf));
}

void check_layer_range(const Keys& k, int64_t layer) {
  const int64_t layers = k.integer("num_hidden_layers");
  const int64_t mtp = k.integer_or("num_nextn_predict_layers", 0);
  if (layer < 0 || layer >= layers + mtp)
    throw InputError(k.file, "num_hidden_layers",
                     fmt::format("layer {} does not exist: the model has layers 0..{}{}", layer, layers + mtp - 1,
                                 mtp ? fmt::format(" ({} of them multi-token-prediction)", mtp) : ""));
}

}  // namespace

std::string_view to_string(ModelFamily f) {
  switch (f) {
    case ModelFamily::deepseek_v3: return "deepseek_v3";
    case ModelFamily::kimi_k2: return "kimi_k2";
    case ModelFamily::glm4_moe: return "glm4_moe";
    case ModelFamily::qwen3_moe: return "qwen3_moe";
  }
  return "?";
}

HfMoeLayer hf_moe_layer(const json& j, const std::string& file, int64_t layer) {
  if (!j.is_object()) throw InputError(file, "", "must be a JSON object");
  const Keys k{j, file};
  HfMoeLayer h;
  h.layer = layer;
  h.family = detect(k, h.model_type);
  MoeConfig& c = h.config;
  c.local_num_experts = -1;
  c.hidden_size = k.integer("hidden_size");
  c.intermediate_size = k.integer("moe_intermediate_size");
  c.top_k = k.integer("num_experts_per_tok");
  check_layer_range(k, layer);

  if (h.family == ModelFamily::qwen3_moe) {
    c.num_experts = k.integer("num_experts");
    const int64_t step = k.integer_or("decoder_sparse_step", 1);
    if (step < 1) throw InputError(file, "decoder_sparse_step", fmt::format("must be >= 1, got {}", step));
    std::vector<int64_t> dense;
    if (const json* m = k.find("mlp_only_layers")) {
      if (!m->is_array()) throw InputError(file, "mlp_only_layers", "must be an array of layer indices");
      for (const json& v : *m) dense.push_back(k.as_int(v, "mlp_only_layers"));
    }
    if (std::find(dense.begin(), dense.end(), layer) != dense.end())
      throw InputError(file, "mlp_only_layers", fmt::format("layer {} is a dense layer (listed in mlp_only_layers): it has no experts", layer));
    if ((layer + 1) % step != 0)
      throw InputError(file, "decoder_sparse_step",
                       fmt::format("layer {} is a dense layer (decoder_sparse_step = {}: layer L has experts when (L + 1) % {} == 0)",
                                   layer, step, step));
    const auto norm = k.boolean("norm_topk_prob");
    if (!norm) h.notes.push_back("norm_topk_prob absent: false (the transformers Qwen3MoeConfig default)");
    c.routing = norm.value_or(false) ? RoutingMethod::renormalize : RoutingMethod::softmax_topk;
    c.n_group = c.topk_group = 1;
    c.routed_scaling_factor = 1.0;
    h.routing_bias = false;
    h.shared_experts = 0;
  } else {
    c.num_experts = k.integer("n_routed_experts");
    c.n_group = k.integer("n_group");
    c.topk_group = k.integer("topk_group");
    c.routed_scaling_factor = k.real("routed_scaling_factor");
    c.routing = RoutingMethod::deepseek_v3;
    h.routing_bias = true;
    const int64_t first_dense = k.integer("first_k_dense_replace");
    if (layer < first_dense)
      throw InputError(file, "first_k_dense_replace",
                       fmt::format("layer {} is a dense layer without experts (first_k_dense_replace = {}: the MoE layers start at "
                                   "layer {})",
                                   layer, first_dense, first_dense));
    if (h.family != ModelFamily::glm4_moe) {
      const int64_t freq = k.integer_or("moe_layer_freq", 1);
      if (freq < 1) throw InputError(file, "moe_layer_freq", fmt::format("must be >= 1, got {}", freq));
      if (layer % freq != 0)
        throw InputError(file, "moe_layer_freq", fmt::format("layer {} is a dense layer (moe_layer_freq = {})", layer, freq));
    }
    if (const auto sf = k.string("scoring_func"); sf && *sf != "sigmoid")
      throw InputError(file, "scoring_func", fmt::format("must be \"sigmoid\" (DeepSeek-V3 routing), got \"{}\"", *sf));
    if (const auto tm = k.string("topk_method"); tm && *tm != "noaux_tc")
      throw InputError(file, "topk_method",
                       fmt::format("must be \"noaux_tc\" (top-k on sigmoid + e_score_correction_bias), got \"{}\"", *tm));
    const auto norm = k.boolean("norm_topk_prob");
    if (norm == false)
      throw InputError(file, "norm_topk_prob",
                       "false is not supported: the case's deepseek_v3 routing renormalizes the chosen weights");
    if (!norm) h.notes.push_back("norm_topk_prob absent: true (DeepSeek-V3 routing)");
    h.shared_experts = k.integer_or("n_shared_experts", 0);
  }
  read_quantization(k, c);
  return h;
}

HfMoeLayer read_hf_moe_layer(const std::string& config_path, int64_t layer) {
  const std::string text = read_json_file(config_path, 16u << 20);
  return hf_moe_layer(json::parse(text), config_path, layer);
}

std::string LayerTensors::expert(int64_t e, std::string_view proj, bool scale) const {
  return fmt::format("{}experts.{}.{}.{}", prefix, e, proj, scale ? "weight_scale_inv" : "weight");
}

LayerTensors layer_tensors(ModelFamily f, int64_t layer) {
  LayerTensors t;
  t.prefix = fmt::format("model.layers.{}.mlp.", layer);
  t.gate_weight = t.prefix + "gate.weight";
  if (f != ModelFamily::qwen3_moe) {
    t.gate_bias = t.prefix + "gate.e_score_correction_bias";
    t.shared_prefix = t.prefix + "shared_experts.";
  }
  return t;
}

}  // namespace moecheck::ckpt
