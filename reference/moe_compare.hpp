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
  double z = 5.0;           // sigma multiple of the aggregate tests (BUDGETS.md §7)
  bool keep_ratios = true;  // fill CompareResult::ratio (for the HTML heatmap)
};

struct ExpertVerdict {
  int64_t expert = 0;       // global id
  int64_t tokens = 0, slots = 0;
  double max_ratio = 0;     // elementwise, over the elements attributed to this expert
  double rel_l2 = 0;        // of its contribution (expert outputs) or of its tokens' outputs
  bool blamed = false;      // elementwise failures attributed here
  double beta = 0, beta_se = 0, beta_allow = 0;  // bias test: fitted relative scale error
  bool bias_ok = true;
  double energy_ratio = 0, energy_limit = 0;     // energy test
  bool energy_ok = true;
  bool pass = true;
};

// The metrics engines' tests use (BUG-CLASSES.md §2), computed on the same data.
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
  std::vector<ExpertVerdict> experts;          // sorted worst first
  FamiliarMetrics metrics;
  int64_t checks = 0, checks_failed = 0;
  std::vector<float> ratio;                    // [T, H] when keep_ratios (inf for non-finite)
  std::vector<double> reference_output;        // [T, H] the reference used (after near-tie re-runs)
};

// ref: moe_forward(p, {tier = quantized, budget = &opt.model}) of the same problem.
CompareResult compare_output(const MoeProblem& p, const ForwardResult& ref, const Observation& obs,
                             const CompareOptions& opt);

FamiliarMetrics familiar_metrics(const std::vector<double>& ref, const std::vector<float>& obs);

}  // namespace moecheck
