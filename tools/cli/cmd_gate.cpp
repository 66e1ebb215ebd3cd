// `moecheck gate [--backend B] [--cases N | --time S] [--seed S] [--presets P,...] [--case i]
//                [--junit FILE] [--golden DIR | --no-golden] [--work-dir DIR] [--shrink N]
//                [--tp N | --ep N [--shard-fault F] [--fault-rank R]]`:
// the one command CI runs. A property sweep of generated cases (tools/sweep/gate_sweep.hpp: presets,
// token counts, distributions, near-ties, scale formats, dtypes, layouts, TP/EP shards,
// routed-only storage), each run on backend B and judged by compare's budgets
// (tools/judge/case_check.hpp), then the golden corpus: every recorded output of golden/cases/*.h5
// judged, and for B = cuda / cublaslt, B run on every corpus case too.
//
// Default backend: cuda when this build has CUDA and probe_gpu() finds a usable device, else
// emulated (the line "gate: backend ..." says which and why). A failing sweep case is shrunk
// (tools/sweep/case_shrink.hpp) into a self-contained case file, and the summary prints for each
// failure its make-case command, `moecheck gate --seed S --case i` and the shrunk case's replay
// command. Exit 0 when everything passed, 1 when a check failed, 2 for bad input (or, with no
// failed check, a generated case that moecheck itself could not judge, or a sweep whose cases the
// backend all declined). With --tp N / --ep N every sweep case is the whole layer, run over N
// ranks on the emulated backends (default: emulated) and judged as a layer, per rank and for the
// reduction; a case the split does not fit is not judged (counted with the reason). The run
// itself is tools/sweep/gate_run.hpp; this file resolves the options and prints.
#include <fmt/format.h>
#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <optional>

#include "golden/case_generator.hpp"
#include "golden/interrupt.hpp"
#include "golden/model_presets.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/cli/progress_line.hpp"
#include "tools/cli/shard_options.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/sweep/gate_run.hpp"
#include "tools/sweep/gate_sweep.hpp"
#include "tools/sweep/junit.hpp"

