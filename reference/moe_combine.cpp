// Combine recipes of the quantized tier and their budgets (moe_combine.hpp; BUDGETS.md §5, §9).
#include "reference/moe_combine.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/fp8_formats.hpp"
#include "reference/noise_model.hpp"

namespace moecheck {

namespace {
constexpr double kU32 = 0x1p-24;
double gamma(double n) { return n * kU32 / (1.0 - n * kU32); }

// Bound on |device fl32(w_j y_j) - w_j y_j| (before any bf16 rounding of the slot): the
// device's weight and slot output deviate by dw and dy, so w' y' - w y = w (y' - y) + (w' - w) y';
// plus the float32 rounding of the product (relative u), and 2^-149 where it underflows.
// coeff_u: how many float32 roundings of the product's magnitude to charge (the f32 combine
// folds the sum's gamma_{k+1} in here; a bf16 slot pays one).
double product_dev(double w, double dw, double y, double dy, double coeff_u) {
  const double ay = std::fabs(y) + dy;
  return std::fabs(w) * dy + dw * ay + coeff_u * (std::fabs(w) + dw) * ay + 0x1p-149;
}
// The noise model's variance of the same product (BUDGETS.md §10.3): the slot's own variance
// through w, the weight's deviation and the float32 roundings as independent terms of their
// worst-case range.
double product_var(double w, double dw, double y, double dy, double vy, double coeff_u) {
  const double ay = std::fabs(y) + dy, r = dw * ay + coeff_u * (std::fabs(w) + dw) * ay + 0x1p-149;
  return w * w * vy + r * r;
}
}  // namespace

double bf16_of_f32(double x) { return double(bf16_round(double(fl32(x)))); }

Interval round_slot_interval(double v, double e) { return {bf16_of_f32(v - e), bf16_of_f32(v + e)}; }

void combine_token(Combine how, std::span<const SlotTerm> slots, int64_t H, int64_t top_k, const CombineOut& out) {
  const bool budget = out.budget != nullptr;
  if (how == Combine::f32) {
    // §5: e = sum_j [|w| dy + dw ay + 2^-149] + gamma_{k+1}(u) sum_j (|w| + dw) ay.
    const double gk = gamma(double(top_k + 1));
    for (int64_t i = 0; i < H; ++i) {
      double e = 0, var = 0;
      for (const SlotTerm& s : slots) {
        out.output[i] += s.w * s.y[i];
        if (budget) e += product_dev(s.w, s.dw, s.y[i], s.dy[i], gk), var += product_var(s.w, s.dw, s.y[i], s.dy[i], s.vy[i], gk);
      }
      if (!budget) continue;
      out.budget[i] = output_budget_bf16(out.output[i], e);
      out.noise_var[i] = rounded_noise_var(out.output[i], bf16_of_f32(out.output[i]), var);
    }
    return;
  }
  if (how == Combine::bf16_slots) {
    // §9.1: each slot's interval is rounded by R_bf16 (bf16 of fl32); the float32 sum of the k
    // rounded values errs by gamma_k(u) of their magnitudes; then the final bf16 rounding.
    const double gk = gamma(double(top_k));
    for (int64_t i = 0; i < H; ++i) {
      double width = 0, mag = 0, var = 0;
      for (const SlotTerm& s : slots) {
        const double p = s.w * s.y[i], v = bf16_of_f32(p);
        out.output[i] += v;
        if (!budget) continue;
        const Interval r = round_slot_interval(p, product_dev(s.w, s.dw, s.y[i], s.dy[i], kU32));
        width += r.width_from(v);
        mag += std::max(std::fabs(r.lo), std::fabs(r.hi));
        var += rounded_noise_var(p, v, product_var(s.w, s.dw, s.y[i], s.dy[i], s.vy[i], kU32));
      }
      if (!budget) continue;
      const double e = width + gk * mag;
      out.budget[i] = output_budget_bf16(out.output[i], e);
      out.noise_var[i] = rounded_noise_var(out.output[i], bf16_of_f32(out.output[i]), var + gk * mag * gk * mag);
    }
    return;
  }
  // §9.2 bf16_expert_order: the running bf16 sum's interval [A_lo, A_hi] follows the device's
  // additions end by end (bf16(fl32(a + v)) is monotone in a and v), in ascending expert id.
  std::vector<const SlotTerm*> order;
  for (const SlotTerm& s : slots) order.push_back(&s);
  std::sort(order.begin(), order.end(), [](const SlotTerm* a, const SlotTerm* b) { return a->expert < b->expert; });
  for (int64_t i = 0; i < H; ++i) {
    double acc = 0;
    Interval a{0, 0};
    for (const SlotTerm* s : order) {
      const double p = s->w * s->y[i], v = bf16_of_f32(p);
      acc = bf16_of_f32(acc + v);
      if (!budget) continue;
      const Interval r = round_slot_interval(p, product_dev(s->w, s->dw, s->y[i], s->dy[i], kU32));
      a = {bf16_of_f32(a.lo + r.lo), bf16_of_f32(a.hi + r.hi)};
    }
    out.output[i] += acc;
    if (!budget) continue;
    // The output is already bf16 on both sides: no further rounding. Every deviation is
    // counted as systematic (nothing here is independent of the reference's own roundings): the
    // noise model keeps the worst case (BUDGETS.md §10.3).
    out.budget[i] = std::max(a.width_from(acc), 0.0);
    out.noise_var[i] = out.budget[i] * out.budget[i];
  }
}

}  // namespace moecheck
