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
// correct backend was flagged or a bug case was not caught, 2 for bad input.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>

#include "golden/case_generator.hpp"
#include "golden/interrupt.hpp"
#include "kernels/emulated/emulated_moe.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/sweep/gate_sweep.hpp"

namespace moecheck::cli {

namespace fs = std::filesystem;

namespace {

struct Tally {
  int64_t cases = 0, caught = 0, unsupported = 0;  // unsupported: declined by the backend, not counted in cases
  int64_t missed[4] = {0, 0, 0, 0};  // deepgemm, sglang, vllm, nmse: passed although moecheck caught it
  int64_t flagged[4] = {0, 0, 0, 0}; // familiar check failed (for the correct backend: false alarms)
};

void tally(Tally& t, const CompareResult* r) {
  ++t.cases;
  const bool caught = !r || !r->pass;  // no result: the backend threw, which anything notices
  const bool pass[4] = {r && r->metrics.deepgemm_pass, r && r->metrics.sglang_pass, r && r->metrics.vllm_pass,
                        r && r->metrics.nmse_pass};
  t.caught += caught;
  for (int j = 0; j < 4; ++j) {
    t.missed[j] += caught && pass[j];
    t.flagged[j] += !pass[j];
  }
}

std::string default_bugs_dir() {
#ifdef MOECHECK_SOURCE_DIR
  return std::string(MOECHECK_SOURCE_DIR) + "/golden/bugs";
#else
  return "golden/bugs";
#endif
}

std::string short_named(const CompareResult& r) {
  // What moecheck names: the failing experts, the tokens failing alone, the routing mismatches.
  std::vector<std::string> p;
  std::vector<int64_t> ex;
  for (const ExpertVerdict& v : r.experts)
    if (!v.pass) ex.push_back(v.expert);
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 4; ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return v.size() > 4 ? s + ",..." : s;
  };
  if (!ex.empty()) p.push_back("expert " + list(ex));
  if (!r.failing_tokens_unexplained.empty()) p.push_back("token " + list(r.failing_tokens_unexplained));
  if (!r.mismatched.empty()) p.push_back("routing of token " + list(r.mismatched));
  if (r.metrics.nonfinite) p.push_back(fmt::format("{} NaN/Inf", r.metrics.nonfinite));
  std::string s = r.pass ? "**not caught**" : "caught: ";
  for (size_t i = 0; i < p.size(); ++i) s += (i ? "; " : "") + p[i];
  return s;
}

const char* miss(bool familiar_pass) { return familiar_pass ? "**missed**" : "caught"; }

// The bug case run on `backend` and judged with its default model; no result: the backend threw
// or declined the case (unsupported()).
judge::CheckOutcome judge_bug_case(const std::string& file, const std::string& backend, int64_t thr) {
  judge::CheckOptions k;
  k.backend = backend;
  k.int32_threshold = thr;
  judge::CheckOutcome out = judge::check_case(file, k);
  if (out.status == judge::CheckStatus::input_error) throw InputError(file, "", out.reason);
  return out;
}

// The bug case judged as an FP8 tensor-core output: faulty:<fault>@hopper, default model hopper.
std::string under_hopper(const std::string& file, const std::string& backend, int64_t thr) {
  const judge::CheckOutcome out = judge_bug_case(file, backend + "@hopper", thr);
  if (out.results.empty()) return "caught: the backend threw";
  const CompareResult* r = &out.results.front();
  if (r->checks_failed == 0 && r->power.vacuous) return "VACUOUS";
  return r->pass ? "**missed**" : "caught";
}

}  // namespace

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
    const std::string bugs = o->bugs.empty() ? default_bugs_dir() : o->bugs;
    if (!o->bugs.empty() && !fs::is_directory(bugs)) throw InputError(bugs, "--bugs", "not a directory");
    // The rows: the correct backend, then one per fault, each with its name (the bug case's file name).
    std::vector<std::string> backends, fault_names;
    const bool exec = !o->backend.empty();
    if (exec) {
      for (const std::string& f : judge::exec_fault_names(o->backend, o->faults_csv)) {
        backends.push_back(judge::exec_with_fault(o->backend, f));
        fault_names.push_back(f);
      }
    } else {
      if (!o->faults_csv.empty()) throw InputError("", "--faults", "only with --backend exec:CMD (the built-in faults all run)");
      backends = {"emulated"}, fault_names = {"none"};
      for (Fault f : all_faults()) {
        backends.push_back("faulty:" + std::string(to_string(f)));
        fault_names.push_back(std::string(to_string(f)));
      }
    }
    std::vector<Tally> sweep_tally(backends.size());
    const BudgetModel fp32 = parse_budget_model("fp32");

    // The sweep: one case, one reference, every backend.
    std::string tmpl = (fs::temp_directory_path() / "moecheck-faults-XXXXXX").string();
    if (o->cases > 0 && !mkdtemp(tmpl.data())) throw InputError(tmpl, "", "cannot create a temporary directory");
    const interrupt::ScratchPath work_dir(tmpl);  // registered once mkdtemp has chosen the name
    const std::vector<std::string> presets = sweep::default_sweep_presets(false);
    for (int64_t i = 0; i < o->cases; ++i) {
      interrupt::set_stage(fmt::format("faults: sweep case {} of {} (seed {})", i + 1, o->cases, o->seed));
      const GeneratorOptions g = sweep::sweep_case(o->seed, i, presets);
      const std::string path = (fs::path(tmpl) / fmt::format("case-{}.h5", i)).string();
      write_case(plan_case(g, path), path);
      {
        const CaseProblem cp(path);
        if (exec) {
          // Each run judged with the model its output names (one reference per model, as check_problem does).
          for (size_t b = 0; b < backends.size(); ++b) {
            judge::CheckOptions k;
            k.backend = backends[b];
            const judge::CheckOutcome out = judge::check_problem(cp, k);
            if (out.status == judge::CheckStatus::input_error) throw InputError(path, "", out.reason);
            if (out.unsupported()) {
              ++sweep_tally[b].unsupported;
              continue;
            }
            tally(sweep_tally[b], out.results.empty() ? nullptr : &out.results.front());
          }
          fs::remove(path);
          if (!o->quiet) std::cerr << fmt::format("\rmoecheck faults: sweep case {}/{}", i + 1, o->cases) << std::flush;
          continue;
        }
        const ForwardResult ref = judge::judging_reference(cp, fp32);
        CompareOptions copt;
        copt.model = fp32;
        copt.keep_ratios = false;
        for (size_t b = 0; b < backends.size(); ++b) {
          const int64_t thr =
              backends[b] == "faulty:int32_overflow" ? judge::scaled_int32_threshold(cp.config(), cp.tokens()) : 0;
          try {
            const BackendOutput out = judge::run_backend(cp, backends[b], true, thr);
            const CompareResult r = compare_output(cp.problem(), ref, judge::observation_of(out), copt);
            tally(sweep_tally[b], &r);
          } catch (const InputError& e) {
            if (e.where() == "--backend") throw;
            tally(sweep_tally[b], nullptr);
          }
        }
      }
      fs::remove(path);
      if (!o->quiet) std::cerr << fmt::format("\rmoecheck faults: sweep case {}/{}", i + 1, o->cases) << std::flush;
    }
    if (o->cases > 0) {
      fs::remove_all(tmpl);
      if (!o->quiet) std::cerr << "\n";
    }

    bool ok = sweep_tally[0].caught == 0;
    if (exec) std::cout << fmt::format("backend {}\n\n", judge::shell_quote(o->backend));
    std::cout << fmt::format(
        "| backend | golden/bugs case: moecheck | the same @hopper | DeepGEMM cos-diff < 1e-3 | SGLang mean-rel < 0.02 | "
        "vLLM atol=rtol=0.035 | NMSE < 5e-3 | sweep (seed {}): caught / cases | missed by DeepGEMM / SGLang / vLLM / NMSE |\n",
        o->seed);
    std::cout << "|---|---|---|---|---|---|---|---:|---|\n";
    for (size_t b = 0; b < backends.size(); ++b) {
      const std::string& be = backends[b];
      std::string bug = "-", hopper = "-", cols[4] = {"-", "-", "-", "-"};
      const std::string file = (fs::path(bugs) / (fault_names[b] + ".h5")).string();
      if (b > 0 && fs::exists(file)) {
        int64_t thr = 0;
        {
          const CaseReader rd(file);
          for (const OutputInfo& oi : rd.outputs())
            if (oi.attributes.count("int32_threshold")) thr = std::stoll(oi.attributes.at("int32_threshold"));
        }
        const judge::CheckOutcome out = judge_bug_case(file, be, thr);
        if (out.unsupported()) {
          bug = "declined by the backend (unsupported)";
          ok = false;
        } else if (!out.results.empty()) {
          const CompareResult* r = &out.results.front();
          bug = short_named(*r);
          const FamiliarMetrics& m = r->metrics;
          cols[0] = miss(m.deepgemm_pass), cols[1] = miss(m.sglang_pass), cols[2] = miss(m.vllm_pass), cols[3] = miss(m.nmse_pass);
          ok = ok && !r->pass;
        } else {
          bug = "caught: the backend threw";
        }
        if (!exec) hopper = under_hopper(file, be, thr);
      } else if (b > 0) {
        bug = "(no bug case)";
      }
      const Tally& t = sweep_tally[b];
      std::string sw = o->cases > 0 ? fmt::format("{} / {}{}", t.caught, t.cases,
                                                  t.unsupported ? fmt::format(" ({} unsupported)", t.unsupported) : "")
                                    : "-";
      std::string mi = "-";
      if (o->cases > 0)
        mi = b == 0 ? fmt::format("false alarms: {} / {} / {} / {}", t.flagged[0], t.flagged[1], t.flagged[2], t.flagged[3])
                    : fmt::format("{} / {} / {} / {}", t.missed[0], t.missed[1], t.missed[2], t.missed[3]);
      std::cout << fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                               b == 0 ? (exec ? "`{fault}=none` (correct)" : "emulated (correct)")
                                      : exec ? "`{fault}=" + fault_names[b] + "`" : "`" + be + "`",
                               b == 0 ? "-" : bug, hopper, cols[0], cols[1],
                               cols[2], cols[3], sw, mi);
    }
    std::cout << "\n\"missed\": the familiar check passes the faulty output. \"@hopper\": the bug case run as "
                 "faulty:<fault>@hopper and judged with the default model of an FP8 tensor-core output (not part of the "
                 "exit status). Sweep columns: of the cases moecheck caught, how many each familiar check passed "
                 "(emulated row: how many correct outputs each check flagged).\n";
    return ok ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace moecheck::cli
