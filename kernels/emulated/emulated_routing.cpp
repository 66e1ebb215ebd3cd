// Routing of the emulated backend in float32 (DEVICE-ALGORITHM.md §1), written from the method
// definitions of reference/moe_routing.hpp without its code.
//
// Per token: float32 scores (gate = what becomes the weight, sel = what top-k ranks), optional
// group exclusion (deepseek_v3 with n_group > 1), top-k by repeated arg-max (a later expert
// replaces the current best only when strictly greater: ties go to the lower index), weights.
// Rounding order of a weight: fl32(gate / sum) (renormalizing methods, sum over the chosen in
// rank order), then fl32(w * fl32(rsf)), then routing_weight_dtype (bf16: RNE of that float).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/emulated/emulated_internal.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck::emulated {
namespace {

float sigmoid_f32(float x) { return 1.0f / (1.0f + std::exp(-x)); }

bool uses_bias(RoutingMethod m) { return m == RoutingMethod::deepseek_v3 || m == RoutingMethod::sigmoid_renormalize; }
bool renormalizes(RoutingMethod m) {
  return m == RoutingMethod::deepseek_v3 || m == RoutingMethod::renormalize || m == RoutingMethod::sigmoid_renormalize;
}

// Index of the largest v[i] over i in [begin, end) with taken[i] false (first index on ties).
// Callers always leave an untaken index in the range (top_k <= candidates, topk_group <= n_group).
int64_t arg_max(const float* v, const std::vector<char>& taken, int64_t begin, int64_t end) {
  int64_t best = begin;
  while (best + 1 < end && taken[best]) ++best;
  for (int64_t i = best + 1; i < end; ++i)
    if (!taken[i] && v[i] > v[best]) best = i;
  return best;
}

// Scores of one token: gate[E] and sel[E].
void token_scores(const MoeConfig& c, const float* l, const float* bias, Fault fault, float* gate, float* sel) {
  const int64_t E = c.num_experts;
  switch (c.routing) {
    case RoutingMethod::deepseek_v3:
    case RoutingMethod::sigmoid_renormalize:
      for (int64_t e = 0; e < E; ++e) {
        gate[e] = sigmoid_f32(l[e]);
        sel[e] = gate[e];
        // faulty bias_ignored: docs/BUG-CLASSES.md #17 (bias missing from the selection)
        if (bias && fault != Fault::bias_ignored) {
          // faulty bias_bf16: docs/BUG-CLASSES.md #17 (bias handed over in bf16)
          const float b = fault == Fault::bias_bf16 ? bf16_round(bias[e]) : bias[e];
          sel[e] = gate[e] + b;
        }
      }
      break;
    case RoutingMethod::renormalize:
    case RoutingMethod::softmax_topk: {
      float mx = l[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
      float sum = 0.0f;
      for (int64_t e = 0; e < E; ++e) {
        gate[e] = std::exp(l[e] - mx);
        sum += gate[e];
      }
      for (int64_t e = 0; e < E; ++e) sel[e] = gate[e] = gate[e] / sum;
      break;
    }
    case RoutingMethod::llama4:
      for (int64_t e = 0; e < E; ++e) {
        gate[e] = sigmoid_f32(l[e]);
        sel[e] = l[e];
      }
      break;
  }
}

// Grouped deepseek_v3: keep the topk_group groups of largest (best + second best sel), set the
// other groups' sel to -inf.
void exclude_groups(const MoeConfig& c, float* sel, Fault fault, std::vector<float>& gscore, std::vector<char>& gtaken) {
  const int64_t G = c.n_group, per = c.num_experts / c.n_group;
  for (int64_t g = 0; g < G; ++g) {
    // The two largest values of the group (equal maxima count twice).
    float best = -std::numeric_limits<float>::infinity(), second = best;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) {
      if (sel[e] > best) {
        second = best;
        best = sel[e];
      } else if (sel[e] > second) {
        second = sel[e];
      }
    }
    gscore[g] = per == 1 ? best : best + second;
  }
  std::fill(gtaken.begin(), gtaken.end(), 0);
  for (int64_t i = 0; i < c.topk_group; ++i) gtaken[arg_max(gscore.data(), gtaken, 0, G)] = 1;
  // faulty group_mask_zero: docs/BUG-CLASSES.md #19 (masked groups filled with 0 instead of -inf)
  const float excluded = fault == Fault::group_mask_zero ? 0.0f : -std::numeric_limits<float>::infinity();
  for (int64_t g = 0; g < G; ++g)
    if (!gtaken[g])
      for (int64_t e = g * per; e < (g + 1) * per; ++e) sel[e] = excluded;
}

}  // namespace

RoutingF32 route_f32(const MoeConfig& c, const float* logits, const float* bias, int64_t tokens, Fault fault) {
  if (bias && !uses_bias(c.routing))
    throw std::invalid_argument("emulated routing: a correction bias is only defined for deepseek_v3 and "
                                "sigmoid_renormalize routing");
  const int64_t E = c.num_experts, k = c.top_k;
  RoutingF32 r;
  r.ids.resize(tokens * k);
  r.weights.resize(tokens * k);
  std::vector<float> gate(E), sel(E), gscore(c.n_group);
  std::vector<char> taken(E), gtaken(c.n_group);
  const float rsf = static_cast<float>(c.routed_scaling_factor);
  const bool grouped = c.routing == RoutingMethod::deepseek_v3 && c.n_group > 1;
  for (int64_t t = 0; t < tokens; ++t) {
    token_scores(c, logits + t * E, bias, fault, gate.data(), sel.data());
    std::fill(taken.begin(), taken.end(), 0);
    if (grouped) exclude_groups(c, sel.data(), fault, gscore, gtaken);
    int32_t* ids = r.ids.data() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = arg_max(sel.data(), taken, 0, E);
      taken[e] = 1;
      ids[j] = static_cast<int32_t>(e);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) sum += gate[ids[j]];
    float* w = r.weights.data() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = gate[ids[j]];
      // faulty no_renormalize: docs/BUG-CLASSES.md §1.1 "Routing formula" (weights not renormalized)
      if (renormalizes(c.routing) && fault != Fault::no_renormalize) w[j] = w[j] / sum;
      // faulty scaling_factor_missing: docs/BUG-CLASSES.md #16 (rsf not multiplied)
      if (fault != Fault::scaling_factor_missing) w[j] = w[j] * rsf;
      // faulty scaling_factor_twice: docs/BUG-CLASSES.md #16 (rsf applied again in the epilogue)
      if (fault == Fault::scaling_factor_twice) w[j] = w[j] * rsf;
      if (c.routing_weight_dtype == Precision::bf16) w[j] = bf16_round(w[j]);
    }
  }
  return r;
}

}  // namespace moecheck::emulated
