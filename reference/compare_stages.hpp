// The stages of compare_output (moe_compare.hpp), in the order it runs them. Each stage reads
// what the earlier ones produced and fills its part of the CompareResult:
//
//   agree_routing      expert sets vs the reference; near-tie tokens re-run (BUDGETS.md §6)
//   elementwise_ratios |observed - reference| / budget per output element and per slot
//   attribute_failures which expert (or which token alone) an elementwise failure belongs to
//   aggregate_tests    per-expert bias (scale) and energy tests (BUDGETS.md §7, §10.5)
//   token_scale_tests  one scale test per token's row (BUDGETS.md §10.5)
//   judge_power        what the check could have seen: smallest detectable errors, vacuity (§10.6)
//   familiar_metrics   the checks engines' own tests use (moe_compare.hpp)
//   give_verdict       severity order, check counts, the output's status
//
// Internal to reference/: the contract for callers is moe_compare.hpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "reference/moe_compare.hpp"
#include "reference/tail_bound.hpp"

namespace moecheck::compare {

// |obs - ref| / budget; infinite for a non-finite observation, and where a zero budget meets a
// nonzero difference (LAPACK's convention: nothing may differ where the budget is 0).
double ratio_of(double obs, double ref, double budget);

// The reference as judged: the caller's ForwardResult with the near-tie tokens replaced by
// their re-run (so every later stage sees one consistent reference). Arrays as ForwardResult.
struct JudgedReference {
  std::vector<double> output, budget, noise_var;  // [T, H]
  std::vector<double> slot_output, slot_budget;   // [T, k, H]
  std::vector<double> slot_noise_var;             // [T, k, H]
  // [T, H] where the noise model centres a correct device's output: the reference rounded as
  // the device rounds its output (bf16_of_f32; BUDGETS.md §10.3)
  std::vector<double> center;
  std::vector<double> flip_projection;            // [T, k], or empty when the reference has none
  // [T, k, kFlipTailWidth] the flips among them as bounded terms (FlipTail), or empty: then every
  // flip projection counts as Gaussian variance.
  std::vector<double> flip_tail;
  // [T, k, kEnergyTailWidth] the same crossings by the norm of their move of the slot output (the
  // energy test's), or empty: then the energy test takes every element as independent.
  std::vector<double> energy_tail;
  // Crossings left out of the aggregate tests: a slot's crossings or bins (FlipTail) whose
  // TailBound::rare_score is at most rare_cut; together of probability at most
  // kRareCrossingShare of the output's false-alarm level (rare_crossing_cut; BUDGETS.md §10.8).
  double rare_cut = -1;
  // The re-quantization test's terms (ForwardResult::requant), or empty when the reference has none.
  RequantTerms requant;
  std::vector<int32_t> ids;                       // [T, k]
  std::vector<double> weights;                    // [T, k]
};

// Fills R.ambiguous, R.mismatched and their counts.
// Re-runs go through opt.forward when it is set.
JudgedReference agree_routing(const MoeProblem& p, const ForwardResult& ref, const Observation& obs,
                              const CompareOptions& opt, CompareResult& R);

// Per-element and per-slot ratios of one output against the judged reference.
struct Ratios {
  std::vector<double> token_max;  // [T] largest ratio of each token's output row
  std::vector<double> slot_max;   // [T, k] largest ratio of each local slot (0 without slot outputs)
  // [T, k, H] the observed slot outputs in the judged slot order (Observation::expert_outputs, or
  // `reordered` when the backend's slot order differs); null without slot outputs.
  const float* slots = nullptr;
  std::vector<float> reordered;
  bool have_slots = false;
};
// Fills R.ratio (when keep_ratios), R.elements_over, R.max_ratio, R.worst_token, R.worst_col.
Ratios elementwise_ratios(const MoeProblem& p, const JudgedReference& J, const Observation& obs, bool keep_ratios,
                          CompareResult& R);

// Which expert each slot and failing token belongs to.
struct Attribution {
  std::map<int32_t, std::vector<int64_t>> slots_of;  // local expert -> its slots t*k+j, ascending
  std::map<int32_t, size_t> index;                   // local expert -> its row of R.experts
  std::vector<int32_t> owner;                        // [T] expert a failing token is blamed on, or -1
};
// Creates R.experts (one per local expert with a slot; tokens, slots, max_ratio, blamed) and
// fills R.failing_tokens_unexplained.
Attribution attribute_failures(const MoeProblem& p, const JudgedReference& J, const Ratios& X, CompareResult& R);

// The largest systematic relative scale error a correct device may have (BUDGETS.md §7).
double scale_allowance(const MoeConfig& c, const BudgetModel& m);

// The sigma multiple of the aggregate tests: CompareOptions::z when set, else the one at which
// all of an output's aggregate tests together false-alarm with probability <= 1e-6 (BUDGETS.md §10.5).
double aggregate_z(const MoeProblem& p, size_t experts, const CompareOptions& opt);
// The largest rare_cut whose left-out terms (every slot's terms and bins of rare_score <= the
// cut, the rarest relative to their size first) have a sum of probabilities of at most
// kRareCrossingShare kFalseAlarmPerOutput; -1 (nothing left out) without tails.
double rare_crossing_cut(const std::vector<double>& flip_tail, const std::vector<double>& flip_projection);
// Slot s's flip projection as a term of a test statistic that moves by f per unit of the slot's
// projection: its flips as bounded terms (J.flip_tail), the rest (the groups' scale terms) as
// variance; all of it as variance when the reference has no tails.
void add_slot_flips(const JudgedReference& J, int64_t s, double f, TailBound& tb);
// The threshold of a test with noise tb at the aggregate tests' z: with tail probability
// e^(-z^2 / 2), as z sigma is for a Gaussian (BUDGETS.md §10.8).
double aggregate_threshold(const TailBound& tb, double z);
// The energy test's limit on sum d^2 / sum sigma^2 at that level; move: the bound on the large
// crossings' move of the expert's slots (large_crossings_move), 0 when it has none.
double energy_limit(double sum_var, double sum_b2var, double b2_max, const MoeProblem& p, size_t experts,
                    const CompareOptions& opt, double move = 0);
// The bound, at tail probability e^-x, on how far the expert's large crossings (those of the
// slots' energy tails that move their slot by more than half the root of the predicted energy
// en_pred) move its outputs together: sum of B_i a_i (f a_i: the routing weight's on the
// combined output); 0 when there are none or the reference has no energy tails (BUDGETS.md §10.8).
double large_crossings_move(const JudgedReference& J, const std::vector<int64_t>& slots, bool have_slots,
                            double en_pred, double x);
// Those slots for expert e (its slots ascending): its own with slot outputs; on the combined
// output every local slot of the tokens whose rows its energy counts.
std::vector<int64_t> energy_slots(const MoeProblem& p, const JudgedReference& J, const Attribution& A, int32_t e,
                                  const std::vector<int64_t>& slots, bool have_slots);

// Fills each expert's bias and energy statistics and its pass.
void aggregate_tests(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const Ratios& X,
                     const Attribution& A, const CompareOptions& opt, CompareResult& R);

// Fills R.token_scale: each token's output fitted as (1 + beta_t) times the reference's.
void token_scale_tests(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const CompareOptions& opt,
                       CompareResult& R);

// Fills R.requant (BUDGETS.md §10.7).
void requant_test(const MoeProblem& p, const JudgedReference& J, const Observation& obs, const CompareOptions& opt,
                  CompareResult& R);

// Fills R.power (BUDGETS.md §10.6); after token_scale_tests.
void judge_power(const JudgedReference& J, const CompareOptions& opt, CompareResult& R);

// Orders R.experts worst first, counts the checks, sets R.pass.
void give_verdict(const MoeProblem& p, const CompareOptions& opt, CompareResult& R);

}  // namespace moecheck::compare
