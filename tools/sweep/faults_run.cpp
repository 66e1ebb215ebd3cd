// `moecheck faults`'s table (contract: faults_run.hpp).
#include "tools/sweep/faults_run.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <optional>

#include "golden/case_file.hpp"
#include "golden/case_generator.hpp"
#include "golden/case_problem.hpp"
#include "golden/interrupt.hpp"
#include "reference/budget_model.hpp"
#include "reference/errors.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/sweep/gate_sweep.hpp"

namespace moecheck::sweep {

namespace fs = std::filesystem;

bool FaultsResult::ok() const {
  if (rows.empty() || rows.front().sweep.caught != 0) return false;
  for (size_t b = 1; b < rows.size(); ++b)
    if (!rows[b].bug_caught) return false;
  return true;
}

namespace {

// One judged sweep output of a row; no result: the backend threw, which anything notices.
void tally(FaultTally& t, const CompareResult* r) {
  ++t.cases;
  const bool caught = !r || !r->pass;
  const bool pass[4] = {r && r->metrics.deepgemm_pass, r && r->metrics.sglang_pass, r && r->metrics.vllm_pass,
                        r && r->metrics.nmse_pass};
  t.caught += caught;
  for (int j = 0; j < 4; ++j) {
    t.missed[j] += caught && pass[j];
    t.flagged[j] += !pass[j];
  }
}

// What moecheck names: the failing experts, the tokens failing alone, the routing mismatches.
std::string short_named(const CompareResult& r) {
  std::vector<std::string> p;
  std::vector<int64_t> ex;
  for (const ExpertVerdict& v : r.experts)
    if (!v.pass) ex.push_back(v.expert);
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 4; ++i) s += fmt::format("{}{}", i ? "," : "", v[i]);
    return v.size() > 4 ? s + ",..." : s;
  };
  if (!ex.empty()) p.push_back("expert " + list(ex));
  if (!r.failing_tokens_unexplained.empty()) p.push_back("token " + list(r.failing_tokens_unexplained));
  if (!r.mismatched.empty()) p.push_back("routing of token " + list(r.mismatched));
  if (r.metrics.nonfinite) p.push_back(fmt::format("{} NaN/Inf", r.metrics.nonfinite));
  std::string s = r.pass ? "**not caught**" : "caught: ";
  for (size_t i = 0; i < p.size(); ++i) s += fmt::format("{}{}", i ? "; " : "", p[i]);
  return s;
}

const char* miss(bool familiar_pass) { return familiar_pass ? "**missed**" : "caught"; }

// The bug case run on `backend` and judged with its default model.
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
  const CompareResult& r = out.results.front();
  if (r.checks_failed == 0 && r.power.vacuous) return "VACUOUS";
  return r.pass ? "**missed**" : "caught";
}

// The wrap index the bug case was recorded with (faulty:int32_overflow), 0 if none.
int64_t recorded_int32_threshold(const std::string& file) {
  const CaseReader rd(file);
  for (const OutputInfo& oi : rd.outputs())
    if (oi.attributes.count("int32_threshold")) return std::stoll(oi.attributes.at("int32_threshold"));
  return 0;
}

void judge_bug_corpus(const FaultsRequest& q, FaultsResult& res) {
  for (size_t b = 1; b < res.rows.size(); ++b) {
    FaultRow& row = res.rows[b];
    const std::string file = (fs::path(q.bugs_dir) / (row.fault + ".h5")).string();
    if (!fs::exists(file)) {
      row.bug = "(no bug case)";
      continue;
    }
    const int64_t thr = recorded_int32_threshold(file);
    const judge::CheckOutcome out = judge_bug_case(file, row.backend, thr);
    if (out.unsupported()) {
      row.bug = "declined by the backend (unsupported)";
      row.bug_caught = false;
    } else if (!out.results.empty()) {
      const CompareResult& r = out.results.front();
      row.bug = short_named(r);
      const FamiliarMetrics& m = r.metrics;
      row.familiar[0] = miss(m.deepgemm_pass), row.familiar[1] = miss(m.sglang_pass);
      row.familiar[2] = miss(m.vllm_pass), row.familiar[3] = miss(m.nmse_pass);
      row.bug_caught = !r.pass;
    } else {
      row.bug = "caught: the backend threw";
    }
    if (!q.exec) row.hopper = under_hopper(file, row.backend, thr);
  }
}

