// The weighted combine of the slot outputs of one token, in the quantized tier, with its error
// budget, for each combine recipe (moe_config.hpp Combine; derivation: BUDGETS.md §5 and §9.1-9.2).
//
// Inputs per local slot j (non-local slots are left out; they contribute nothing): the
// reference's weight w_j (already rounded to routing_weight_dtype) and slot output y_j, the
// deviation dw_j a correct device's weight may have, and the slot budget dy_j. What a correct
// device computes, and what the reference computes with the same roundings on its own values:
//   f32                out = bf16(sum_j fl32(w_j y_j)) in float32, slot order. The reference keeps
//                      the sum unrounded (double); the final bf16 rounding is in the budget.
//   bf16_slots         v_j = bf16(fl32(w_j y_j)), out = bf16(float32 sum of the v_j). The
//                      reference rounds its own v_j the same way and keeps their sum unrounded.
//   bf16_expert_order  acc = bf16(fl32(acc + v_j)) over the slots in ascending expert id, from
//                      acc = 0. The reference's output is its own acc (already bf16).
#pragma once

#include <cstdint>
#include <span>

#include "reference/moe_budget.hpp"
#include "reference/moe_config.hpp"

namespace moecheck {

// bf16 rounding of the float32 rounding of x: the device's composite when it rounds a float32
// value that approximates x (monotone, so it may be applied to interval ends).
double bf16_of_f32(double x);
// [bf16_of_f32(v - e), bf16_of_f32(v + e)]: where a device value within e of v lands after the
// device rounds it to bf16.
Interval round_slot_interval(double v, double e);

struct SlotTerm {
  int64_t expert = 0;          // global id (the order of bf16_expert_order)
  double w = 0, dw = 0;        // weight and its deviation bound
  const double* y = nullptr;   // [H] slot output
  const double* dy = nullptr;  // [H] slot budget (nullptr: no budget wanted)
  const double* vy = nullptr;  // [H] with dy: the slot's noise variance (BUDGETS.md §10.3)
};

struct CombineOut {
  double* output = nullptr;     // [H] (accumulated into: must hold 0 on entry)
  double* budget = nullptr;     // [H] or nullptr: bound on |device output - output|
  double* noise_var = nullptr;  // [H] with budget: the noise model's variance (§10.3), about bf16_of_f32(output)
};

// top_k: the case's k (the float32 sums' length in the bound, as §5 counts it).
void combine_token(Combine how, std::span<const SlotTerm> slots, int64_t H, int64_t top_k, const CombineOut& out);

}  // namespace moecheck
