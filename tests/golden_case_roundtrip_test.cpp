// Case format round trips: everything CaseWriter writes, CaseReader reads back bit for bit
// (bf16 values decoded exactly), in token ranges and expert by expert; outputs and references
// added atomically; temporaries never left behind; chunking as documented.
#include <gtest/gtest.h>

#include <algorithm>

#include "golden/hdf5_io.hpp"
#include "reference/fp8_formats.hpp"
#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

using test::SmallCase;
using test::TempDir;

std::vector<std::string> dir_entries(const TempDir& d) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(d.path())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

OutputData sample_output(const MoeConfig& c, int64_t T, Precision dtype) {
  OutputData o;
  o.attributes = {{"backend", "emulated"}, {"device", "cpu"}, {"created", "2025-01-01T00:00:00Z"}, {"note", "x"}};
  o.output_dtype = dtype;
  for (int64_t i = 0; i < T * c.hidden_size; ++i) o.output.push_back(float(i % 19 - 9) / 16.0f);
  for (int64_t i = 0; i < T * c.top_k; ++i) o.topk_ids.push_back(int32_t(i % c.num_experts));
  for (int64_t i = 0; i < T * c.top_k; ++i) o.topk_weights.push_back(0.25f + float(i % 3) / 8.0f);
  for (int64_t i = 0; i < T * c.top_k * c.hidden_size; ++i) o.expert_outputs.push_back(float(i % 7) - 3.0f);
  return o;
}

ReferenceData sample_reference(const MoeConfig& c, int64_t T, double salt) {
  ReferenceData r;
  r.tool_version = "moecheck 0.1.0";
  r.input_hash = "0123456789abcdef";
  r.attributes = {{"budget_model", "fp32"}};
  for (int64_t i = 0; i < T * c.hidden_size; ++i) r.output.push_back(salt + 1.0 / double(i + 3));
  for (int64_t i = 0; i < T * c.top_k; ++i) r.topk_ids.push_back(int32_t((i * 3) % c.num_experts));
  for (int64_t i = 0; i < T * c.top_k; ++i) r.topk_weights.push_back(1.0 / double(i + 2));
  for (int64_t t = 0; t < T; ++t) r.selection_margin.push_back(0.5 / double(t + 1));
  for (int64_t i = 0; i < T * c.top_k * c.hidden_size; ++i) r.expert_outputs.push_back(double(i) / 7.0);
  return r;
}

void expect_same_expert(const ExpertWeights& got, const ExpertWeights& want) {
  EXPECT_EQ(got.w13, want.w13);
  EXPECT_EQ(got.w13_scale, want.w13_scale);
  EXPECT_EQ(got.w2, want.w2);
  EXPECT_EQ(got.w2_scale, want.w2_scale);
}

