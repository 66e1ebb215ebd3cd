// Run-and-judge in-process (case_check.hpp).
#include "tools/judge/case_check.hpp"

#include <chrono>
#include <fmt/format.h>
#include <stdexcept>

#include "reference/budget_model.hpp"
#include "reference/compare_sharded.hpp"
#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/judge/recorded_outputs.hpp"

namespace moecheck::judge {

std::string_view to_string(CheckStatus s) {
  switch (s) {
    case CheckStatus::pass: return "pass";
    case CheckStatus::fail: return "fail";
    case CheckStatus::unsupported: return "unsupported";
    case CheckStatus::input_error: return "input error";
  }
  return "?";
}

ForwardResult judging_reference(const CaseProblem& cp, const BudgetModel& model) {
  ForwardOptions fo;
  fo.tier = Tier::quantized;
  fo.budget = &model;
  return moe_forward(cp.problem(), fo);
}

ForwardResult ideal_judging_reference(const CaseProblem& cp, const BudgetModel& model) {
  ForwardOptions fq;
  fq.tier = Tier::quantized, fq.budget = &model, fq.ideal_bound = true;
  ForwardOptions fi;
  fi.tier = Tier::ideal;
  ForwardResult q = moe_forward(cp.problem(), fq);
  for (size_t i = 0; i < q.output.size(); ++i) {
    q.budget[i] += q.ideal_bound[i];
    q.noise_var[i] += q.ideal_bound[i] * q.ideal_bound[i] / 3;
  }
  q.output = moe_forward(cp.problem(), fi).output;
  return q;
}

Observation observation_of(const BackendOutput& b) {
  Observation o;
  o.name = b.backend;
  if (!b.output_f32.empty()) {
    o.output = b.output_f32;
  } else {
    o.output.resize(b.output_bf16.size());
    for (size_t i = 0; i < b.output_bf16.size(); ++i) o.output[i] = bf16_decode(b.output_bf16[i]);
  }
  o.topk_ids = b.topk_ids;
  o.expert_outputs = b.expert_outputs;  // float32 slot outputs: no extra rounding to admit
  o.expert_outputs_bf16 = b.expert_outputs_bf16;
  return o;
}

Observation observation_of(const std::string& name, OutputData&& d) {
  Observation o;
  o.name = name;
  o.output = std::move(d.output);
  o.topk_ids = std::move(d.topk_ids);
  o.expert_outputs = std::move(d.expert_outputs);
  o.expert_outputs_bf16 = d.expert_outputs_dtype == Precision::bf16;
  return o;
}

namespace {
std::string id_list(const std::vector<int64_t>& v, size_t max_shown = 6) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_shown; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > max_shown) s += fmt::format(", ... ({} in all)", v.size());
  return s;
}
std::string g3(double x) { return fmt::format("{:.3g}", x); }

// A layer over ranks: each failing rank with its own reason, and the reduction.
void sharding_reasons(const ShardedVerdict& v, std::vector<std::string>& parts) {
  for (int64_t rank : v.failing_ranks()) parts.push_back(fmt::format("[{}]", failure_reason(v.ranks[size_t(rank)])));
  if (v.reduction_pass()) return;
  std::string s = fmt::format("the reduction: {} elements outside the float32 all-reduce of the ranks' partials",
                              v.reduction_outside);
  if (v.blamed_rank >= 0) s += fmt::format(" (rank {}'s partial x {:.3f} explains it)", v.blamed_rank, v.blamed_beta);
  parts.push_back(s);
}
}  // namespace

