// "Run backend B on a case and judge it", in-process: the step that gate, shrink, repro and
// faults share with the `run` + `compare` pipeline, without writing the output into the case.
//
// The judgement is compare's: the quantized-tier float64 reference with the budget of the
// backend's model (default_budget_model(backend), reference/budget_model.hpp), every output element,
// routing, per-expert bias and energy tests (reference/moe_compare.hpp). Nothing here loosens a
// budget: a case passes exactly when `moecheck run CASE --backend B --expert-outputs && moecheck
// compare CASE --output B` would exit 0. Recorded outputs (no backend) are judged by compare's
// own code, judge_recorded_outputs (recorded_outputs.hpp), input-hash check included.
//
// Outcomes: pass; fail (a check exceeded its budget, or the backend threw on a case the
// reference accepted: a crash of the thing checked); unsupported (the backend declined the case:
// BackendUnsupported, backend_run.hpp; nothing judged); input_error (the case is unreadable or
// invalid, a recorded output was computed from other inputs, the reference refuses it, or the
// backend cannot run here at all, e.g. cuda without a GPU): exit codes 0 / 1 / 2 / 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "golden/case_problem.hpp"
#include "kernels/backend_output.hpp"
#include "reference/moe_compare.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/judge/sharded_run.hpp"

namespace moecheck::judge {

struct CheckOptions {
  std::string backend;         // run this backend on the case; empty: judge recorded outputs
  std::string output;          // (backend empty) judge only /outputs/<output>; empty: every output
  std::string budget_model;    // empty: default_budget_model(backend), or the recorded output's model
  int64_t int32_threshold = 0; // faulty:int32_overflow's wrap index (0: the emulation's 2^31)
  bool expert_outputs = true;  // run the backend with per-slot outputs (judged per slot)
  bool keep_ratios = false;    // keep CompareResult::ratio (reports that draw heatmaps)
  bool allow_vacuous = false;  // a vacuous output (CompareOptions) does not fail the check
  // Run the backend over N ranks (sharded_run.hpp) and judge the layer, each rank and the
  // reduction (reference/compare_sharded.hpp); its slot outputs are not recorded then.
  ShardRequest shard;
  // Where the reference's products and the budget's extras run, chosen for the case being judged
  // (reference_store.hpp ReferenceDevice::for_case); nullptr: this CPU.
  ReferenceDevice* reference_device = nullptr;
};

enum class CheckStatus { pass, fail, unsupported, input_error };
std::string_view to_string(CheckStatus s);

struct CheckOutcome {
  CheckStatus status = CheckStatus::pass;
  std::vector<CompareResult> results;  // one per judged output
  std::vector<std::string> budget_models;  // parallel to results
  std::string reason;                  // one line: what failed, or the input error; "" on pass
  std::optional<BackendOutput> run;    // the backend run, when one was made
  double seconds = 0;                  // wall time (reference + backend + judging)
  int exit_code() const { return status == CheckStatus::pass ? 0 : status == CheckStatus::fail ? 1 : 2; }
  bool unsupported() const { return status == CheckStatus::unsupported; }
  bool failed() const { return status == CheckStatus::fail; }
};

// An invalid case, or an output the case cannot hold, is status input_error (never a verdict);
// an InputError about --backend (a backend that cannot run here) is rethrown.
CheckOutcome check_case(const std::string& case_path, const CheckOptions& opt);
// The same on a case already loaded (and validated by CaseProblem).
CheckOutcome check_problem(const CaseProblem& cp, const CheckOptions& opt);
// The recorded output `repro` reports by default: the first of the case's outputs that
// check_problem(cp, opt) fails (opt.backend empty; opt.output ignored), else the first output;
// "" when the case holds none.
std::string first_failing_output(const CaseProblem& cp, const CheckOptions& opt);

// The quantized-tier reference with the budget of `model` (what compare judges against).
ForwardResult judging_reference(const CaseProblem& cp, const BudgetModel& model);
// The ideal-tier reference (`compare --tier ideal`, BUDGETS.md §8): the ideal output as the
// reference, its budget the quantized budget of `model` plus the bound on |ideal - quantized|
// (noise variance plus bound^2 / 3). Slot outputs are not judged in this tier.
ForwardResult ideal_judging_reference(const CaseProblem& cp, const BudgetModel& model);
// A backend run or a recorded output as compare_output takes it.
Observation observation_of(const BackendOutput& b);
Observation observation_of(const std::string& name, OutputData&& d);

// One line naming what failed: failing experts (and which test), token-local failures,
// routing mismatches, non-finite values, failing ranks (each with its own reason) and the
// reduction of a layer over ranks, the worst ratio. "" when r passed.
std::string failure_reason(const CompareResult& r);

// The int32 wrap index at which faulty:int32_overflow can show on a case of this size: half of
// the slot buffer, T * k * H / 2 (at least 1). The real bug needs > 2^31 elements; the gate and
// the bug corpus emulate it at a threshold the tiny case reaches.
int64_t scaled_int32_threshold(const MoeConfig& c, int64_t tokens);

// The command that replays a backend's judgement of a case through the ordinary pipeline
// (budget_model: the model named on the command line, "" for the backend's default).
std::string replay_command(const std::string& case_path, const std::string& backend, int64_t int32_threshold,
                           const std::string& budget_model = "", const ShardRequest& shard = {});

}  // namespace moecheck::judge
