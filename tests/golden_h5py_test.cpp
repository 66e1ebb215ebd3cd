// The h5py side of the format: tests/h5py/write_cases.py writes the FORMAT.md example (extracted
// verbatim from golden/FORMAT.md) and variants with variable-length vs fixed-length strings,
// assorted integer widths, bf16 vs float32 hidden states; CaseReader reads each back and every
// value is checked against the formulas of the Python side.
//
// python3-h5py is a declared dependency (tools/install-deps.sh): without it this test FAILS.
#include <gtest/gtest.h>

#include <cmath>

#include "reference/fp8_formats.hpp"
#include "tests/golden_test_support.hpp"

#ifndef MOECHECK_PYTHON3
#define MOECHECK_PYTHON3 "/usr/bin/python3"
#endif

namespace moecheck {
namespace {

class H5pyCases : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("h5py");
    const auto probe = test::run_process({MOECHECK_PYTHON3, "-c", "import h5py, numpy"});
    if (probe.exit_code != 0) {
      error_ = std::string("python3 (") + MOECHECK_PYTHON3 + ") cannot import h5py/numpy: install python3-h5py and " +
               "python3-numpy (tools/install-deps.sh)\n" + probe.err;
      return;
    }
    const auto r = test::run_process({MOECHECK_PYTHON3, test::source_path("tests/h5py/write_cases.py"),
                                      test::source_path("golden/FORMAT.md"), dir_->path().string()});
    if (r.exit_code != 0) error_ = "tests/h5py/write_cases.py failed (exit " + std::to_string(r.exit_code) + "):\n" + r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }
  static std::string file(const std::string& name) { return dir_->file(name); }

  static test::TempDir* dir_;
  static std::string error_;
};
test::TempDir* H5pyCases::dir_ = nullptr;
std::string H5pyCases::error_;

void expect_valid(const CaseReader& r) {
  const auto problems = r.validate();
  for (const Problem& p : problems) ADD_FAILURE() << p.where << ": " << p.rule;
}

TEST_F(H5pyCases, FormatMdExampleReadsBackExactly) {
  const CaseReader r(file("format_example.h5"));
  expect_valid(r);
  const MoeConfig& c = r.config();
  const int64_t T = 4, E = 8, H = 256, I = 128;
  EXPECT_EQ(c.num_experts, E);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.hidden_size, H);
  EXPECT_EQ(c.intermediate_size, I);
  EXPECT_EQ(c.routing, RoutingMethod::deepseek_v3);
  EXPECT_EQ(c.n_group, 2);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.weight_block, 128);  // defaults
  EXPECT_EQ(c.local_experts(), E);
  EXPECT_EQ(r.config_defaults().size(), 14u);  // 9 + the 5 engine-recipe attributes
  EXPECT_EQ(r.description(), "FORMAT.md example");
  ASSERT_EQ(r.tokens(), T);
  EXPECT_EQ(r.hidden_dtype(), Precision::bf16);

  // hidden = float32((n % 23 - 11) / 7), stored as bf16 (round to nearest even).
  const std::vector<float> x = r.read_hidden_states();
  for (int64_t n = 0; n < T * H; ++n) {
    const float f = float(double(n % 23 - 11) / 7.0);
    ASSERT_EQ(x[size_t(n)], bf16_round(f)) << "hidden element " << n;
  }
  const std::vector<float> logits = r.read_router_logits();
  for (int64_t n = 0; n < T * E; ++n) ASSERT_EQ(logits[size_t(n)], float(double((n * 37) % 101 - 50) / 10.0)) << n;
  const auto bias = r.read_routing_bias();
  ASSERT_TRUE(bias.has_value());
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ((*bias)[size_t(e)], float(double(e) / 16.0 - 0.25));

  for (int64_t e = 0; e < E; ++e) {
    const ExpertWeights w = r.read_expert(e);
    auto code = [](int64_t i) { return uint8_t(((i * 7) % 126) | (i % 3 == 0 ? 0x80 : 0)); };
    for (int64_t j = 0; j < 2 * I * H; ++j) ASSERT_EQ(w.w13[size_t(j)], code(e * 2 * I * H + j)) << e << " " << j;
    for (int64_t j = 0; j < H * I; ++j) ASSERT_EQ(w.w2[size_t(j)], code(e * H * I + j)) << e << " " << j;
    // scale[e, r, c] = (1 + r + 2c) * 2^-(8 + e % 4); w13_scale [2, 2], w2_scale [2, 1].
    for (int64_t rb = 0; rb < 2; ++rb)
      for (int64_t cb = 0; cb < 2; ++cb)
        EXPECT_EQ(w.w13_scale[size_t(rb * 2 + cb)], std::ldexp(float(1 + rb + 2 * cb), -int(8 + e % 4)));
    for (int64_t rb = 0; rb < 2; ++rb) EXPECT_EQ(w.w2_scale[size_t(rb)], std::ldexp(float(1 + rb), -int(8 + e % 4)));
  }
}

void check_variant(const CaseReader& r, bool fixed) {
  expect_valid(r);
  const MoeConfig& c = r.config();
  const int64_t T = 3, E = 4, H = 128;
  EXPECT_EQ(c.num_experts, E);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.hidden_size, H);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.routing, RoutingMethod::renormalize);
  EXPECT_EQ(c.gate_up_layout, GateUpLayout::up_gate);
  EXPECT_EQ(c.intermediate_dtype, Precision::bf16);
  EXPECT_EQ(c.routed_scaling_factor, fixed ? 2.0 : 1.5);
  EXPECT_EQ(c.act_eps, fixed ? double(1e-10f) : 1e-6);
  EXPECT_EQ(r.source(), "tests/h5py/write_cases.py");
  ASSERT_EQ(r.tokens(), T);
  EXPECT_EQ(r.hidden_dtype(), fixed ? Precision::bf16 : Precision::f32);
  const std::vector<float> x = r.read_hidden_states();
  for (int64_t n = 0; n < T * H; ++n) {
    const float f = float(double(n % 31 - 15) / 3.0);
    ASSERT_EQ(x[size_t(n)], fixed ? bf16_round(f) : f) << n;
  }
  const std::vector<float> logits = r.read_router_logits();
  for (int64_t n = 0; n < T * E; ++n) ASSERT_EQ(logits[size_t(n)], float(n % 5) - 2.5f) << n;
  EXPECT_TRUE(r.experts_subset());
  EXPECT_EQ(r.expert_ids(), (std::vector<int64_t>{0, 1, 2, 3}));
  const ExpertWeights w = r.read_expert(2);
  EXPECT_EQ(w.w13[5], uint8_t(((2 * 256 * 128 + 5) * 5) % 0x7F));
  EXPECT_EQ(w.w2_scale, std::vector<float>(1, 0.125f));
  const auto outs = r.outputs();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].attributes.at("backend"), "flashinfer");
  EXPECT_EQ(outs[0].attributes.at("device"), "NVIDIA H200");
  const OutputData o = r.read_output("engine");
  EXPECT_EQ(o.output, std::vector<float>(size_t(T * H), 0.5f));
  EXPECT_EQ(o.topk_ids, (std::vector<int32_t>{1, 3, 1, 3, 1, 3}));
  EXPECT_TRUE(o.topk_weights.empty());
}

TEST_F(H5pyCases, VariableLengthStringsAndFloat32HiddenStates) { check_variant(CaseReader(file("vlen_strings.h5")), false); }

TEST_F(H5pyCases, FixedLengthStringsIntegerWidthsAndBf16Rounding) {
  check_variant(CaseReader(file("fixed_strings.h5")), true);
}

}  // namespace
}  // namespace moecheck
