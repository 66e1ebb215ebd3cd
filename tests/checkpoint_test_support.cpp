// Tiny FP8 checkpoints in each model family's real layout (checkpoint_test_support.hpp).
#include "tests/checkpoint_test_support.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck::testing::ckpt {

namespace {

bool deepseek_family(Layout l) { return l != Layout::qwen3_moe; }

uint64_t stream_of(const TinySpec&, int64_t layer, int64_t expert, int proj) {
  return 1000 + uint64_t(layer) * 100000 + uint64_t(expert + 2) * 10 + uint64_t(proj);
}

void put_f32(std::vector<uint8_t>& out, float v) {
  const uint32_t b = std::bit_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(b >> (8 * i)));
}
void put_u16(std::vector<uint8_t>& out, uint16_t b) {
  out.push_back(uint8_t(b));
  out.push_back(uint8_t(b >> 8));
}

// An FP8 weight [rows, cols] and its scale_inv [ceil(rows/128), ceil(cols/128)] for a
// (layer, expert, proj) triple; expert -1 = dense MLP, -2 = shared expert.
void add_fp8_linear(std::vector<StTensor>& out, const TinySpec& s, const std::string& base, int64_t layer, int64_t expert,
                    int proj, uint64_t rows, uint64_t cols) {
  StTensor w{base + ".weight", "F8_E4M3", {rows, cols}, {}};
  w.data.resize(rows * cols);
  for (uint64_t i = 0; i < rows * cols; ++i) w.data[i] = expert_code(s, layer, expert, proj, i);
  const uint64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
  StTensor sc{base + ".weight_scale_inv", "F32", {br, bc}, {}};
  for (uint64_t i = 0; i < br * bc; ++i) put_f32(sc.data, expert_scale(s, layer, expert, proj, i));
  out.push_back(std::move(w));
  out.push_back(std::move(sc));
}

StTensor bf16_tensor(const std::string& name, std::vector<uint64_t> shape, uint64_t stream, uint64_t seed, double sigma) {
  StTensor t{name, "BF16", std::move(shape), {}};
  uint64_t n = 1;
  for (const uint64_t d : t.shape) n *= d;
  const CounterRng rng{seed, stream};
  for (uint64_t i = 0; i < n; ++i) put_u16(t.data, bf16_encode(rng.normal(i) * sigma));
  return t;
}

}  // namespace

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::deepseek_v3: return "deepseek_v3";
    case Layout::kimi_k2: return "kimi_k2";
    case Layout::glm4_moe: return "glm4_moe";
    case Layout::qwen3_moe: return "qwen3_moe";
  }
  return "?";
}

uint8_t expert_code(const TinySpec& s, int64_t layer, int64_t expert, int proj, uint64_t index) {
  const CounterRng rng{s.seed, stream_of(s, layer, expert, proj)};
  // Sign, an exponent field of 1..12 (|value| in [2^-6, 64) times 1.mmm) and any mantissa:
  // a spread of magnitudes without the NaN codes 0x7F / 0xFF.
  const uint64_t b = rng.bits(index);
  const uint8_t sign = uint8_t((b & 1) << 7), exp = uint8_t(1 + (b >> 1) % 12), mant = uint8_t((b >> 8) & 7);
  return uint8_t(sign | (exp << 3) | mant);
}

float expert_scale(const TinySpec& s, int64_t layer, int64_t expert, int proj, uint64_t block_index) {
  const CounterRng rng{s.seed, stream_of(s, layer, expert, proj) + 7};
  const double u = rng.uniform(block_index);
  if (s.ue8m0) return std::ldexp(1.0f, -10 - int(u * 4));  // powers of two (scale_fmt ue8m0)
  return float((1.0 + u) * 0x1p-10);
}