TEST(CaseRoundTrip, EveryDatasetAndAttribute) {
  TempDir dir("roundtrip");
  SmallCase s = test::small_case();
  s.header.routing_bias_dtype = Precision::bf16;
  const std::string path = dir.file("case.h5");
  {
    CaseWriter w(path, s.header);
    w.write_hidden_states(s.hidden);
    w.write_hidden_fp8(s.hidden_fp8, s.hidden_scale);
    w.write_router_logits(s.logits);
    w.write_routing_bias(s.bias);
    for (size_t e = 0; e < s.experts.size(); ++e) w.write_expert(int64_t(e), s.experts[e]);
    w.add_output("emulated", sample_output(s.header.config, s.header.tokens, Precision::bf16));
    w.add_reference("ideal", sample_reference(s.header.config, s.header.tokens, 0.0));
    w.commit();
  }
  EXPECT_EQ(dir_entries(dir), std::vector<std::string>{"case.h5"});  // no temporary left

  const CaseReader r(path);
  const MoeConfig& c = r.config();
  const MoeConfig& want = s.header.config;
  EXPECT_EQ(r.format_version(), 1);
  EXPECT_EQ(r.description(), s.header.description);
  EXPECT_EQ(r.source(), s.header.source);
  EXPECT_EQ(c.num_experts, want.num_experts);
  EXPECT_EQ(c.top_k, want.top_k);
  EXPECT_EQ(c.hidden_size, want.hidden_size);
  EXPECT_EQ(c.intermediate_size, want.intermediate_size);
  EXPECT_EQ(c.routing, want.routing);
  EXPECT_EQ(c.n_group, 2);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.act_eps, 1e-10);
  EXPECT_EQ(c.local_experts(), 8);
  EXPECT_TRUE(r.config_defaults().empty());  // the writer writes every attribute
  EXPECT_EQ(r.tokens(), 5);

  EXPECT_EQ(r.hidden_dtype(), Precision::bf16);
  EXPECT_EQ(r.read_hidden_states(), s.hidden);
  ASSERT_TRUE(r.has_hidden_fp8());
  const HiddenFp8 q = r.read_hidden_fp8();
  EXPECT_EQ(q.codes, s.hidden_fp8);
  EXPECT_EQ(q.scales, s.hidden_scale);
  EXPECT_EQ(r.read_router_logits(), s.logits);
  const auto bias = r.read_routing_bias();
  ASSERT_TRUE(bias.has_value());
  for (size_t e = 0; e < s.bias.size(); ++e) EXPECT_EQ((*bias)[e], bf16_round(s.bias[e])) << e;

  // Token ranges are hyperslabs of the same rows.
  const int64_t H = c.hidden_size;
  const std::vector<float> rows = r.read_hidden_states(2, 2);
  EXPECT_EQ(rows, std::vector<float>(s.hidden.begin() + 2 * H, s.hidden.begin() + 4 * H));
  EXPECT_EQ(r.read_router_logits(4, 1), std::vector<float>(s.logits.end() - 8, s.logits.end()));
  EXPECT_THROW(r.read_hidden_states(4, 2), InputError);

  ASSERT_EQ(r.stored_experts(), 8);
  EXPECT_FALSE(r.experts_subset());
  for (int64_t e = 0; e < 8; ++e) {
    const ExpertWeights w = r.read_expert(e);
    EXPECT_EQ(w.expert, e);
    expect_same_expert(w, s.experts[size_t(e)]);
  }

  const auto outs = r.outputs();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].name, "emulated");
  EXPECT_EQ(outs[0].attributes.at("backend"), "emulated");
  EXPECT_EQ(outs[0].attributes.at("note"), "x");
  EXPECT_EQ(outs[0].output_dtype, Precision::bf16);
  EXPECT_TRUE(outs[0].has_topk_ids && outs[0].has_topk_weights && outs[0].has_expert_outputs);
  const OutputData want_out = sample_output(c, 5, Precision::bf16);
  const OutputData o = r.read_output("emulated");
  EXPECT_EQ(o.output, want_out.output);  // bf16-exact values survive the bf16 storage
  EXPECT_EQ(o.topk_ids, want_out.topk_ids);
  EXPECT_EQ(o.topk_weights, want_out.topk_weights);
  EXPECT_EQ(o.expert_outputs, want_out.expert_outputs);
  const OutputData part = r.read_output("emulated", 1, 2, false);
  EXPECT_EQ(part.token_begin, 1);
  EXPECT_EQ(part.output, std::vector<float>(want_out.output.begin() + H, want_out.output.begin() + 3 * H));
  EXPECT_EQ(part.topk_ids, std::vector<int32_t>(want_out.topk_ids.begin() + 2, want_out.topk_ids.begin() + 6));
  EXPECT_TRUE(part.expert_outputs.empty());
  EXPECT_THROW(r.read_output("missing"), InputError);

  EXPECT_EQ(r.reference_tiers(), std::vector<std::string>{"ideal"});
  const auto ref = r.read_reference("ideal");
  ASSERT_TRUE(ref.has_value());
  const ReferenceData want_ref = sample_reference(c, 5, 0.0);
  EXPECT_EQ(ref->tool_version, want_ref.tool_version);
  EXPECT_EQ(ref->input_hash, want_ref.input_hash);
  EXPECT_EQ(ref->attributes, want_ref.attributes);
  EXPECT_EQ(ref->output, want_ref.output);
  EXPECT_EQ(ref->topk_ids, want_ref.topk_ids);
  EXPECT_EQ(ref->topk_weights, want_ref.topk_weights);
  EXPECT_EQ(ref->selection_margin, want_ref.selection_margin);
  EXPECT_EQ(ref->expert_outputs, want_ref.expert_outputs);
  EXPECT_FALSE(r.read_reference("quantized").has_value());

  EXPECT_TRUE(r.validate().empty());
}

