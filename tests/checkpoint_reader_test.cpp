// tools/checkpoint in-process: the safetensors parser on valid and hostile bytes (each rule of
// tools/checkpoint/README.md gives an InputError naming the tensor or key and the rule), the
// config.json mapping of every family, dense layers, and the .npy parser.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/checkpoint_test_support.hpp"
#include "tests/generator_test_support.hpp"
#include "tools/checkpoint/checkpoint.hpp"
#include "tools/checkpoint/hf_config.hpp"
#include "tools/checkpoint/hidden_input.hpp"
#include "tools/checkpoint/safetensors.hpp"

namespace moecheck {
namespace {

using namespace testing::ckpt;
using moecheck::ckpt::parse_safetensors;

std::vector<StTensor> two_tensors() {
  return {StTensor{"a.weight", "F32", {2, 3}, std::vector<uint8_t>(24, 1)},
          StTensor{"b.weight", "F8_E4M3", {4}, std::vector<uint8_t>{1, 2, 3, 4}}};
}

// The InputError a buffer gives, as "where: rule" (empty when it parses).
std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    parse_safetensors(bytes, "f.safetensors");
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "f.safetensors");
    return e.where() + ": " + e.rule();
  }
  return "";
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& where, const std::string& rule_part) {
  const std::string e = error_of(bytes);
  EXPECT_EQ(e.rfind(where + ": ", 0), 0u) << "expected where \"" << where << "\", got: " << e;
  EXPECT_NE(e.find(rule_part), std::string::npos) << "expected \"" << rule_part << "\" in: " << e;
}

TEST(Safetensors, ParsesWhatTheIndependentWriterWrites) {
  for (const bool reverse : {false, true}) {
    const auto bytes = safetensors_bytes(two_tensors(), reverse);
    const auto h = parse_safetensors(bytes, "f");
    ASSERT_EQ(h.tensors.size(), 2u);
    const auto* a = h.find("a.weight");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dtype, moecheck::ckpt::Dtype::F32);
    EXPECT_EQ(a->shape, (std::vector<uint64_t>{2, 3}));
    EXPECT_EQ(a->bytes(), 24u);
    EXPECT_EQ(h.find("b.weight")->begin, reverse ? 0u : 24u);
    EXPECT_EQ(h.metadata.at("format"), "pt");
    EXPECT_EQ(h.data_start % 8, 0u);  // the writer pads the header to 8 bytes
  }
  // Empty header, rank-0 and empty tensors are valid.
  EXPECT_EQ(error_of(raw_safetensors("{}", {})), "");
  EXPECT_EQ(error_of(raw_safetensors(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                                     R"("z":{"dtype":"BF16","shape":[0,7],"data_offsets":[4,4]}})",
                                     std::vector<uint8_t>(4))),
            "");
}

TEST(Safetensors, HeaderLengthRules) {
  expect_error({1, 2, 3}, "header length", "fewer than the 8-byte header length");
  auto b = safetensors_bytes(two_tensors());
  // 2^63: over the limit and past the end.
  std::vector<uint8_t> huge = b;
  for (int i = 0; i < 8; ++i) huge[size_t(i)] = i == 7 ? 0x80 : 0;
  expect_error(huge, "header length", "header length 9223372036854775808 exceeds the limit of 100000000 bytes");
  std::vector<uint8_t> past = b;
  past[0] = 0xFF, past[1] = 0xFF, past[2] = 0x0F;  // ~1 MiB, under the limit, past the end
  for (int i = 3; i < 8; ++i) past[size_t(i)] = 0;
  expect_error(past, "header length", "runs past the end of the file");
  // Truncated inside the header, and inside the data.
  expect_error(std::vector<uint8_t>(b.begin(), b.begin() + 20), "header length", "runs past the end of the file");
  expect_error(std::vector<uint8_t>(b.begin(), b.end() - 1), "b.weight", "run past the end of the data region");
}

