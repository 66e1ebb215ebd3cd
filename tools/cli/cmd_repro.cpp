// `moecheck repro CASE [--backend B | --output NAME] [--int32-threshold N] [--budget-model M]`: a bug-report block
// in Markdown, small enough to paste into an issue (about 60 lines at most): the moecheck version
// and this machine, the case's config (every MoeConfig field), shapes, source and description,
// the judged output's attributes (backend, device, created, tool_version), the verdict and its
// one-line reason, the per-expert table (worst rows first), token-local and routing failures,
// the familiar metrics with their verdicts, and the command that replays it.
// Exit 0 when the judged output passes, 1 when it fails (the report is printed either way), 2
// for bad input.
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <string>

#include "golden/case_problem.hpp"
#include "golden/engine_recipes.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/report/report.hpp"

namespace moecheck::cli {

namespace {

std::string shape_of(const CaseReader& r, const std::string& path) {
  for (const DatasetInfo& d : r.datasets())
    if (d.path == path) return fmt::format("[{}] {}", fmt::join(d.shape, ", "), d.dtype);
  return "";
}

std::string yes(bool pass) { return pass ? "pass" : "**FAIL**"; }

std::string ids(const std::vector<int64_t>& v, size_t n = 12) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < n; ++i) s += (i ? " " : "") + std::to_string(v[i]);
  if (v.size() > n) s += fmt::format(" ... ({})", v.size());
  return s;
}

struct ReproOptions {
  std::string path, backend, output, model;
  int64_t int32_threshold = -1;
  size_t rows = 8;
  bool allow_vacuous = false;
};

// What the report is about: the judgement and the judged output's attributes (a recording's,
// or this run's for --backend), with the int32 threshold it was judged with.
struct Judged {
  judge::CheckOutcome out;
  std::map<std::string, std::string> attrs;
  int64_t int32_threshold = 0;
  std::string what, backend;  // "/outputs/NAME" or "backend B"; the backend the replay runs
};

Judged judge_case(const CaseProblem& cp, ReproOptions& o) {
  const CaseReader& rd = cp.reader();
  judge::CheckOptions chk;
  chk.backend = o.backend;
  chk.budget_model = o.model;
  chk.allow_vacuous = o.allow_vacuous;
  Judged j;
  if (o.backend.empty()) {
    const auto outs = rd.outputs();
    if (outs.empty()) throw InputError(rd.path(), "/outputs", "the case holds no recorded output; give --backend B");
    if (o.output.empty()) o.output = judge::first_failing_output(cp, chk);  // else the first output
    for (const OutputInfo& oi : outs)
      if (oi.name == o.output) j.attrs = oi.attributes;
    chk.output = o.output;
  }
  // The int32 threshold: given, else the one the recording was made with.
  j.int32_threshold = o.int32_threshold;
  if (j.int32_threshold < 0) {
    const auto it = j.attrs.find("int32_threshold");
    j.int32_threshold = it != j.attrs.end() ? std::stoll(it->second) : 0;
  }
  chk.int32_threshold = j.int32_threshold;
  j.out = judge::check_problem(cp, chk);
  if (!o.backend.empty() && j.out.run) {
    j.attrs["backend"] = j.out.run->backend;
    j.attrs["device"] = j.out.run->device;
    j.attrs["created"] = "(this run)";
    j.attrs["tool_version"] = MOECHECK_VERSION;
  }
  j.what = o.backend.empty() ? "/outputs/" + o.output : "backend " + o.backend;
  j.backend = o.backend.empty() ? (j.attrs.count("backend") ? j.attrs["backend"] : o.output) : o.backend;
  return j;
}

// The heading, the config (every MoeConfig field), shapes, source, description and the judged
// output's attributes.
void print_case(std::ostream& os, const CaseProblem& cp, const Judged& j) {
  const CaseReader& rd = cp.reader();
  const MoeConfig& c = cp.config();
  const judge::CheckOutcome& out = j.out;
  os << fmt::format("### moecheck repro: {} ({})\n\n", rd.path(), out.failed() ? "FAIL" : std::string(judge::to_string(out.status)));
  os << fmt::format("- moecheck {}; judged: {}; budget model {}\n", MOECHECK_VERSION, j.what,
                    out.budget_models.empty() ? "-" : out.budget_models.front());
  os << fmt::format("- config: E={} top_k={} H={} I={} routing={} n_group={} topk_group={} rsf={}\n", c.num_experts,
                    c.top_k, c.hidden_size, c.intermediate_size, to_string(c.routing), c.n_group, c.topk_group,
                    c.routed_scaling_factor);
  os << fmt::format("  gate_up_layout={} scale_format={} intermediate_dtype={} routing_weight_dtype={} group_size={} "
                    "weight_block={} act_eps={:g} local experts [{}, {})\n",
                    to_string(c.gate_up_layout), to_string(c.scale_format), to_string(c.intermediate_dtype),
                    to_string(c.routing_weight_dtype), c.group_size, c.weight_block, c.act_eps, c.local_expert_offset,
                    c.local_expert_offset + c.local_experts());
  if (const std::vector<std::string> r = recipe_settings(c.recipe); !r.empty())
    os << fmt::format("  engine recipe: {}\n", fmt::join(r, " "));
  os << fmt::format("- shapes: T={}; hidden_states {}; router_logits {}{}; w13 {}; w2 {}; stored experts: {}\n",
                    cp.tokens(), shape_of(rd, "/inputs/hidden_states"), shape_of(rd, "/inputs/router_logits"),
                    rd.has_routing_bias() ? "; routing_bias " + shape_of(rd, "/inputs/routing_bias") : "",
                    shape_of(rd, "/weights/w13"), shape_of(rd, "/weights/w2"), ids(rd.expert_ids()));
  os << fmt::format("- source: `{}`\n", report::elide(rd.source().value_or("(none)"), 400));
  os << fmt::format("- description: {}\n", report::elide(rd.description().value_or("(none)"), 400));
  os << "- output:";
  for (const char* k : {"backend", "device", "created", "tool_version", "budget_model", "int32_threshold"})
    if (const auto it = j.attrs.find(k); it != j.attrs.end()) os << fmt::format(" {}={}", k, it->second);
  os << "\n";
}

