// `moecheck faults [--bugs DIR] [--cases N] [--seed S]`: per fault of the faulty:<fault>
// backend (kernels/emulated/emulated_moe.hpp), what moecheck reports and which of the familiar
// checks engines' own tests use (docs/BUG-CLASSES.md §2) would have missed it:
//   DeepGEMM  calc_diff (cosine diff) < 1e-3       SGLang  mean|d| / mean|ref| < 0.02
//   vLLM      every element within atol = rtol = 0.035   ggml  NMSE < 5e-3
// "missed" = that check passes the faulty output. Two sources of evidence per fault: its minimal
// case in golden/bugs/<fault>.h5 (run again here, with the recorded int32_threshold; and once
// more as faulty:<fault>@hopper, the Hopper emulation judged with the default model of an FP8
// tensor-core output, `hopper`: what a user's engine output gets), and the
// first N cases of the gate's sweep (seed S), on which the fault is run and judged; there the
// columns count, among the cases moecheck caught, those each familiar check passed. The correct
// backend (emulated) heads the table: moecheck must flag it on no case.
// Prints a Markdown table (the README's and golden/bugs/README.md's); exit 0, or 1 when the
// correct backend was flagged or a bug case was not caught, 2 for bad input. The run and the
// table are tools/sweep/faults_run.hpp; this file builds the rows and prints.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "kernels/emulated/emulated_moe.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/sweep/faults_run.hpp"

namespace moecheck::cli {

namespace fs = std::filesystem;

void register_faults(CLI::App& app) {
  auto* sub = app.add_subcommand("faults", "per fault: what moecheck reports and which familiar checks miss it");
  struct Opts {
    std::string bugs, backend, faults_csv;
    int64_t cases = 40;
    uint64_t seed = 1;
    bool quiet = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--bugs", o->bugs, "the bug corpus (default: the source tree's golden/bugs)");
  sub->add_option("--cases", o->cases, "gate sweep cases each fault is also run on (default 40; 0: none)")
      ->check(at_least(0));
  sub->add_option("--seed", o->seed, "seed of those sweep cases (default 1)")->check(seed_text());
  sub->add_flag("-q,--quiet", o->quiet, "no progress output");
  sub->add_option("--backend", o->backend,
                  "exec:CMD with {fault} in CMD: your kernel and its mutants instead of emulated and faulty:<fault> "
                  "({fault} is 'none' for the correct run)");
  sub->add_option("--faults", o->faults_csv, "with --backend exec:CMD: the mutants CMD implements, comma-separated");
  add_exec_timeout_option(sub);
  set_runner(sub, [o]() {
    sweep::FaultsRequest q;
    q.bugs_dir = o->bugs.empty() ? source_tree_path("golden/bugs") : o->bugs;
    if (!o->bugs.empty() && !fs::is_directory(q.bugs_dir)) throw InputError(q.bugs_dir, "--bugs", "not a directory");
    q.cases = o->cases, q.seed = o->seed, q.exec = !o->backend.empty();
    // The rows: the correct backend, then one per fault, each with its name (the bug case's file name).
    if (q.exec) {
      for (const std::string& f : judge::exec_fault_names(o->backend, o->faults_csv)) {
        q.backends.push_back(judge::exec_with_fault(o->backend, f));
        q.fault_names.push_back(f);
      }
    } else {
      if (!o->faults_csv.empty()) throw InputError("", "--faults", "only with --backend exec:CMD (the built-in faults all run)");
      q.backends = {"emulated"}, q.fault_names = {"none"};
      for (Fault f : all_faults()) {
        q.backends.push_back("faulty:" + std::string(to_string(f)));
        q.fault_names.push_back(std::string(to_string(f)));
      }
    }
    const sweep::FaultsResult r = sweep::run_faults(q, [&](const std::string& s) {
      if (!o->quiet) std::cerr << "\rmoecheck faults: " << s << std::flush;
    });
    if (!o->quiet && q.cases > 0) std::cerr << "\n";
    std::cout << sweep::faults_table(q, r);
    return r.ok() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace moecheck::cli