TEST(Safetensors, JsonRules) {
  expect_error(raw_safetensors("{\"a\xff\": 1}", {}), "header", "not valid UTF-8 (byte 3");
  expect_error(raw_safetensors("{\"\xc0\xaf\": 1}", {}), "header", "not valid UTF-8");  // overlong '/'
  std::string deep(100000, '[');
  expect_error(raw_safetensors(deep, {}), "header", "JSON nested deeper than 16 levels");
  expect_error(raw_safetensors("{\"a\": {\"b\": [1, 2}", {}), "header", "not valid JSON");
  expect_error(raw_safetensors("[1, 2]", {}), "header", "must be a JSON object, got a array");
  expect_error(raw_safetensors(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                               R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                               {0, 0}),
               "header", "duplicate key \"t\"");
  expect_error(raw_safetensors(R"({"__metadata__": {"k": 1}})", {}), "__metadata__", "must be a string");
  expect_error(raw_safetensors("{} \x01", {}), "header", "not valid JSON");
  expect_error(raw_safetensors(std::string("{}\0\0", 4), {}), "header", "not valid JSON");  // NUL padding is not JSON whitespace
  EXPECT_EQ(error_of(raw_safetensors("{}      ", {})), "");                                   // space padding is
}

TEST(Safetensors, TensorEntryRules) {
  auto with = [](const char* entry, size_t data) {
    return raw_safetensors(std::string(R"({"t": )") + entry + "}", std::vector<uint8_t>(data));
  };
  expect_error(with(R"({"dtype":"F8_E4M3FN","shape":[2],"data_offsets":[0,2]})", 2), "t", "unknown dtype \"F8_E4M3FN\"");
  expect_error(with(R"({"dtype":7,"shape":[2],"data_offsets":[0,2]})", 2), "t", "dtype must be a string");
  expect_error(with(R"({"shape":[2],"data_offsets":[0,2]})", 2), "t", "missing \"dtype\"");
  expect_error(with(R"({"dtype":"U8","shape":[2],"data_offsets":[0,2],"strides":[1]})", 2), "t", "unknown key \"strides\"");
  expect_error(with(R"({"dtype":"U8","shape":[-2],"data_offsets":[0,2]})", 2), "t", "every shape dimension must be a non-negative integer");
  expect_error(with(R"({"dtype":"U8","shape":[2.0],"data_offsets":[0,2]})", 2), "t", "non-negative integer");
  expect_error(with(R"({"dtype":"U8","shape":[2],"data_offsets":[0]})", 2), "t", "data_offsets must be an array [begin, end]");
  expect_error(with(R"({"dtype":"U8","shape":[2],"data_offsets":[2,0]})", 2), "t", "begin is after end");
  expect_error(with(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})", 8), "t",
               "data_offsets [0, 4] hold 4 bytes, but dtype F32 and shape [2] need 8 bytes");
  expect_error(with(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]})", 2), "t", "more than 2^64 elements");
  expect_error(with(R"({"dtype":"F64","shape":[4294967296,1073741824],"data_offsets":[0,2]})", 2), "t", "more than 2^64 bits");
  expect_error(with(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})", 2), "t", "do not end on a byte boundary");
  expect_error(with(R"({"dtype":"U8","shape":[2],"data_offsets":[0,18446744073709551615]})", 2), "t", "run past the end of the data region");
  expect_error(with(R"({"dtype":"U8","shape":[2],"data_offsets":[0,18446744073709551616]})", 2), "t", "data_offsets end must be");
  expect_error(with("[1]", 0), "t", "a tensor entry must be a JSON object");
}

TEST(Safetensors, CoverageRules) {
  const char* overlap = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})";
  expect_error(raw_safetensors(overlap, std::vector<uint8_t>(6)), "b", "data_offsets [2, 6] overlap tensor \"a\" [0, 4]");
  const char* hole = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})";
  expect_error(raw_safetensors(hole, std::vector<uint8_t>(5)), "b", "leave bytes [2, 3) of the data region to no tensor");
  const char* late = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})";
  expect_error(raw_safetensors(late, std::vector<uint8_t>(3)), "a", "leave bytes [0, 1)");
  const char* one = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  expect_error(raw_safetensors(one, std::vector<uint8_t>(3)), "", "trailing bytes after the last tensor");
  const char* same = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  expect_error(raw_safetensors(same, std::vector<uint8_t>(2)), "b", "overlap tensor \"a\"");
}