// The verdict, its reason and power, routing and token-local failures, the per-expert table
// (at most `rows` rows, failing first) and the familiar metrics on the same data.
void print_verdict(std::ostream& os, const judge::CheckOutcome& out, size_t rows) {
  if (out.results.empty()) {
    os << fmt::format("- verdict: **{}**: {}\n", to_string(out.status), out.reason);
    return;
  }
  const CompareResult& r = out.results.front();
  os << fmt::format("- verdict: **{}**, max ratio {} at token {} col {}; {} of {} elements over budget; {} of {} "
                    "checks failed\n",
                    report::verdict_word(r), report::num(r.max_ratio), r.worst_token, r.worst_col, r.elements_over,
                    r.elements, r.checks_failed, r.checks);
  if (!r.pass) os << fmt::format("- reason: {}\n", judge::failure_reason(r));
  os << fmt::format("- power: {}\n", report::power_line(r));
  os << fmt::format("- routing: {} tokens differ from the reference ({} accepted near-ties){}\n",
                    r.mismatched_tokens, r.ambiguous_tokens,
                    r.mismatched.empty() ? "" : "; not accepted: tokens " + ids(r.mismatched));
  if (!r.failing_tokens_unexplained.empty())
    os << fmt::format("- token-local failures: tokens {}\n", ids(r.failing_tokens_unexplained));
  os << "\n| expert | tokens | max ratio | rel-L2 | bias beta +- SE (allow) | energy / limit | verdict |\n"
        "|---:|---:|---:|---:|---|---|---|\n";
  for (size_t i = 0; i < r.experts.size() && i < rows; ++i) {
    const ExpertVerdict& v = r.experts[i];
    os << fmt::format("| {} | {} | {} | {} | {} +- {} ({}){} | {} / {}{} | {} |\n", v.expert, v.tokens,
                      report::num(v.max_ratio), report::num(v.rel_l2), report::num(v.beta), report::num(v.beta_se),
                      report::num(v.beta_allow), v.bias_ok ? "" : " FAIL", report::num(v.energy_ratio),
                      report::num(v.energy_limit), v.energy_ok ? "" : " FAIL", v.pass ? "pass" : "**FAIL**");
  }
  if (r.experts.size() > rows) os << fmt::format("| ... {} more | | | | | | |\n", r.experts.size() - rows);
  const FamiliarMetrics& m = r.metrics;
  os << fmt::format("\nfamiliar checks on the same data: DeepGEMM cos diff {} (< 1e-3: {}), SGLang mean-rel {} "
                    "(< 0.02: {}), vLLM atol=rtol=0.035 {:.2f}% within ({}), NMSE {} (< 5e-3: {}); max abs {}, "
                    "non-finite {}\n",
                    report::num(m.cos_diff), yes(m.deepgemm_pass), report::num(m.mean_rel), yes(m.sglang_pass),
                    100 * m.allclose_fraction, yes(m.vllm_pass), report::num(m.nmse), yes(m.nmse_pass),
                    report::num(m.max_abs), m.nonfinite);
}

// The command that replays the judgement: compare for a recording of an engine, else a run.
void print_replay(std::ostream& os, const std::string& path, const ReproOptions& o, const Judged& j) {
  os << "\nreplay:\n\n```\n";
  if (o.backend.empty() && j.backend.rfind("faulty:", 0) != 0 && j.backend != "emulated")
    os << fmt::format("moecheck compare {} --output {}{}\n", path, o.output,
                      o.model.empty() ? "" : " --budget-model " + o.model);
  else
    os << judge::replay_command(path, j.backend, j.int32_threshold, o.model) << "\n";
  os << "```\n";
}

}  // namespace

void register_repro(CLI::App& app) {
  auto* sub = app.add_subcommand("repro", "print a bug-report block (Markdown) for a case and a backend or output");
  auto o = std::make_shared<ReproOptions>();
  sub->add_option("CASE", o->path, "case file")->required();
  auto* b = sub->add_option("--backend", o->backend, "run this backend on the case and report its judgement");
  sub->add_option("--output", o->output, "report the judgement of /outputs/NAME (default: the first failing output)")
      ->excludes(b);
  sub->add_option("--int32-threshold", o->int32_threshold,
                  "faulty:int32_overflow: the wrap index (default: the recorded output's int32_threshold)")->check(at_least(1));
  sub->add_option("--rows", o->rows, "expert rows shown (default 8, failing first)");
  sub->add_flag("--allow-vacuous", o->allow_vacuous, "a vacuous output (its checks would not see it zeroed: BUDGETS.md §10.6) does not fail");
  sub->add_option("--budget-model", o->model,
                  "judge with this model (default: the backend's or the recorded output's): " + budget_model_names())
      ->check(budget_model_validator());
  add_exec_timeout_option(sub);
  set_runner(sub, [o]() {
    const CaseProblem cp(o->path);
    const Judged j = judge_case(cp, *o);
    print_case(std::cout, cp, j);
    print_verdict(std::cout, j.out, o->rows);
    print_replay(std::cout, cp.reader().path(), *o, j);
    return j.out.status == judge::CheckStatus::pass ? kExitOk : j.out.exit_code();
  });
}

}  // namespace moecheck::cli
