// The float64 MoE forward: what the layer means (tier "ideal") and what an FP8 block-scale
// implementation is supposed to compute with every matrix product exact (tier "quantized").
//
// Tiers, step by step (docs/DEVICE-ALGORITHM.md is the device version of the same recipe):
//   ideal      a = hidden states (bf16/float inputs are exact in double); weights dequantized
//              exactly (decode(q) * scale, exact in double); x = a W13^T, h = silu(gate) * up,
//              y = h W2^T, out = sum_slots w * y; everything in double; routing weights in double.
//   quantized  a = dequant(group_quantize(hidden)) (or the case's own hidden_states_fp8 +
//              scales); x = a W13^T in double, then rounded to intermediate_dtype;
//              h = silu(gate) * up in double (silu rounded to silu_dtype first), rounded to
//              intermediate_dtype (float32 at least); h group-quantized per group_size along I
//              and dequantized; y = h W2^T in double, rounded to expert_output_dtype; routing
//              weights rounded to routing_weight_dtype; combined as the combine recipe says
//              (moe_combine.hpp). Quantization follows act_scale_floor and quant_divide
//              (fp8_quant.hpp). The recipe attributes are MoeConfig::recipe (moe_config.hpp).
// "Exact products": the GEMMs run in double on exactly dequantized operands. Their rounding
// error is <= ~K * 2^-53 relative to sum |a||w| (about 1e-12 at K = 7168), which the budgets
// (reference/BUDGETS.md) treat as zero: it is 9 orders of magnitude under the FP8 terms.
//
// Both tiers honour gate_up_layout, UE8M0 scales, expert parallelism (only experts in
// [local_expert_offset, local_expert_offset + local_num_experts) contribute; a slot of another
// expert gives 0, as in an EP shard before the all-reduce) and subset storage (a token routed to
// a local expert the case does not store is an InputError).
//
// Memory and speed: weights stay FP8 in memory; one expert at a time is dequantized, in panels
// of rows that stay in cache, never the layer. Tokens are grouped by expert and each expert runs
// as two Eigen GEMMs in double; threads take experts from a shared counter. Slot outputs are
// kept per (token, slot) and combined in slot order afterwards, so results do not depend on
// thread scheduling.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reference/moe_budget.hpp"
#include "reference/moe_config.hpp"
#include "reference/moe_routing.hpp"
#include "reference/weight_products.hpp"