namespace moecheck::cli {

namespace fs = std::filesystem;

namespace {

struct GateOptions {
  std::string backend, golden, work_dir, junit, shrink_dir, presets_csv, device = "auto";
  std::vector<std::string> recipes;  // --recipe, in order (gate_sweep.hpp apply_recipes)
  int64_t cases = 100, case_index = -1, shrink = 1, int32_threshold = 0, max_failures = 0;
  double time = 0;
  uint64_t seed = 1;
  bool no_golden = false, quiet = false, keep = false, no_expert_outputs = false, verbose = false;
  bool allow_vacuous = false;
  ShardOptions shard;
  const CLI::Option *cases_opt = nullptr, *time_opt = nullptr;
};

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> v;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    if (j > i) v.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return v;
}

// The backend (default: cuda with a usable GPU, else emulated) and why; the presets and recipes
// checked. InputError for what cannot run.
sweep::GateRequest resolve_request(GateOptions& o, std::string& why) {
  const judge::ShardRequest shard = shard_request(o.shard);
  if (o.backend.empty() && shard.plan) {
    o.backend = "emulated";
    why = "default over ranks: multi-GPU runs through NCCL are not built yet";
  } else if (o.backend.empty()) {
    const judge::GpuAvailability g = judge::gpu_availability();
    o.backend = g.usable ? "cuda" : "emulated";
    why = g.usable ? "default: a usable GPU (" + g.device + ")" : "default without a usable GPU: " + g.why;
  } else {
    why = "given with --backend";
  }
  const judge::BackendName bn = judge::parse_backend_name(o.backend);
  judge::check_shard_request(o.backend, shard);
  if (bn.gpu()) {
    const judge::GpuAvailability g = judge::gpu_availability();
    if (!g.usable) throw InputError("", "--backend", o.backend + " needs a usable GPU: " + g.why);
  }
  sweep::GateRequest q;
  q.backend = o.backend;
  q.presets = o.presets_csv.empty() ? sweep::default_sweep_presets(bn.gpu()) : split_csv(o.presets_csv);
  for (const std::string& p : q.presets) {
    const ModelPreset* mp = find_model_preset(p);
    if (!mp) throw InputError("", "--presets", fmt::format("unknown preset \"{}\"; known presets: {}", p, model_preset_names()));
    if (mp->full_size) throw InputError("", "--presets", fmt::format("{} is a full-size layer; the sweep takes tiny presets", p));
  }
  if (o.cases_opt->count() && o.time_opt->count()) throw InputError("", "--time", "give --cases or --time, not both");
  if (GeneratorOptions probe; !o.recipes.empty())
    if (const std::string rule = sweep::apply_recipes(probe, o.recipes); !rule.empty()) throw InputError("", "--recipe", rule);
  q.presets_csv = o.presets_csv;
  q.recipes = o.recipes;
  q.seed = o.seed;
  q.cases = o.cases, q.time = o.time, q.case_index = o.case_index;
  q.golden_dir = o.no_golden ? "" : (o.golden.empty() ? source_tree_path("golden/cases") : o.golden);
  q.golden_dir_required = !o.golden.empty();
  q.shrink = o.shrink, q.max_failures = o.max_failures, q.int32_threshold = o.int32_threshold;
  q.expert_outputs = !o.no_expert_outputs, q.allow_vacuous = o.allow_vacuous, q.verbose = o.verbose;
  q.shard = shard;
  q.reference_device = std::make_shared<judge::ReferenceDevice>(o.device);
  return q;
}

// The work directory: --work-dir, or a new temporary one (own = true: removed when all passed).
std::string work_directory(const GateOptions& o, bool& own) {
  own = false;
  if (o.work_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "moecheck-gate-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw InputError(tmpl, "--work-dir", "cannot create a temporary directory");
    own = true;
    return tmpl;
  }
  std::error_code ec;
  fs::create_directories(o.work_dir, ec);
  if (ec) throw InputError(o.work_dir, "--work-dir", "cannot create the directory: " + ec.message());
  return o.work_dir;
}

int run_gate(GateOptions& o) {
  std::string why;
  sweep::GateRequest q = resolve_request(o, why);
  std::cout << fmt::format("gate: backend {} ({}), seed {}, presets {}\n", q.backend, why, q.seed, fmt::join(q.presets, ","));
  if (o.device == "cuda") std::cout << "gate: the references' products and the budget's on the GPU (--device cuda)\n";
  if (o.device == "auto")
    std::cout << fmt::format("gate: the references' products and the budget's on the GPU for cases of {:g} GFLOP or more "
                             "where one is usable, else on this CPU (--device auto)\n",
                             judge::ReferenceDevice::kAutoGpuFlops * 1e-9);
  if (q.shard.plan)
    std::cout << fmt::format("gate: every sweep case run over {} ranks ({}) and judged as a layer, per rank and for "
                             "the reduction; cases the split does not fit are not judged\n",
                             q.shard.plan->ranks,
                             judge::shard_arguments(q.shard, judge::parse_backend_name(q.backend).faulty()).substr(1));
  if (q.backend == "faulty:int32_overflow" && q.int32_threshold == 0)
    std::cout << "gate: faulty:int32_overflow wraps at T*k*H/2 of each case (the real 2^31 needs a huge case)\n";

  bool own_dir = false;
  const std::string work = work_directory(o, own_dir);
  // Interrupted, the gate removes its own work directory unless --keep or until it holds a
  // failing case, and always the case in flight (not yet judged).
  std::optional<interrupt::ScratchPath> work_scratch;
  if (own_dir && !o.keep) work_scratch.emplace(work);
  std::cout << fmt::format("gate: work directory {}\n", work) << std::flush;
  q.work_dir = work;
  q.shrink_dir = o.shrink_dir.empty() ? work : o.shrink_dir;
  if (!o.shrink_dir.empty()) fs::create_directories(o.shrink_dir);

  Progress progress(!o.quiet, "gate");
  sweep::GateEvents ev;
  ev.say = [&](const std::string& s) { progress.say(s); };
  ev.update = [&](int64_t done, int64_t total, int64_t failed, const std::string& what) {
    progress.update(done, total, failed, what);
  };
  ev.seconds = [&] { return progress.seconds(); };
  ev.kept = [&](const std::string&) { work_scratch.reset(); };
  const sweep::GateResult r = sweep::run_gate(q, ev);
  progress.stop();

  std::cout << sweep::gate_summary(r);
  if (!o.junit.empty()) sweep::write_junit_file(o.junit, r.suites);
  const bool holds_results = !r.failures.empty() || !r.not_judged.empty();
  if (own_dir && !holds_results && !o.keep) {
    std::error_code ec;
    fs::remove_all(work, ec);
  } else if (holds_results || o.keep) {
    std::cout << "work directory kept: " << work << "\n";
  }
  std::cout << fmt::format("gate: {} ({} of {} cases failed{})\n",
                           r.ok() ? "PASS" : r.failures.empty() ? "ERROR" : "FAIL", r.failures.size(),
                           r.run + r.golden_judged, r.errors ? fmt::format(", {} could not be judged", r.errors) : "");
  return r.exit_code();
}

}  // namespace

