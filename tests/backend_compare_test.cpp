// The budgets against real backend runs: the emulated backend (an independent float32
// implementation of docs/DEVICE-ALGORITHM.md) must pass `compare` on thousands of random cases
// (zero false alarms), and the faulty backends must fail, naming the right expert where the fault
// is local to one.
//
// Cases are drawn from our own seed sequence (not RapidCheck) so that each is replayable on its
// own: a failure prints `MOECHECK_SEED=<s> <this test binary> --gtest_filter=<test>`, and
// MOECHECK_CASES=<n> changes how many are run (default 1500).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fmt/format.h>

#include "kernels/emulated/emulated_moe.hpp"
#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_compare.hpp"
#include "tests/small_layer.hpp"

namespace moecheck {
namespace {

using testing::make_small_layer;
using testing::observe;
using testing::SmallLayer;

// A random configuration from one seed: every routing method, scale format, intermediate and
// routing-weight precision, gate/up layout, EP shards and ragged-free sizes up to 384.
MoeConfig random_config(uint64_t seed) {
  const CounterRng r{seed, 77};
  auto pick = [&](uint64_t i, uint64_t n) { return static_cast<int64_t>(r.bits(i) % n); };
  MoeConfig c;
  c.routing = static_cast<RoutingMethod>(pick(0, 5));
  c.num_experts = 4 << pick(1, 3);  // 4, 8, 16
  c.top_k = c.routing == RoutingMethod::llama4 ? 1 : 1 + pick(2, std::min<int64_t>(4, c.num_experts));
  if (c.routing == RoutingMethod::deepseek_v3 && pick(3, 2)) {
    c.n_group = 4, c.topk_group = 2;
    c.top_k = std::min<int64_t>(c.top_k, c.topk_group * c.num_experts / c.n_group);
  }
  c.hidden_size = 128 * (1 + pick(4, 3));
  c.intermediate_size = 128 * (1 + pick(5, 3));
  c.routed_scaling_factor = pick(6, 2) ? 2.5 : 1.0;
  c.scale_format = pick(7, 2) ? ScaleFormat::ue8m0 : ScaleFormat::f32;
  c.intermediate_dtype = pick(8, 2) ? Precision::bf16 : Precision::f32;
  c.routing_weight_dtype = pick(9, 2) ? Precision::bf16 : Precision::f32;
  c.gate_up_layout = pick(10, 2) ? GateUpLayout::up_gate : GateUpLayout::gate_up;
  if (pick(11, 3) == 0) {  // an EP shard
    const int64_t shards = 2 << pick(12, 2);
    if (c.num_experts % shards == 0) {
      c.local_num_experts = c.num_experts / shards;
      c.local_expert_offset = pick(13, shards) * c.local_num_experts;
    }
  }
  return c;
}

bool uses_bias(const MoeConfig& c) {
  return c.routing == RoutingMethod::deepseek_v3 || c.routing == RoutingMethod::sigmoid_renormalize;
}

std::string describe(const CompareResult& r) {
  std::string s = fmt::format("max ratio {} at token {} col {}, {} of {} checks failed, mismatched tokens {}",
                              r.max_ratio, r.worst_token, r.worst_col, r.checks_failed, r.checks,
                              r.mismatched.size());
  s += fmt::format("; power: whole-output scale {}, median token {}", r.power.scale_output, r.power.token_scale_median);
  s += fmt::format("; noise limit > |reference| on {:.1f}% of elements (vacuous {}), worst case on {:.1f}%",
                   100 * r.power.noise_over_magnitude, r.power.vacuous, 100 * r.power.over_magnitude);
  for (const auto& t : r.token_scale)
    if (!t.ok) s += fmt::format("\n  token {}: beta {} +- {} (detectable {})", t.token, t.beta, t.se, t.detectable);
  for (const auto& v : r.experts)
    if (!v.pass)
      s += fmt::format("\n  expert {}: max ratio {} blamed {} beta {} +- {} (allow {}) energy {} / {}", v.expert,
                       v.max_ratio, v.blamed, v.beta, v.beta_se, v.beta_allow, v.energy_ratio, v.energy_limit);
  return s;
}

TEST(EmulatedBackend, PassesCompareOnRandomCases) {
  const auto [first, count] = testing::seed_range(1500);
  int64_t near_ties = 0, slots_checked = 0, vacuous = 0;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    const MoeConfig c = random_config(seed);
    const CounterRng r{seed, 78};
    const int64_t T = 1 + static_cast<int64_t>(r.bits(0) % 12);
    const SmallLayer L = make_small_layer(c, T, seed, uses_bias(c));
    CompareOptions opt;  // fp32 accumulator: what the emulated backend declares
    // A false alarm is a failed check; an output whose checks could not see it zeroed (a few
    // tokens of tiny outputs) is VACUOUS, a statement of power, counted below.
    opt.allow_vacuous = true;
    ForwardOptions fo;
    fo.budget = &opt.model;
    const ForwardResult ref = moe_forward(L.problem(), fo);
    EmulatedOptions eo;
    eo.expert_outputs = (seed % 2) == 0;  // judge per slot on half of the cases
    const CompareResult res = compare_output(L.problem(), ref, observe(run_emulated(L.problem(), eo)), opt);
    near_ties += res.ambiguous_tokens;
    vacuous += res.power.vacuous;
    slots_checked += eo.expert_outputs ? T * c.top_k : 0;
    ASSERT_TRUE(res.pass) << "false alarm on seed " << seed << ": " << describe(res)
                          << "\nreplay: MOECHECK_SEED=" << seed
                          << " tests/backend_compare_test --gtest_filter=EmulatedBackend.PassesCompareOnRandomCases";
  }
  std::cout << "[ cases    ] " << count << " random cases passed (" << near_ties << " near-tie tokens accepted, "
            << slots_checked << " slots judged per slot, " << vacuous << " vacuous)\n";
  // The judge keeps its power on these small layers: at most 1% of them vacuous.
  // (Judged over at least 100 cases: a replay of one vacuous seed is no loss of power.)
  EXPECT_LE(vacuous * 100, std::max<int64_t>(int64_t(count), 100)) << vacuous << " of " << count
                                                                    << " correct outputs were vacuous";
}

// ---- faults ----------------------------------------------------------------------------
struct FaultCase {
  Fault fault;
  MoeConfig config;
  bool expect_expert;  // the fault is local to one expert, which must be named
};

MoeConfig dsv3() {
  MoeConfig c;
  c.num_experts = 16, c.top_k = 4, c.hidden_size = 256, c.intermediate_size = 256;
  c.routing = RoutingMethod::deepseek_v3, c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5;
  return c;
}

class FaultyBackend : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultyBackend, IsCaught) {
  const FaultCase& fc = GetParam();
  SmallLayer L = make_small_layer(fc.config, 24, 3, uses_bias(fc.config));
  // Negative biases, so that zero-masking excluded groups changes the choice (docs/BUG-CLASSES.md #19).
  for (float& b : L.bias) b -= 1.0f;
  // bias_bf16 shows where biases are large and close (GLM-style, docs/BUG-CLASSES.md #18): near 8 the bf16
  // spacing is 1/16, so biases 1/256 apart collapse and the selection changes.
  if (fc.fault == Fault::bias_bf16)
    for (size_t e = 0; e < L.bias.size(); ++e) L.bias[e] = 8.0f + float((e * 7) % 16) / 256.0f;
  // An all-zero activation group for zero_group_nan.
  for (int64_t i = 0; i < 128; ++i) L.hidden[5 * fc.config.hidden_size + i] = 0.0f;
  CompareOptions opt;
  ForwardOptions fo;
  fo.budget = &opt.model;
  const ForwardResult ref = moe_forward(L.problem(), fo);
  EmulatedOptions eo;
  eo.fault = fc.fault;
  eo.int32_overflow_threshold = 12 * fc.config.hidden_size * fc.config.top_k;  // rows past 12 tokens wrap
  BackendOutput b = run_emulated(L.problem(), eo);
  const CompareResult r = compare_output(L.problem(), ref, observe(b), opt);
  EXPECT_FALSE(r.pass) << to_string(fc.fault) << " was not caught: " << describe(r);
  // The correct backend on the same case passes: the failure is the fault's.
  const CompareResult ok = compare_output(L.problem(), ref, observe(run_emulated(L.problem(), {})), opt);
  EXPECT_TRUE(ok.pass) << describe(ok);
  if (fc.expect_expert) {
    ASSERT_FALSE(r.experts.empty());
    int blamed = 0;
    for (const auto& v : r.experts) blamed += !v.pass;
    EXPECT_EQ(blamed, 1) << "a fault local to one expert must be reported on that expert alone: " << describe(r);
  }
}

std::vector<FaultCase> fault_cases() {
  std::vector<FaultCase> v;
  MoeConfig ue = dsv3();
  ue.scale_format = ScaleFormat::ue8m0;
  MoeConfig ep = dsv3();
  ep.local_expert_offset = 8, ep.local_num_experts = 8;
  MoeConfig renorm = dsv3();
  renorm.routing = RoutingMethod::renormalize, renorm.n_group = 1, renorm.topk_group = 1;
  for (Fault f : all_faults()) {
    MoeConfig c = f == Fault::ue8m0_mismatch ? ue : f == Fault::ep_offset_ignored ? ep : dsv3();
    v.push_back({f, c, f == Fault::empty_expert_garbage});
  }
  v.push_back({Fault::no_renormalize, renorm, false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllFaults, FaultyBackend, ::testing::ValuesIn(fault_cases()), [](const auto& info) {
  return std::string(to_string(info.param.fault)) + "_" + std::string(to_string(info.param.config.routing)) + "_" +
         std::to_string(info.index);
});

}  // namespace
}  // namespace moecheck
