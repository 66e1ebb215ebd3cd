// `moecheck dump` through the real binary on tiny checkpoints in every family's layout
// (checkpoint_test_support.hpp): the case's config follows config.json, its expert weights are
// bit for bit the tensors written (packed per gate_up_layout, sliced for TP, picked for EP and
// --experts routed), router logits are hidden @ gate^T, the case passes run + compare, and every
// hostile checkpoint exits 2 with the file, the tensor or key, and the rule in the message.
#include <gtest/gtest.h>

#include <H5Cpp.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "golden/case_file.hpp"
#include "golden/hdf5_io.hpp"
#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_routing.hpp"
#include "tests/checkpoint_test_support.hpp"
#include "tests/generator_test_support.hpp"
#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

using namespace testing::ckpt;
using test::run_process;

const auto moecheck = test::run_moecheck;

// The case's expert slot must hold exactly the checkpoint's expert `e`, rows/columns
// [off, off + Il) of the intermediate dimension, packed per the layout.
void expect_expert_is_checkpoint(const TinySpec& s, int64_t L, int64_t e, const ExpertWeights& w, GateUpLayout layout,
                                 int64_t off, int64_t Il) {
  const int64_t H = s.H, I = s.I, B = 128, nbH = H / B, nbI = I / B;
  ASSERT_EQ(w.w13.size(), size_t(2 * Il * H));
  const int gate_half = layout == GateUpLayout::gate_up ? 0 : 1;
  size_t bad = 0;
  for (int64_t r = 0; r < 2 * Il; ++r) {
    const int proj = (r < Il) == (gate_half == 0) ? 0 : 1;  // 0 gate, 1 up
    const int64_t src_row = off + (r % Il);
    for (int64_t h = 0; h < H; ++h)
      bad += w.w13[size_t(r * H + h)] != expert_code(s, L, e, proj, uint64_t(src_row * H + h));
  }
  for (int64_t br = 0; br < 2 * Il / B; ++br) {
    const int proj = (br < Il / B) == (gate_half == 0) ? 0 : 1;
    const int64_t src = off / B + br % (Il / B);
    for (int64_t bc = 0; bc < nbH; ++bc)
      bad += w.w13_scale[size_t(br * nbH + bc)] != expert_scale(s, L, e, proj, uint64_t(src * nbH + bc));
  }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Il; ++i) bad += w.w2[size_t(h * Il + i)] != expert_code(s, L, e, 2, uint64_t(h * I + off + i));
  for (int64_t r = 0; r < nbH; ++r)
    for (int64_t c = 0; c < Il / B; ++c)
      bad += w.w2_scale[size_t(r * (Il / B) + c)] != expert_scale(s, L, e, 2, uint64_t(r * nbI + off / B + c));
  EXPECT_EQ(bad, 0u) << "expert " << e << ": " << bad << " values differ from the checkpoint";
}

struct LayoutCase {
  Layout layout;
  bool sharded;
};

std::ostream& operator<<(std::ostream& os, const LayoutCase& c) { return os << layout_name(c.layout) << (c.sharded ? " sharded" : ""); }

class DumpLayouts : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(DumpLayouts, CaseHoldsTheCheckpointsLayerAndPassesRunAndCompare) {
  const testing::ScratchDir dir(std::string("ckpt-dump-") + layout_name(GetParam().layout));
  TinySpec s;
  s.layout = GetParam().layout;
  s.sharded = GetParam().sharded;
  s.ue8m0 = s.layout == Layout::kimi_k2;
  s.reverse_data_order = s.layout == Layout::glm4_moe;
  s.gate_dtype = s.layout == Layout::qwen3_moe ? "F32" : "BF16";
  const std::string ck = dir.file("ckpt");
  write_tiny_checkpoint(ck, s);