TEST(Safetensors, HostileNamesAreEscapedInMessages) {
  const std::string e = error_of(raw_safetensors("{\"\\u001b[31mx\": {\"dtype\":\"Q\",\"shape\":[],\"data_offsets\":[0,0]}}", {}));
  EXPECT_NE(e.find("\\x1b[31mx"), std::string::npos) << e;
  EXPECT_EQ(e.find('\x1b'), std::string::npos) << e;
}

// --- config.json ---------------------------------------------------------------------------
moecheck::ckpt::HfMoeLayer layer_of(const nlohmann::json& j, int64_t L) { return moecheck::ckpt::hf_moe_layer(j, "config.json", L); }

std::string config_error(const nlohmann::json& j, int64_t L) {
  try {
    layer_of(j, L);
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "config.json");
    return e.where() + ": " + e.rule();
  }
  return "";
}

TEST(HfConfig, EveryFamilyMapsToTheCaseConfig) {
  struct Want {
    Layout layout;
    moecheck::ckpt::ModelFamily family;
    RoutingMethod routing;
    int64_t n_group;
    double rsf;
    bool bias;
  };
  using F = moecheck::ckpt::ModelFamily;
  for (const Want w : {Want{Layout::deepseek_v3, F::deepseek_v3, RoutingMethod::deepseek_v3, 2, 2.5, true},
                       Want{Layout::kimi_k2, F::kimi_k2, RoutingMethod::deepseek_v3, 1, 2.827, true},
                       Want{Layout::glm4_moe, F::glm4_moe, RoutingMethod::deepseek_v3, 1, 2.5, true},
                       Want{Layout::qwen3_moe, F::qwen3_moe, RoutingMethod::renormalize, 1, 1.0, false}}) {
    TinySpec s;
    s.layout = w.layout;
    s.ue8m0 = w.layout == Layout::deepseek_v3;
    const auto h = layer_of(tiny_config(s), 1);
    SCOPED_TRACE(layout_name(w.layout));
    EXPECT_EQ(h.family, w.family);
    EXPECT_EQ(h.config.routing, w.routing);
    EXPECT_EQ(h.config.num_experts, 8);
    EXPECT_EQ(h.config.top_k, 2);
    EXPECT_EQ(h.config.hidden_size, 256);
    EXPECT_EQ(h.config.intermediate_size, 256);
    EXPECT_EQ(h.config.n_group, w.n_group);
    EXPECT_EQ(h.config.topk_group, 1);
    EXPECT_DOUBLE_EQ(h.config.routed_scaling_factor, w.rsf);
    EXPECT_EQ(h.routing_bias, w.bias);
    EXPECT_EQ(h.shared_experts, w.bias ? 1 : 0);
    EXPECT_EQ(h.config.weight_block, 128);
    EXPECT_EQ(h.config.scale_format, s.ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32);
    // Layer 0 is dense in every tiny layout.
    const std::string dense = config_error(tiny_config(s), 0);
    EXPECT_NE(dense.find("layer 0 is a dense layer"), std::string::npos) << dense;
    EXPECT_NE(config_error(tiny_config(s), 2).find("layer 2 does not exist"), std::string::npos);
  }
  TinySpec q;
  q.layout = Layout::qwen3_moe;
  auto j = tiny_config(q);
  j["norm_topk_prob"] = false;
  EXPECT_EQ(layer_of(j, 1).config.routing, RoutingMethod::softmax_topk);
}

