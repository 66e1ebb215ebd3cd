// Tests of the emulated backend (kernels/emulated/): its kernels against their definitions, and
// every stage of whole runs against float64 loops (tests/emulated_test_support.hpp states the
// bounds and derives them).
//
// Sections:
//   kernels   e4m3 decode vs the format table (all 256 codes); the vectorised block-scale GEMM
//             vs the scalar definition, bitwise, ragged blocks included; scale edge cases.
//   exact     integer-valued FP8 data with power-of-two scales: every GEMM1 sum is exact in
//             float32, so GEMM1 must equal the exact double result bitwise.
//   stages    fixed configs (every routing method, up_gate, ue8m0, bf16 intermediate and
//             weights, EP shard with offset > 0, ragged sizes, case-provided FP8 hidden states):
//             routing vs the float64 reference, then each stage vs float64 from its emulated
//             input; plus a negative control showing the checks catch a wrong run.
//   contract  subset storage error, tokens without local experts give +0, bitwise determinism
//             across thread counts, batch independence (RapidCheck), EP shard slot equality.
// Every random layer comes from make_small_layer(config, T, seed): the seed is in the test.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iostream>

#include "kernels/emulated/emulated_internal.hpp"
#include "reference/errors.hpp"
#include "tests/emulated_test_support.hpp"