void register_gate(CLI::App& app) {
  auto o = std::make_shared<GateOptions>();
  auto* sub = app.add_subcommand("gate", "property sweep + golden corpus against a backend (what CI runs)");
  sub->add_option("--backend", o->backend,
                  "emulated | faulty:<fault> (either with @hopper: Hopper wgmma block sums) | cuda | cublaslt | exec:CMD "
                  "(default: cuda with a GPU, else emulated)");
  o->cases_opt = sub->add_option("--cases", o->cases, "sweep cases to run (default 100)")->check(at_least(1));
  o->time_opt = sub->add_option("--time", o->time, "run sweep cases until S seconds have passed")
                    ->check(CLI::Range(1e-3, 1e7));
  sub->add_option("--seed", o->seed, "seed of the sweep (default 1); case i of seed S is always the same case")
      ->check(seed_text());
  sub->add_option("--case", o->case_index, "run only sweep case i (replay a failure), no golden corpus")
      ->check(at_least(0));
  sub->add_option("--presets", o->presets_csv, "comma-separated tiny presets (default: all tiny presets)");
  sub->add_option("--recipe", o->recipes,
                  "pin every sweep case to an engine recipe (golden/FORMAT.md): sglang | transformers | KEY=VALUE; "
                  "repeatable, applied in order over the sweep's own draw");
  sub->add_option("--junit", o->junit, "write JUnit XML (one testsuite for the sweep, one for golden)")->check(output_file());
  sub->add_option("--golden", o->golden, "golden corpus directory (default: the source tree's golden/cases)");
  sub->add_flag("--no-golden", o->no_golden, "skip the golden corpus");
  sub->add_option("--work-dir", o->work_dir, "where sweep cases are written (default: a new /tmp directory, removed when all pass)");
  sub->add_flag("--keep", o->keep, "keep the work directory");
  sub->add_option("--shrink", o->shrink, "failing cases to shrink (default 1; 0: none)")->check(at_least(0));
  sub->add_option("--shrink-dir", o->shrink_dir, "where shrunk cases go (default: the work directory)");
  sub->add_option("--max-failures", o->max_failures, "stop the sweep after N failures (default: never)")
      ->check(at_least(1));
  sub->add_option("--int32-threshold", o->int32_threshold,
                  "faulty:int32_overflow: the wrap index (default: T*k*H/2 of each case)")
      ->check(at_least(1));
  sub->add_flag("--no-expert-outputs", o->no_expert_outputs,
                "judge the combined output only (no per-slot judging of each expert's output)");
  sub->add_flag("-v,--verbose", o->verbose, "print every sweep case with its make-case command");
  sub->add_flag("--allow-vacuous", o->allow_vacuous, "a vacuous output (its checks would not see it zeroed: BUDGETS.md §10.6) does not fail");
  add_reference_device_option(sub, o->device);
  sub->add_flag("-q,--quiet", o->quiet, "no progress line");
  add_exec_timeout_option(sub);
  add_shard_options(sub, o->shard);
  set_runner(sub, [o]() { return run_gate(*o); });
}

}  // namespace moecheck::cli
