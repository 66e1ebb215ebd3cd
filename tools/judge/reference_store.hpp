// The reference as the CLI computes, stores and reuses it: the budget model named on the command
// line, progress on stderr, /reference/<tier> written atomically, and a stored reference reused
// only when its input hash and budget model match the case and the request.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "golden/case_problem.hpp"
#include "reference/budget_model.hpp"
#include "reference/moe_forward.hpp"

namespace moecheck::judge {

// The forward of one tier (budget only for the quantized tier), with a progress line on stderr.
// products: where the weight products run (reference_products); nullptr: this CPU.
ForwardResult compute_reference(const CaseProblem& cp, Tier tier, const BudgetModel* model, bool expert_outputs,
                                bool progress, bool requant_terms = false, WeightProducts* products = nullptr);

// The weight products of `--device NAME` (reference, compare, gate, bench reference): nullptr for
// cpu; for cuda the GPU's float64 GEMM with the budget's products beside it
// (kernels/fp64_weight_products.hpp). InputError naming --device when this build has no CUDA or
// this machine no usable GPU.
std::unique_ptr<WeightProducts> reference_products(const std::string& device);

// What ran a reference's products, in words: the engine's describe(), or "this CPU".
std::string products_device(const WeightProducts* products);

// device: what computed the products (WeightProducts::describe(); empty: this CPU), stored as
// the tier's attribute `device`.
void store_reference(const std::string& case_path, Tier tier, const ForwardResult& r, const std::string& input_hash,
                     const std::string& budget_model, bool expert_outputs, const std::string& out_path,
                     const std::string& device = "");

// The quantized-tier reference with the budget of `model_name`: the stored one when its input
// hash, budget model and noise-model revision (kNoiseModelRevision) match and it holds every
// array the judgement reads (budgets, noise variance, flip projections, and with requant_terms
// the re-quantization test's terms; reused = true), else computed. Either way the same judgement.
// products: where the products run when it is computed (nullptr: this CPU).
ForwardResult quantized_reference(const CaseProblem& cp, const std::string& input_hash, const std::string& model_name,
                                  bool progress, bool* reused, bool requant_terms = false,
                                  WeightProducts* products = nullptr);

}  // namespace moecheck::judge