std::vector<StTensor> tiny_tensors(const TinySpec& s) {
  std::vector<StTensor> t;
  const uint64_t H = uint64_t(s.H), I = uint64_t(s.I), E = uint64_t(s.E), vocab = 16;
  t.push_back(bf16_tensor("model.embed_tokens.weight", {vocab, H}, 1, s.seed, 1.0));
  t.push_back(bf16_tensor("model.norm.weight", {H}, 2, s.seed, 1.0));
  t.push_back(bf16_tensor("lm_head.weight", {vocab, H}, 3, s.seed, 0.05));
  for (int64_t L = 0; L < s.layers; ++L) {
    const std::string p = fmt::format("model.layers.{}.", L);
    t.push_back(bf16_tensor(p + "input_layernorm.weight", {H}, 10 + uint64_t(L), s.seed, 1.0));
    const bool dense = s.layout == Layout::qwen3_moe ? L == 0 : L < s.first_dense;
    if (dense) {
      add_fp8_linear(t, s, p + "mlp.gate_proj", L, -1, 0, 512, H);
      add_fp8_linear(t, s, p + "mlp.up_proj", L, -1, 1, 512, H);
      add_fp8_linear(t, s, p + "mlp.down_proj", L, -1, 2, H, 512);
      continue;
    }
    StTensor gate = bf16_tensor(p + "mlp.gate.weight", {E, H}, 100 + uint64_t(L), s.seed, 0.06);
    if (s.gate_dtype == "F32") {
      StTensor g{gate.name, "F32", gate.shape, {}};
      for (size_t i = 0; i < gate.data.size(); i += 2) put_f32(g.data, bf16_decode(uint16_t(gate.data[i] | (gate.data[i + 1] << 8))));
      gate = std::move(g);
    }
    t.push_back(std::move(gate));
    if (deepseek_family(s.layout)) {
      StTensor b{p + "mlp.gate.e_score_correction_bias", "F32", {E}, {}};
      const CounterRng rng{s.seed, 200 + uint64_t(L)};
      for (uint64_t e = 0; e < E; ++e) put_f32(b.data, float(rng.normal(e) * 0.02));
      t.push_back(std::move(b));
      add_fp8_linear(t, s, p + "mlp.shared_experts.gate_proj", L, -2, 0, I, H);
      add_fp8_linear(t, s, p + "mlp.shared_experts.up_proj", L, -2, 1, I, H);
      add_fp8_linear(t, s, p + "mlp.shared_experts.down_proj", L, -2, 2, H, I);
    }
    for (int64_t e = 0; e < s.E; ++e) {
      const std::string x = fmt::format("{}mlp.experts.{}.", p, e);
      add_fp8_linear(t, s, x + "gate_proj", L, e, 0, I, H);
      add_fp8_linear(t, s, x + "up_proj", L, e, 1, I, H);
      add_fp8_linear(t, s, x + "down_proj", L, e, 2, H, I);
    }
  }
  return t;
}

nlohmann::json tiny_config(const TinySpec& s) {
  nlohmann::json q = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  if (s.ue8m0) q["scale_fmt"] = "ue8m0";
  nlohmann::json c = {{"hidden_size", s.H},          {"moe_intermediate_size", s.I}, {"intermediate_size", 512},
                      {"num_experts_per_tok", s.top_k}, {"num_hidden_layers", s.layers}, {"quantization_config", q},
                      {"torch_dtype", "bfloat16"},   {"vocab_size", 16}};
  switch (s.layout) {
    case Layout::deepseek_v3:
    case Layout::kimi_k2:
      c["architectures"] = {"DeepseekV3ForCausalLM"};
      c["model_type"] = s.layout == Layout::kimi_k2 ? "kimi_k2" : "deepseek_v3";
      c["n_routed_experts"] = s.E;
      c["n_shared_experts"] = 1;
      c["n_group"] = s.layout == Layout::kimi_k2 ? 1 : 2;
      c["topk_group"] = 1;
      c["routed_scaling_factor"] = s.layout == Layout::kimi_k2 ? 2.827 : 2.5;
      c["scoring_func"] = "sigmoid";
      c["topk_method"] = "noaux_tc";
      c["norm_topk_prob"] = true;
      c["first_k_dense_replace"] = s.first_dense;
      c["moe_layer_freq"] = 1;
      c["num_nextn_predict_layers"] = 0;
      break;
    case Layout::glm4_moe:  // GLM-4.5's config.json has no scoring_func / topk_method
      c["architectures"] = {"Glm4MoeForCausalLM"};
      c["model_type"] = "glm4_moe";
      c["n_routed_experts"] = s.E;
      c["n_shared_experts"] = 1;
      c["n_group"] = 1;
      c["topk_group"] = 1;
      c["routed_scaling_factor"] = 2.5;
      c["norm_topk_prob"] = true;
      c["first_k_dense_replace"] = s.first_dense;
      break;
    case Layout::qwen3_moe:
      c["architectures"] = {"Qwen3MoeForCausalLM"};
      c["model_type"] = "qwen3_moe";
      c["num_experts"] = s.E;
      c["norm_topk_prob"] = true;
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = {0};
      break;
  }
  return c;
}

