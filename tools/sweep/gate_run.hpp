// `moecheck gate`'s run as a library call: the property sweep (gate_sweep.hpp) on one backend,
// each case judged by compare's budgets (tools/judge/case_check.hpp), failing cases shrunk
// (case_shrink.hpp), then the golden corpus (every recorded output judged, and the backend run on
// every corpus case when it is a GPU or exec:CMD backend).
//
// What each sweep case becomes:
//   passed       every check within budget; its file is removed
//   failed       a check exceeded its budget, or the backend crashed on it: kept, shrunk (the
//                first `shrink` of them), listed with make-case and replay commands; a faulty:*
//                backend's failure is re-run on the correct backend, which must pass
//   vacuous      fails only because its checks could not see the output zeroed (a tiny case,
//                BUDGETS.md §10.6): not judged, counted
//   unsupported  the backend declined the case (judge::BackendUnsupported: an exec:CMD command
//                exiting 77, a recipe our GPU kernels lack): not judged, counted with the reason
//   error        moecheck could not judge its own generated case: reported, counted
// Exit status (GateResult::exit_code): an invalid golden file 2; else a failure 1; else a sweep
// case moecheck could not judge 2; else a sweep whose cases the backend all declined (none
// passed, none failed) 2; else 0.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tools/judge/reference_store.hpp"
#include "tools/judge/sharded_run.hpp"
#include "tools/sweep/junit.hpp"

namespace moecheck::sweep {

struct GateRequest {
  std::string backend;                // resolved: never empty
  std::vector<std::string> presets;   // the tiny presets drawn from (validated by the caller)
  std::string presets_csv;            // as the user gave them ("" for the default), for replay commands
  std::vector<std::string> recipes;   // gate_sweep.hpp apply_recipes, in order
  uint64_t seed = 1;
  int64_t cases = 100;                // sweep cases, unless time > 0 or case_index >= 0
  double time = 0;                    // > 0: run cases until this many seconds have passed
  int64_t case_index = -1;            // >= 0: only this sweep case, no golden corpus
  std::string golden_dir;             // "" : no golden corpus
  bool golden_dir_required = false;   // a missing golden_dir is bad input (else a note)
  std::string work_dir;               // where sweep cases are written (exists)
  std::string shrink_dir;             // where shrunk cases go (exists)
  int64_t shrink = 1, max_failures = 0, int32_threshold = 0;
  bool expert_outputs = true, allow_vacuous = false, verbose = false;
  // gate --tp N / --ep N: every sweep case is drawn as the whole layer (the sweep's own TP/EP
  // draw dropped) and run over the ranks (judge/sharded_run.hpp); a case the split does not fit
  // is declined (unsupported, with moe_sharding's rule), and a failure's control runs over the
  // same ranks with none at fault.
  judge::ShardRequest shard;
  // Where the references' products and the budget's run (`--device`; null: this CPU).
  std::shared_ptr<judge::ReferenceDevice> reference_device;
};

struct GateIssue {  // a failure, or a case that could not be judged or was declined
  std::string what, reason, make_case, gate, shrunk, replay, summary;
};

struct GateResult {
  int64_t run = 0, passed = 0, failed = 0, vacuous = 0, unsupported = 0, errors = 0, control_failed = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> features;  // label -> (run, failed)
  bool golden_run = false;
  int64_t golden_judged = 0, golden_failed = 0, golden_invalid = 0;
  std::vector<GateIssue> failures, not_judged, declined;
  std::vector<JunitSuite> suites;
  double seconds = 0;
  bool ok() const { return failures.empty() && not_judged.empty() && !judged_nothing(); }
  // Every sweep case declined or not judged, at least one declined: the backend was never judged.
  bool judged_nothing() const { return unsupported > 0 && passed == 0 && failed == 0; }
  int exit_code() const;
};

// Progress reporting: say(line) prints a line; update(done, total (0: open-ended), failed, what)
// redraws a progress line; seconds() is the wall time since the start; kept(path) tells that a
// case file stays in the work directory (a failure, an error, a vacuous case). All optional.
struct GateEvents {
  std::function<void(const std::string&)> say;
  std::function<void(const std::string&)> kept;
  std::function<void(int64_t, int64_t, int64_t, const std::string&)> update;
  std::function<double()> seconds;
};

GateResult run_gate(const GateRequest& q, const GateEvents& ev);

// The summary lines after the run (counts, features, failures with their commands, cases not
// judged, the verdict line).
std::string gate_summary(const GateResult& r);

// `moecheck gate --backend B --seed S --case i [--presets ...] [--recipe ...] [--tp N ...]`: replays one case.
std::string gate_command(const GateRequest& q, const std::string& backend, int64_t index);

}  // namespace moecheck::sweep