TEST(CaseRoundTrip, Float32HiddenStatesNoBiasExpertSubset) {
  TempDir dir("subset");
  SmallCase s = test::small_case();
  MoeConfig& c = s.header.config;
  c.routing = RoutingMethod::renormalize;
  c.n_group = c.topk_group = 1;
  c.local_expert_offset = 4;
  c.local_num_experts = 4;
  c.gate_up_layout = GateUpLayout::up_gate;
  c.scale_format = ScaleFormat::ue8m0;
  s.header.routing_bias = false;
  s.header.hidden_fp8 = false;
  s.header.hidden_dtype = Precision::f32;
  s.header.expert_ids = {5, 7};
  for (float& x : s.hidden) x = x / 3.0f;  // not bf16-exact: float32 storage keeps it
  s.experts.resize(2);
  const std::string path = dir.file("subset.h5");
  test::write_case(path, s);

  const CaseReader r(path);
  EXPECT_EQ(r.config().gate_up_layout, GateUpLayout::up_gate);
  EXPECT_EQ(r.config().scale_format, ScaleFormat::ue8m0);
  EXPECT_EQ(r.hidden_dtype(), Precision::f32);
  EXPECT_EQ(r.read_hidden_states(), s.hidden);
  EXPECT_FALSE(r.has_hidden_fp8());
  EXPECT_FALSE(r.read_routing_bias().has_value());
  EXPECT_TRUE(r.experts_subset());
  EXPECT_EQ(r.expert_ids(), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(r.slot_of(7), 1);
  EXPECT_FALSE(r.slot_of(6).has_value());
  expect_same_expert(r.read_expert(7), s.experts[1]);
  try {
    r.read_expert(4);
    FAIL() << "expert 4 is not stored";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "/weights/expert_ids");
    EXPECT_NE(e.rule().find("expert 4 is not stored"), std::string::npos);
  }
  EXPECT_TRUE(r.validate().empty());
}

TEST(CaseRoundTrip, AddOutputAndReferenceAtomically) {
  TempDir dir("add");
  const SmallCase s = test::small_case();
  const std::string path = dir.file("case.h5"), copy = dir.file("copy.h5");
  test::write_case(path, s);
  const MoeConfig& c = s.header.config;

  // -o OUT: the original stays as it was.
  add_output_to_case(path, "cuda", sample_output(c, 5, Precision::f32), copy);
  EXPECT_TRUE(CaseReader(path).outputs().empty());
  ASSERT_EQ(CaseReader(copy).outputs().size(), 1u);

  // In place, then replaced by different data.
  add_reference_to_case(path, "quantized", sample_reference(c, 5, 0.0));
  add_reference_to_case(path, "quantized", sample_reference(c, 5, 10.0));
  add_output_to_case(path, "cuda", sample_output(c, 5, Precision::f32));
  const CaseReader r(path);
  EXPECT_EQ(r.reference_tiers(), std::vector<std::string>{"quantized"});
  EXPECT_EQ(r.read_reference("quantized")->output, sample_reference(c, 5, 10.0).output);
  EXPECT_EQ(r.read_output("cuda").output, sample_output(c, 5, Precision::f32).output);
  EXPECT_EQ(r.read_hidden_states(), s.hidden);  // the rest of the case is intact
  EXPECT_TRUE(r.validate().empty());
  EXPECT_EQ(dir_entries(dir), (std::vector<std::string>{"case.h5", "copy.h5"}));

  // Bad requests change nothing and leave no temporary.
  EXPECT_THROW(add_output_to_case(path, "bad name", sample_output(c, 5, Precision::f32)), InputError);
  EXPECT_THROW(add_reference_to_case(path, "best", sample_reference(c, 5, 0.0)), InputError);
  OutputData wrong = sample_output(c, 5, Precision::f32);
  wrong.output.pop_back();
  EXPECT_THROW(add_output_to_case(path, "short", wrong), std::invalid_argument);
  EXPECT_THROW(add_output_to_case(dir.file("missing.h5"), "x", wrong), InputError);
  EXPECT_EQ(dir_entries(dir), (std::vector<std::string>{"case.h5", "copy.h5"}));
  EXPECT_EQ(CaseReader(path).outputs().size(), 1u);
}

// An output over ranks: /outputs/<name>/ranks@shard and one dataset per rank, read back exactly
// (bf16 values), by token range too; an output without ranks reads as before (no shard).
TEST(CaseRoundTrip, OutputWithItsRanks) {
  TempDir dir("ranks");
  const SmallCase s = test::small_case();
  const std::string path = dir.file("case.h5");
  test::write_case(path, s);
  const MoeConfig& c = s.header.config;
  OutputData o = sample_output(c, 5, Precision::bf16);
  o.shard = "ep 4";  // E = 8: two experts per rank
  for (int r = 0; r < 4; ++r) {
    o.ranks.emplace_back();
    for (int64_t i = 0; i < 5 * c.hidden_size; ++i) o.ranks.back().push_back(bf16_round(float(r) - float(i % 11) / 4.0f));
  }
  add_output_to_case(path, "sharded", o);
  add_output_to_case(path, "plain", sample_output(c, 5, Precision::bf16));
  const CaseReader r(path);
  EXPECT_TRUE(r.validate().empty());
  for (const OutputInfo& info : r.outputs()) EXPECT_EQ(info.shard, info.name == "sharded" ? "ep 4" : "") << info.name;
  const OutputData back = r.read_output("sharded");
  EXPECT_EQ(back.shard, "ep 4");
  EXPECT_EQ(back.ranks_dtype, Precision::bf16);
  EXPECT_EQ(back.ranks, o.ranks);
  const OutputData rows = r.read_output("sharded", 2, 2);
  ASSERT_EQ(rows.ranks.size(), 4u);
  EXPECT_EQ(rows.ranks[3], std::vector<float>(o.ranks[3].begin() + 2 * c.hidden_size, o.ranks[3].begin() + 4 * c.hidden_size));
  EXPECT_TRUE(r.read_output("plain").ranks.empty());
  EXPECT_TRUE(r.read_output("plain").shard.empty());

  // What the reader would refuse is not written: a count that is not the shard's, a split the
  // layer does not allow (I = 96 is no whole block), no temporary left.
  OutputData wrong = o;
  wrong.ranks.pop_back();
  EXPECT_THROW(add_output_to_case(path, "short", wrong), std::invalid_argument);
  wrong = o;
  wrong.shard = "tp 4";
  EXPECT_THROW(add_output_to_case(path, "tp", wrong), InputError);
  EXPECT_EQ(dir_entries(dir), std::vector<std::string>{"case.h5"});
  EXPECT_EQ(CaseReader(path).outputs().size(), 2u);
}

