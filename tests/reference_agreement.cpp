// The agreement interval of two float64 engines' references (reference_agreement.hpp).
#include "tests/reference_agreement.hpp"

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <fmt/format.h>

#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_combine.hpp"

namespace moecheck::testing {

std::vector<double> dequantize_weight(const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B) {
  std::vector<double> w(size_t(N * K));
  const int64_t kb = ceil_div(K, B);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c)
      w[size_t(r * K + c)] = fp8_decode(codes[r * K + c], Fp8Format::e4m3fn) * double(scales[(r / B) * kb + c / B]);
  return w;
}

namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr double kU = 0x1p-53;
double gamma(int64_t n) { return double(n) * kU / (1 - double(n) * kU); }

Mat dequantize(const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B) {
  return Eigen::Map<const Mat>(dequantize_weight(codes, scales, N, K, B).data(), N, K);
}

// [lo, hi] computed in round-to-nearest, each end moved outward by one double rounding.
Interval outward(double lo, double hi) {
  return {lo - std::fabs(lo) * 0x1p-52 - 0x1p-1074, hi + std::fabs(hi) * 0x1p-52 + 0x1p-1074};
}

// The product of two intervals, widened by one double rounding of the largest corner.
Interval product_interval(Interval a, Interval b) {
  const double c[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
  const double lo = *std::min_element(c, c + 4), hi = *std::max_element(c, c + 4);
  const double w = std::max(std::fabs(lo), std::fabs(hi)) * 0x1p-52 + 0x1p-1074;
  return {lo - w, hi + w};
}

}  // namespace

