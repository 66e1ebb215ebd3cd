// Error-budget primitives (derivation: reference/BUDGETS.md; contract: moe_budget.hpp).
#include "reference/moe_budget.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"

namespace moecheck {

namespace {
constexpr double kU32 = 0x1p-24;  // float32 unit roundoff

// gamma_n(u) = n u / (1 - n u) (Higham, Accuracy and Stability, §3.1).
double gamma(double n, double u) { return n * u / (1.0 - n * u); }

// silu's minimum: g* solves 1 + e^-g (1 + g) = 0; silu(g*) = g* + 1 (BUDGETS.md §3).
constexpr double kSiluArgMin = -1.2784645427610738;
double silu_d(double g) { return g / (1.0 + std::exp(-g)); }
}  // namespace

std::string AccumulatorModel::describe() const {
  return fmt::format("{} bits kept, {}{}", kept_bits, truncating ? "truncating" : "round-to-nearest",
                     truncating ? fmt::format(", {} products per instruction", instr_k) : "");
}

double dot_product_bound(const AccumulatorModel& acc, int64_t K, int64_t block, bool pow2_scales) {
  const int64_t nb = std::max<int64_t>(1, ceil_div(K, block));
  const int64_t n = std::min(K, block);  // products per block
  double c_blk;
  if (acc.truncating) {
    // Per instruction: its products and the running sum are aligned to the largest and each
    // truncated to kept_bits below it: < (instr_k + 1) 2^(1-p) max|term| <= that times the sum of
    // magnitudes so far; plus one float32 rounding of the accumulator register.
    const double c_inst = double(acc.instr_k + 1) * std::ldexp(1.0, 1 - acc.kept_bits) + kU32;
    c_blk = std::pow(1.0 + c_inst, double(ceil_div(n, acc.instr_k))) - 1.0;
  } else {
    // Recursive summation of n exact products, any order: gamma_{n-1}(2^-p).
    c_blk = gamma(double(n - 1), std::ldexp(1.0, -acc.kept_bits));
  }
  // Promotion: fl32(sa * sb) (exact for powers of two), then one FFMA rounding per block.
  const double c_scale = pow2_scales ? 0.0 : kU32;
  return (1.0 + c_scale) * (1.0 + c_blk) * (1.0 + gamma(double(nb), kU32)) - 1.0;
}

double promotion_bound(int64_t K, int64_t block, bool pow2_scales) {
  const int64_t nb = std::max<int64_t>(1, ceil_div(K, block));
  return (1.0 + (pow2_scales ? 0.0 : kU32)) * (1.0 + gamma(double(nb), kU32)) - 1.0;
}

double Interval::width_from(double v) const { return std::max(hi - v, v - lo); }

Interval round_interval(Interval x, Precision p) {
  if (p == Precision::bf16) return {double(bf16_round(x.lo)), double(bf16_round(x.hi))};
  return {double(fl32(x.lo)), double(fl32(x.hi))};
}

Interval silu_interval(Interval g, int silu_ulps) {
  double lo, hi;
  if (g.hi <= kSiluArgMin) {
    lo = silu_d(g.hi), hi = silu_d(g.lo);  // decreasing branch
  } else if (g.lo >= kSiluArgMin) {
    lo = silu_d(g.lo), hi = silu_d(g.hi);  // increasing branch
  } else {
    lo = silu_d(kSiluArgMin), hi = std::max(silu_d(g.lo), silu_d(g.hi));
  }
  // float32 evaluation: relative silu_ulps 2^-24 (+ 2^-50 for our own double evaluation), and an
  // absolute 2^-126 for the region where expf overflows and the device returns -0.
  const double m = std::max(std::fabs(lo), std::fabs(hi));
  const double w = m * (silu_ulps * kU32 + 0x1p-50) + 0x1p-126;
  return {lo - w, hi + w};
}

Interval product_interval_f32(Interval a, Interval b) {
  const double c[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
  double lo = *std::min_element(c, c + 4), hi = *std::max_element(c, c + 4);
  const double w = std::max(std::fabs(lo), std::fabs(hi)) * kU32 + 0x1p-149;
  return {lo - w, hi + w};
}

namespace {
// Range of scales a correct device may derive from an amax in [amax_lo, amax_hi] (no floor:
// amax itself, and a zero scale stays 0).
Interval scale_range(double amax_lo, double amax_hi, const ActQuantRule& r, int ulps) {
  auto one = [&](double amax, double widen) {
    const double floored = r.floor == ActScaleFloor::eps ? std::max(amax, r.eps) : amax;
    const float s = fl32(floored / 448.0 * (1.0 + widen * ulps * kU32));
    return r.format == ScaleFormat::f32 || s == 0.0f ? double(s) : ue8m0_decode(ue8m0_encode_ceil(s));
  };
  return {one(amax_lo, -1.0), one(amax_hi, +1.0)};
}
}  // namespace

void requant_deviation(const double* lo, const double* hi, const double* ref_deq, int64_t n, ScaleFormat fmt,
                       double eps, const BudgetModel& m, double* dev) {
  requant_deviation(lo, hi, ref_deq, n, ActQuantRule{fmt, eps}, m, dev);
}

void requant_deviation(const double* lo, const double* hi, const double* ref_deq, int64_t n, const ActQuantRule& r,
                       const BudgetModel& m, double* dev) {
  double amax_lo = 0, amax_hi = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = (lo[i] <= 0 && hi[i] >= 0) ? 0.0 : std::min(std::fabs(lo[i]), std::fabs(hi[i]));
    amax_lo = std::max(amax_lo, a);
    amax_hi = std::max({amax_hi, std::fabs(lo[i]), std::fabs(hi[i])});
  }
  const Interval s = scale_range(amax_lo, amax_hi, r, m.scale_ulps);
  // x * fl32(1/s) is within (1 + u)^2 - 1 < 2u of x / s: the divide_ulps = 2 slack (§1) covers
  // the reciprocal recipe with the same formula.
  const double dw = m.divide_ulps * kU32;
  for (int64_t i = 0; i < n; ++i) {
    if (s.lo == 0) {
      // No floor and a group that may be all zero (BUDGETS.md §9.3): the device's scale lies in
      // [0, s_hi]; a zero scale gives 0 (the reference's rule), any other keeps the sign of h and
      // saturates at 448 s <= 448 s_hi.
      const double q_lo = lo[i] < 0 ? -448.0 * s.hi : 0.0, q_hi = hi[i] > 0 ? 448.0 * s.hi : 0.0;
      dev[i] = std::max({q_hi - ref_deq[i], ref_deq[i] - q_lo, 0.0});
      continue;
    }
    double v_lo = std::min(lo[i] / s.lo, lo[i] / s.hi), v_hi = std::max(hi[i] / s.lo, hi[i] / s.hi);
    v_lo -= std::fabs(v_lo) * dw;
    v_hi += std::fabs(v_hi) * dw;
    // e4m3 RNE with saturation is monotone, so the codes of the whole range lie between these.
    const double d_lo = fp8_decode(fp8_encode(v_lo, Fp8Format::e4m3fn, Saturation::finite), Fp8Format::e4m3fn);
    const double d_hi = fp8_decode(fp8_encode(v_hi, Fp8Format::e4m3fn, Saturation::finite), Fp8Format::e4m3fn);
    const double q_lo = std::min(d_lo * s.lo, d_lo * s.hi), q_hi = std::max(d_hi * s.lo, d_hi * s.hi);
    dev[i] = std::max({q_hi - ref_deq[i], ref_deq[i] - q_lo, 0.0});
  }
}

double weight_deviation(double w, double w_ref, Precision p, int64_t slack_ulps, const BudgetModel& m) {
  const double rel = double(slack_ulps + m.routing_ulps) * kU32;
  const Interval r = round_interval({std::min(w * (1 - rel), w * (1 + rel)), std::max(w * (1 - rel), w * (1 + rel))}, p);
  return std::max(r.width_from(w_ref), 0.0);
}

double output_budget_bf16(double o, double e) {
  const double lo = bf16_round(o - e), hi = bf16_round(o + e);
  return std::max(hi - o, o - lo);
}

double bf16_ulp(double x) {
  if (x == 0 || !std::isfinite(x)) return 0.0;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  return std::ldexp(1.0, std::max(e - 1, -126) - 7);
}

}  // namespace moecheck