std::string failure_reason(const CompareResult& r) {
  if (r.pass) return "";
  std::vector<std::string> parts;
  std::vector<int64_t> elem, bias, energy;
  for (const ExpertVerdict& v : r.experts) {
    if (v.pass) continue;
    if (v.blamed || v.max_ratio > 1) elem.push_back(v.expert);
    if (!v.bias_ok) bias.push_back(v.expert);
    if (!v.energy_ok) energy.push_back(v.expert);
  }
  if (!elem.empty()) parts.push_back(fmt::format("expert{} {} over budget", elem.size() > 1 ? "s" : "", id_list(elem)));
  if (!bias.empty()) parts.push_back(fmt::format("scale (bias) test fails on expert{} {}", bias.size() > 1 ? "s" : "", id_list(bias)));
  if (!energy.empty())
    parts.push_back(fmt::format("energy test fails on expert{} {}", energy.size() > 1 ? "s" : "", id_list(energy)));
  if (r.power.vacuous && !r.pass)
    parts.push_back(fmt::format("vacuous: a scale error of {} of the whole output would pass (budget model {})",
                                g3(r.power.scale_output), budget_model_name(r.model.acc)));
  std::vector<int64_t> scaled;
  for (const TokenScale& t : r.token_scale)
    if (!t.ok) scaled.push_back(t.token);
  if (!r.output_scale.ok)
    parts.push_back(fmt::format("the whole output is off by a factor 1 + {} (+- {})", g3(r.output_scale.beta),
                                g3(r.output_scale.se)));
  if (!scaled.empty())
    parts.push_back(fmt::format("token scale test fails on token{} {}", scaled.size() > 1 ? "s" : "", id_list(scaled)));
  if (!r.failing_tokens_unexplained.empty())
    parts.push_back(fmt::format("token{} {} fail{} alone", r.failing_tokens_unexplained.size() > 1 ? "s" : "",
                                id_list(r.failing_tokens_unexplained), r.failing_tokens_unexplained.size() > 1 ? "" : "s"));
  if (!r.mismatched.empty())
    parts.push_back(fmt::format("routing differs on token{} {}", r.mismatched.size() > 1 ? "s" : "", id_list(r.mismatched)));
  if (r.metrics.nonfinite > 0) parts.push_back(fmt::format("{} non-finite values", r.metrics.nonfinite));
  if (r.sharded) sharding_reasons(*r.sharded, parts);
  std::string s = fmt::format("{}: ", r.name);
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? "; " : "") + parts[i];
  if (r.worst_token >= 0)
    s += fmt::format("{}max ratio {} at token {} col {}", parts.empty() ? "" : "; ", g3(r.max_ratio), r.worst_token,
                     r.worst_col);
  s += fmt::format(" ({} of {} checks failed)", r.checks_failed, r.checks);
  return s;
}

int64_t scaled_int32_threshold(const MoeConfig& c, int64_t tokens) {
  return std::max<int64_t>(1, tokens * c.top_k * c.hidden_size / 2);
}

std::string replay_command(const std::string& case_path, const std::string& backend, int64_t int32_threshold,
                           const std::string& budget_model, const ShardRequest& shard) {
  // compare --output: the name run records the output under (exec:CMD -> exec, '@' -> '+'; a
  // sharded run's with its split). A sharded run records no slot outputs.
  return fmt::format("moecheck run {0} --backend {1}{5}{2} && moecheck compare {0} --output {4}{3}", case_path,
                     shell_quote(backend), int32_threshold > 0 ? fmt::format(" --int32-threshold {}", int32_threshold) : "",
                     budget_model.empty() ? "" : " --budget-model " + budget_model, sharded_output_name(backend, shard),
                     shard.plan ? shard_arguments(shard, parse_backend_name(backend).faulty()) : " --expert-outputs") +
         (is_exec_backend(backend) && exec_timeout_seconds() != 600
              ? fmt::format(" --exec-timeout {}", exec_timeout_seconds()) : "");
}