Agreement agreement_interval(const MoeProblem& p, Tier tier, const Routing& rt) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, I = c.intermediate_size, k = c.top_k, B = c.weight_block,
                G = c.group_size, hg = ceil_div(H, G);
  const ActQuantRule rule = act_quant_rule(c);
  std::vector<uint8_t> qcodes;
  std::vector<float> qscales;
  if (tier == Tier::quantized) {
    if (p.hidden_fp8 && p.hidden_scale) {
      qcodes.assign(p.hidden_fp8, p.hidden_fp8 + T * H);
      qscales.assign(p.hidden_scale, p.hidden_scale + T * hg);
    } else {
      GroupQuantized g = group_quantize(p.hidden, T, H, G, rule);
      qcodes = std::move(g.codes), qscales = std::move(g.scales);
    }
  }
  // group_quantize_row's scale fl32(amax / 448) is scale_range's own formula (no slack); its
  // quotient fl32(x / s), or fl32(x fl32(1 / s)) for the reciprocal recipe, lies within one, or
  // two, 2^-24 ulps of the double quotient the range takes at its ends.
  BudgetModel slack;
  slack.scale_ulps = 0, slack.divide_ulps = rule.divide == QuantDivide::divide ? 1 : 2;
  const int64_t gate0 = c.gate_up_layout == GateUpLayout::gate_up ? 0 : I, up0 = I - gate0;
  Agreement A;
  A.slot_lo.assign(size_t(T * k * H), 0.0), A.slot_hi.assign(size_t(T * k * H), 0.0);
  std::vector<double> a(H), ilo(I), ihi(I), href(I), dev(I);
  std::vector<float> hf(I), qs(ceil_div(I, G));
  std::vector<uint8_t> hq(I);
  for (int64_t e : p.stored_experts) {
    if (!c.is_local(e)) continue;
    bool used = false;
    for (int64_t s = 0; s < T * k; ++s) used |= rt.ids[s] == e;
    if (!used) continue;
    const ExpertView w = p.load_expert(e);
    const Mat W13 = dequantize(w.w13, w.w13_scale, 2 * I, H, B), W2 = dequantize(w.w2, w.w2_scale, H, I, B);
    const Mat A13 = W13.cwiseAbs(), A2 = W2.cwiseAbs();
    for (int64_t s = 0; s < T * k; ++s) {
      if (rt.ids[s] != e) continue;
      const int64_t t = s / k;
      for (int64_t i = 0; i < H; ++i)
        a[i] = tier == Tier::ideal ? double(p.hidden[t * H + i])
                                   : fp8_decode(qcodes[t * H + i], Fp8Format::e4m3fn) * double(qscales[t * hg + i / G]);
      const Eigen::Map<const Eigen::VectorXd> av(a.data(), H);
      const Eigen::VectorXd x = W13 * av, m1 = A13 * av.cwiseAbs();
      for (int64_t i = 0; i < I; ++i) {
        // m1 is itself a double sum of non-negative terms: within gamma_H of its exact value.
        const double dg = 2 * gamma(H) * m1[gate0 + i] * (1 + 2 * gamma(H)),
                     du = 2 * gamma(H) * m1[up0 + i] * (1 + 2 * gamma(H));
        Interval g = outward(x[gate0 + i] - dg, x[gate0 + i] + dg), u = outward(x[up0 + i] - du, x[up0 + i] + du);
        if (tier == Tier::ideal) {
          const Interval h = product_interval(silu_interval(g, 0), u);
          ilo[i] = h.lo, ihi[i] = h.hi;
          continue;
        }
        const Precision ip = c.intermediate_dtype;
        g = round_interval(g, ip), u = round_interval(u, ip);
        Interval sg = silu_interval(g, 0);
        if (c.recipe.silu_dtype == Precision::bf16) sg = round_interval(sg, Precision::bf16);
        const Interval h = round_interval(product_interval(sg, u), ip);
        ilo[i] = h.lo, ihi[i] = h.hi;
        // The centre the re-quantization range is measured from: this file's own h.
        const double gc = round_to(x[gate0 + i], ip), uc = round_to(x[up0 + i], ip);
        const double sc = c.recipe.silu_dtype == Precision::bf16 ? round_to(silu(gc), Precision::bf16) : silu(gc);
        hf[i] = float(round_to(sc * uc, ip));
      }
      if (tier == Tier::quantized) {
        group_quantize_row(hf.data(), I, G, rule, hq.data(), qs.data());
        for (int64_t i = 0; i < I; ++i) href[i] = fp8_decode(hq[i], Fp8Format::e4m3fn) * double(qs[i / G]);
        for (int64_t g0 = 0; g0 < I; g0 += G)
          requant_deviation(ilo.data() + g0, ihi.data() + g0, href.data() + g0, std::min(G, I - g0), rule, slack,
                            dev.data() + g0);
        for (int64_t i = 0; i < I; ++i) {
          const Interval h = outward(href[i] - dev[i], href[i] + dev[i]);
          ilo[i] = h.lo, ihi[i] = h.hi;
        }
      }
      Eigen::VectorXd hc(I), hr(I);
      for (int64_t i = 0; i < I; ++i) hc[i] = 0.5 * (ilo[i] + ihi[i]), hr[i] = 0.5 * (ihi[i] - ilo[i]);
      const Eigen::VectorXd y = W2 * hc, rad = A2 * hr, mag = A2 * (hc.cwiseAbs() + hr);
      for (int64_t o = 0; o < H; ++o) {
        // Two engines' GEMM2 roundings plus this file's own evaluation of the centre and radius.
        const double d = (rad[o] + 3 * gamma(I) * mag[o]) * (1 + 2 * gamma(I)) + 0x1p-1074;
        const Interval yi = outward(y[o] - d, y[o] + d);
        double lo = yi.lo, hi = yi.hi;
        if (tier == Tier::quantized && c.recipe.expert_output_dtype == Precision::bf16)
          lo = bf16_of_f32(lo), hi = bf16_of_f32(hi);
        A.slot_lo[size_t(s * H + o)] = lo, A.slot_hi[size_t(s * H + o)] = hi;
      }
    }
  }
  // The combine at both ends (weights >= 0: monotone in every slot output).
  A.lo.assign(size_t(T * H), 0.0), A.hi.assign(size_t(T * H), 0.0);
  std::vector<SlotTerm> lo_terms, hi_terms;
  for (int64_t t = 0; t < T; ++t) {
    lo_terms.clear(), hi_terms.clear();
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      if (!c.is_local(rt.ids[s])) continue;
      EXPECT_GE(rt.weights[s], 0.0) << "the combine's monotonicity needs weights >= 0";
      lo_terms.push_back({rt.ids[s], rt.weights[s], 0.0, A.slot_lo.data() + s * H, nullptr});
      hi_terms.push_back({rt.ids[s], rt.weights[s], 0.0, A.slot_hi.data() + s * H, nullptr});
    }
    combine_token(c.recipe.combine, lo_terms, H, k, CombineOut{A.lo.data() + t * H});
    combine_token(c.recipe.combine, hi_terms, H, k, CombineOut{A.hi.data() + t * H});
  }
  return A;
}

namespace {

void check_inside(const std::vector<double>& v, const std::vector<double>& lo, const std::vector<double>& hi,
                  const char* what, double scale, AgreementTally& tally) {
  ASSERT_EQ(v.size(), lo.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!(v[i] >= lo[i] && v[i] <= hi[i])) {
      if (tally.outside++ == 0)
        tally.first_outside = fmt::format("{}[{}] = {:.17g} outside [{:.17g}, {:.17g}]", what, i, v[i], lo[i], hi[i]);
    }
    tally.widest = std::max(tally.widest, (hi[i] - lo[i]) / scale);
  }
  tally.checked += int64_t(v.size());
}

