// `moecheck gate [--backend B] [--cases N | --time S] [--seed S] [--presets P,...] [--case i]
//                [--junit FILE] [--golden DIR | --no-golden] [--work-dir DIR] [--shrink N]`:
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
// failed check, a generated case that moecheck itself could not judge: reported, the sweep goes on).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "golden/case_generator.hpp"
#include "golden/interrupt.hpp"
#include "golden/model_presets.hpp"
#include "kernels/emulated/emulated_moe.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/sweep/case_shrink.hpp"
#include "tools/sweep/gate_sweep.hpp"
#include "tools/sweep/junit.hpp"

namespace moecheck::cli {

namespace fs = std::filesystem;

namespace {

// The progress line on stderr: redrawn in place at least every second on a terminal (a ticker
// thread, so a slow case still shows elapsed time), plain lines every 10 s otherwise.
class Progress {
 public:
  Progress(bool enabled, std::string label) : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), label_(std::move(label)) {
    t0_ = std::chrono::steady_clock::now();
    if (enabled_) ticker_ = std::thread([this] { tick(); });
  }
  ~Progress() { stop(); }
  void update(int64_t done, int64_t total, int64_t failed, const std::string& what) {
    std::lock_guard<std::mutex> l(m_);
    done_ = done, total_ = total, failed_ = failed, what_ = what;
    if (enabled_ && tty_) draw_locked();
  }
  // Prints a line to stdout without tearing the progress line.
  void say(const std::string& line) {
    std::lock_guard<std::mutex> l(m_);
    if (enabled_ && tty_) std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    std::cout << line << std::endl;
    if (enabled_ && tty_) draw_locked();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> l(m_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    if (ticker_.joinable()) ticker_.join();
    if (enabled_ && tty_) std::fputs("\r\033[K", stderr);
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  void draw_locked() {
    const std::string total = total_ > 0 ? fmt::format("/{}", total_) : "";
    std::fprintf(stderr, "%s%s: case %lld%s, %.1f s, %lld failed%s%s%s", tty_ ? "\r\033[K" : "", label_.c_str(),
                 static_cast<long long>(done_), total.c_str(), seconds(), static_cast<long long>(failed_),
                 what_.empty() ? "" : "  ", tty_ ? what_.substr(0, 60).c_str() : what_.c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void tick() {
    std::unique_lock<std::mutex> l(m_);
    while (!stopped_) {
      cv_.wait_for(l, std::chrono::seconds(tty_ ? 1 : 10));
      if (!stopped_ && done_ + failed_ >= 0) draw_locked();
    }
  }
  bool enabled_, tty_;
  std::string label_;
  std::chrono::steady_clock::time_point t0_;
  std::mutex m_;
  std::condition_variable cv_;
  std::thread ticker_;
  bool stopped_ = false;
  int64_t done_ = 0, total_ = 0, failed_ = 0;
  std::string what_;
};

struct GateOptions {
  std::string backend, golden, work_dir, junit, shrink_dir, presets_csv;
  std::vector<std::string> recipes;  // --recipe, in order (gate_sweep.hpp apply_recipes)
  int64_t cases = 100, case_index = -1, shrink = 1, int32_threshold = 0, max_failures = 0;
  double time = 0;
  uint64_t seed = 1;
  bool no_golden = false, quiet = false, keep = false, no_expert_outputs = false, verbose = false;
  bool allow_vacuous = false;
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

std::string default_golden_dir() {
#ifdef MOECHECK_SOURCE_DIR
  return std::string(MOECHECK_SOURCE_DIR) + "/golden/cases";
#else
  return "golden/cases";
#endif
}

std::string gate_command(const GateOptions& o, const std::string& backend, int64_t index) {
  std::string s = fmt::format("moecheck gate --backend {} --seed {} --case {}", judge::shell_quote(backend), o.seed, index);
  if (!o.presets_csv.empty()) s += " --presets " + o.presets_csv;
  for (const std::string& r : o.recipes) s += " --recipe " + judge::shell_quote(r);
  if (o.int32_threshold > 0) s += fmt::format(" --int32-threshold {}", o.int32_threshold);
  if (judge::is_exec_backend(backend) && judge::exec_timeout_seconds() != 600)
    s += fmt::format(" --exec-timeout {}", judge::exec_timeout_seconds());
  return s;
}

struct Failure {
  std::string what, reason, make_case, gate, shrunk, replay, summary;
};

int run_gate(GateOptions& o) {
  // ---- which backend ----
  std::string why;
  if (o.backend.empty()) {
    const judge::GpuAvailability g = judge::gpu_availability();
    o.backend = g.usable ? "cuda" : "emulated";
    why = g.usable ? "default: a usable GPU (" + g.device + ")" : "default without a usable GPU: " + g.why;
  } else {
    why = "given with --backend";
  }
  const judge::BackendName bn = judge::parse_backend_name(o.backend);
  const bool gpu = bn.gpu();
  // Backends that run on the golden corpus's cases too (not only judged on their recordings).
  const bool runs_on_corpus = gpu || bn.exec();
  if (gpu) {
    const judge::GpuAvailability g = judge::gpu_availability();
    if (!g.usable) throw InputError("", "--backend", o.backend + " needs a usable GPU: " + g.why);
  }
  std::vector<std::string> presets = o.presets_csv.empty() ? sweep::default_sweep_presets(gpu) : split_csv(o.presets_csv);
  for (const std::string& p : presets) {
    const ModelPreset* mp = find_model_preset(p);
    if (!mp) throw InputError("", "--presets", fmt::format("unknown preset \"{}\"; known presets: {}", p, model_preset_names()));
    if (mp->full_size) throw InputError("", "--presets", fmt::format("{} is a full-size layer; the sweep takes tiny presets", p));
  }
  if (o.cases_opt->count() && o.time_opt->count()) throw InputError("", "--time", "give --cases or --time, not both");
  if (GeneratorOptions probe; !o.recipes.empty())
    if (const std::string rule = sweep::apply_recipes(probe, o.recipes); !rule.empty()) throw InputError("", "--recipe", rule);
  const bool int32_fault = bn.base == "faulty:int32_overflow";
  std::cout << fmt::format("gate: backend {} ({}), seed {}, presets {}\n", o.backend, why, o.seed, fmt::join(presets, ","));
  if (int32_fault && o.int32_threshold == 0)
    std::cout << "gate: faulty:int32_overflow wraps at T*k*H/2 of each case (the real 2^31 needs a huge case)\n";

  // ---- work directory ----
  bool own_dir = false;
  std::string work = o.work_dir;
  if (work.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "moecheck-gate-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw InputError(tmpl, "--work-dir", "cannot create a temporary directory");
    work = tmpl, own_dir = true;
  } else {
    std::error_code ec;
    fs::create_directories(work, ec);
    if (ec) throw InputError(work, "--work-dir", "cannot create the directory: " + ec.message());
  }
  // Interrupted, the gate removes its own work directory unless --keep or until it holds a
  // failing case, and always the case in flight (not yet judged).
  std::optional<interrupt::ScratchPath> work_scratch;
  if (own_dir && !o.keep) work_scratch.emplace(work);
  std::cout << fmt::format("gate: work directory {}\n", work) << std::flush;
  const std::string shrink_dir = o.shrink_dir.empty() ? work : o.shrink_dir;
  if (!o.shrink_dir.empty()) fs::create_directories(shrink_dir);

  std::vector<sweep::JunitSuite> suites;
  std::vector<Failure> failures;
  std::map<std::string, std::pair<int64_t, int64_t>> features;  // label -> (run, failed)
  int64_t run = 0, passed = 0, shrunk = 0, control_failed = 0, errors = 0, vacuous = 0;
  std::vector<Failure> error_list;  // cases that could not be judged
  Progress progress(!o.quiet, "gate");

  // ---- the sweep ----
  sweep::JunitSuite sweep_suite{fmt::format("sweep {} seed {}", o.backend, o.seed), {}};
  const int64_t first = o.case_index >= 0 ? o.case_index : 0;
  const int64_t count = o.case_index >= 0 ? 1 : (o.time > 0 ? INT64_MAX : o.cases);
  for (int64_t i = first; i < first + count; ++i) {
    if (o.time > 0 && progress.seconds() >= o.time) break;
    if (o.max_failures > 0 && int64_t(failures.size()) >= o.max_failures) break;
    GeneratorOptions g = sweep::sweep_case(o.seed, i, presets);
    sweep::apply_recipes(g, o.recipes);
    const std::string path = (fs::path(work) / fmt::format("case-{}.h5", i)).string();
    const std::string make = make_case_command(g, path);
    interrupt::ScratchPath case_scratch(path);
    interrupt::set_stage(o.time > 0 ? fmt::format("gate: case {} (seed {})", i, o.seed)
                                    : fmt::format("gate: case {} ({} of {}, seed {}; {} failed so far)", i, i - first + 1, count,
                                                  o.seed, failures.size()));
    progress.update(i - first, o.time > 0 ? 0 : count, int64_t(failures.size()),
                    fmt::format("{} T={}", g.preset, g.tokens));
    judge::CheckOptions chk;
    chk.backend = o.backend;
    chk.expert_outputs = !o.no_expert_outputs;
    chk.allow_vacuous = o.allow_vacuous;
    const auto tc0 = std::chrono::steady_clock::now();
    write_case(plan_case(g, path), path);
    {
      const CaseReader rd(path);
      chk.int32_threshold = o.int32_threshold > 0 ? o.int32_threshold
                            : int32_fault       ? judge::scaled_int32_threshold(rd.config(), rd.tokens())
                                                : 0;
    }
    const judge::CheckOutcome out = judge::check_case(path, chk);
    if (out.status != judge::CheckStatus::pass) case_scratch.release(), work_scratch.reset();  // a result: kept
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc0).count();
    ++run;
    const std::vector<std::string> feats = sweep::sweep_features(g);
    for (const std::string& f : feats) ++features[f].first;
    sweep::JunitCase jc;
    jc.classname = "moecheck.gate.sweep";
    jc.name = fmt::format("case {}: {} T={} {}", i, g.preset, g.tokens, fmt::join(feats.begin() + 1, feats.end(), " "));
    jc.seconds = secs;
    if (out.status == judge::CheckStatus::input_error) {
      // A generated case the reader or the reference refuses (say a routed-only case without the
      // near-tie partner the backend chose) is moecheck's own defect, not the backend's: an
      // error, reported and counted, and the sweep goes on.
      ++errors;
      Failure fl;
      fl.what = fmt::format("sweep case {} ({} T={}) could not be judged", i, g.preset, g.tokens);
      fl.reason = out.reason, fl.make_case = make, fl.gate = gate_command(o, o.backend, i);
      progress.say(fmt::format("ERROR {}: {}\n  make-case: {}\n  replay:    {}", fl.what, fl.reason, make, fl.gate));
      jc.result = sweep::JunitCase::Result::error;
      jc.message = out.reason;
      jc.text = fmt::format("make-case: {}\nreplay: {}\n", make, fl.gate);
      sweep_suite.cases.push_back(jc);
      error_list.push_back(fl);
      continue;
    }
    // A random sweep case whose only defect is vacuity (a tiny case the checks cannot see: one or
    // two tokens, an EP shard with one expert, a scale ambiguity; BUDGETS.md §10.6) is not judged:
    // reported and counted, not failed. Golden cases and compare, shrink and repro still fail it.
    const bool only_vacuous =
        out.status == judge::CheckStatus::fail && !out.results.empty() &&
        std::all_of(out.results.begin(), out.results.end(),
                    [](const CompareResult& r) { return r.pass || (r.checks_failed == 0 && r.power.vacuous); });
    if (only_vacuous) {
      ++vacuous;
      progress.say(fmt::format("VACUOUS sweep case {} ({} T={}), not judged: {}", i, g.preset, g.tokens, out.reason));
      jc.result = sweep::JunitCase::Result::skipped;
      jc.message = "vacuous: " + out.reason;
      sweep_suite.cases.push_back(jc);
      continue;
    }
    if (out.status == judge::CheckStatus::pass) {
      ++passed;
      if (o.verbose) progress.say(fmt::format("pass case {} ({:.2f} s): {}", i, secs, make));
      sweep_suite.cases.push_back(jc);
      std::error_code ec;
      fs::remove(path, ec);
      continue;
    }
    for (const std::string& f : feats) ++features[f].second;
    Failure fl;
    fl.what = fmt::format("sweep case {} ({} T={})", i, g.preset, g.tokens);
    fl.reason = out.reason;
    fl.make_case = make;
    fl.gate = gate_command(o, o.backend, i);
    if (bn.faulty()) {
      // Is it the fault's failure? The correct backend on the same case tells.
      judge::CheckOptions ctl = chk;
      ctl.backend = bn.correct();
      if (judge::check_case(path, ctl).status != judge::CheckStatus::pass) {
        fl.reason += " [emulated fails on this case too: not this fault's doing]";
        ++control_failed;
      }
    }
    progress.say(fmt::format("FAIL {}: {}\n  make-case: {}\n  replay:    {}", fl.what, fl.reason, fl.make_case, fl.gate));
    if (shrunk < o.shrink) {
      sweep::ShrinkOptions so;
      so.check = chk;
      so.origin = fmt::format("gate sweep case {} of seed {} ({})", i, o.seed, make);
      so.progress = [&](const std::string& s) { progress.update(i - first, o.time > 0 ? 0 : count, int64_t(failures.size()), s); };
      const std::string min = (fs::path(shrink_dir) / fmt::format("case-{}-min.h5", i)).string();
      const sweep::ShrinkResult sr = sweep::shrink_case(path, min, so);
      ++shrunk;
      fl.shrunk = min, fl.replay = sr.replay, fl.summary = sr.summary();
      progress.say(fmt::format("  shrunk:    {} ({}, {} attempts)\n  replay:    {}", min, fl.summary, sr.attempts, fl.replay));
    }
    jc.result = sweep::JunitCase::Result::failure;
    jc.message = fl.reason;
    jc.text = fmt::format("make-case: {}\nreplay: {}\n", fl.make_case, fl.gate);
    if (!fl.shrunk.empty()) jc.text += fmt::format("shrunk case: {} ({})\nreplay shrunk: {}\n", fl.shrunk, fl.summary, fl.replay);
    sweep_suite.cases.push_back(jc);
    failures.push_back(fl);
  }
  const int64_t sweep_failed = run - passed - errors - vacuous;
  suites.push_back(sweep_suite);

  // ---- the golden corpus ----
  int64_t golden_judged = 0, golden_failed = 0, golden_invalid = 0;
  if (!o.no_golden && o.case_index < 0) {
    const std::string dir = o.golden.empty() ? default_golden_dir() : o.golden;
    sweep::JunitSuite gs{"golden " + dir, {}};
    if (!fs::is_directory(dir)) {
      if (!o.golden.empty()) throw InputError(dir, "--golden", "not a directory");
      progress.say(fmt::format("gate: golden corpus {} not found; skipped (give --golden DIR)", dir));
    } else {
      std::vector<std::string> cases;
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".h5") cases.push_back(e.path().string());
      std::sort(cases.begin(), cases.end());
      int64_t n = 0;
      for (const std::string& c : cases) {
        // An invalid corpus file is bad input (exit 2), reported and skipped; never judged.
        std::optional<CaseProblem> cp;
        try {
          cp.emplace(c);
        } catch (const InputError& e) {
          ++golden_invalid;
          progress.say(fmt::format("INVALID golden case: {}", e.what()));
          Failure invalid;
          invalid.what = fmt::format("golden case {} is invalid", c), invalid.reason = e.what();
          error_list.push_back(invalid);
          sweep::JunitCase jc;
          jc.classname = "moecheck.gate.golden";
          jc.name = fs::path(c).filename().string();
          jc.result = sweep::JunitCase::Result::error;
          jc.message = e.what();
          gs.cases.push_back(jc);
          continue;
        }
        std::vector<std::pair<std::string, judge::CheckOptions>> jobs;
        for (const OutputInfo& oi : cp->reader().outputs()) {
          judge::CheckOptions k;
          k.output = oi.name;
          k.allow_vacuous = o.allow_vacuous;
          jobs.push_back({"/outputs/" + oi.name, k});
        }
        if (runs_on_corpus) {
          judge::CheckOptions k;
          k.backend = o.backend;
          k.allow_vacuous = o.allow_vacuous;
          jobs.push_back({"run " + o.backend, k});
        }
        for (const auto& [label, k] : jobs) {
          progress.update(++n, 0, int64_t(failures.size()), fs::path(c).filename().string() + " " + label);
          const judge::CheckOutcome out = judge::check_problem(*cp, k);
          ++golden_judged;
          sweep::JunitCase jc;
          jc.classname = "moecheck.gate.golden";
          jc.name = fs::path(c).filename().string() + " " + label;
          jc.seconds = out.seconds;
          if (out.status != judge::CheckStatus::pass) {
            ++golden_failed;
            Failure fl;
            fl.what = jc.name;
            fl.reason = out.reason;
            fl.replay = k.backend.empty() ? fmt::format("moecheck compare {} --output {}", c, k.output)
                                          : judge::replay_command(c, k.backend, 0);
            jc.result = out.status == judge::CheckStatus::fail ? sweep::JunitCase::Result::failure
                                                               : sweep::JunitCase::Result::error;
            jc.message = out.reason;
            jc.text = "replay: " + fl.replay + "\n";
            progress.say(fmt::format("FAIL golden {}: {}\n  replay:    {}", jc.name, fl.reason, fl.replay));
            failures.push_back(fl);
          }
          gs.cases.push_back(jc);
        }
      }
    }
    suites.push_back(gs);
  }
  progress.stop();

  // ---- summary ----
  std::cout << fmt::format("\nsweep: {} cases run, {} passed, {} failed{}{} ({:.1f} s)\n", run, passed, sweep_failed,
                           vacuous ? fmt::format(", {} vacuous (not judged)", vacuous) : "",
                           errors ? fmt::format(", {} could not be judged", errors) : "", progress.seconds());
  std::string fl;
  for (const auto& [name, rf] : features)
    fl += fmt::format("{}{} {}{}", fl.empty() ? "" : ", ", name, rf.first, rf.second ? fmt::format(" ({} failed)", rf.second) : "");
  if (run) std::cout << "  features: " << fl << "\n";
  if (control_failed)
    std::cout << fmt::format("  {} of the failing cases fail with the correct backend (emulated) too\n", control_failed);
  if (!o.no_golden && o.case_index < 0)
    std::cout << fmt::format("golden: {} judged, {} failed\n", golden_judged, golden_failed);
  if (!failures.empty()) {
    std::cout << "failures:\n";
    for (const Failure& f : failures) {
      std::cout << fmt::format("  {}: {}\n", f.what, f.reason);
      if (!f.make_case.empty()) std::cout << fmt::format("    make-case: {}\n    replay:    {}\n", f.make_case, f.gate);
      if (!f.shrunk.empty()) std::cout << fmt::format("    shrunk:    {} ({})\n", f.shrunk, f.summary);
      if (!f.replay.empty()) std::cout << fmt::format("    replay:    {}\n", f.replay);
    }
  }
  if (!error_list.empty()) {
    std::cout << "could not be judged (a defect of moecheck or its generator, not of the backend):\n";
    for (const Failure& f : error_list)
      std::cout << fmt::format("  {}: {}\n    make-case: {}\n    replay:    {}\n", f.what, f.reason, f.make_case, f.gate);
  }
  if (!o.junit.empty()) sweep::write_junit_file(o.junit, suites);
  const bool ok = failures.empty() && error_list.empty();
  if (own_dir && ok && !o.keep) {
    std::error_code ec;
    fs::remove_all(work, ec);
  } else if (!ok || o.keep) {
    std::cout << "work directory kept: " << work << "\n";
  }
  std::cout << fmt::format("gate: {} ({} of {} cases failed{})\n", ok ? "PASS" : failures.empty() ? "ERROR" : "FAIL",
                           failures.size(), run + golden_judged,
                           errors ? fmt::format(", {} could not be judged", errors) : "");
  // A failed check outranks a case that could not be judged: exit 1, else 2, else 0.
  // An invalid golden file is bad input and wins over a failure; a sweep case that could not be
  // judged (moecheck's own defect) only where nothing failed.
  return golden_invalid ? kExitInputError : !failures.empty() ? kExitCheckFailed : errors ? kExitInputError : kExitOk;
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
  sub->add_flag("-q,--quiet", o->quiet, "no progress line");
  add_exec_timeout_option(sub);
  set_runner(sub, [o]() { return run_gate(*o); });
}

}  // namespace moecheck::cli
