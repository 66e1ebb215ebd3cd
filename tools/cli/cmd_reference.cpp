// `moecheck reference CASE [--tier ideal|quantized|both] [--expert-outputs] [--device auto|cpu|cuda]
// [-o OUT]`: computes the float64 reference of a case and stores it under /reference/<tier>
// (atomically, into the case or into a copy OUT), with the tool version and the hash of the inputs
// it read. --device cuda runs the weight products and the budget's on the GPU (BUDGETS.md §11
// bounds how far that may differ from the CPU's; the tier's attribute `device` says what ran
// them); auto, the default, does so where a GPU is usable and the case is large enough
// (judge::ReferenceDevice).
#include <chrono>
#include <fmt/format.h>
#include <iostream>

#include "golden/case_problem.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/reference_store.hpp"

namespace moecheck::cli {

void register_reference(CLI::App& app) {
  auto* sub = app.add_subcommand("reference", "compute the float64 reference of a case and store it in the case");
  struct Opts {
    std::string path, tier = "both", out, model = "fp32", device = "auto";
    bool expert_outputs = false, quiet = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("CASE", o->path, "case file (HDF5, golden/FORMAT.md)")->required();
  sub->add_option("--tier", o->tier, "ideal | quantized | both")->check(CLI::IsMember({"ideal", "quantized", "both"}));
  sub->add_flag("--expert-outputs", o->expert_outputs, "also store each slot's output before weighting [T, k, H]");
  sub->add_option("--budget-model", o->model,
                  "accumulator model of the budget stored with the quantized tier: " + budget_model_names())
      ->check(budget_model_validator());
  add_reference_device_option(sub, o->device);
  sub->add_option("-o,--output", o->out, "write the result into a copy OUT instead of the case")->check(output_file());
  sub->add_flag("-q,--quiet", o->quiet, "no progress output");
  set_runner(sub, [o]() {
    const CaseProblem cp(o->path);
    const BudgetModel model = parse_budget_model(o->model);
    judge::ReferenceDevice device(o->device);
    WeightProducts* products = device.for_case(cp.config(), cp.tokens());
    if (!o->quiet)
      std::cerr << fmt::format("moecheck: weight products and the budget's on {}{}\n", judge::products_device(products),
                               device.why_not_gpu().empty() ? "" : " (" + device.why_not_gpu() + ")");
    std::string dest = o->path;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string hash = cp.input_hash();
    for (Tier tier : {Tier::ideal, Tier::quantized}) {
      if (o->tier != "both" && o->tier != to_string(tier)) continue;
      const BudgetModel* budget = tier == Tier::quantized ? &model : nullptr;
      const ForwardResult r =
          judge::compute_reference(cp, tier, budget, o->expert_outputs, !o->quiet, budget != nullptr, products);
      judge::store_reference(dest, tier, r, hash, budget ? o->model : "", o->expert_outputs,
                             o->out.empty() ? "" : o->out, products ? products->describe() : "");
      if (!o->out.empty()) dest = o->out;  // the second tier goes into the same copy
      if (!o->quiet)
        std::cerr << fmt::format("moecheck: /reference/{} written to {} ({} experts run, {:.1f} GFLOP)\n",
                                 to_string(tier), dest, r.experts_run, r.gemm_flops * 1e-9);
    }
    if (!o->quiet)
      std::cerr << fmt::format("moecheck: done in {:.2f} s (input hash {})\n",
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), hash);
    return kExitOk;
  });
}

}  // namespace moecheck::cli
