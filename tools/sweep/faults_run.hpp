// `moecheck faults`'s table as a library call: per fault (a faulty:<fault> backend, or a mutant
// of an exec:CMD kernel), what moecheck reports and which of the familiar checks engines' own
// tests use (docs/BUG-CLASSES.md §2) would have missed it:
//   DeepGEMM  calc_diff (cosine diff) < 1e-3       SGLang  mean|d| / mean|ref| < 0.02
//   vLLM      every element within atol = rtol = 0.035   ggml  NMSE < 5e-3
// "missed" = that check passes the faulty output. Two sources of evidence per fault: its minimal
// case in the bug corpus (golden/bugs/<fault>.h5, run again with the recorded int32_threshold;
// for the built-in faults once more as faulty:<fault>@hopper, judged with `hopper`: what a user's
// engine output gets), and the first N cases of the gate's sweep (seed S), on which every row is
// run and judged; there the columns count, among the cases moecheck caught, those each familiar
// check passed. The correct backend (emulated, or the command with {fault} = none) heads the
// table: moecheck must flag it on no case. A case a row declines (unsupported) is not counted.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace moecheck::sweep {

struct FaultsRequest {
  std::vector<std::string> backends;     // row 0 the correct backend, then one per fault
  std::vector<std::string> fault_names;  // parallel: "none", then each fault (the bug case's file name)
  bool exec = false;                     // rows of an exec:CMD kernel (judged with their own models)
  std::string bugs_dir;                  // the bug corpus
  int64_t cases = 40;                    // sweep cases every row runs on (0: none)
  uint64_t seed = 1;
};

// Sweep counts of one row.
struct FaultTally {
  int64_t cases = 0, caught = 0, unsupported = 0;  // unsupported: declined by the row, not in cases
  int64_t missed[4] = {0, 0, 0, 0};   // DeepGEMM, SGLang, vLLM, NMSE passed although moecheck caught it
  int64_t flagged[4] = {0, 0, 0, 0};  // the familiar check failed (correct row: its false alarms)
};

struct FaultRow {
  std::string backend, fault;
  std::string bug = "-";     // the bug case: what moecheck names, "(no bug case)", ...
  std::string hopper = "-";  // the same as faulty:<fault>@hopper (built-in faults only)
  std::string familiar[4] = {"-", "-", "-", "-"};  // on the bug case: "caught" or "**missed**"
  bool bug_caught = true;    // false: the bug case passed or was declined
  FaultTally sweep;
};

struct FaultsResult {
  std::vector<FaultRow> rows;
  // The correct row flagged on no sweep case, and every bug case caught.
  bool ok() const;
};

// progress(line): short status lines while the sweep runs (optional).
FaultsResult run_faults(const FaultsRequest& q, const std::function<void(const std::string&)>& progress = {});

// The Markdown table (the README's and golden/bugs/README.md's) and its legend.
std::string faults_table(const FaultsRequest& q, const FaultsResult& r);

}  // namespace moecheck::sweep
