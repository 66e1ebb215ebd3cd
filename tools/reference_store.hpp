// The reference as the CLI computes, stores and reuses it: the budget model named on the command
// line, progress on stderr, /reference/<tier> written atomically, and a stored reference reused
// only when its input hash and budget model match the case and the request.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "golden/case_problem.hpp"
#include "reference/moe_budget.hpp"
#include "reference/moe_forward.hpp"

namespace moecheck::cli {

// Budget models by name: "fp32" (round-to-nearest float32 accumulation: CPU backends, CUDA-core
// code), "hmma-f32" (24-bit truncating sums of 4: f16 HMMA with float32 accumulation, what our
// mma.sync kernels run), "hopper" (14 kept bits, truncating, 32 products per instruction: FP8
// wgmma tensor cores), or
// "bits:N" / "trunc:N" (N kept bits, round-to-nearest / truncating).
std::string budget_model_names();
CLI::Validator budget_model_validator();
BudgetModel parse_budget_model(const std::string& name);
std::string budget_model_name(const AccumulatorModel& acc);  // inverse of parse for the presets

// The budget model a backend's outputs are judged with: emulated and faulty:* -> fp32 (float32
// round-to-nearest on the CPU), cuda -> hmma-f32 (our mma.sync kernels), cublaslt and any other
// (an engine's dump) -> hopper (FP8 tensor cores, the conservative model).
std::string default_budget_model(const std::string& backend);

// The forward of one tier (budget only for the quantized tier), with a progress line on stderr.
ForwardResult compute_reference(const CaseProblem& cp, Tier tier, const BudgetModel* model, bool expert_outputs,
                                bool progress);

void store_reference(const std::string& case_path, Tier tier, const ForwardResult& r, const std::string& input_hash,
                     const std::string& budget_model, bool expert_outputs, const std::string& out_path);

// The quantized-tier reference with the budget of `model_name`: the stored one when its input
// hash and budget model match (reused = true), else computed.
ForwardResult quantized_reference(const CaseProblem& cp, const std::string& input_hash, const std::string& model_name,
                                  bool progress, bool* reused);

}  // namespace moecheck::cli