// The CPU's and the engine's forwards of one tier, checked against the agreement interval.
void compare_engines(const MoeProblem& p, Tier tier, WeightProducts& products, const std::string& replay,
                     AgreementTally& tally) {
  ForwardOptions opt;
  opt.tier = tier;
  opt.expert_outputs = true;
  const ForwardResult cpu = moe_forward(p, opt);
  opt.products = &products;
  const ForwardResult dev = moe_forward(p, opt);
  ASSERT_EQ(cpu.routing.ids, dev.routing.ids) << replay;
  ASSERT_EQ(cpu.routing.weights, dev.routing.weights) << replay;
  const Agreement A = agreement_interval(p, tier, cpu.routing);
  double scale = 0x1p-1074;
  for (double v : cpu.output) scale = std::max(scale, std::fabs(v));
  AgreementTally t;
  check_inside(cpu.output, A.lo, A.hi, "cpu output", scale, t);
  check_inside(dev.output, A.lo, A.hi, "engine output", scale, t);
  check_inside(cpu.expert_outputs, A.slot_lo, A.slot_hi, "cpu slot", scale, t);
  check_inside(dev.expert_outputs, A.slot_lo, A.slot_hi, "engine slot", scale, t);
  if (t.outside && tally.first_outside.empty())
    tally.first_outside = fmt::format("{} tier: {}\n  replay: {}", to_string(tier), t.first_outside, replay);
  for (size_t i = 0; i < cpu.output.size(); ++i) {
    tally.wide += A.hi[i] - A.lo[i] > 0x1p-30 * scale;
    tally.identical += cpu.output[i] == dev.output[i];
    tally.largest_diff = std::max(tally.largest_diff, std::fabs(cpu.output[i] - dev.output[i]) / scale);
  }
  tally.elements += int64_t(cpu.output.size());
  tally.outside += t.outside;
  tally.checked += t.checked;
  tally.widest = std::max(tally.widest, t.widest);
}

}  // namespace

void check_engines_agree(const MoeProblem& p, WeightProducts& products, const std::string& replay,
                         AgreementTally& tally) {
  for (Tier tier : {Tier::ideal, Tier::quantized}) compare_engines(p, tier, products, replay, tally);
}

std::string AgreementTally::summary(const std::string& what) const {
  const double n = double(std::max<int64_t>(1, elements));
  return fmt::format("{}: {} outputs, {} bit-identical ({:.1f} %), largest |cpu - engine| {:.3g}; agreement interval "
                     "wider than 2^-30 (a rounding boundary within reach) for {} ({:.2f} %), widest {:.3g} (all relative "
                     "to the largest |output| of each case); {} of {} checked values (outputs and slot outputs of "
                     "both forwards) outside",
                     what, elements, identical, 100.0 * double(identical) / n, largest_diff, wide,
                     100.0 * double(wide) / n, widest, outside, checked);
}

namespace {
void diff_array(const std::string& name, const std::vector<double>& a, const std::vector<double>& b,
                std::vector<BudgetArrayDiff>& out) {
  BudgetArrayDiff d;
  static_cast<ArrayAgreement&>(d) = array_agreement(a, b);
  d.name = name;
  out.push_back(d);
}
}  // namespace

std::vector<BudgetArrayDiff> budget_differences(const ForwardResult& cpu, const ForwardResult& engine) {
  std::vector<BudgetArrayDiff> out;
  diff_array("budget", cpu.budget, engine.budget, out);
  diff_array("slot_budget", cpu.slot_budget, engine.slot_budget, out);
  diff_array("noise_var", cpu.noise_var, engine.noise_var, out);
  diff_array("slot_noise_var", cpu.slot_noise_var, engine.slot_noise_var, out);
  diff_array("slot_flip_projection", cpu.slot_flip_projection, engine.slot_flip_projection, out);
  diff_array("slot_flip_tail", cpu.slot_flip_tail, engine.slot_flip_tail, out);
  diff_array("slot_energy_tail", cpu.slot_energy_tail, engine.slot_energy_tail, out);
  diff_array("requant.direction", cpu.requant.direction, engine.requant.direction, out);
  diff_array("requant.signal", cpu.requant.signal, engine.requant.signal, out);
  diff_array("requant.var", cpu.requant.var, engine.requant.var, out);
  diff_array("requant.mean", cpu.requant.mean, engine.requant.mean, out);
  diff_array("requant.mean_bound", cpu.requant.mean_bound, engine.requant.mean_bound, out);
  diff_array("requant.tail", cpu.requant.tail, engine.requant.tail, out);
  return out;
}

std::string BudgetArrayDiff::describe() const {
  return fmt::format("{}: {} values, {} bit-identical, largest relative difference {:.3g}{}", name, values, identical,
                     largest_rel, where >= 0 ? fmt::format(" (at {}: cpu {:.17g}, engine {:.17g})", where, cpu, engine) : "");
}

}  // namespace moecheck::testing