TEST(HfConfig, BadKeysNameTheKey) {
  const auto base = tiny_config(TinySpec{});
  auto e = [&](const std::function<void(nlohmann::json&)>& f) {
    nlohmann::json j = base;
    f(j);
    return config_error(j, 1);
  };
  EXPECT_EQ(e([](auto& j) { j.erase("n_routed_experts"); }), "n_routed_experts: required key missing");
  EXPECT_EQ(e([](auto& j) { j["num_experts_per_tok"] = "8"; }), "num_experts_per_tok: must be an integer, got \"8\"");
  EXPECT_NE(e([](auto& j) { j["scoring_func"] = "softmax"; }).find("scoring_func: must be \"sigmoid\""), std::string::npos);
  EXPECT_NE(e([](auto& j) { j["topk_method"] = "greedy"; }).find("topk_method: must be \"noaux_tc\""), std::string::npos);
  EXPECT_NE(e([](auto& j) { j["norm_topk_prob"] = false; }).find("norm_topk_prob: false is not supported"), std::string::npos);
  EXPECT_NE(e([](auto& j) { j.erase("quantization_config"); }).find("quantization_config: required key missing"), std::string::npos);
  EXPECT_NE(e([](auto& j) { j["quantization_config"]["quant_method"] = "gptq"; }).find("quantization_config.quant_method: must be \"fp8\""),
            std::string::npos);
  EXPECT_NE(e([](auto& j) { j["quantization_config"]["fmt"] = "e5m2"; }).find("quantization_config.fmt"), std::string::npos);
  EXPECT_NE(e([](auto& j) { j["quantization_config"]["weight_block_size"] = {128, 64}; }).find("blocks must be square"), std::string::npos);
  EXPECT_NE(e([](auto& j) { j["quantization_config"]["scale_fmt"] = "e8m0x"; }).find("quantization_config.scale_fmt"), std::string::npos);
  EXPECT_NE(e([](auto& j) { j["quantization_config"]["activation_scheme"] = "static"; }).find("activation_scheme"), std::string::npos);
  EXPECT_NE(e([](auto& j) { j["model_type"] = "llama"; j["architectures"] = {"LlamaForCausalLM"}; }).find("unsupported model \"llama\""),
            std::string::npos);
  EXPECT_NE(e([](auto& j) { j["moe_layer_freq"] = 2; }).find("moe_layer_freq: layer 1 is a dense layer"), std::string::npos);
}

// --- .npy ----------------------------------------------------------------------------------
TEST(Npy, StrictParser) {
  const testing::ScratchDir dir("ckpt-npy");
  write_npy_f32(dir.file("a.npy"), 2, 3, {1, 2, 3, 4, 5, 6.5f});
  auto h = moecheck::ckpt::read_hidden_states_file(dir.file("a.npy"));
  EXPECT_EQ(h.tokens, 2);
  EXPECT_EQ(h.hidden, 3);
  EXPECT_EQ(h.dtype, Precision::f32);
  EXPECT_EQ(h.values.back(), 6.5f);
  write_npy_u16(dir.file("b.npy"), 1, 2, {0x3F80, 0xC040});  // 1.0, -3.0 in bfloat16
  h = moecheck::ckpt::read_hidden_states_file(dir.file("b.npy"));
  EXPECT_EQ(h.dtype, Precision::bf16);
  EXPECT_EQ(h.values, (std::vector<float>{1.0f, -3.0f}));

  auto npy_error = [](const std::string& header, size_t data) {
    std::vector<uint8_t> b;
    b.reserve(10 + header.size() + data);
    for (const int c : {0x93, int('N'), int('U'), int('M'), int('P'), int('Y'), 1, 0}) b.push_back(uint8_t(c));
    b.push_back(uint8_t(header.size()));
    b.push_back(uint8_t(header.size() >> 8));
    b.insert(b.end(), header.begin(), header.end());
    b.resize(b.size() + data);
    try {
      moecheck::ckpt::parse_npy(b, "x.npy");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(npy_error("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }\n", 16).find("descr '<f8' is not accepted"), std::string::npos);
  EXPECT_NE(npy_error("{'descr': '|V2', 'fortran_order': False, 'shape': (1, 2), }\n", 4).find("ml_dtypes.bfloat16"), std::string::npos);
  EXPECT_NE(npy_error("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2), }\n", 8).find("fortran_order True"), std::string::npos);
  EXPECT_NE(npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8).find("shape must be (T, H)"), std::string::npos);
  EXPECT_NE(npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }\n", 7).find("truncated"), std::string::npos);
  EXPECT_NE(npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), 'x': 1}\n", 8).find("npy header"), std::string::npos);
  EXPECT_NE(npy_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }\n", 0).find("truncated"), std::string::npos);
  std::vector<float> nan = {1.0f, std::nanf("")};
  write_npy_f32(dir.file("n.npy"), 1, 2, nan);
  EXPECT_THROW(moecheck::ckpt::read_hidden_states_file(dir.file("n.npy")), InputError);
}

}  // namespace
}  // namespace moecheck