TEST(CaseWriterTest, NoFileWithoutCommitAndNoTemporaryOnFailure) {
  TempDir dir("writer");
  const SmallCase s = test::small_case();
  {
    CaseWriter w(dir.file("never.h5"), s.header);
    w.write_hidden_states(s.hidden);
  }  // destroyed without commit
  EXPECT_TRUE(dir_entries(dir).empty());
  {
    CaseWriter w(dir.file("incomplete.h5"), s.header);
    w.write_hidden_states(s.hidden);
    w.write_hidden_fp8(s.hidden_fp8, s.hidden_scale);
    w.write_router_logits(s.logits);
    w.write_routing_bias(s.bias);
    for (size_t e = 0; e + 1 < s.experts.size(); ++e) w.write_expert(int64_t(e), s.experts[e]);
    try {
      w.commit();
      FAIL() << "commit must refuse a case with an expert missing";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("expert slot 7"), std::string::npos) << e.what();
    }
    EXPECT_THROW(w.write_expert(0, s.experts[0]), std::logic_error);  // written twice
    ExpertWeights short_w = s.experts[7];
    short_w.w2.pop_back();
    EXPECT_THROW(w.write_expert(7, short_w), std::invalid_argument);
  }
  EXPECT_TRUE(dir_entries(dir).empty());
}

TEST(CaseWriterTest, RefusesWhatTheReaderRefuses) {
  TempDir dir("writer-rules");
  SmallCase s = test::small_case();
  s.header.config.top_k = 9;
  try {
    CaseWriter w(dir.file("bad.h5"), s.header);
    FAIL() << "top_k > num_experts accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.where(), "/config@top_k");
  }
  s = test::small_case();
  s.header.routing_bias = false;  // deepseek_v3 needs one
  EXPECT_THROW(CaseWriter(dir.file("bad.h5"), s.header), InputError);
  s = test::small_case();
  s.header.expert_ids = {3, 2};
  EXPECT_THROW(CaseWriter(dir.file("bad.h5"), s.header), InputError);
  EXPECT_TRUE(dir_entries(dir).empty());
}

TEST(CaseWriterTest, WeightsChunkedOneExpertSlabOfAtMost4MiB) {
  // chunk_for: leading dims 1, rows along axis 1 rounded to weight blocks, trailing dims whole.
  EXPECT_EQ(h5::chunk_for({256, 4096, 7168}, 1, 1, uint64_t(4) << 20, 128), (std::vector<uint64_t>{1, 512, 7168}));
  EXPECT_EQ(h5::chunk_for({8, 512, 256}, 1, 1, uint64_t(4) << 20, 128), (std::vector<uint64_t>{1, 512, 256}));
  EXPECT_EQ(h5::chunk_for({16, 7168}, 2, 0, uint64_t(1) << 20), (std::vector<uint64_t>{16, 7168}));
  EXPECT_EQ(h5::chunk_for({1, 1 << 22}, 4, 1, 100), (std::vector<uint64_t>{1, 25}));

  TempDir dir("chunks");
  const SmallCase s = test::small_case();
  test::write_case(dir.file("c.h5"), s);
  H5::H5File f(dir.file("c.h5"), H5F_ACC_RDONLY);
  const H5::DSetCreatPropList p = f.openDataSet("/weights/w13").getCreatePlist();
  ASSERT_EQ(p.getLayout(), H5D_CHUNKED);
  hsize_t chunk[3] = {0, 0, 0};
  p.getChunk(3, chunk);
  EXPECT_EQ(chunk[0], 1u);
  EXPECT_EQ(chunk[1], 192u);  // 2I rows of one expert
  EXPECT_EQ(chunk[2], 160u);
}

}  // namespace
}  // namespace moecheck