// One sweep case, every row: an exec kernel's rows each judged with the model its output names
// (one reference per model, as check_problem does); the built-in rows against one fp32 reference.
void judge_sweep_case(const FaultsRequest& q, const std::string& path, FaultsResult& res) {
  const CaseProblem cp(path);
  if (q.exec) {
    for (FaultRow& row : res.rows) {
      judge::CheckOptions k;
      k.backend = row.backend;
      const judge::CheckOutcome out = judge::check_problem(cp, k);
      if (out.status == judge::CheckStatus::input_error) throw InputError(path, "", out.reason);
      if (out.unsupported()) ++row.sweep.unsupported;
      else tally(row.sweep, out.results.empty() ? nullptr : &out.results.front());
    }
    return;
  }
  const BudgetModel fp32 = parse_budget_model("fp32");
  const ForwardResult ref = judge::judging_reference(cp, fp32);
  CompareOptions copt;
  copt.model = fp32;
  copt.keep_ratios = false;
  for (FaultRow& row : res.rows) {
    const int64_t thr = row.backend == "faulty:int32_overflow" ? judge::scaled_int32_threshold(cp.config(), cp.tokens()) : 0;
    try {
      const BackendOutput out = judge::run_backend(cp, row.backend, true, thr);
      const CompareResult r = compare_output(cp.problem(), ref, judge::observation_of(out), copt);
      tally(row.sweep, &r);
    } catch (const InputError& e) {
      if (e.where() == "--backend") throw;
      tally(row.sweep, nullptr);
    }
  }
}

void run_sweep(const FaultsRequest& q, FaultsResult& res, const std::function<void(const std::string&)>& progress) {
  if (q.cases <= 0) return;
  std::string tmpl = (fs::temp_directory_path() / "moecheck-faults-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw InputError(tmpl, "", "cannot create a temporary directory");
  const interrupt::ScratchPath work_dir(tmpl);  // registered once mkdtemp has chosen the name
  const std::vector<std::string> presets = default_sweep_presets(false);
  for (int64_t i = 0; i < q.cases; ++i) {
    interrupt::set_stage(fmt::format("faults: sweep case {} of {} (seed {})", i + 1, q.cases, q.seed));
    const GeneratorOptions g = sweep_case(q.seed, i, presets);
    const std::string path = (fs::path(tmpl) / fmt::format("case-{}.h5", i)).string();
    write_case(plan_case(g, path), path);
    judge_sweep_case(q, path, res);
    fs::remove(path);
    if (progress) progress(fmt::format("sweep case {}/{}", i + 1, q.cases));
  }
  fs::remove_all(tmpl);
}

}  // namespace

FaultsResult run_faults(const FaultsRequest& q, const std::function<void(const std::string&)>& progress) {
  FaultsResult res;
  for (size_t b = 0; b < q.backends.size(); ++b) {
    FaultRow row;
    row.backend = q.backends[b];
    row.fault = q.fault_names[b];
    res.rows.push_back(row);
  }
  run_sweep(q, res, progress);
  judge_bug_corpus(q, res);
  return res;
}

std::string faults_table(const FaultsRequest& q, const FaultsResult& r) {
  std::string s;
  if (q.exec) s += fmt::format("backend {}\n\n", judge::shell_quote(q.backends.empty() ? "" : q.backends.front()));
  s += fmt::format(
      "| backend | golden/bugs case: moecheck | the same @hopper | DeepGEMM cos-diff < 1e-3 | SGLang mean-rel < 0.02 | "
      "vLLM atol=rtol=0.035 | NMSE < 5e-3 | sweep (seed {}): caught / cases | missed by DeepGEMM / SGLang / vLLM / NMSE |\n",
      q.seed);
  s += "|---|---|---|---|---|---|---|---:|---|\n";
  for (size_t b = 0; b < r.rows.size(); ++b) {
    const FaultRow& row = r.rows[b];
    const FaultTally& t = row.sweep;
    const std::string sw =
        q.cases > 0 ? fmt::format("{} / {}{}", t.caught, t.cases, t.unsupported ? fmt::format(" ({} unsupported)", t.unsupported) : "")
                    : "-";
    std::string mi = "-";
    if (q.cases > 0)
      mi = b == 0 ? fmt::format("false alarms: {} / {} / {} / {}", t.flagged[0], t.flagged[1], t.flagged[2], t.flagged[3])
                  : fmt::format("{} / {} / {} / {}", t.missed[0], t.missed[1], t.missed[2], t.missed[3]);
    const std::string name = b == 0   ? std::string(q.exec ? "`{fault}=none` (correct)" : "emulated (correct)")
                             : q.exec ? fmt::format("`{{fault}}={}`", row.fault)
                                      : fmt::format("`{}`", row.backend);
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", name, b == 0 ? "-" : row.bug, row.hopper,
                     row.familiar[0], row.familiar[1], row.familiar[2], row.familiar[3], sw, mi);
  }
  s += "\n\"missed\": the familiar check passes the faulty output. \"@hopper\": the bug case run as "
       "faulty:<fault>@hopper and judged with the default model of an FP8 tensor-core output (not part of the "
       "exit status). Sweep columns: of the cases moecheck caught, how many each familiar check passed "
       "(emulated row: how many correct outputs each check flagged).\n";
  return s;
}

}  // namespace moecheck::sweep
