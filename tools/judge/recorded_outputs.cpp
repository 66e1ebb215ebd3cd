// Judging a case's recorded outputs (recorded_outputs.hpp).
#include "tools/judge/recorded_outputs.hpp"

#include <chrono>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <stdexcept>

#include "reference/compare_sharded.hpp"
#include "reference/errors.hpp"
#include "tools/judge/backend_run.hpp"
#include "tools/judge/case_check.hpp"
#include "tools/judge/reference_store.hpp"
#include "tools/judge/sharded_run.hpp"

namespace moecheck::judge {

namespace {

// Where the choice runs this case's products; nullptr: this CPU.
WeightProducts* products_for(const CaseProblem& cp, const ReferenceChoice& choice) {
  return choice.device ? choice.device->for_case(cp.config(), cp.tokens()) : nullptr;
}

}  // namespace

ForwardResult reference_to_judge(const CaseProblem& cp, const std::string& model_name, const ReferenceChoice& choice,
                                 const std::string& input_hash, bool* reused) {
  bool stored = false;
  try {
    const BudgetModel model = parse_budget_model(model_name);
    ForwardResult r;
    if (choice.tier == Tier::ideal)
      r = ideal_judging_reference(cp, model);
    else if (choice.reuse_stored)
      r = quantized_reference(cp, input_hash, model_name, choice.progress, &stored, choice.requant_test,
                              [&] { return products_for(cp, choice); });
    else
      r = compute_reference(cp, Tier::quantized, &model, true, choice.progress, choice.requant_test,
                            products_for(cp, choice));
    if (reused) *reused = stored;
    return r;
  } catch (const std::invalid_argument& e) {
    throw InputError(cp.reader().path(), "", std::string("the reference refuses the case: ") + e.what());
  }
}

namespace {

// The outputs opt selects, in the case's order.
std::vector<OutputInfo> selected_outputs(const CaseReader& r, const RecordedOptions& opt) {
  std::vector<OutputInfo> outputs = r.outputs();
  if (!opt.output.empty()) {
    std::erase_if(outputs, [&](const OutputInfo& x) { return x.name != opt.output; });
    if (outputs.empty()) throw InputError(r.path(), "/outputs/" + opt.output, "no such output in the case");
  }
  if (outputs.empty())
    throw InputError(r.path(), "/outputs", "the case holds no recorded output (record one with moecheck run)");
  if (opt.reference.tier == Tier::ideal)
    for (const OutputInfo& o : outputs)
      if (!o.shard.empty())
        throw InputError(r.path(), "--tier",
                         fmt::format("the ideal tier does not judge /outputs/{}, a layer over ranks ({}: its ranks are "
                                     "judged against their shards' quantized references); use --tier quantized",
                                     o.name, o.shard));
  return outputs;
}

// The outputs (indices into `outputs`) judged with each budget model; a stored model name that
// is not known is an input error.
std::map<std::string, std::vector<size_t>> outputs_by_model(const CaseReader& r, const std::vector<OutputInfo>& outputs,
                                                            const RecordedOptions& opt) {
  std::map<std::string, std::vector<size_t>> by_model;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string m = opt.budget_model.empty() ? budget_model_of_output(outputs[i].attributes) : opt.budget_model;
    parse_budget_model(m, r.path(), "/outputs/" + outputs[i].name + "@budget_model");
    by_model[m].push_back(i);
  }
  return by_model;
}

// The case's input hashes, computed (one pass over the weights) only when a stored reference may
// be reused or an output records hashes to check; empty otherwise.
CaseProblem::InputHashes hashes_needed(const CaseProblem& cp, const std::vector<OutputInfo>& outputs,
                                       const RecordedOptions& opt) {
  bool needed = opt.reference.reuse_stored && opt.reference.tier == Tier::quantized;
  for (const OutputInfo& out : outputs) needed = needed || out.attributes.contains("input_hash");
  return needed ? cp.input_hashes() : CaseProblem::InputHashes{};
}

// The recorded output as compare_output takes it (no slot outputs in the ideal tier), its shape
// checked against the case.
Observation read_observation(const CaseProblem& cp, const std::string& name, Tier tier) {
  const CaseReader& r = cp.reader();
  Observation obs = observation_of(name, r.read_output(name));
  if (tier == Tier::ideal) obs.expert_outputs.clear();
  if (obs.output.size() != size_t(cp.tokens() * cp.config().hidden_size))
    throw InputError(r.path(), "/outputs/" + name + "/output", "shape does not match [T, H]");
  return obs;
}

// One recorded output judged against the layer's reference: with its ranks and their reduction
// when it has them (compare_sharded). `kept`: the output as judged, for the reports.
CompareResult judge_output(const CaseProblem& cp, const OutputInfo& info, const ForwardResult& ref,
                           const CompareOptions& copt, Tier tier, std::vector<float>& kept) {
  if (info.shard.empty()) {
    Observation obs = read_observation(cp, info.name, tier);
    CompareResult R = compare_output(cp.problem(), ref, obs, copt);
    kept = std::move(obs.output);
    return R;
  }
  ShardedObservation obs = sharded_observation_of(info.name, cp.reader().read_output(info.name));
  CompareResult R = compare_sharded(cp.problem(), *parse_shard_plan(info.shard), ref, obs, copt);
  kept = std::move(obs.layer.output);
  return R;
}

}  // namespace

RecordedJudgement judge_recorded_outputs(const CaseProblem& cp, const RecordedOptions& opt) {
  const CaseReader& r = cp.reader();
  const std::vector<OutputInfo> outputs = selected_outputs(r, opt);
  const std::map<std::string, std::vector<size_t>> by_model = outputs_by_model(r, outputs, opt);
  const CaseProblem::InputHashes hashes = hashes_needed(cp, outputs, opt);
  for (const OutputInfo& out : outputs) check_input_hashes(hashes, out, r.path());

  RecordedJudgement j;
  j.results.resize(outputs.size());
  j.budget_models.resize(outputs.size());
  j.outputs.resize(outputs.size());
  for (const auto& [model_name, idx] : by_model) {
    const auto t0 = std::chrono::steady_clock::now();
    bool reused = false;
    const ForwardResult ref = reference_to_judge(cp, model_name, opt.reference, hashes.combined, &reused);
    j.reference_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The ideal tier's reference runs on this CPU (ideal_judging_reference).
    const std::string device =
        reused ? "" : products_device(opt.reference.tier == Tier::quantized ? products_for(cp, opt.reference) : nullptr);
    if (!device.empty() && j.reference_device.find(device) == std::string::npos)
      j.reference_device += (j.reference_device.empty() ? "" : "; ") + device;
    if (opt.reference.progress)
      std::cerr << fmt::format("moecheck: reference ({}, budget model {}) {}\n", to_string(opt.reference.tier),
                               model_name, reused ? "reused from /reference/quantized" : "computed on " + device);
    CompareOptions copt;
    copt.model = parse_budget_model(model_name);
    copt.keep_ratios = opt.keep_ratios;
    copt.allow_vacuous = opt.allow_vacuous;
    copt.requant_test = opt.reference.requant_test;
    j.models.push_back(copt.model);
    for (size_t i : idx) {
      j.results[i] = judge_output(cp, outputs[i], ref, copt, opt.reference.tier, j.outputs[i]);
      j.budget_models[i] = model_name;
    }
  }
  return j;
}

}  // namespace moecheck::judge