namespace moecheck {

enum class Tier { ideal, quantized };
std::string_view to_string(Tier t);
std::optional<Tier> parse_tier(std::string_view s);
inline std::ostream& operator<<(std::ostream& os, Tier t) { return os << to_string(t); }

// One expert's FP8 weights as stored: w13 [2I, H] codes + [ceil(2I/B), ceil(H/B)] scales,
// w2 [H, I] codes + [ceil(H/B), ceil(I/B)] scales. `owner` keeps the memory alive when the
// loader allocated it (pointers may also point into memory the caller owns).
struct ExpertView {
  const uint8_t* w13 = nullptr;
  const float* w13_scale = nullptr;
  const uint8_t* w2 = nullptr;
  const float* w2_scale = nullptr;
  std::shared_ptr<void> owner;
};

// Returns the weights of one global expert. Called from worker threads, one call at a time
// (the forward serialises calls, so a loader reading an HDF5 file needs no locking of its own).
using ExpertLoader = std::function<ExpertView(int64_t global_expert)>;

// Everything the forward reads. Pointers are row-major and must outlive the call.
struct MoeProblem {
  MoeConfig config;
  int64_t tokens = 0;
  const float* hidden = nullptr;        // [T, H] values (bf16 inputs decoded exactly)
  const uint8_t* hidden_fp8 = nullptr;  // optional [T, H] e4m3 codes the engine produced ...
  const float* hidden_scale = nullptr;  // ... and their scales [T, ceil(H/G)]
  const float* logits = nullptr;        // [T, E]
  const float* bias = nullptr;          // [E] or nullptr
  std::vector<int64_t> stored_experts;  // global ids available to load_expert (ascending)
  ExpertLoader load_expert;
  std::string source;                   // file name for error messages
};

struct ForwardOptions {
  Tier tier = Tier::quantized;
  bool expert_outputs = false;          // keep the per-slot outputs [T, k, H]
  int threads = 0;                      // 0: std::thread::hardware_concurrency()
  // Use these ids and (exact, double) weights instead of routing; the quantized tier rounds the
  // weights to routing_weight_dtype as it does its own.
  const Routing* routing_override = nullptr;
  // Quantized tier only: also compute the error budget of every output element and slot
  // (reference/BUDGETS.md) under this model. Implies expert_outputs.
  const BudgetModel* budget = nullptr;
  // Quantized tier only: also bound |ideal tier - quantized tier| per output element (the
  // recipe's quantization error, reference/BUDGETS.md §8). Implies expert_outputs.
  bool ideal_bound = false;
  // With budget: also the re-quantization test's terms (BUDGETS.md §10.7; requant_projection.hpp),
  // at the cost of a float32 GEMM2-sized product per expert and a second pass over W2.
  bool requant_terms = false;
  // Called after each expert with (experts done, experts to do); may be empty.
  std::function<void(int64_t, int64_t)> progress;
  // Where the two weight products of each expert run (weight_products.hpp); nullptr: Eigen on
  // this CPU. Everything else (routing, activation quantization, SiLU and the re-quantization of
  // h, the combine) stays on the CPU, the same code either way. The budget's and the ideal
  // bound's extra products run there too where the engine runs them all
  // (WeightProducts::multiply_with_extras), else on the CPU's panels, per product. Tokens go in
  // chunks of up to 4 GiB of slot outputs (512 MiB on the CPU): each chunk sends every routed
  // expert's weights to the engine.
  WeightProducts* products = nullptr;
};

// The re-quantization test's reference terms (BUDGETS.md §10.7; requant_projection.hpp): the
// test direction q_t = sum over local slots of w_j W2_j (a o (h_deq - h))_j [T, H], and per
// token [T] a skipped re-quantization's projection on it <r_t, q_t> (signal), the variance, the
// mean and a bound on the mean's unsigned part of the intermediate deviations' share of <d_t, q_t>.
struct RequantTerms {
  std::vector<double> direction, signal, var, mean, mean_bound;
  // Per slot [T, k, kFlipTailWidth]: the codes' crossings among the var terms as rare bounded
  // terms of <d_t, q_t> (FlipTail, reference/tail_bound.hpp; BUDGETS.md §10.8).
  std::vector<double> tail;
  bool complete(int64_t T, int64_t H, int64_t k) const;  // every field sized for T tokens
  void clear();
  void copy_token(const RequantTerms& from, int64_t i, int64_t t, int64_t H, int64_t k);  // from's token i -> token t
};

struct ForwardResult {
  Tier tier = Tier::quantized;
  Routing routing;                      // ids, weights (rounded in the quantized tier), margins
  std::vector<double> output;           // [T, H]
  std::vector<double> expert_outputs;   // [T, k, H] when asked for; 0 for non-local slots
  // With ForwardOptions::budget: bound on |device - reference| per output element [T, H]
  // (after the device's bf16 rounding) and per slot output before weighting [T, k, H].
  std::vector<double> budget, slot_budget;
  // The noise model (BUDGETS.md §10): the variance proxy of a correct device's deviation from
  // the reference rounded as the device rounds it (bf16_of_f32 of output; the slot outputs as
  // they are), per output element [T, H] and per slot output before weighting [T, k, H].
  std::vector<double> noise_var, slot_noise_var;
  // Per slot [T, k]: root sum of squares over the slot's flip-able intermediates i of
  // dh_i |<W2[:, i], y>|, the projections of re-quantization flips onto the slot's own output,
  // and over its groups g of sd(e_g) |<y_g, y>|, those of the groups' shared scale deviations
  // (BUDGETS.md §7).
  std::vector<double> slot_flip_projection;
  // Per slot [T, k, kFlipTailWidth]: the flips among those terms as rare bounded terms, each with
  // its own bound (FlipTail, reference/tail_bound.hpp; BUDGETS.md §10.8).
  std::vector<double> slot_flip_tail;
  // Per slot [T, k, kEnergyTailWidth]: the same crossings by the norm of their move of the whole
  // slot output, step ||W2[:, i]|| (before weighting), for the energy test (BUDGETS.md §10.8):
  // those of p <= 1/2 as a FlipTail (with p itself), then the sum of the norms of those of
  // p > 1/2.
  std::vector<double> slot_energy_tail;
  // The re-quantization test's terms (BUDGETS.md §10.7), with a budget model and requant_terms.
  RequantTerms requant;
  // With ForwardOptions::ideal_bound: bound on |ideal output - this quantized output| [T, H].
  std::vector<double> ideal_bound;
  int64_t experts_run = 0;              // local experts that received at least one token
  double gemm_flops = 0;                // weight_product_flops of the slots run
};

ForwardResult moe_forward(const MoeProblem& p, const ForwardOptions& opt);

// The weight products of `slots` routed (token, expert) pairs, in flops (2 per multiply-add):
// GEMM1 (H x 2I) and GEMM2 (I x H), 6 H I per slot.
double weight_product_flops(const MoeConfig& c, int64_t slots);

// SiLU in double: g / (1 + exp(-g)) (g -> -inf gives -0, never NaN).
double silu(double g);
// Its derivative, sigma(g) (1 + g (1 - sigma(g))), sigma the logistic function.
double silu_slope(double g);

// x rounded to precision p as the quantized tier rounds it: bf16 RNE, or float32.
double round_to(double x, Precision p);

}  // namespace moecheck
