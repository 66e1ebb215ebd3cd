// Tests of the float64 MoE forward (reference/moe_forward.hpp).
//
// Sections:
//   naive      a second, deliberately plain implementation of both tiers (loops, no Eigen, no
//              panels, no threads) written from the spec; the optimised forward must agree.
//   cases      fixed configs: every routing method, both layouts, ue8m0, bf16 intermediates,
//              EP shards, subset storage errors.
//   properties RapidCheck: batch independence, linearity in the routing weights, EP shards sum
//              to the unsharded output, a TP split of I sums to the unsplit output.
//
// Tolerance used throughout (derived): two double evaluations of the same sums differ by at most
// ~2 K 2^-53 sum|a||w| per GEMM element (K <= 1024 here: ~2e-13 relative to the magnitudes), and
// an FP8 re-quantization turns such a difference into a code flip only when h/s lies within it
// of a rounding midpoint (probability ~1e-12 per element). kRel = 1e-9 of the row's largest
// magnitude is 4 orders of magnitude above the first and leaves the second negligible.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_forward.hpp"
#include "reference/moe_routing.hpp"
#include "tests/small_layer.hpp"

namespace moecheck {
namespace {

using testing::make_small_layer;
using testing::SmallLayer;
constexpr double kRel = 1e-9;

// ---- naive ---------------------------------------------------------------------------
double deq_w(const std::vector<uint8_t>& q, const std::vector<float>& s, int64_t cols, int64_t B, int64_t r, int64_t c) {
  return double(fp8_decode(q[r * cols + c], Fp8Format::e4m3fn)) * double(s[(r / B) * ceil_div(cols, B) + c / B]);
}

double rnd(double x, Precision p) { return p == Precision::bf16 ? double(bf16_round(x)) : double(static_cast<float>(x)); }

std::vector<double> naive_forward(const SmallLayer& L, Tier tier, const Routing& rt) {
  const MoeConfig& c = L.config;
  const int64_t T = L.tokens, H = c.hidden_size, I = c.intermediate_size, B = c.weight_block, G = c.group_size, k = c.top_k;
  std::vector<double> out(T * H, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    // activations
    std::vector<double> a(H);
    if (tier == Tier::ideal) {
      for (int64_t i = 0; i < H; ++i) a[i] = L.hidden[t * H + i];
    } else {
      for (int64_t g0 = 0; g0 < H; g0 += G) {
        const int64_t g1 = std::min(H, g0 + G);
        float amax = 0;
        for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(L.hidden[t * H + i]));
        const float s = group_scale(amax, c.scale_format, c.act_eps);
        for (int64_t i = g0; i < g1; ++i)
          a[i] = fp8_decode(fp8_encode(double(static_cast<float>(double(L.hidden[t * H + i]) / double(s))), Fp8Format::e4m3fn),
                            Fp8Format::e4m3fn) * double(s);
      }
    }
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = rt.ids[t * k + j];
      if (!c.is_local(e)) continue;
      size_t si = 0;
      while (L.stored[si] != e) ++si;
      const auto &w13 = L.w13[si], &w2 = L.w2[si];
      const auto &s13 = L.w13_scale[si], &s2 = L.w2_scale[si];
      std::vector<double> x(2 * I, 0.0);
      for (int64_t r = 0; r < 2 * I; ++r)
        for (int64_t i = 0; i < H; ++i) x[r] += a[i] * deq_w(w13, s13, H, B, r, i);
      const bool gate_first = c.gate_up_layout == GateUpLayout::gate_up;
      std::vector<double> h(I);
      for (int64_t i = 0; i < I; ++i) {
        double g = x[gate_first ? i : I + i], u = x[gate_first ? I + i : i];
        if (tier == Tier::quantized) g = rnd(g, c.intermediate_dtype), u = rnd(u, c.intermediate_dtype);
        h[i] = g / (1 + std::exp(-g)) * u;
        if (tier == Tier::quantized) h[i] = rnd(h[i], c.intermediate_dtype);
      }
      if (tier == Tier::quantized) {
        for (int64_t g0 = 0; g0 < I; g0 += G) {
          const int64_t g1 = std::min(I, g0 + G);
          float amax = 0;
          for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(static_cast<float>(h[i])));
          const float s = group_scale(amax, c.scale_format, c.act_eps);
          for (int64_t i = g0; i < g1; ++i)
            h[i] = fp8_decode(fp8_encode(double(static_cast<float>(h[i] / double(s))), Fp8Format::e4m3fn), Fp8Format::e4m3fn) * s;
        }
      }
      for (int64_t r = 0; r < H; ++r) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += h[i] * deq_w(w2, s2, I, B, r, i);
        out[t * H + r] += rt.weights[t * k + j] * y;
      }
    }
  }
  return out;
}

