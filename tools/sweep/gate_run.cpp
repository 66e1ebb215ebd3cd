// The gate's run (contract: gate_run.hpp).
#include "tools/sweep/gate_run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>

#include "golden/case_generator.hpp"
#include "golden/case_problem.hpp"
#include "golden/interrupt.hpp"
#include "reference/errors.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/sweep/case_shrink.hpp"
#include "tools/sweep/gate_sweep.hpp"

namespace moecheck::sweep {

namespace fs = std::filesystem;

int GateResult::exit_code() const {
  // A failed check outranks a case that could not be judged: exit 1, else 2, else 0. An invalid
  // golden file is bad input and wins over a failure; a sweep case that could not be judged
  // (moecheck's own defect), or a sweep that judged nothing, only where nothing failed.
  if (golden_invalid) return 2;
  if (!failures.empty()) return 1;
  return errors || judged_nothing() ? 2 : 0;
}

std::string gate_command(const GateRequest& q, const std::string& backend, int64_t index) {
  std::string s = fmt::format("moecheck gate --backend {} --seed {} --case {}", judge::shell_quote(backend), q.seed, index);
  if (!q.presets_csv.empty()) s += " --presets " + q.presets_csv;
  for (const std::string& r : q.recipes) s += " --recipe " + judge::shell_quote(r);
  s += judge::shard_arguments(q.shard, judge::parse_backend_name(backend).faulty());
  if (q.int32_threshold > 0) s += fmt::format(" --int32-threshold {}", q.int32_threshold);
  if (judge::is_exec_backend(backend) && judge::exec_timeout_seconds() != 600)
    s += fmt::format(" --exec-timeout {}", judge::exec_timeout_seconds());
  return s;
}

namespace {

// The run's state and its reporting hooks.
struct Run {
  const GateRequest& q;
  const GateEvents& ev;
  GateResult r;
  judge::BackendName bn;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  void say(const std::string& s) const {
    if (ev.say) ev.say(s);
  }
  void update(int64_t done, int64_t total, const std::string& what) const {
    if (ev.update) ev.update(done, total, int64_t(r.failures.size()), what);
  }
  double seconds() const {
    return ev.seconds ? ev.seconds() : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// ---- the sweep ----------------------------------------------------------------------------

// One generated case: its options, file, make-case command and JUnit record.
struct SweepCase {
  int64_t index = 0;
  GeneratorOptions g;
  std::string path, make;
  std::vector<std::string> features;
  JunitCase jc;
};

SweepCase make_sweep_case(const Run& run, int64_t i) {
  SweepCase c;
  c.index = i;
  c.g = sweep_case(run.q.seed, i, run.q.presets);
  apply_recipes(c.g, run.q.recipes);
  if (run.q.shard.plan) c.g.tp = 1, c.g.tp_rank = 0, c.g.ep = 1, c.g.ep_rank = 0;  // the whole layer, split by the run
  c.path = (fs::path(run.q.work_dir) / fmt::format("case-{}.h5", i)).string();
  c.make = make_case_command(c.g, c.path);
  c.features = sweep_features(c.g);
  c.jc.classname = "moecheck.gate.sweep";
  c.jc.name = fmt::format("case {}: {} T={} {}", i, c.g.preset, c.g.tokens,
                          fmt::join(c.features.begin() + 1, c.features.end(), " "));
  return c;
}

// The judgement of a written sweep case: faulty:int32_overflow wraps at T*k*H/2 of the case
// unless --int32-threshold names the index.
judge::CheckOptions check_options(const Run& run, const SweepCase& c) {
  judge::CheckOptions chk;
  chk.backend = run.q.backend;
  chk.expert_outputs = run.q.expert_outputs;
  chk.allow_vacuous = run.q.allow_vacuous;
  chk.shard = run.q.shard;
  chk.reference_device = run.q.reference_device.get();
  if (run.q.int32_threshold > 0) {
    chk.int32_threshold = run.q.int32_threshold;
  } else if (run.bn.base == "faulty:int32_overflow") {
    const CaseReader rd(c.path);
    chk.int32_threshold = judge::scaled_int32_threshold(rd.config(), rd.tokens());
  }
  return chk;
}

// A random sweep case whose only defect is vacuity (a tiny case the checks cannot see: one or
// two tokens, an EP shard with one expert, a scale ambiguity; BUDGETS.md §10.6) is not judged:
// reported and counted, not failed. Golden cases and compare, shrink and repro still fail it.
bool only_vacuous(const judge::CheckOutcome& out) {
  return out.status == judge::CheckStatus::fail && !out.results.empty() &&
         std::all_of(out.results.begin(), out.results.end(),
                     [](const CompareResult& r) { return r.pass || (r.checks_failed == 0 && r.power.vacuous); });
}

void record_not_judged(Run& run, SweepCase& c, const judge::CheckOutcome& out) {
  // A generated case the reader or the reference refuses (say a routed-only case without the
  // near-tie partner the backend chose) is moecheck's own defect, not the backend's: an error,
  // reported and counted, and the sweep goes on.
  ++run.r.errors;
  GateIssue is;
  is.what = fmt::format("sweep case {} ({} T={}) could not be judged", c.index, c.g.preset, c.g.tokens);
  is.reason = out.reason, is.make_case = c.make, is.gate = gate_command(run.q, run.q.backend, c.index);
  run.say(fmt::format("ERROR {}: {}\n  make-case: {}\n  replay:    {}", is.what, is.reason, c.make, is.gate));
  c.jc.result = JunitCase::Result::error;
  c.jc.message = out.reason;
  c.jc.text = fmt::format("make-case: {}\nreplay: {}\n", c.make, is.gate);
  run.r.not_judged.push_back(is);
}

void record_declined(Run& run, SweepCase& c, const judge::CheckOutcome& out) {
  ++run.r.unsupported;
  GateIssue is;
  is.what = fmt::format("sweep case {} ({} T={})", c.index, c.g.preset, c.g.tokens);
  is.reason = out.reason, is.make_case = c.make, is.gate = gate_command(run.q, run.q.backend, c.index);
  if (run.q.verbose) run.say(fmt::format("UNSUPPORTED {}: {}", is.what, is.reason));
  c.jc.result = JunitCase::Result::skipped;
  c.jc.message = out.reason;
  run.r.declined.push_back(is);
}

void record_failure(Run& run, SweepCase& c, const judge::CheckOutcome& out, const judge::CheckOptions& chk) {
  for (const std::string& f : c.features) ++run.r.features[f].second;
  GateIssue fl;
  fl.what = fmt::format("sweep case {} ({} T={})", c.index, c.g.preset, c.g.tokens);
  fl.reason = out.reason, fl.make_case = c.make, fl.gate = gate_command(run.q, run.q.backend, c.index);
  if (run.bn.faulty() || chk.shard.faulty()) {
    // Is it the fault's failure? The correct backend on the same case (over the same ranks) tells.
    judge::CheckOptions ctl = chk;
    ctl.backend = run.bn.correct();
    ctl.shard.fault = ShardFault::none, ctl.shard.fault_rank = -1;
    if (judge::check_case(c.path, ctl).status != judge::CheckStatus::pass) {
      fl.reason += " [emulated fails on this case too: not this fault's doing]";
      ++run.r.control_failed;
    }
  }
  run.say(fmt::format("FAIL {}: {}\n  make-case: {}\n  replay:    {}", fl.what, fl.reason, fl.make_case, fl.gate));
  if (int64_t(run.r.failures.size()) < run.q.shrink) {
    ShrinkOptions so;
    so.check = chk;
    so.origin = fmt::format("gate sweep case {} of seed {} ({})", c.index, run.q.seed, c.make);
    so.progress = [&](const std::string& s) { run.update(c.index, 0, s); };
    const std::string min = (fs::path(run.q.shrink_dir) / fmt::format("case-{}-min.h5", c.index)).string();
    const ShrinkResult sr = shrink_case(c.path, min, so);
    fl.shrunk = min, fl.replay = sr.replay, fl.summary = sr.summary();
    run.say(fmt::format("  shrunk:    {} ({}, {} attempts)\n  replay:    {}", min, fl.summary, sr.attempts, fl.replay));
  }
  c.jc.result = JunitCase::Result::failure;
  c.jc.message = fl.reason;
  c.jc.text = fmt::format("make-case: {}\nreplay: {}\n", fl.make_case, fl.gate);
  if (!fl.shrunk.empty()) c.jc.text += fmt::format("shrunk case: {} ({})\nreplay shrunk: {}\n", fl.shrunk, fl.summary, fl.replay);
  run.r.failures.push_back(fl);
}

void run_sweep(Run& run) {
  const GateRequest& q = run.q;
  JunitSuite suite{fmt::format("sweep {} seed {}", q.backend, q.seed), {}};
  const int64_t first = q.case_index >= 0 ? q.case_index : 0;
  const int64_t count = q.case_index >= 0 ? 1 : (q.time > 0 ? INT64_MAX : q.cases);
  for (int64_t i = first; i < first + count; ++i) {
    if (q.time > 0 && run.seconds() >= q.time) break;
    if (q.max_failures > 0 && int64_t(run.r.failures.size()) >= q.max_failures) break;
    SweepCase c = make_sweep_case(run, i);
    interrupt::ScratchPath case_scratch(c.path);
    interrupt::set_stage(q.time > 0 ? fmt::format("gate: case {} (seed {})", i, q.seed)
                                    : fmt::format("gate: case {} ({} of {}, seed {}; {} failed so far)", i, i - first + 1,
                                                  count, q.seed, run.r.failures.size()));
    run.update(i - first, q.time > 0 ? 0 : count, fmt::format("{} T={}", c.g.preset, c.g.tokens));
    const auto tc0 = std::chrono::steady_clock::now();
    write_case(plan_case(c.g, c.path), c.path);
    const judge::CheckOptions chk = check_options(run, c);
    const judge::CheckOutcome out = judge::check_case(c.path, chk);
    c.jc.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc0).count();
    ++run.r.run;
    for (const std::string& f : c.features) ++run.r.features[f].first;
    const bool keep = out.status != judge::CheckStatus::pass && !out.unsupported();
    if (keep) {  // a result: kept
      case_scratch.release();
      if (run.ev.kept) run.ev.kept(c.path);
    }
    if (out.status == judge::CheckStatus::input_error) record_not_judged(run, c, out);
    else if (out.unsupported()) record_declined(run, c, out);
    else if (only_vacuous(out)) {
      ++run.r.vacuous;
      run.say(fmt::format("VACUOUS sweep case {} ({} T={}), not judged: {}", i, c.g.preset, c.g.tokens, out.reason));
      c.jc.result = JunitCase::Result::skipped;
      c.jc.message = "vacuous: " + out.reason;
    } else if (out.status == judge::CheckStatus::pass) {
      ++run.r.passed;
      if (q.verbose) run.say(fmt::format("pass case {} ({:.2f} s): {}", i, c.jc.seconds, c.make));
    } else {
      record_failure(run, c, out, chk);
    }
    if (!keep) {
      std::error_code ec;
      fs::remove(c.path, ec);
    }
    suite.cases.push_back(c.jc);
  }
  run.r.failed = int64_t(run.r.failures.size());
  run.r.suites.push_back(suite);
}

// ---- the golden corpus --------------------------------------------------------------------

JunitCase golden_invalid_case(Run& run, const std::string& file, const InputError& e) {
  ++run.r.golden_invalid;
  run.say(fmt::format("INVALID golden case: {}", e.what()));
  GateIssue invalid;
  invalid.what = fmt::format("golden case {} is invalid", file), invalid.reason = e.what();
  run.r.not_judged.push_back(invalid);
  JunitCase jc;
  jc.classname = "moecheck.gate.golden";
  jc.name = fs::path(file).filename().string();
  jc.result = JunitCase::Result::error;
  jc.message = e.what();
  return jc;
}

// The judgements of one corpus case: every recorded output, and the backend itself when it runs
// on corpus cases (GPU and exec:CMD backends).
std::vector<std::pair<std::string, judge::CheckOptions>> golden_jobs(const Run& run, const CaseProblem& cp) {
  std::vector<std::pair<std::string, judge::CheckOptions>> jobs;
  for (const OutputInfo& oi : cp.reader().outputs()) {
    judge::CheckOptions k;
    k.output = oi.name;
    k.allow_vacuous = run.q.allow_vacuous;
    k.reference_device = run.q.reference_device.get();
    jobs.push_back({"/outputs/" + oi.name, k});
  }
  if (run.bn.gpu() || run.bn.exec()) {
    judge::CheckOptions k;
    k.backend = run.q.backend;
    k.allow_vacuous = run.q.allow_vacuous;
    k.reference_device = run.q.reference_device.get();
    jobs.push_back({"run " + run.q.backend, k});
  }
  return jobs;
}

void run_golden(Run& run) {
  const std::string& dir = run.q.golden_dir;
  if (dir.empty() || run.q.case_index >= 0) return;
  run.r.golden_run = true;
  JunitSuite gs{"golden " + dir, {}};
  if (!fs::is_directory(dir)) {
    if (run.q.golden_dir_required) throw InputError(dir, "--golden", "not a directory");
    run.say(fmt::format("gate: golden corpus {} not found; skipped (give --golden DIR)", dir));
    run.r.suites.push_back(gs);
    return;
  }
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  int64_t n = 0;
  for (const std::string& file : files) {
    // An invalid corpus file is bad input (exit 2), reported and skipped; never judged.
    std::optional<CaseProblem> cp;
    try {
      cp.emplace(file);
    } catch (const InputError& e) {
      gs.cases.push_back(golden_invalid_case(run, file, e));
      continue;
    }
    for (const auto& [label, k] : golden_jobs(run, *cp)) {
      JunitCase jc;
      jc.classname = "moecheck.gate.golden";
      jc.name = fs::path(file).filename().string() + " " + label;
      run.update(++n, 0, jc.name);
      const judge::CheckOutcome out = judge::check_problem(*cp, k);
      ++run.r.golden_judged;
      jc.seconds = out.seconds;
      if (out.status != judge::CheckStatus::pass) {
        ++run.r.golden_failed;
        GateIssue fl;
        fl.what = jc.name;
        fl.reason = out.reason;
        fl.replay = k.backend.empty() ? fmt::format("moecheck compare {} --output {}", file, k.output)
                                      : judge::replay_command(file, k.backend, 0);
        jc.result = out.status == judge::CheckStatus::fail ? JunitCase::Result::failure : JunitCase::Result::error;
        jc.message = out.reason;
        jc.text = "replay: " + fl.replay + "\n";
        run.say(fmt::format("FAIL golden {}: {}\n  replay:    {}", jc.name, fl.reason, fl.replay));
        run.r.failures.push_back(fl);
      }
      gs.cases.push_back(jc);
    }
  }
  run.r.suites.push_back(gs);
}

}  // namespace

GateResult run_gate(const GateRequest& q, const GateEvents& ev) {
  Run run{q, ev, {}, judge::parse_backend_name(q.backend)};
  run_sweep(run);
  run_golden(run);
  run.r.seconds = run.seconds();
  return run.r;
}

std::string gate_summary(const GateResult& r) {
  std::string s;
  auto line = [&](const std::string& l) { s += l + "\n"; };
  line(fmt::format("\nsweep: {} cases run, {} passed, {} failed{}{}{} ({:.1f} s)", r.run, r.passed, r.failed,
                   r.vacuous ? fmt::format(", {} vacuous (not judged)", r.vacuous) : "",
                   r.unsupported ? fmt::format(", {} unsupported by the backend (not judged)", r.unsupported) : "",
                   r.errors ? fmt::format(", {} could not be judged", r.errors) : "", r.seconds));
  std::string fl;
  for (const auto& [name, rf] : r.features)
    fl += fmt::format("{}{} {}{}", fl.empty() ? "" : ", ", name, rf.first, rf.second ? fmt::format(" ({} failed)", rf.second) : "");
  if (r.run) line("  features: " + fl);
  if (r.control_failed)
    line(fmt::format("  {} of the failing cases fail with the correct backend (emulated) too", r.control_failed));
  if (!r.declined.empty()) {
    // The reasons, each with how many cases gave it (a kernel usually declines for a few reasons).
    std::map<std::string, int64_t> reasons;
    for (const GateIssue& d : r.declined) ++reasons[d.reason];
    line(fmt::format("unsupported by the backend ({} cases; first: {}):", r.unsupported, r.declined.front().gate));
    for (const auto& [why, count] : reasons) line(fmt::format("  {} x {}", count, why));
  }
  if (r.golden_run) line(fmt::format("golden: {} judged, {} failed", r.golden_judged, r.golden_failed));
  if (!r.failures.empty()) {
    line("failures:");
    for (const GateIssue& f : r.failures) {
      line(fmt::format("  {}: {}", f.what, f.reason));
      if (!f.make_case.empty()) line(fmt::format("    make-case: {}\n    replay:    {}", f.make_case, f.gate));
      if (!f.shrunk.empty()) line(fmt::format("    shrunk:    {} ({})", f.shrunk, f.summary));
      if (!f.replay.empty()) line(fmt::format("    replay:    {}", f.replay));
    }
  }
  if (!r.not_judged.empty()) {
    line("could not be judged (a defect of moecheck or its generator, not of the backend):");
    for (const GateIssue& f : r.not_judged) {
      line(fmt::format("  {}: {}", f.what, f.reason));
      if (!f.make_case.empty()) line(fmt::format("    make-case: {}\n    replay:    {}", f.make_case, f.gate));
    }
  }
  if (r.judged_nothing())
    line(fmt::format("no sweep case was judged ({} unsupported, {} vacuous, {} not judgeable): narrow the sweep to "
                     "what the backend implements (--presets, --recipe)",
                     r.unsupported, r.vacuous, r.errors));
  return s;
}

}  // namespace moecheck::sweep