namespace moecheck {
namespace {

using testing::check_routing;
using testing::check_stages;
using testing::make_small_layer;
using testing::SmallLayer;
using testing::StageReport;

MoeConfig base_config(RoutingMethod m) {
  MoeConfig c;
  c.num_experts = 16, c.top_k = 4, c.hidden_size = 256, c.intermediate_size = 256;
  c.routing = m;
  c.routed_scaling_factor = 2.5;
  if (m == RoutingMethod::deepseek_v3) c.n_group = 4, c.topk_group = 2;
  if (m == RoutingMethod::llama4) c.top_k = 1;
  return c;
}
bool with_bias(const MoeConfig& c) {
  return c.routing == RoutingMethod::deepseek_v3 || c.routing == RoutingMethod::sigmoid_renormalize;
}

BackendOutput run(const SmallLayer& L, EmulatedTrace* tr, int threads = 0, Fault f = Fault::none) {
  EmulatedOptions o;
  o.expert_outputs = true, o.trace = tr, o.threads = threads, o.fault = f;
  return run_emulated(L.problem(), o);
}

// ---- kernels --------------------------------------------------------------------------
TEST(EmulatedKernels, DecodeMatchesFormatTable) {
  uint8_t codes[256];
  float got[256];
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  emulated::decode_e4m3(codes, 256, got);
  for (int i = 0; i < 256; ++i) {
    const float want = e4m3_decode(codes[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << "code " << i;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << "code " << i;
    }
  }
}

// The optimised GEMM (vector lanes, 4-row groups, prefetch, A tiles) equals the scalar
// definition composed from decode_e4m3, block_dot and fmaf, bitwise.
TEST(EmulatedKernels, GemmEqualsScalarDefinition) {
  const CounterRng rng{77, 1};
  uint64_t draw = 0;
  for (int64_t G : {int64_t(128), int64_t(64), int64_t(16), int64_t(8)}) {
    for (int64_t K : {G, 2 * G, 3 * G + 8, G / 2 + 3}) {
      for (int64_t N : {int64_t(1), int64_t(4), int64_t(7), G + 5}) {
        for (int64_t M : {int64_t(1), int64_t(3)}) {
          const int64_t KB = (K + G - 1) / G, NB = (N + G - 1) / G;
          std::vector<uint8_t> ac(M * K), w(N * K);
          std::vector<float> a(M * K), sa(M * KB), sw(NB * KB), got(M * N), ad(K);
          for (auto& v : ac) v = testing::random_code(rng, draw++);
          for (auto& v : w) v = testing::random_code(rng, draw++);
          for (auto& v : sa) v = std::ldexp(1.0f + float(rng.uniform(draw++)), -3);
          for (auto& v : sw) v = std::ldexp(1.0f + float(rng.uniform(draw++)), -7);
          emulated::decode_e4m3(ac.data(), M * K, a.data());
          emulated::block_scale_gemm(M, N, K, G, a.data(), sa.data(), w.data(), sw.data(), got.data());
          std::vector<float> wd(K);
          for (int64_t n = 0; n < N; ++n) {
            emulated::decode_e4m3(w.data() + n * K, K, wd.data());
            for (int64_t m = 0; m < M; ++m) {
              float acc = 0;
              for (int64_t b = 0; b < KB; ++b) {
                const float p = emulated::block_dot(a.data() + m * K + b * G, wd.data() + b * G, std::min(G, K - b * G));
                acc = std::fma(sa[m * KB + b] * sw[(n / G) * KB + b], p, acc);
              }
              ASSERT_EQ(std::bit_cast<uint32_t>(got[m * N + n]), std::bit_cast<uint32_t>(acc))
                  << "G=" << G << " K=" << K << " N=" << N << " M=" << M << " m=" << m << " n=" << n;
            }
          }
        }
      }
    }
  }
}

TEST(EmulatedKernels, ScaleEdgeCases) {
  emulated::QuantRule f32{ScaleFormat::f32, 1e-10, false, false};
  emulated::QuantRule ue{ScaleFormat::ue8m0, 1e-10, false, false};
  float qs;
  EXPECT_EQ(emulated::group_scale_f32(0.0f, f32, &qs), static_cast<float>(1e-10 / 448));
  EXPECT_EQ(emulated::group_scale_f32(448.0f, f32, &qs), 1.0f);
  EXPECT_EQ(emulated::group_scale_f32(448.0f * 1.5f, ue, &qs), 2.0f);
  EXPECT_EQ(emulated::group_scale_f32(448.0f, ue, &qs), 1.0f);  // a power of two stays
  EXPECT_EQ(emulated::group_scale_f32(0.0f, ue, &qs), std::ldexp(1.0f, -42));  // 1e-10/448 = 2.23e-13 <= 2^-42
  EXPECT_EQ(qs, std::ldexp(1.0f, -42));
  emulated::QuantRule mismatch{ScaleFormat::ue8m0, 1e-10, false, true};
  EXPECT_EQ(emulated::group_scale_f32(448.0f * 1.5f, mismatch, &qs), 1.5f);  // dequantizes with fp32 ...
  EXPECT_EQ(qs, 2.0f);                                                       // ... quantized with ue8m0
  emulated::QuantRule no_eps{ScaleFormat::f32, 1e-10, true, false};
  EXPECT_EQ(emulated::group_scale_f32(0.0f, no_eps, &qs), 0.0f);
}

// ---- exact ----------------------------------------------------------------------------
// Codes of small integers / halves, power-of-two scales: block sums are multiples of 2^-4 below
// 2^12, so float32 holds every partial sum exactly and GEMM1 equals the exact product.
TEST(EmulatedExact, Gemm1IsExactOnExactData) {
  MoeConfig c = base_config(RoutingMethod::renormalize);
  SmallLayer L = make_small_layer(c, 6, 11, false);
  const uint8_t small[] = {0x00, 0x30, 0x38, 0x40, 0xB0, 0xB8, 0xC0, 0x28};  // 0, .5, 1, 2, -.5, -1, -2, .25
  const CounterRng r{11, 9};
  uint64_t d = 0;
  for (auto& w : L.w13)
    for (auto& v : w) v = small[r.bits(d++) % 8];
  for (auto& s : L.w13_scale)
    for (auto& v : s) v = std::ldexp(1.0f, -int(r.bits(d++) % 5));
  std::vector<uint8_t> hc(L.tokens * c.hidden_size);
  std::vector<float> hs(L.tokens * 2);
  for (auto& v : hc) v = small[r.bits(d++) % 8];
  for (auto& v : hs) v = std::ldexp(1.0f, 1 + int(r.bits(d++) % 4));
  MoeProblem p = L.problem();
  p.hidden_fp8 = hc.data(), p.hidden_scale = hs.data();
  EmulatedTrace tr;
  EmulatedOptions o;
  o.trace = &tr;
  const BackendOutput out = run_emulated(p, o);
  ASSERT_EQ(tr.act_codes, hc);
  const int64_t H = c.hidden_size, I = c.intermediate_size, k = c.top_k;
  int64_t nonzero = 0;
  for (int64_t s = 0; s < L.tokens * k; ++s) {
    const int64_t e = out.topk_ids[s], t = s / k;
    for (int64_t n = 0; n < 2 * I; ++n) {
      double v, m;
      testing::exact_dot(hc.data() + t * H, hs.data() + t * 2, L.w13[e].data(), L.w13_scale[e].data(), H, 128, n, &v, &m);
      ASSERT_EQ(double(tr.gemm1[s * 2 * I + n]), v) << "slot " << s << " row " << n;
      nonzero += v != 0;
    }
  }
  EXPECT_GT(nonzero, L.tokens * k * I);  // not vacuous
}

// ---- stages ---------------------------------------------------------------------------
struct StageCase {
  std::string name;
  MoeConfig config;
  int64_t tokens = 24;
  uint64_t seed = 1;
};
std::ostream& operator<<(std::ostream& os, const StageCase& s) { return os << s.name; }

std::vector<StageCase> stage_cases() {
  std::vector<StageCase> v;
  for (RoutingMethod m : {RoutingMethod::deepseek_v3, RoutingMethod::renormalize, RoutingMethod::softmax_topk,
                          RoutingMethod::sigmoid_renormalize, RoutingMethod::llama4})
    v.push_back({std::string(to_string(m)), base_config(m), 24, 2});
  MoeConfig c = base_config(RoutingMethod::deepseek_v3);
  c.gate_up_layout = GateUpLayout::up_gate;
  v.push_back({"up_gate", c, 24, 3});
  c = base_config(RoutingMethod::deepseek_v3);
  c.scale_format = ScaleFormat::ue8m0;
  v.push_back({"ue8m0", c, 24, 4});
  c = base_config(RoutingMethod::renormalize);
  c.intermediate_dtype = Precision::bf16, c.routing_weight_dtype = Precision::bf16;
  v.push_back({"bf16_intermediate_and_weights", c, 24, 5});
  c = base_config(RoutingMethod::deepseek_v3);
  c.local_expert_offset = 4, c.local_num_experts = 6;
  v.push_back({"ep_shard_offset4", c, 24, 6});
  c = base_config(RoutingMethod::sigmoid_renormalize);
  c.hidden_size = 200, c.intermediate_size = 72, c.group_size = c.weight_block = 64;
  v.push_back({"ragged_G64_H200_I72", c, 16, 7});
  c = base_config(RoutingMethod::renormalize);
  c.hidden_size = 1024, c.intermediate_size = 384, c.num_experts = 8, c.top_k = 2;
  v.push_back({"H1024_I384", c, 8, 8});
  return v;
}

class EmulatedStages : public ::testing::TestWithParam<StageCase> {};

TEST_P(EmulatedStages, EveryStageWithinItsBound) {
  const StageCase& sc = GetParam();
  SCOPED_TRACE("seed " + std::to_string(sc.seed));
  const SmallLayer L = make_small_layer(sc.config, sc.tokens, sc.seed, with_bias(sc.config));
  EmulatedTrace tr;
  const BackendOutput out = run(L, &tr);
  EXPECT_EQ(out.backend, "emulated");
  int64_t skipped = 0;
  const StageReport rr = check_routing(L, out, &skipped);
  EXPECT_EQ(rr.violations, 0) << "routing: " << rr.str();
  EXPECT_LE(skipped, sc.tokens / 10) << "too many near-ties: routing barely compared";
  const auto reps = check_stages(L, out, tr);
  std::string ratios = "worst error/bound: routing " + std::to_string(rr.worst_ratio);
  for (size_t i = 0; i < reps.size(); ++i) {
    EXPECT_EQ(reps[i].violations, 0) << testing::stage_name(i) << ": " << reps[i].str();
    EXPECT_GT(reps[i].compared, 0) << testing::stage_name(i) << " compared nothing";
    ratios += std::string(", ") + testing::stage_name(i) + " " + std::to_string(reps[i].worst_ratio);
  }
  std::cout << sc.name << ": " << ratios << "\n";
  double norm = 0;
  for (uint16_t b : out.output_bf16) norm += std::fabs(bf16_decode(b));
  EXPECT_GT(norm, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, EmulatedStages, ::testing::ValuesIn(stage_cases()),
                         [](const auto& i) { return i.param.name; });

// Case-provided FP8 hidden states are used as given (no re-quantization).
TEST(EmulatedStagesFp8Input, HiddenFp8UsedAsGiven) {
  const MoeConfig c = base_config(RoutingMethod::deepseek_v3);
  const SmallLayer L = make_small_layer(c, 12, 21, true);
  std::vector<uint8_t> hc(12 * c.hidden_size);
  std::vector<float> hs(12 * 2);
  const CounterRng r{21, 50};
  for (size_t i = 0; i < hc.size(); ++i) hc[i] = testing::random_code(r, i);
  for (size_t i = 0; i < hs.size(); ++i) hs[i] = std::ldexp(1.0f + float(r.uniform(1000 + i)), -9);
  MoeProblem p = L.problem();
  p.hidden_fp8 = hc.data(), p.hidden_scale = hs.data();
  EmulatedTrace tr;
  EmulatedOptions o;
  o.trace = &tr, o.expert_outputs = true;
  const BackendOutput out = run_emulated(p, o);
  EXPECT_EQ(tr.act_codes, hc);
  EXPECT_EQ(tr.act_scales, hs);
  auto reps = check_stages(L, out, tr);
  EXPECT_GT(reps[0].violations, 0);  // the act check recomputes from hidden: must disagree here
  for (size_t i = 1; i < reps.size(); ++i) EXPECT_EQ(reps[i].violations, 0) << testing::stage_name(i) << ": " << reps[i].str();
}

// Negative control: the stage checks flag a run whose weight scales were read transposed.
TEST(EmulatedStagesControl, ChecksCatchAWrongRun) {
  const MoeConfig c = base_config(RoutingMethod::deepseek_v3);
  const SmallLayer L = make_small_layer(c, 8, 31, true);
  EmulatedTrace tr;
  const BackendOutput out = run(L, &tr, 0, Fault::weight_scale_transposed);
  const auto reps = check_stages(L, out, tr);
  EXPECT_GT(reps[1].violations, reps[1].compared / 2) << reps[1].str();
  EXPECT_GT(reps[4].violations, reps[4].compared / 2) << reps[4].str();
}

// ---- contract -------------------------------------------------------------------------
TEST(EmulatedContract, UnstoredLocalExpertIsInputError) {
  const MoeConfig c = base_config(RoutingMethod::renormalize);
  SmallLayer L = make_small_layer(c, 8, 41, false);
  const BackendOutput full = run(L, nullptr);
  std::vector<char> used(16, 0);
  for (int32_t e : full.topk_ids) used[e] = 1;
  int64_t unused = -1, routed = full.topk_ids[0];
  for (int64_t e = 0; e < 16; ++e)
    if (!used[e]) unused = e;
  ASSERT_GE(unused, 0) << "every expert routed: pick another seed";
  SmallLayer without_unused = L;
  without_unused.stored.erase(without_unused.stored.begin() + unused);
  without_unused.w13.erase(without_unused.w13.begin() + unused), without_unused.w2.erase(without_unused.w2.begin() + unused);
  without_unused.w13_scale.erase(without_unused.w13_scale.begin() + unused);
  without_unused.w2_scale.erase(without_unused.w2_scale.begin() + unused);
  EXPECT_EQ(run(without_unused, nullptr).output_bf16, full.output_bf16);
  SmallLayer without_routed = L;
  without_routed.stored.erase(without_routed.stored.begin() + routed);
  try {
    run(without_routed, nullptr);
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "small_layer");
    EXPECT_EQ(e.where(), "/weights/expert_ids");
    EXPECT_NE(e.rule().find("does not store"), std::string::npos) << e.what();
  }
}

TEST(EmulatedContract, TokensWithoutLocalSlotsArePlusZero) {
  MoeConfig c = base_config(RoutingMethod::renormalize);
  c.top_k = 2, c.local_expert_offset = 10, c.local_num_experts = 2;
  const SmallLayer L = make_small_layer(c, 32, 51, false);
  const BackendOutput out = run(L, nullptr);
  int64_t without = 0, with = 0;
  for (int64_t t = 0; t < 32; ++t) {
    bool local = false;
    for (int64_t j = 0; j < 2; ++j) local = local || c.is_local(out.topk_ids[t * 2 + j]);
    for (int64_t i = 0; i < c.hidden_size; ++i) {
      if (local) {
        with += out.output_bf16[t * c.hidden_size + i] != 0;
      } else {
        EXPECT_EQ(out.output_bf16[t * c.hidden_size + i], 0) << "token " << t;
      }
    }
    without += !local;
  }
  EXPECT_GT(without, 0);
  EXPECT_GT(with, 0);
}

TEST(EmulatedContract, BitwiseDeterministicAcrossThreadCounts) {
  const MoeConfig c = base_config(RoutingMethod::deepseek_v3);
  const SmallLayer L = make_small_layer(c, 40, 61, true);
  const BackendOutput one = run(L, nullptr, 1);
  for (int th : {2, 3, 8, 0}) {
    const BackendOutput o = run(L, nullptr, th);
    EXPECT_EQ(o.output_bf16, one.output_bf16) << th << " threads";
    EXPECT_EQ(0, std::memcmp(o.expert_outputs.data(), one.expert_outputs.data(), one.expert_outputs.size() * 4)) << th;
    EXPECT_EQ(o.topk_ids, one.topk_ids);
  }
}

// A slot's output depends only on its token and expert: an EP shard reproduces the unsharded
// run's local slot outputs bitwise (same seed = same weights per global expert).
TEST(EmulatedContract, EpShardSlotsEqualUnsharded) {
  const MoeConfig c = base_config(RoutingMethod::deepseek_v3);
  const SmallLayer full = make_small_layer(c, 16, 71, true);
  const BackendOutput f = run(full, nullptr);
  MoeConfig cs = c;
  cs.local_expert_offset = 5, cs.local_num_experts = 7;
  const SmallLayer shard = make_small_layer(cs, 16, 71, true);
  const BackendOutput s = run(shard, nullptr);
  ASSERT_EQ(s.topk_ids, f.topk_ids);
  const int64_t H = c.hidden_size;
  int64_t local = 0;
  for (int64_t i = 0; i < 16 * c.top_k; ++i) {
    const bool is_local = cs.is_local(s.topk_ids[i]);
    local += is_local;
    for (int64_t n = 0; n < H; ++n)
      ASSERT_EQ(s.expert_outputs[i * H + n], is_local ? f.expert_outputs[i * H + n] : 0.0f) << "slot " << i;
  }
  EXPECT_GT(local, 0);
}

// Batch independence: each token's output is the same, bitwise, when it runs alone.
RC_GTEST_PROP(EmulatedProps, TokenOutputIndependentOfBatch, ()) {
  const auto m = *rc::gen::element(RoutingMethod::deepseek_v3, RoutingMethod::renormalize, RoutingMethod::llama4);
  MoeConfig c = base_config(m);
  c.hidden_size = 128 * *rc::gen::inRange(1, 3), c.intermediate_size = 128;
  c.scale_format = *rc::gen::element(ScaleFormat::f32, ScaleFormat::ue8m0);
  const int64_t T = *rc::gen::inRange(2, 9);
  const uint64_t seed = *rc::gen::arbitrary<uint32_t>();
  const SmallLayer L = make_small_layer(c, T, seed, with_bias(c));
  const BackendOutput all = run(L, nullptr, 2);
  const int64_t t = *rc::gen::inRange<int64_t>(0, T);
  SmallLayer one = L;
  one.tokens = 1;
  one.hidden.assign(L.hidden.begin() + t * c.hidden_size, L.hidden.begin() + (t + 1) * c.hidden_size);
  one.logits.assign(L.logits.begin() + t * c.num_experts, L.logits.begin() + (t + 1) * c.num_experts);
  const BackendOutput alone = run(one, nullptr, 1);
  for (int64_t i = 0; i < c.hidden_size; ++i) RC_ASSERT(alone.output_bf16[i] == all.output_bf16[t * c.hidden_size + i]);
}

}  // namespace
}  // namespace moecheck