// |a - b| <= kRel * (row max magnitude + tiny), row by row.
::testing::AssertionResult rows_close(const std::vector<double>& a, const std::vector<double>& b, int64_t T, int64_t H) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (int64_t t = 0; t < T; ++t) {
    double m = 1e-300;
    for (int64_t i = 0; i < H; ++i) m = std::max({m, std::fabs(a[t * H + i]), std::fabs(b[t * H + i])});
    for (int64_t i = 0; i < H; ++i)
      if (!(std::fabs(a[t * H + i] - b[t * H + i]) <= kRel * m))
        return ::testing::AssertionFailure() << "token " << t << " col " << i << ": " << a[t * H + i] << " vs "
                                             << b[t * H + i] << " (row max " << m << ")";
  }
  return ::testing::AssertionSuccess();
}

MoeConfig small_config(RoutingMethod m) {
  MoeConfig c;
  c.num_experts = 8;
  c.top_k = m == RoutingMethod::llama4 ? 1 : 3;
  c.hidden_size = 256;
  c.intermediate_size = 256;
  c.routing = m;
  if (m == RoutingMethod::deepseek_v3) c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5;
  return c;
}

// ---- cases ---------------------------------------------------------------------------
struct ForwardCase {
  const char* name;
  MoeConfig config;
  bool bias;
};

class ForwardVsNaive : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(ForwardVsNaive, BothTiersAgree) {
  const ForwardCase& fc = GetParam();
  SmallLayer L = make_small_layer(fc.config, 7, 1234, fc.bias);
  for (Tier tier : {Tier::ideal, Tier::quantized}) {
    ForwardOptions opt;
    opt.tier = tier;
    opt.threads = 2;
    ForwardResult r = moe_forward(L.problem(), opt);
    EXPECT_TRUE(rows_close(r.output, naive_forward(L, tier, r.routing), L.tokens, fc.config.hidden_size))
        << fc.name << " tier " << to_string(tier);
    double norm = 0;
    for (double v : r.output) norm += v * v;
    EXPECT_GT(norm, 0) << "vacuous: all-zero output";
  }
}

