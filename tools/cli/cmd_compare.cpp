// `moecheck compare CASE [--output NAME | --all] [--tier quantized|ideal] [--json FILE] [--html FILE]
//                   [--junit FILE]`:
// judges recorded outputs against the float64 reference and its error budgets
// (reference/BUDGETS.md). Exit 0 when every judged output is within budget, 1 when one is not,
// 2 for bad input.
//
// Each output is judged with the budget model of the backend that made it (its budget_model
// attribute, else by its backend attribute: reference/budget_model.hpp), or the one given with
// --budget-model. The quantized-tier reference of a model is computed once per model, or taken
// from /reference/quantized when its input hash and budget model match the case. --junit writes
// one testsuite (the case) with one testcase per judged output: a failure's message is
// failure_reason (case_check.hpp), its text the terminal report of that output; a vacuous output
// that does not fail is "skipped" with its power line.
#include <chrono>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <sstream>

#include "golden/case_problem.hpp"
#include "reference/moe_compare.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/report/report.hpp"
#include "tools/sweep/junit.hpp"

namespace moecheck::cli {

namespace {
// The JUnit record of a compare run: the case a suite, each judged output a testcase.
sweep::JunitSuite junit_suite(const report::ReportContext& ctx, const std::vector<CompareResult>& results, double seconds) {
  sweep::JunitSuite suite{.name = "moecheck compare " + ctx.case_path, .cases = {}};
  for (size_t i = 0; i < results.size(); ++i) {
    const CompareResult& r = results[i];
    sweep::JunitCase jc{.name = r.name, .classname = ctx.case_path, .seconds = seconds / double(results.size())};
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
  struct Opts {
    std::string path, output, tier = "quantized", json, html, junit, model;
    bool all = false, quiet = false, allow_vacuous = false, requant_test = false;
  };
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
  sub->add_flag("--requant-test", o->requant_test,
                "also run the re-quantization test (BUDGETS.md §10.7): a skipped re-quantization of the intermediate "
                "is beta = -1 along a direction the reference computes; costs a second pass over W2 (about 0.6x the "
                "reference's time on DeepSeek-V3 at T = 64)");
  sub->add_flag("-q,--quiet", o->quiet, "no progress output");
  set_runner(sub, [o]() {
    const CaseProblem cp(o->path);
    const CaseReader& r = cp.reader();
    std::vector<OutputInfo> outputs = r.outputs();
    if (!o->output.empty()) {
      std::erase_if(outputs, [&](const OutputInfo& x) { return x.name != o->output; });
      if (outputs.empty()) throw InputError(r.path(), "/outputs/" + o->output, "no such output in the case");
    }
    if (outputs.empty())
      throw InputError(r.path(), "/outputs", "the case holds no recorded output (record one with moecheck run)");

    // One reference per budget model.
    std::map<std::string, std::vector<size_t>> by_model;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string m = o->model.empty() ? budget_model_of_output(outputs[i].attributes) : o->model;
      // A stored name we do not know is an input error.
      parse_budget_model(m, r.path(), "/outputs/" + outputs[i].name + "@budget_model");
      by_model[m].push_back(i);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const CaseProblem::InputHashes hashes = cp.input_hashes();
    const std::string& hash = hashes.combined;
    for (const OutputInfo& out : outputs) judge::check_input_hashes(hashes, out, r.path());
    std::vector<CompareResult> results(outputs.size());
    std::vector<std::vector<float>> observed(outputs.size());
    std::string models;
    double ref_seconds = 0;
    for (const auto& [model_name, idx] : by_model) {
      const auto tr = std::chrono::steady_clock::now();
      bool reused = false;
      ForwardResult ref;
      if (o->tier == "ideal") {
        const BudgetModel m = parse_budget_model(model_name);
        ref = judge::ideal_judging_reference(cp, m);  // slot outputs are not judged in this tier
      } else {
        ref = judge::quantized_reference(cp, hash, model_name, !o->quiet, &reused, o->requant_test);
      }
      ref_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
      if (!o->quiet)
        std::cerr << fmt::format("moecheck: reference ({}, budget model {}) {}\n", o->tier, model_name,
                                 reused ? "reused from /reference/quantized" : "computed");
      CompareOptions copt;
      copt.model = parse_budget_model(model_name);
      copt.allow_vacuous = o->allow_vacuous;
      copt.requant_test = o->requant_test;
      models += (models.empty() ? "" : "; ") + report::describe_budget_model(copt.model);
      for (size_t i : idx) {
        Observation obs = judge::observation_of(outputs[i].name, r.read_output(outputs[i].name));
        if (o->tier == "ideal") obs.expert_outputs.clear();
        if (obs.output.size() != size_t(cp.tokens() * cp.config().hidden_size))
          throw InputError(r.path(), "/outputs/" + outputs[i].name + "/output", "shape does not match [T, H]");
        results[i] = compare_output(cp.problem(), ref, obs, copt);
        observed[i] = std::move(obs.output);
      }
    }
    report::ReportContext ctx;
    ctx.case_path = o->path;
    ctx.config = report::config_summary(cp.config(), cp.tokens());
    ctx.tier = o->tier;
    ctx.budget_model = models;
    ctx.reference_seconds = ref_seconds;
    for (const auto& v : observed) ctx.data.push_back({std::span<const float>(v)});
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
                               ref_seconds);
    return report::totals(results).pass() ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace moecheck::cli
