// Judging the outputs a case has recorded (/outputs/<name>) against the float64 reference and its
// budgets: what `moecheck compare` does, and what check_problem does when no backend is given
// (case_check.hpp). The one owner of "judge the recorded outputs of a case".
//
// Steps: the outputs selected (one by name, or every one); each output's budget model (the one
// given, else its budget_model attribute, else its backend's: reference/budget_model.hpp); the
// input-hash check (an output that records input hashes must have been computed from the case's
// present inputs: check_input_hashes, backend_run.hpp); one reference per budget model; every
// output read, its shape checked and judged (reference/moe_compare.hpp); an output that records
// its ranks (/outputs/<name>/ranks) judged as a layer over ranks (reference/compare_sharded.hpp:
// the layer, each rank, the reduction; quantized tier only).
//
// Errors are InputError on the case file: no such output, no output at all, an unknown budget
// model name, changed inputs, an output of the wrong shape, a case the reference refuses.
#pragma once

#include <string>
#include <vector>

#include "golden/case_problem.hpp"
#include "reference/budget_model.hpp"
#include "reference/moe_compare.hpp"
#include "reference/moe_forward.hpp"
#include "tools/judge/reference_store.hpp"

namespace moecheck::judge {

// Which reference an output is judged against.
struct ReferenceChoice {
  Tier tier = Tier::quantized;  // ideal: compare --tier ideal (ideal_judging_reference; slot outputs not judged)
  bool reuse_stored = false;    // quantized tier: a matching /reference/quantized is reused (reference_store.hpp)
  bool requant_test = true;     // with the re-quantization test and its terms (BUDGETS.md §10.7)
  bool progress = false;        // the reference's progress on stderr
  // Where the quantized tier's products and the budget's extras run when it is computed
  // (reference_store.hpp): asked for the case only then, so a reused stored reference never
  // starts the GPU; nullptr: this CPU.
  ReferenceDevice* device = nullptr;
};

// The reference of `model_name` under `choice`; *reused (when given) says whether it was the
// stored one. A case the reference refuses (std::invalid_argument) is an InputError on the case.
ForwardResult reference_to_judge(const CaseProblem& cp, const std::string& model_name, const ReferenceChoice& choice,
                                 const std::string& input_hash = "", bool* reused = nullptr);

struct RecordedOptions {
  std::string output;        // judge only /outputs/<output>; empty: every recorded output
  std::string budget_model;  // judge every output with this model; empty: each output's own
  ReferenceChoice reference;
  bool keep_ratios = true;   // keep CompareResult::ratio (the HTML heatmap)
  bool allow_vacuous = false;  // a vacuous output (CompareOptions) does not fail
};

struct RecordedJudgement {
  std::vector<CompareResult> results;       // one per judged output, in the case's order
  std::vector<std::string> budget_models;   // parallel to results: the model each was judged with
  std::vector<std::vector<float>> outputs;  // parallel to results: the output [T, H] as judged
  std::vector<BudgetModel> models;          // each model once, in the order their references were made
  double reference_seconds = 0;             // wall time of the references
  std::string reference_device;             // what computed them ("this CPU", a GPU; "" when all were reused)
};

// With reference.progress, one line per reference on stderr ("moecheck: reference (TIER, budget
// model M) computed" or "reused from /reference/quantized") after its own progress.
RecordedJudgement judge_recorded_outputs(const CaseProblem& cp, const RecordedOptions& opt);

}  // namespace moecheck::judge