std::vector<ForwardCase> forward_cases() {
  std::vector<ForwardCase> v;
  v.push_back({"deepseek_v3", small_config(RoutingMethod::deepseek_v3), true});
  v.push_back({"renormalize", small_config(RoutingMethod::renormalize), false});
  v.push_back({"softmax_topk", small_config(RoutingMethod::softmax_topk), false});
  v.push_back({"sigmoid_renormalize", small_config(RoutingMethod::sigmoid_renormalize), true});
  v.push_back({"llama4", small_config(RoutingMethod::llama4), false});
  MoeConfig c = small_config(RoutingMethod::renormalize);
  c.gate_up_layout = GateUpLayout::up_gate;
  v.push_back({"up_gate", c, false});
  c = small_config(RoutingMethod::deepseek_v3);
  c.scale_format = ScaleFormat::ue8m0;
  c.intermediate_dtype = Precision::bf16;
  c.routing_weight_dtype = Precision::bf16;
  v.push_back({"ue8m0_bf16", c, true});
  c = small_config(RoutingMethod::renormalize);
  c.local_expert_offset = 3, c.local_num_experts = 4;
  v.push_back({"ep_shard", c, false});
  c = small_config(RoutingMethod::renormalize);
  c.hidden_size = 200, c.intermediate_size = 136;  // ragged blocks and groups
  v.push_back({"ragged", c, false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Configs, ForwardVsNaive, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(MoeForward, UnstoredLocalExpertIsAnInputError) {
  SmallLayer L = make_small_layer(small_config(RoutingMethod::renormalize), 5, 7, false);
  MoeProblem p = L.problem();
  p.stored_experts = {0};  // the tokens route to more experts than this
  EXPECT_THROW(moe_forward(p, {}), InputError);
}

TEST(MoeForward, ExpertOutputsCombineToTheOutput) {
  SmallLayer L = make_small_layer(small_config(RoutingMethod::deepseek_v3), 6, 99, true);
  ForwardOptions opt;
  opt.expert_outputs = true;
  ForwardResult r = moe_forward(L.problem(), opt);
  const int64_t H = L.config.hidden_size, k = L.config.top_k;
  ASSERT_EQ(r.expert_outputs.size(), size_t(L.tokens * k * H));
  std::vector<double> sum(L.tokens * H, 0.0);
  for (int64_t t = 0; t < L.tokens; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t i = 0; i < H; ++i) sum[t * H + i] += r.routing.weights[t * k + j] * r.expert_outputs[(t * k + j) * H + i];
  EXPECT_TRUE(rows_close(sum, r.output, L.tokens, H));
}

// ---- properties ----------------------------------------------------------------------
bool uses_bias(const MoeConfig& c) {
  return c.routing == RoutingMethod::deepseek_v3 || c.routing == RoutingMethod::sigmoid_renormalize;
}

MoeConfig gen_config() {
  const auto method = *rc::gen::element(RoutingMethod::deepseek_v3, RoutingMethod::renormalize,
                                        RoutingMethod::softmax_topk, RoutingMethod::sigmoid_renormalize);
  MoeConfig c = small_config(method);
  c.hidden_size = 128 * *rc::gen::inRange(1, 3);
  c.intermediate_size = 128 * *rc::gen::inRange(1, 3);
  c.scale_format = *rc::gen::element(ScaleFormat::f32, ScaleFormat::ue8m0);
  c.intermediate_dtype = *rc::gen::element(Precision::f32, Precision::bf16);
  c.gate_up_layout = *rc::gen::element(GateUpLayout::gate_up, GateUpLayout::up_gate);
  return c;
}

RC_GTEST_PROP(MoeForwardProps, TokenUnaffectedByOtherTokens, ()) {
  const MoeConfig c = gen_config();
  const uint64_t seed = *rc::gen::arbitrary<uint32_t>();
  const int64_t T = *rc::gen::inRange(2, 9), t = *rc::gen::inRange<int64_t>(0, T);
  SmallLayer L = make_small_layer(c, T, seed, uses_bias(c));
  RC_TAG(to_string(c.routing));
  const Tier tier = *rc::gen::element(Tier::ideal, Tier::quantized);
  ForwardOptions opt;
  opt.tier = tier;
  ForwardResult all = moe_forward(L.problem(), opt);
  SmallLayer one = L;
  const int64_t H = c.hidden_size, E = c.num_experts;
  one.tokens = 1;
  one.hidden.assign(L.hidden.begin() + t * H, L.hidden.begin() + (t + 1) * H);
  one.logits.assign(L.logits.begin() + t * E, L.logits.begin() + (t + 1) * E);
  ForwardResult single = moe_forward(one.problem(), opt);
  std::vector<double> row(all.output.begin() + t * H, all.output.begin() + (t + 1) * H);
  RC_ASSERT(rows_close(row, single.output, 1, H));
}

RC_GTEST_PROP(MoeForwardProps, LinearInRoutingWeights, ()) {
  const MoeConfig c = gen_config();
  SmallLayer L = make_small_layer(c, 4, *rc::gen::arbitrary<uint32_t>(), uses_bias(c));
  const Routing base = route(c, L.logits.data(), L.bias.empty() ? nullptr : L.bias.data(), L.tokens);
  Routing r1 = base, r2 = base, r12 = base;
  for (size_t i = 0; i < base.weights.size(); ++i) {
    r1.weights[i] = *rc::gen::inRange(-8, 9) / 4.0;
    r2.weights[i] = *rc::gen::inRange(-8, 9) / 4.0;
    r12.weights[i] = r1.weights[i] + r2.weights[i];
  }
  auto run = [&](const Routing& r) {
    ForwardOptions opt;
    opt.routing_override = &r;
    return moe_forward(L.problem(), opt).output;
  };
  const auto o1 = run(r1), o2 = run(r2), o12 = run(r12);
  std::vector<double> sum(o1.size());
  for (size_t i = 0; i < o1.size(); ++i) sum[i] = o1[i] + o2[i];
  RC_ASSERT(rows_close(sum, o12, L.tokens, c.hidden_size));
}

RC_GTEST_PROP(MoeForwardProps, EpShardsSumToUnsharded, ()) {
  MoeConfig c = gen_config();
  const uint64_t seed = *rc::gen::arbitrary<uint32_t>();
  SmallLayer full = make_small_layer(c, 5, seed, uses_bias(c));
  const Tier tier = *rc::gen::element(Tier::ideal, Tier::quantized);
  ForwardOptions opt;
  opt.tier = tier;
  const auto ref = moe_forward(full.problem(), opt).output;
  const int shards = *rc::gen::element(2, 4, 8);
  std::vector<double> sum(ref.size(), 0.0);
  for (int s = 0; s < shards; ++s) {
    MoeConfig cs = c;
    cs.local_num_experts = c.num_experts / shards;
    cs.local_expert_offset = s * cs.local_num_experts;
    SmallLayer shard = make_small_layer(cs, 5, seed, uses_bias(c));  // same seed: same weights per global expert
    const auto o = moe_forward(shard.problem(), opt).output;
    for (size_t i = 0; i < o.size(); ++i) sum[i] += o[i];
  }
  RC_ASSERT(rows_close(sum, ref, full.tokens, c.hidden_size));
}

// A tp-style split of I: rank r keeps gate/up rows [r*I/n, (r+1)*I/n) of each half of w13 and
// the same columns of w2. With I/n a multiple of the group and block size, every re-quantization
// group and scale block stays whole, so the shards' outputs sum to the unsplit output.
RC_GTEST_PROP(MoeForwardProps, TpSplitSumsToUnsplit, ()) {
  MoeConfig c = gen_config();
  const int tp = *rc::gen::element(2, 4);
  c.intermediate_size = 128 * tp;
  const int64_t H = c.hidden_size, I = c.intermediate_size, Is = I / tp, B = c.weight_block;
  SmallLayer full = make_small_layer(c, 4, *rc::gen::arbitrary<uint32_t>(), uses_bias(c));
  const Tier tier = *rc::gen::element(Tier::ideal, Tier::quantized);
  ForwardOptions opt;
  opt.tier = tier;
  const auto ref = moe_forward(full.problem(), opt).output;
  std::vector<double> sum(ref.size(), 0.0);
  for (int r = 0; r < tp; ++r) {
    SmallLayer s = full;
    s.config.intermediate_size = Is;
    for (size_t e = 0; e < full.stored.size(); ++e) {
      std::vector<uint8_t> w13(2 * Is * H), w2(H * Is);
      std::vector<float> s13(ceil_div(2 * Is, B) * ceil_div(H, B)), s2(ceil_div(H, B) * ceil_div(Is, B));
      for (int half = 0; half < 2; ++half)
        for (int64_t i = 0; i < Is; ++i)
          std::copy_n(&full.w13[e][(half * I + r * Is + i) * H], H, &w13[(half * Is + i) * H]);
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t bi = 0; bi < Is / B; ++bi)
          std::copy_n(&full.w13_scale[e][((half * I + r * Is) / B + bi) * ceil_div(H, B)], ceil_div(H, B),
                      &s13[(half * Is / B + bi) * ceil_div(H, B)]);
      for (int64_t h = 0; h < H; ++h) std::copy_n(&full.w2[e][h * I + r * Is], Is, &w2[h * Is]);
      for (int64_t hb = 0; hb < ceil_div(H, B); ++hb)
        std::copy_n(&full.w2_scale[e][hb * (I / B) + r * Is / B], Is / B, &s2[hb * (Is / B)]);
      s.w13[e] = w13, s.w2[e] = w2, s.w13_scale[e] = s13, s.w2_scale[e] = s2;
    }
    const auto o = moe_forward(s.problem(), opt).output;
    for (size_t i = 0; i < o.size(); ++i) sum[i] += o[i];
  }
  RC_ASSERT(rows_close(sum, ref, full.tokens, H));
}

}  // namespace
}  // namespace moecheck