namespace {

CheckOutcome input_error_outcome(const InputError& e) {
  if (e.where() == "--backend") throw e;  // a usage error: exit 2 from the caller
  CheckOutcome o;
  o.status = CheckStatus::input_error;
  o.reason = e.what();
  return o;
}

// Runs opt.backend on the case and judges its output with the model the command line names,
// else the one the run asks for (an exec:CMD output's budget_model attribute), else the
// backend's default. A backend that cannot run here at all (unknown name, no GPU) is a usage
// problem (rethrown); one that declines the case leaves it unsupported; any other failure on a
// case the reader accepted is the backend's failure.
void judge_backend_run(const CaseProblem& cp, const CheckOptions& opt, CheckOutcome& out) {
  try {
    out.run = opt.shard.plan ? run_sharded_backend(cp, opt.backend, opt.shard, opt.int32_threshold)
                             : run_backend(cp, opt.backend, opt.expert_outputs, opt.int32_threshold);
  } catch (const BackendUnsupported& e) {
    out.status = CheckStatus::unsupported;
    out.reason = e.rule();  // without the file: the same reason for every case it applies to
    return;
  } catch (const InputError& e) {
    if (e.where() == "--backend") throw;
    out.status = CheckStatus::fail;
    out.reason = fmt::format("{}: the backend refused a valid case: {}", opt.backend, e.what());
    return;
  } catch (const std::exception& e) {
    out.status = CheckStatus::fail;
    out.reason = fmt::format("{}: the backend failed: {}", opt.backend, e.what());
    return;
  }
  const std::string model = !opt.budget_model.empty()     ? opt.budget_model
                            : !out.run->budget_model.empty() ? out.run->budget_model
                                                             : default_budget_model(opt.backend);
  CompareOptions copt;
  copt.model = parse_budget_model(model);
  copt.keep_ratios = opt.keep_ratios;
  copt.allow_vacuous = opt.allow_vacuous;
  ForwardResult ref = reference_to_judge(cp, model, ReferenceChoice{.device = opt.reference_device});
  out.results.push_back(out.run->ranks.empty() ? compare_output(cp.problem(), ref, observation_of(*out.run), copt)
                                               : compare_sharded(cp.problem(), *parse_shard_plan(out.run->shard),
                                                                 std::move(ref), sharded_observation_of(*out.run), copt));
  out.budget_models.push_back(model);
}

// The recorded outputs opt selects, judged as compare judges them (recorded_outputs.hpp).
void judge_recorded(const CaseProblem& cp, const CheckOptions& opt, CheckOutcome& out) {
  RecordedOptions ropt;
  ropt.output = opt.output;
  ropt.budget_model = opt.budget_model;
  ropt.keep_ratios = opt.keep_ratios;
  ropt.allow_vacuous = opt.allow_vacuous;
  ropt.reference.device = opt.reference_device;
  RecordedJudgement j = judge_recorded_outputs(cp, ropt);
  out.results = std::move(j.results);
  out.budget_models = std::move(j.budget_models);
}

CheckOutcome judge_problem(const CaseProblem& cp, const CheckOptions& opt) {
  CheckOutcome out;
  const auto t0 = std::chrono::steady_clock::now();
  if (!opt.backend.empty())
    judge_backend_run(cp, opt, out);
  else
    judge_recorded(cp, opt, out);
  for (const CompareResult& r : out.results)
    if (!r.pass) {
      out.status = CheckStatus::fail;
      out.reason += (out.reason.empty() ? "" : " | ") + failure_reason(r);
    }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace

CheckOutcome check_problem(const CaseProblem& cp, const CheckOptions& opt) {
  try {
    return judge_problem(cp, opt);
  } catch (const InputError& e) {
    return input_error_outcome(e);
  }
}

std::string first_failing_output(const CaseProblem& cp, const CheckOptions& opt) {
  const std::vector<OutputInfo> outs = cp.reader().outputs();
  for (const OutputInfo& oi : outs) {
    CheckOptions k = opt;
    k.output = oi.name;
    if (check_problem(cp, k).failed()) return oi.name;
  }
  return outs.empty() ? "" : outs.front().name;
}

CheckOutcome check_case(const std::string& case_path, const CheckOptions& opt) {
  try {
    const CaseProblem cp(case_path);
    return check_problem(cp, opt);
  } catch (const InputError& e) {
    return input_error_outcome(e);
  }
}

}  // namespace moecheck::judge