  for (const char* layout : {"gate_up", "up_gate"}) {
    SCOPED_TRACE(layout);
    const std::string out = dir.file(std::string("case-") + layout + ".h5");
    const auto r = moecheck({"dump", "--checkpoint", ck, "--layer", "1", "--tokens", "6", "--seed", "11", "--gate-up-layout", layout,
                             "-o", out});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.err.find("dump: expert 8/8 (id 7)"), std::string::npos) << r.err;
    if (s.layout != Layout::qwen3_moe) {
      EXPECT_NE(r.out.find("shared expert"), std::string::npos) << r.out;
    }
    const CaseReader c(out);
    EXPECT_TRUE(c.validate().empty());
    const MoeConfig& cfg = c.config();
    EXPECT_EQ(cfg.num_experts, 8);
    EXPECT_EQ(cfg.top_k, 2);
    EXPECT_EQ(cfg.hidden_size, 256);
    EXPECT_EQ(cfg.intermediate_size, 256);
    EXPECT_EQ(cfg.routing, s.layout == Layout::qwen3_moe ? RoutingMethod::renormalize : RoutingMethod::deepseek_v3);
    EXPECT_EQ(cfg.scale_format, s.ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32);
    EXPECT_EQ(c.has_routing_bias(), s.layout != Layout::qwen3_moe);
    EXPECT_EQ(c.stored_experts(), 8);
    const GateUpLayout gl = std::string(layout) == "gate_up" ? GateUpLayout::gate_up : GateUpLayout::up_gate;
    EXPECT_EQ(cfg.gate_up_layout, gl);
    for (int64_t e = 0; e < 8; ++e) expect_expert_is_checkpoint(s, 1, e, c.read_expert(e), gl, 0, 256);
    EXPECT_NE(c.source().value_or("").find("moecheck dump --checkpoint"), std::string::npos);
  }
  const std::string out = dir.file("case-gate_up.h5");
  ASSERT_EQ(moecheck({"run", out, "--backend", "emulated"}).exit_code, 0);
  const auto cmp = moecheck({"compare", out});
  EXPECT_EQ(cmp.exit_code, 0) << cmp.out << cmp.err;
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, DumpLayouts,
                         ::testing::Values(LayoutCase{Layout::deepseek_v3, false}, LayoutCase{Layout::kimi_k2, true},
                                           LayoutCase{Layout::glm4_moe, false}, LayoutCase{Layout::qwen3_moe, true}),
                         [](const auto& i) { return std::string(layout_name(i.param.layout)) + (i.param.sharded ? "_sharded" : ""); });

TEST(Dump, TensorAndExpertParallelSlicesAndRoutedExperts) {
  const testing::ScratchDir dir("ckpt-dump-tp-ep");
  TinySpec s;
  s.sharded = true;
  const std::string ck = dir.file("ckpt");
  write_tiny_checkpoint(ck, s);
  const std::string out = dir.file("c.h5");
  const auto r = moecheck({"dump", "--checkpoint", ck, "--layer", "1", "--tokens", "4", "--seed", "5", "--tp", "2", "--tp-rank", "1",
                           "--ep", "2", "--ep-rank", "1", "--experts", "routed", "-q", "-o", out});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const CaseReader c(out);
  EXPECT_TRUE(c.validate().empty());
  EXPECT_EQ(c.config().intermediate_size, 128);
  EXPECT_EQ(c.config().local_expert_offset, 4);
  EXPECT_EQ(c.config().local_num_experts, 4);
  // The stored experts are exactly the local experts the reference routing picks.
  const auto logits = c.read_router_logits();
  const auto bias = c.read_routing_bias();
  const Routing routing = route(c.config(), logits.data(), bias->data(), c.tokens());
  std::set<int64_t> want;
  for (const int32_t id : routing.ids)
    if (id >= 4) want.insert(id);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(c.expert_ids(), std::vector<int64_t>(want.begin(), want.end()));
  for (const int64_t e : c.expert_ids()) expect_expert_is_checkpoint(s, 1, e, c.read_expert(e), GateUpLayout::gate_up, 128, 128);
  ASSERT_EQ(moecheck({"run", out, "--backend", "emulated"}).exit_code, 0);
  EXPECT_EQ(moecheck({"compare", out, "-q"}).exit_code, 0);
}

