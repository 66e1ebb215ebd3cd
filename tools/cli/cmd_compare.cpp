// `moecheck compare CASE [--output NAME | --all] [--tier quantized|ideal] [--json FILE] [--html FILE]
//                   [--junit FILE]`:
// judges recorded outputs against the float64 reference and its error budgets
// (reference/BUDGETS.md). Exit 0 when every judged output is within budget, 1 when one is not,
// 2 for bad input.
//
// The judgement is judge::judge_recorded_outputs (tools/judge/recorded_outputs.hpp): each output
// with the budget model of the backend that made it (its budget_model attribute, else by its
// backend attribute: reference/budget_model.hpp), or the one given with --budget-model; the
// quantized-tier reference computed once per model, or taken from /reference/quantized when its
// input hash and budget model match the case. --junit writes
// one testsuite (the case) with one testcase per judged output: a failure's message is
// failure_reason (case_check.hpp), its text the terminal report of that output; a vacuous output
// that does not fail is "skipped" with its power line.
#include <chrono>
#include <fmt/format.h>
#include <iostream>
#include <sstream>

#include "golden/case_problem.hpp"
#include "reference/moe_compare.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/recorded_outputs.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/report/report.hpp"
#include "tools/sweep/junit.hpp"

namespace moecheck::cli {

namespace {
struct Opts {
  std::string path, output, tier = "quantized", json, html, junit, model, device = "auto";
  bool all = false, quiet = false, allow_vacuous = false, requant_test = true;
};

// What the command line asks of the judgement: a stored reference is reused when it matches;
// one computed runs its products where `device` chooses for the case.
judge::RecordedOptions recorded_options(const Opts& o, judge::ReferenceDevice* device) {
  judge::RecordedOptions r;
  r.output = o.output;
  r.budget_model = o.model;
  r.reference = {.tier = o.tier == "ideal" ? Tier::ideal : Tier::quantized,
                 .reuse_stored = true,
                 .requant_test = o.requant_test,
                 .progress = !o.quiet,
                 .device = device};
  r.allow_vacuous = o.allow_vacuous;
  return r;
}

// What every report names: the case, its config, the tier, the budget models and the outputs.
report::ReportContext report_context(const Opts& o, const CaseProblem& cp, const judge::RecordedJudgement& j) {
  report::ReportContext ctx;
  ctx.case_path = o.path;
  ctx.config = report::config_summary(cp.config(), cp.tokens());
  ctx.tier = o.tier;
  for (const BudgetModel& m : j.models)
    ctx.budget_model += (ctx.budget_model.empty() ? "" : "; ") + report::describe_budget_model(m);
  ctx.reference_seconds = j.reference_seconds;
  ctx.reference_device = j.reference_device;
  for (const auto& v : j.outputs) ctx.data.push_back({std::span<const float>(v)});
  return ctx;
}

// The JUnit record of a compare run: the case a suite, each judged output a testcase.
sweep::JunitSuite junit_suite(const report::ReportContext& ctx, const std::vector<CompareResult>& results, double seconds) {
  sweep::JunitSuite suite{.name = "moecheck compare " + ctx.case_path, .cases = {}};
  for (size_t i = 0; i < results.size(); ++i) {
    const CompareResult& r = results[i];
    sweep::JunitCase jc;
    jc.name = r.name, jc.classname = ctx.case_path, jc.seconds = seconds / double(results.size());
    report::ReportContext one = ctx;
    one.data.clear();
    std::ostringstream text;
    report::write_text(text, one, {r});
    if (!r.pass) {
      jc.result = sweep::JunitCase::Result::failure;
      jc.message = r.power.vacuous && r.checks_failed == 0 ? "vacuous: " + report::power_line(r) : judge::failure_reason(r);
      jc.text = text.str();
    } else if (r.power.vacuous) {
      jc.result = sweep::JunitCase::Result::skipped;
      jc.message = "vacuous (allowed): " + report::power_line(r);
    }
    suite.cases.push_back(std::move(jc));
  }
  return suite;
}
}  // namespace

void register_compare(CLI::App& app) {
  auto* sub = app.add_subcommand("compare", "judge recorded outputs against the float64 reference and its budgets");
  auto o = std::make_shared<Opts>();
  sub->add_option("CASE", o->path, "case file")->required();
  auto* one = sub->add_option("--output", o->output, "judge only /outputs/NAME");
  sub->add_flag("--all", o->all, "judge every recorded output (the default)")->excludes(one);
  sub->add_option("--tier", o->tier, "quantized (the gate) | ideal (orientation)")
      ->check(CLI::IsMember({"quantized", "ideal"}));
  sub->add_option("--budget-model", o->model, "judge every output with this model: " + budget_model_names())
      ->check(budget_model_validator());
  sub->add_option("--json", o->json, "also write the report as JSON (tools/report/REPORT-SCHEMA.md)")->check(output_file());
  sub->add_option("--html", o->html, "also write a self-contained HTML page")->check(output_file());
  sub->add_option("--junit", o->junit, "also write JUnit XML: one testcase per judged output")->check(output_file());
  sub->add_flag("--allow-vacuous", o->allow_vacuous,
                "exit 0 for an output whose checks would not see it zeroed (BUDGETS.md §10.6; still reported VACUOUS)");
  sub->add_flag("--requant-test,!--no-requant-test", o->requant_test,
                "the re-quantization test (BUDGETS.md §10.7), on by default: a skipped re-quantization of the "
                "intermediate is beta = -1 along a direction the reference computes; --no-requant-test leaves it "
                "out and saves its second pass over W2");
  add_reference_device_option(sub, o->device);
  sub->add_flag("-q,--quiet", o->quiet, "no progress output");
  set_runner(sub, [o]() {
    const CaseProblem cp(o->path);
    judge::ReferenceDevice device(o->device);
    const auto t0 = std::chrono::steady_clock::now();
    const judge::RecordedJudgement j = judge::judge_recorded_outputs(cp, recorded_options(*o, &device));
    if (!o->quiet && !device.why_not_gpu().empty())
      std::cerr << "moecheck: --device auto: the reference ran on this CPU (" << device.why_not_gpu() << ")\n";
    const std::vector<CompareResult>& results = j.results;
    const report::ReportContext ctx = report_context(*o, cp, j);
    report::TextOptions topt;
    topt.color = report::color_wanted(1);
    report::write_text(std::cout, ctx, results, topt);
    if (!o->json.empty()) report::write_json_file(o->json, ctx, results);
    if (!o->html.empty()) report::write_html_file(o->html, ctx, results);
    if (!o->junit.empty())
      sweep::write_junit_file(
          o->junit,
          {junit_suite(ctx, results, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count())},
          "moecheck compare");
    if (!o->quiet)
      std::cerr << fmt::format("moecheck: compare took {:.2f} s (reference {:.2f} s)\n",
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                               j.reference_seconds);
    return report::totals(results).pass() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace moecheck::cli
