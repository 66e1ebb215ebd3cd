// Judging one recorded backend output against the float64 reference and its error budgets
// (reference/BUDGETS.md): elementwise ratios, routing agreement with near-tie acceptance,
// per-expert attribution, the per-expert bias (scale) and energy tests, and the familiar metrics
// that engines' own tests use, for comparison.
//
// Attribution (an error confined to one expert is reported on that expert, not smeared):
//   with expert_outputs recorded: each slot's output is judged against its slot budget, so an
//   expert's verdict comes from its own slots;
//   without: a token fails when any of its elements does; among the experts most of whose tokens
//   fail, the one explaining the most still-unexplained failing tokens is blamed first (greedy set
//   cover), its failing tokens then count as explained. Failing tokens no blamed expert explains are reported per token
//   (a token-local fault such as a NaN from an all-zero activation group).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reference/moe_budget.hpp"
#include "reference/moe_forward.hpp"

namespace moecheck {

// A backend's recorded output, decoded to float.
struct Observation {
  std::string name;
  std::vector<float> output;          // [T, H]
  std::vector<int32_t> topk_ids;      // [T, k] or empty
  std::vector<float> expert_outputs;  // [T, k, H] or empty
  bool expert_outputs_bf16 = false;   // stored as bf16: one more rounding to admit
};

struct CompareOptions {
  BudgetModel model;
  double z = 0;             // sigma multiple of the aggregate tests; 0: from the false-alarm level (BUDGETS.md §10.5)
  bool keep_ratios = true;  // fill CompareResult::ratio (for the HTML heatmap)
  // An output is vacuous when its checks would not detect the whole output scaled by a factor
  // (1 + s) with |s| this large: at 1, zeroed (BUDGETS.md §10.6).
  double vacuous_scale = 1.0;
  bool allow_vacuous = false;  // a vacuous output without failed checks counts as passing (still labelled vacuous)
  // Run the re-quantization test (BUDGETS.md §10.7); the reference must then carry its terms
  // (ForwardOptions::requant_terms), else the test reports "not fitted".
  bool requant_test = true;
  // The reference of the near-tie tokens re-run with the backend's experts (BUDGETS.md §6): the
  // same computation as the one that made `ref`. Empty: moe_forward; a sharded layer's judge
  // (compare_sharded.hpp) passes its sharded reference.
  std::function<ForwardResult(const MoeProblem&, const ForwardOptions&)> forward;
};

struct ExpertVerdict {
  int64_t expert = 0;       // global id
  int64_t tokens = 0, slots = 0;
  double max_ratio = 0;     // elementwise, over the elements attributed to this expert
  double rel_l2 = 0;        // of its contribution (expert outputs) or of its tokens' outputs
  bool blamed = false;      // elementwise failures attributed here
  double beta = 0, beta_se = 0, beta_allow = 0;  // bias test: fitted relative scale error
  // allow + the threshold of its noise (z SE where no rare crossing dominates, BUDGETS.md §10.8):
  // the smallest scale error it detects (0: no data)
  double beta_detectable = 0;
  bool bias_ok = true;
  double energy_ratio = 0, energy_limit = 0;     // energy test
  bool energy_ok = true;
  bool pass = true;
};

// The metrics engines' tests use (docs/BUG-CLASSES.md §2), computed on the same data.
struct FamiliarMetrics {
  double max_abs = 0, max_rel = 0;  // max_rel: |d| / |ref| over elements with |ref| >= 1e-3 max|ref|
  double rel_l2 = 0, sqnr_db = 0;
  double cos_diff = 0;              // DeepGEMM calc_diff: 1 - 2 sum xy / (sum x^2 + sum y^2)
  double mean_rel = 0;              // SGLang: mean |d| / mean |ref|
  double nmse = 0;                  // sum d^2 / sum ref^2
  double allclose_fraction = 0;     // fraction with |d| <= 0.035 + 0.035 |ref| (vLLM's tol)
  int64_t nonfinite = 0;
  // Verdicts of the familiar checks (true = that check would have passed this output).
  bool deepgemm_pass = false, sglang_pass = false, vllm_pass = false, nmse_pass = false;
};

// The per-token scale test (BUDGETS.md §10.5): beta_t = sum_h d_h o_h / sum_h o_h^2 with d the
// observation minus the reference as the device rounds it and o the reference's output row.
struct TokenScale {
  int64_t token = 0;
  double beta = 0, se = 0;
  // The smallest |beta_t| the test would detect: allow + the threshold of its noise, z se where
  // no rare crossing dominates (BUDGETS.md §10.8; a zeroed row is beta = -1).
  double detectable = 0;
  bool ok = true;
};

// The re-quantization test (BUDGETS.md §10.7): the whole output's deviation d (observation minus
// the reference as the device rounds it) fitted along r, the direction in which a skipped
// re-quantization of the intermediate moves it: beta = <d, r> / <r, r> (skipped: beta = -1).
struct RequantTest {
  double beta = 0, se = 0;
  double allow = 0;       // |mean of beta| a correct device may have (its crossings' mean, its scale)
  double detectable = 0;  // allow + the threshold of se's terms (TailBound): the smallest |beta| the test flags
  bool ok = true;
  bool fitted = false;    // false when the reference has no direction (no model, or r = 0)
};

// What the judgement of one output could have seen, at its false-alarm level (BUDGETS.md §10.6).
// NaN where nothing was fitted (no expert with data, no token with a nonzero row).
struct Power {
  // Smallest relative scale error |s| the bias test detects: the output scaled as a whole by
  // (1 + s) (every expert's beta moves by s: the most sensitive expert decides), and the
  // contribution of any single expert scaled (the least sensitive one decides). Per expert the
  // figure is beta_detectable (beta_allow + z beta_se where no rare crossing dominates).
  double scale_output = 0, scale_any_expert = 0;
  // Smallest relative scale error of one token's row the per-token test detects (a zeroed row is
  // -1): the largest over the tokens (any token) and the median token.
  double token_scale = 0, token_scale_median = 0;
  // Relative L2 change of one token's row above which the elementwise (worst-case) test flags it,
  // whatever its direction: ||budget_t|| / ||reference_t||, largest over the tokens and median.
  double token_rel_l2 = 0, token_rel_l2_median = 0;
  double over_magnitude = 0;        // fraction of elements whose worst-case budget exceeds |reference|
  double noise_over_magnitude = 0;  // fraction whose noise-model limit z sigma exceeds |reference|
  bool vacuous = false;             // scale_output >= CompareOptions::vacuous_scale
};

struct ShardedVerdict;  // compare_sharded.hpp

struct CompareResult {
  std::string name;
  BudgetModel model;   // the budget model judged with (CompareOptions::model; names: budget_model.hpp)
  bool pass = true;
  int64_t tokens = 0, hidden = 0, top_k = 0;
  int64_t elements = 0, elements_over = 0;
  double max_ratio = 0;
  int64_t worst_token = -1, worst_col = -1;
  // Routing: tokens whose expert set differs from the reference; of them those accepted as near-ties.
  int64_t mismatched_tokens = 0, ambiguous_tokens = 0;
  std::vector<int64_t> mismatched, ambiguous;  // token indices (mismatched excludes ambiguous)
  std::vector<int64_t> failing_tokens_unexplained;
  std::vector<TokenScale> token_scale;         // [T]
  TokenScale output_scale;                     // the same fit over the whole output (token -1)
  RequantTest requant;
  double aggregate_z = 0;                      // sigma multiple of the aggregate tests
  std::vector<ExpertVerdict> experts;          // sorted worst first
  FamiliarMetrics metrics;
  int64_t checks = 0, checks_failed = 0;
  Power power;
  std::vector<float> ratio;                    // [T, H] when keep_ratios (inf for non-finite)
  std::vector<double> reference_output;        // [T, H] the reference used (after near-tie re-runs)
  // A layer run over N ranks (compare_sharded): its ranks' and reduction's verdicts, counted in
  // checks and pass above; null for a one-device output.
  std::shared_ptr<const ShardedVerdict> sharded;
};

// ref: moe_forward(p, {tier = quantized, budget = &opt.model}) of the same problem.
CompareResult compare_output(const MoeProblem& p, const ForwardResult& ref, const Observation& obs,
                             const CompareOptions& opt);

// "fail" when a check failed, else "vacuous" when the output is vacuous, else "pass".
const char* verdict_label(const CompareResult& r);

// Ids of the experts that fail in r, worst first (the order of r.experts).
std::vector<int64_t> failing_expert_ids(const CompareResult& r);

FamiliarMetrics familiar_metrics(const std::vector<double>& ref, const std::vector<float>& obs);

}  // namespace moecheck