// Router logits from captured hidden states: the case stores the file's values, and the logits
// are hidden @ gate^T (checked against a float64 dot product within float32's error bound).
TEST(Dump, CapturedHiddenStatesFromNpyAndHdf5) {
  const testing::ScratchDir dir("ckpt-dump-hidden");
  TinySpec s;
  s.layout = Layout::qwen3_moe;
  const std::string ck = dir.file("ckpt");
  write_tiny_checkpoint(ck, s);
  const int64_t T = 3, H = 256, E = 8;
  std::vector<float> x(size_t(T * H));
  const CounterRng rng{9, 1};
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(rng.normal(i) * 2.0);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_encode(x[i]);
  write_npy_f32(dir.file("h32.npy"), T, H, x);
  write_npy_u16(dir.file("h16.npy"), T, H, xb);
  {
    H5::H5File f(dir.file("h.h5"), H5F_ACC_TRUNC);
    const hsize_t dims[2] = {hsize_t(T), hsize_t(H)};
    H5::DataSet ds = f.createDataSet("captured", H5::PredType::STD_U16LE, H5::DataSpace(2, dims));
    ds.write(xb.data(), H5::PredType::NATIVE_UINT16);
    h5::write_attr(ds, "dtype", std::string("bfloat16"));
  }
  // The router as written (rows of E x H, bf16 normals), decoded independently of dump.
  const auto tensors = tiny_tensors(s);
  std::vector<float> gate;
  for (const StTensor& t : tensors)
    if (t.name == "model.layers.1.mlp.gate.weight")
      for (size_t i = 0; i < t.data.size(); i += 2) gate.push_back(bf16_decode(uint16_t(t.data[i] | (t.data[i + 1] << 8))));
  ASSERT_EQ(gate.size(), size_t(E * H));

  struct Input {
    std::vector<std::string> args;
    Precision dtype;
  };
  for (const Input& in : {Input{{"--hidden-states", dir.file("h32.npy")}, Precision::f32},
                          Input{{"--hidden-states", dir.file("h16.npy")}, Precision::bf16},
                          Input{{"--hidden-states", dir.file("h.h5"), "--hidden-dataset", "captured"}, Precision::bf16}}) {
    SCOPED_TRACE(in.args[1]);
    std::vector<std::string> args = {"dump", "--checkpoint", ck, "--layer", "1", "-q", "-o", dir.file("c.h5")};
    args.insert(args.end(), in.args.begin(), in.args.end());
    const auto r = moecheck(args);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const CaseReader c(dir.file("c.h5"));
    ASSERT_EQ(c.tokens(), T);
    EXPECT_EQ(c.hidden_dtype(), in.dtype);
    const auto hidden = c.read_hidden_states();
    const auto logits = c.read_router_logits();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        ASSERT_EQ(hidden[size_t(t * H + h)], in.dtype == Precision::bf16 ? bf16_decode(xb[size_t(t * H + h)]) : x[size_t(t * H + h)]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        double exact = 0, mag = 0;
        for (int64_t h = 0; h < H; ++h) {
          exact += double(hidden[size_t(t * H + h)]) * double(gate[size_t(e * H + h)]);
          mag += std::fabs(double(hidden[size_t(t * H + h)]) * double(gate[size_t(e * H + h)]));
        }
        // Recursive float32 summation: |error| <= H * u * sum |x_h g_h| (u = 2^-24), plus the final rounding.
        EXPECT_LE(std::fabs(double(logits[size_t(t * E + e)]) - exact), double(H + 1) * 0x1p-24 * mag) << t << " " << e;
      }
  }
  // A hidden size that is not the layer's.
  write_npy_f32(dir.file("bad.npy"), 1, 128, std::vector<float>(128, 1.0f));
  const auto r = moecheck({"dump", "--checkpoint", ck, "--layer", "1", "--hidden-states", dir.file("bad.npy"), "-o", dir.file("x.h5")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bad.npy: holds [1, 128]: its hidden size 128 is not the layer's hidden_size 256"), std::string::npos) << r.err;
}

// --- Hostile checkpoints: exit 2, the file, the tensor or key, the rule; no case written ----
struct Hostile {
  const char* name;
  std::function<void(const std::string& dir)> make;  // writes a broken checkpoint into dir
  std::vector<std::string> message;                  // every part must be in stderr
};

const std::string kExpert = "model.layers.1.mlp.experts.3.gate_proj.weight";

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Rewrites the u64 header length of a shard.
void set_header_length(const std::string& path, uint64_t n) {
  auto b = read_all(path);
  for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(n >> (8 * i));
  write_bytes(path, b);
}

TEST(Dump, HostileCheckpointsExitTwoWithFileTensorAndRule) {
  const testing::ScratchDir dir("ckpt-dump-hostile");
  auto sharded = [] {
    TinySpec s;
    s.sharded = true;
    return s;
  };
  auto edit_entry = [](const std::string& tensor, std::function<void(nlohmann::json&)> f) {
    return [tensor, f](nlohmann::json& h) {
      if (h.contains(tensor)) f(h[tensor]);
    };
  };
  const std::vector<Hostile> cases = {
      {"truncated shard",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, sharded());
         const std::string f = d + "/" + shard_of(d, kExpert);
         auto b = read_all(f);
         b.resize(b.size() - 100);
         write_bytes(f, b);
       },
       {".safetensors: ", "run past the end of the data region"}},
      {"header length 2^63",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, sharded());
         set_header_length(d + "/" + shard_of(d, kExpert), uint64_t(1) << 63);
       },
       {".safetensors: header length: header length 9223372036854775808 exceeds the limit"}},
      {"header length past the end",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{});
         set_header_length(d + "/model.safetensors", 50'000'000);
       },
       {"model.safetensors: header length: header length 50000000 runs past the end of the file"}},
      {"overlapping offsets",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, {}, edit_entry(kExpert, [](nlohmann::json& t) {
                                 const uint64_t b = t["data_offsets"][0].get<uint64_t>();
                                 t["data_offsets"] = {b - 16, b - 16 + 256 * 256};
                               }));
       },
       {"model.safetensors: ", "overlap tensor"}},
      {"out-of-range offsets",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, {}, edit_entry(kExpert, [](nlohmann::json& t) {
                                 t["data_offsets"] = {uint64_t(1) << 40, (uint64_t(1) << 40) + 256 * 256};
                               }));
       },
       {"model.safetensors: " + kExpert + ": data_offsets [1099511627776, 1099511693312] run past the end of the data region"}},
      {"shape/byte mismatch",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, {}, edit_entry(kExpert, [](nlohmann::json& t) { t["shape"] = {256, 255}; }));
       },
       {"model.safetensors: " + kExpert + ": data_offsets", "hold 65536 bytes, but dtype F8_E4M3 and shape [256, 255] need 65280 bytes"}},
      {"unknown dtype string",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, {}, edit_entry(kExpert, [](nlohmann::json& t) { t["dtype"] = "F8_E4M3FN"; }));
       },
       {"model.safetensors: " + kExpert + ": unknown dtype \"F8_E4M3FN\""}},
      {"wrong dtype for an expert weight",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, [](std::vector<StTensor>& ts) {
           for (StTensor& t : ts)
             if (t.name == kExpert) t.dtype = "U8";
         });
       },
       {"model.safetensors: " + kExpert + ": dtype must be F8_E4M3, got U8"}},
      {"wrong shape for a scale",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, [](std::vector<StTensor>& ts) {
           for (StTensor& t : ts)
             if (t.name == "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv") t.shape = {1, 4};
         });
       },
       {"model.layers.1.mlp.experts.3.down_proj.weight_scale_inv: shape must be [2, 2], got [1, 4]"}},
      {"missing expert tensor",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, [](std::vector<StTensor>& ts) {
           std::erase_if(ts, [](const StTensor& t) { return t.name == "model.layers.1.mlp.experts.5.up_proj.weight_scale_inv"; });
         });
       },
       {"model.safetensors: model.layers.1.mlp.experts.5.up_proj.weight_scale_inv: missing tensor"}},
      {"missing tensor in the index",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, sharded(), [](std::vector<StTensor>& ts) {
           std::erase_if(ts, [](const StTensor& t) { return t.name == "model.layers.1.mlp.gate.e_score_correction_bias"; });
         });
       },
       {"model.safetensors.index.json: model.layers.1.mlp.gate.e_score_correction_bias: missing tensor (not in the index's weight_map)"}},
      {"missing router",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, [](std::vector<StTensor>& ts) {
           std::erase_if(ts, [](const StTensor& t) { return t.name == "model.layers.1.mlp.gate.weight"; });
         });
       },
       {"model.layers.1.mlp.gate.weight: missing tensor"}},
      {"non-UTF-8 header",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{}, {}, [](nlohmann::json& h) { h["__metadata__"]["note"] = "x"; });
         const std::string f = d + "/model.safetensors";
         auto b = read_all(f);
         const std::string needle = "\"note\":\"x\"";
         auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
         ASSERT_NE(it, b.end());
         *(it + 9) = 0xFF;  // the x
         write_bytes(f, b);
       },
       {"model.safetensors: header: not valid UTF-8"}},
      {"deeply nested header",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{});
         std::string deep = "{\"a\": " + std::string(5000, '[') + std::string(5000, ']') + "}";
         write_bytes(d + "/model.safetensors", raw_safetensors(deep, {}));
       },
       {"model.safetensors: header: JSON nested deeper than 16 levels"}},
      {"dense layer",
       [&](const std::string& d) { write_tiny_checkpoint(d, TinySpec{}); },
       {"config.json: first_k_dense_replace: layer 0 is a dense layer"}},
      {"bad config.json",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, TinySpec{});
         std::ofstream(d + "/config.json") << "{\"model_type\": \"deepseek_v3\",";
       },
       {"config.json: not valid JSON"}},
      {"shard name escaping the directory",
       [&](const std::string& d) {
         write_tiny_checkpoint(d, sharded());
         std::ifstream in(d + "/model.safetensors.index.json");
         nlohmann::json j = nlohmann::json::parse(in);
         j["weight_map"][kExpert] = "../evil.safetensors";
         std::ofstream(d + "/model.safetensors.index.json") << j.dump();
       },
       {"model.safetensors.index.json: weight_map: entry \"" + kExpert + "\": shard \"../evil.safetensors\" is not a plain file name"}},
  };
  for (const Hostile& h : cases) {
    SCOPED_TRACE(h.name);
    const std::string d = dir.file(std::string("c-") + std::to_string(&h - cases.data()));
    h.make(d);
    const std::string layer = std::string(h.name) == "dense layer" ? "0" : "1";
    const std::string out = d + "-case.h5";
    const auto r = moecheck({"dump", "--checkpoint", d, "--layer", layer, "--tokens", "4", "--seed", "1", "-q", "-o", out});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_EQ(r.signal, 0);
    EXPECT_EQ(r.err.rfind("moecheck: error: ", 0), 0u) << r.err;
    for (const std::string& part : h.message) EXPECT_NE(r.err.find(part), std::string::npos) << "missing \"" << part << "\" in: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

TEST(Dump, BadOptionsExitTwo) {
  const testing::ScratchDir dir("ckpt-dump-options");
  const std::string ck = dir.file("ckpt");
  write_tiny_checkpoint(ck, TinySpec{});
  auto err = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"dump", "--checkpoint", ck, "-o", dir.file("x.h5")};
    a.insert(a.end(), extra.begin(), extra.end());
    const auto r = moecheck(a);
    EXPECT_EQ(r.exit_code, 2);
    return r.err;
  };
  EXPECT_NE(err({"--tokens", "4", "--seed", "1"}).find("--layer: required"), std::string::npos);
  EXPECT_NE(err({"--layer", "1"}).find("--tokens: required"), std::string::npos);
  EXPECT_NE(err({"--layer", "1", "--tokens", "4", "--seed", "1", "--experts", "some"}).find("--experts: must be all | routed"), std::string::npos);
  EXPECT_NE(err({"--layer", "1", "--tokens", "4", "--seed", "1", "--tp", "4"}).find("--tp: intermediate_size I = 256 must split into 4 equal slices"), std::string::npos);
  EXPECT_NE(err({"--layer", "1", "--tokens", "4", "--seed", "1", "--ep", "3"}).find("--ep: num_experts E = 8 does not divide into 3"),
            std::string::npos);
  EXPECT_NE(err({"--layer", "1", "--hidden-states", dir.file("none.npy")}).find("none.npy: no such file"), std::string::npos);
}

}  // namespace
}  // namespace moecheck