namespace moecheck {
namespace {

// The ideal and quantized tiers differ by the recipe's quantization error; BUDGETS.md §8 bounds
// it per element. The bound must hold everywhere, and must not be vacuous: the worst element
// reaches a sizeable fraction of it (the bound is a worst case: ~1e-2 of it is typical).
RC_GTEST_PROP(MoeForwardProps, IdealVsQuantizedWithinAnalyticBound, ()) {
  const MoeConfig c = gen_config();
  SmallLayer L = make_small_layer(c, *rc::gen::inRange(1, 6), *rc::gen::arbitrary<uint32_t>(), uses_bias(c));
  ForwardOptions oi;
  oi.tier = Tier::ideal;
  const auto ideal = moe_forward(L.problem(), oi).output;
  ForwardOptions oq;
  oq.tier = Tier::quantized;
  oq.ideal_bound = true;
  const ForwardResult q = moe_forward(L.problem(), oq);
  RC_ASSERT(q.ideal_bound.size() == ideal.size());
  double worst = 0;
  for (size_t i = 0; i < ideal.size(); ++i) {
    const double d = std::fabs(ideal[i] - q.output[i]);
    RC_ASSERT(d <= q.ideal_bound[i]);
    if (q.ideal_bound[i] > 0) worst = std::max(worst, d / q.ideal_bound[i]);
  }
  RC_LOG() << "worst ratio " << worst;
  RC_ASSERT(worst > 1e-3);
}

}  // namespace
}  // namespace moecheck
