// Whole-layer tests of the GPU MoE (kernels/fp8_block_scale_moe.hpp): each case runs the layer
// once with poisoned outputs and workspace, then every stage is checked against its float64
// model (check_moe in gpu_moe_checks.cpp). Cases cover T = 1, ragged T, experts spanning
// several M tiles, experts with zero tokens, all tokens on one expert, expert parallelism
// (offset > 0, tokens with no local expert), every routing method, UE8M0 scales, the up_gate
// layout, bf16 intermediates and weights, the bf16 entry, DeepSeek-V3 sizes (H = 7168,
// I = 2048) and T = 16384; then RapidCheck draws random configurations.
//
// Adding a case: append to layer_cases() (gpu_test_support.cpp; both GPU backends run it; the
// name and parameters print as the test's trace).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "reference/fp8_formats.hpp"
#include "tests/gpu_test_support.hpp"

namespace moecheck::gputest {
namespace {

std::vector<MoeCase> moe_cases() {
  std::vector<MoeCase> v = layer_cases();
  for (size_t i = 0; i < v.size(); ++i) v[i].seed = 1000 + i;
  return v;
}

class GpuMoe : public ::testing::TestWithParam<MoeCase> {};

TEST_P(GpuMoe, StagesWithinBounds) {
  MOECHECK_REQUIRE_GPU();
  const MoeCase& m = GetParam();
  SCOPED_TRACE(::testing::PrintToString(m));
  const MoeHostData d = make_moe_data(m);
  const MoeGpuRun g = run_moe_on_gpu(m, d);
  const CheckReport r = check_moe(m, d, g);
  EXPECT_TRUE(r.ok) << r;
  std::cout << "  " << r << "\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuMoe, ::testing::ValuesIn(moe_cases()),
                         [](const ::testing::TestParamInfo<MoeCase>& i) { return i.param.name; });

// The same inputs give bit-identical results run after run, and a CUDA-graph replay of the
// captured call gives the same bits (the path has no host synchronisation and no atomics whose
// order reaches a value).
TEST(GpuMoeProperties, DeterministicAndGraphReplayBitIdentical) {
  MOECHECK_REQUIRE_GPU();
  MoeCase m = make_case("determinism", RoutingMethod::deepseek_v3, 32, 4, 256, 256, 70);
  m.c.n_group = 4, m.c.topk_group = 2, m.bias = true, m.seed = 77;
  m.c.scale_format = ScaleFormat::ue8m0;
  m.c.intermediate_dtype = Precision::bf16;
  const MoeHostData d = make_moe_data(m);
  const MoeGpuRun a = run_moe_on_gpu(m, d), b = run_moe_on_gpu(m, d), g = run_moe_on_gpu(m, d, true);
  const CheckReport r = check_moe(m, d, g);
  EXPECT_TRUE(r.ok) << r;
  for (const MoeGpuRun* x : {&b, &g}) {
    EXPECT_EQ(x->out, a.out);
    EXPECT_EQ(0, std::memcmp(x->expert_outputs.data(), a.expert_outputs.data(), a.expert_outputs.size() * 4));
    EXPECT_EQ(x->topk_ids, a.topk_ids);
    EXPECT_EQ(0, std::memcmp(x->gemm1_out.data(), a.gemm1_out.data(), a.gemm1_out.size() * 4));
    EXPECT_EQ(x->a2_codes, a.a2_codes);
  }
}

// Output row t depends on input row t only (docs/BUG-CLASSES.md #1, #12): the other tokens' hidden
// states are replaced by saturated codes with huge scales, so their rows overflow to inf/NaN
// through both GEMMs; token 0's output and slot outputs must keep the same bits.
TEST(GpuMoeProperties, RowIsolationUnderOverflowingNeighbours) {
  MOECHECK_REQUIRE_GPU();
  MoeCase m = make_case("isolation", RoutingMethod::renormalize, 8, 2, 256, 128, 70);
  m.seed = 78;
  const MoeHostData d = make_moe_data(m);
  MoeHostData bad = d;
  const int64_t T = m.tokens, H = m.c.hidden_size, k = m.c.top_k;
  for (int64_t t = 1; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) bad.hidden_codes[t * H + h] = (h % 3 == 0) ? 0xFE : 0x7E;  // -448 / 448
    for (int64_t b = 0; b < H / 128; ++b) bad.hidden_scales[b * T + t] = 3e38f;
  }
  const MoeGpuRun a = run_moe_on_gpu(m, d), b = run_moe_on_gpu(m, bad);
  const CheckReport r = check_moe(m, d, a);
  EXPECT_TRUE(r.ok) << r;
  EXPECT_TRUE(std::equal(a.out.begin(), a.out.begin() + H, b.out.begin())) << "token 0 output changed";
  EXPECT_EQ(0, std::memcmp(a.expert_outputs.data(), b.expert_outputs.data(), k * H * 4)) << "token 0 slots changed";
  int64_t non_finite = 0;  // the neighbours really did overflow (no vacuous pass)
  for (int64_t i = H; i < T * H; ++i) non_finite += !std::isfinite(bf16_decode(b.out[i]));
  EXPECT_GT(non_finite, 0);
}

// Random configurations. The number of cases is fixed (MOECHECK_GPU_RC_CASES, default 8)
// whatever RC_PARAMS's max_success says: each case is a full layer run. Replay with the
// RC_PARAMS="reproduce=..." string RapidCheck prints on failure (its seed line is printed first).
TEST(GpuMoeRandom, RandomConfigsWithinBounds) {
  MOECHECK_REQUIRE_GPU();
  const char* env = std::getenv("MOECHECK_GPU_RC_CASES");
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = env != nullptr ? std::atoi(env) : 8;
  params.maxSize = 100;
  std::cout << "RapidCheck seed=" << params.seed << " cases=" << params.maxSuccess << "\n";
  const auto property = [] {
    MoeCase m;
    m.name = "random";
    MoeConfig& c = m.c;
    c.routing = *rc::gen::element(RoutingMethod::deepseek_v3, RoutingMethod::renormalize, RoutingMethod::softmax_topk,
                                  RoutingMethod::sigmoid_renormalize, RoutingMethod::llama4);
    c.num_experts = *rc::gen::element<int64_t>(4, 8, 16, 32, 64);
    if (c.routing == RoutingMethod::deepseek_v3) {
      c.n_group = *rc::gen::element<int64_t>(1, 2, 4);
      c.topk_group = *rc::gen::inRange<int64_t>(1, c.n_group + 1);
    }
    const int64_t candidates = c.topk_group * (c.num_experts / c.n_group);
    c.top_k = c.routing == RoutingMethod::llama4 ? 1 : *rc::gen::inRange<int64_t>(1, std::min<int64_t>(8, candidates) + 1);
    c.hidden_size = 128 * *rc::gen::inRange<int64_t>(1, 4);
    c.intermediate_size = 128 * *rc::gen::inRange<int64_t>(1, 3);
    c.local_num_experts = *rc::gen::inRange<int64_t>(1, c.num_experts + 1);
    c.local_expert_offset = *rc::gen::inRange<int64_t>(0, c.num_experts - c.local_num_experts + 1);
    c.routed_scaling_factor = *rc::gen::element(1.0, 2.5);
    c.scale_format = *rc::gen::element(ScaleFormat::f32, ScaleFormat::ue8m0);
    c.gate_up_layout = *rc::gen::element(GateUpLayout::gate_up, GateUpLayout::up_gate);
    c.intermediate_dtype = *rc::gen::element(Precision::f32, Precision::bf16);
    c.routing_weight_dtype = *rc::gen::element(Precision::f32, Precision::bf16);
    m.bias = (c.routing == RoutingMethod::deepseek_v3 || c.routing == RoutingMethod::sigmoid_renormalize) &&
             *rc::gen::arbitrary<bool>();
    m.bf16_entry = *rc::gen::arbitrary<bool>();
    m.tokens = *rc::gen::inRange<int64_t>(1, 151);
    m.zero_group_tokens = *rc::gen::inRange<int64_t>(0, 3);
    m.seed = *rc::gen::arbitrary<uint32_t>();
    std::ostringstream os;
    os << m;
    RC_LOG() << os.str() << "\n";
    const MoeHostData d = make_moe_data(m);
    const MoeGpuRun g = run_moe_on_gpu(m, d);
    const CheckReport r = check_moe(m, d, g);
    if (!r.ok) {
      std::ostringstream rs;
      rs << r;
      RC_FAIL(rs.str());
    }
  };
  rc::detail::TestMetadata meta;
  meta.id = "GpuMoeRandom/RandomConfigsWithinBounds";
  meta.description = "random MoE configurations";
  const auto result = rc::detail::checkProperty(rc::detail::toProperty(property), meta, params);
  std::ostringstream msg;
  rc::detail::printResultMessage(result, msg);
  std::cout << msg.str() << "\n";
  EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << msg.str();
}

}  // namespace
}  // namespace moecheck::gputest