std::vector<uint8_t> raw_safetensors(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> safetensors_bytes(const std::vector<StTensor>& tensors, bool reverse_order, const HeaderEdit& edit) {
  std::vector<const StTensor*> order;
  for (const StTensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [&](const StTensor* a, const StTensor* b) {
    return reverse_order ? a->name > b->name : a->name < b->name;
  });
  nlohmann::json h = nlohmann::json::object();
  h["__metadata__"] = {{"format", "pt"}};
  std::vector<uint8_t> data;
  for (const StTensor* t : order) {
    const uint64_t begin = data.size();
    data.insert(data.end(), t->data.begin(), t->data.end());
    h[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {begin, uint64_t(data.size())}}};
  }
  if (edit) edit(h);
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';  // the reference writer's padding
  return raw_safetensors(text, data);
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_tiny_checkpoint(const std::string& dir, const TinySpec& s, const std::function<void(std::vector<StTensor>&)>& tensors_edit,
                           const HeaderEdit& header_edit) {
  std::filesystem::create_directories(dir);
  std::vector<StTensor> tensors = tiny_tensors(s);
  if (tensors_edit) tensors_edit(tensors);
  {
    std::ofstream c(dir + "/config.json");
    c << tiny_config(s).dump(2) << "\n";
  }
  if (!s.sharded) {
    write_bytes(dir + "/model.safetensors", safetensors_bytes(tensors, s.reverse_data_order, header_edit));
    return;
  }
  // Three shards, by position in name order (a layer's experts straddle shards).
  std::sort(tensors.begin(), tensors.end(), [](const StTensor& a, const StTensor& b) { return a.name < b.name; });
  std::vector<std::vector<StTensor>> shards(3);
  for (size_t i = 0; i < tensors.size(); ++i) shards[i * 3 / tensors.size()].push_back(tensors[i]);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  uint64_t total = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
    for (const StTensor& t : shards[k]) {
      index["weight_map"][t.name] = name;
      total += t.data.size();
    }
    write_bytes(dir + "/" + name, safetensors_bytes(shards[k], s.reverse_data_order, header_edit));
  }
  index["metadata"]["total_size"] = total;
  std::ofstream out(dir + "/model.safetensors.index.json");
  out << index.dump(2) << "\n";
}

std::string shard_of(const std::string& dir, const std::string& tensor) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (!std::filesystem::exists(index)) return "model.safetensors";
  std::ifstream in(index);
  const nlohmann::json j = nlohmann::json::parse(in);
  return j["weight_map"].at(tensor).get<std::string>();
}

namespace {
void write_npy(const std::string& path, const char* descr, int64_t rows, int64_t cols, const void* data, size_t bytes) {
  std::string h = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}, {}), }}", descr, rows, cols);
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::vector<uint8_t> out;
  out.reserve(10 + h.size() + bytes);
  for (const uint8_t b : {uint8_t(0x93), uint8_t('N'), uint8_t('U'), uint8_t('M'), uint8_t('P'), uint8_t('Y'), uint8_t(1), uint8_t(0),
                          uint8_t(h.size()), uint8_t(h.size() >> 8)})
    out.push_back(b);
  out.insert(out.end(), h.begin(), h.end());
  const auto* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + bytes);
  write_bytes(path, out);
}
}  // namespace

void write_npy_f32(const std::string& path, int64_t rows, int64_t cols, const std::vector<float>& v) {
  write_npy(path, "<f4", rows, cols, v.data(), v.size() * 4);
}
void write_npy_u16(const std::string& path, int64_t rows, int64_t cols, const std::vector<uint16_t>& v) {
  write_npy(path, "<u2", rows, cols, v.data(), v.size() * 2);
}

}  // namespace moecheck::testing::ckpt
