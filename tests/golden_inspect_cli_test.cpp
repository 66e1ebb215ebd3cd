// The moecheck CLI and `moecheck inspect` on the committed sample case: exit codes (0 ok, 2 usage
// or input error, never CLI11's own codes), --help / --version, the text report and the --json
// document's schema (tools/README.md). Also: the committed golden/cases/sample.h5 holds exactly
// what tools/make_sample_case writes today.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

using nlohmann::json;

std::string sample() { return test::source_path("golden/cases/sample.h5"); }

TEST(MoecheckCli, HelpVersionAndUsageErrors) {
  const std::string bin = test::binary("moecheck");
  const auto help = test::run_process({bin, "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("inspect"), std::string::npos) << help.out;
  const auto sub_help = test::run_process({bin, "inspect", "--help"});
  EXPECT_EQ(sub_help.exit_code, 0);
  EXPECT_NE(sub_help.out.find("--json"), std::string::npos);
  const auto version = test::run_process({bin, "--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.out.find("moecheck "), std::string::npos) << version.out;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {bin}, {bin, "bogus"}, {bin, "inspect"}, {bin, "inspect", sample(), "--bogus"}, {bin, "--bogus"}}) {
    const auto r = test::run_process(args);
    EXPECT_EQ(r.signal, 0);
    EXPECT_EQ(r.exit_code, 2) << args.size() << " args: " << r.err;
    EXPECT_NE(r.err.find("moecheck: error: "), std::string::npos) << r.err;
  }
}

TEST(MoecheckInspect, SampleCaseText) {
  const auto r = test::run_process({test::binary("moecheck"), "inspect", sample()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  for (const char* want : {"format:          moecheck.case version 1", "routing                deepseek_v3",
                           "routed_scaling_factor  2.5", "tokens (T):      16", "/weights/w13", "[8,512,256]",
                           "float8_e4m3fn (uint8)", "bfloat16 (uint16)", "experts stored:  8 of 8 local",
                           "validation:      valid"})
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing \"" << want << "\" in\n" << r.out;
}

TEST(MoecheckInspect, SampleCaseJsonSchema) {
  const auto r = test::run_process({test::binary("moecheck"), "inspect", "--json", sample()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json doc = json::parse(r.out);
  for (const char* key : {"file", "format_version", "description", "source", "config", "config_defaults", "tokens",
                          "datasets", "experts", "outputs", "references", "valid", "problems"})
    EXPECT_TRUE(doc.contains(key)) << key;
  EXPECT_EQ(doc["file"], sample());
  EXPECT_EQ(doc["format_version"], 1);
  EXPECT_EQ(doc["tokens"], 16);
  EXPECT_EQ(doc["valid"], true);
  EXPECT_TRUE(doc["problems"].empty());
  const json& c = doc["config"];
  EXPECT_EQ(c["num_experts"], 8);
  EXPECT_EQ(c["top_k"], 2);
  EXPECT_EQ(c["hidden_size"], 256);
  EXPECT_EQ(c["intermediate_size"], 256);
  EXPECT_EQ(c["routing"], "deepseek_v3");
  EXPECT_EQ(c["n_group"], 2);
  EXPECT_EQ(c["topk_group"], 1);
  EXPECT_EQ(c["routed_scaling_factor"], 2.5);
  EXPECT_EQ(c["act_eps"], 1e-10);
  EXPECT_EQ(c.size(), 22u);  // 17 + the 5 engine-recipe attributes
  ASSERT_EQ(doc["datasets"].size(), 7u);
  bool saw_w13 = false;
  for (const json& d : doc["datasets"]) {
    for (const char* key : {"path", "shape", "dtype", "storage"}) EXPECT_TRUE(d.contains(key)) << key;
    if (d["path"] == "/weights/w13") {
      saw_w13 = true;
      EXPECT_EQ(d["shape"], json({8, 512, 256}));
      EXPECT_EQ(d["dtype"], "float8_e4m3fn");
      EXPECT_EQ(d["storage"], "uint8");
    }
  }
  EXPECT_TRUE(saw_w13);
  EXPECT_EQ(doc["experts"]["stored"], 8);
  EXPECT_EQ(doc["experts"]["subset"], false);
  EXPECT_TRUE(doc["outputs"].is_array());
  EXPECT_TRUE(doc["references"].is_array());
}

TEST(MoecheckInspect, InvalidCaseJsonListsEveryProblem) {
  test::TempDir dir("inspect-invalid");
  const std::string path = dir.file("bad.h5");
  test::write_case(path, test::small_case());
  test::mutate(path, [](H5::H5File& f) {
    test::poke_float(f, "/weights/w13_scale", 0, -1.0f);
    test::poke_byte(f, "/weights/w2", 0, 0x7F);
  });
  const auto r = test::run_process({test::binary("moecheck"), "inspect", "--json", path});
  EXPECT_EQ(r.exit_code, 2);
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["valid"], false);
  ASSERT_EQ(doc["problems"].size(), 2u) << doc["problems"].dump(2);
  EXPECT_EQ(doc["problems"][0]["where"], "/weights/w2");
  EXPECT_EQ(doc["problems"][1]["where"], "/weights/w13_scale");
  EXPECT_NE(r.err.find("moecheck: error: " + path + ": /weights/w2: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("and 1 more problem"), std::string::npos) << r.err;
  const auto text = test::run_process({test::binary("moecheck"), "inspect", path});
  EXPECT_EQ(text.exit_code, 2);
  EXPECT_NE(text.out.find("validation:      INVALID (2 problems)"), std::string::npos) << text.out;
}

TEST(SampleCase, MatchesWhatMakeSampleCaseWrites) {
  test::TempDir dir("sample");
  const std::string fresh = dir.file("sample.h5");
  const auto r = test::run_process({test::binary("make_sample_case"), fresh});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const CaseReader a(sample()), b(fresh);
  EXPECT_TRUE(a.validate().empty());
  EXPECT_EQ(a.description(), b.description());
  EXPECT_EQ(a.config().routing, RoutingMethod::deepseek_v3);
  EXPECT_EQ(a.config().routed_scaling_factor, b.config().routed_scaling_factor);
  EXPECT_EQ(a.tokens(), b.tokens());
  EXPECT_EQ(a.read_hidden_states(), b.read_hidden_states());
  EXPECT_EQ(a.read_router_logits(), b.read_router_logits());
  EXPECT_EQ(a.read_routing_bias(), b.read_routing_bias());
  ASSERT_EQ(a.expert_ids(), b.expert_ids());
  for (int64_t e : a.expert_ids()) {
    const ExpertWeights x = a.read_expert(e), y = b.read_expert(e);
    EXPECT_EQ(x.w13, y.w13) << e;
    EXPECT_EQ(x.w13_scale, y.w13_scale) << e;
    EXPECT_EQ(x.w2, y.w2) << e;
    EXPECT_EQ(x.w2_scale, y.w2_scale) << e;
  }
  // Not a vacuous sample: codes use most of the e4m3 range, none NaN, scales of several magnitudes.
  const ExpertWeights w = a.read_expert(0);
  std::vector<bool> seen(256, false);
  for (uint8_t q : w.w13) seen[q] = true;
  EXPECT_GT(std::count(seen.begin(), seen.end(), true), 200);
  EXPECT_FALSE(seen[0x7F] || seen[0xFF]);
  EXPECT_TRUE(seen[0x7E] && seen[0xFE]);  // +-448 (saturated tails)
}

}  // namespace
}  // namespace moecheck
