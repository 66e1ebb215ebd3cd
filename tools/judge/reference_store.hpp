// The reference as the CLI computes, stores and reuses it: the budget model named on the command
// line, progress on stderr, /reference/<tier> written atomically, and a stored reference reused
// only when its input hash and budget model match the case and the request.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
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

// The weight products of `--device NAME`: nullptr for cpu; for cuda the GPU's float64 GEMM
// (kernels/fp64_weight_products.hpp). InputError naming --device when this build has no CUDA or
// this machine no usable GPU.
std::unique_ptr<WeightProducts> reference_products(const std::string& device);

// Where compare's and gate's references run (`--device cpu | cuda | auto`), decided per case:
// cpu, this CPU; cuda, the GPU's float64 products with the budget's beside them
// (reference_products); auto, the GPU where one is usable and the case's float64 weight products
// reach kAutoGpuFlops, else this CPU. Either way the same reference within BUDGETS.md §11.
// Thread-safe.
class ReferenceDevice {
 public:
  // Measured, not derived (README "Measured": `bench reference --compare --device cuda` on one
  // H100 host with 16 threads): compare took longer with the GPU at 0.8 GFLOP of float64 products,
  // 1.4x less time at 3.2 GFLOP (a saving about the size of the GPU's start in a fresh process,
  // 0.25 s), 1.8x at 25.8, 3.2x at 45 and 6.1x at 721 GFLOP.
  static constexpr double kAutoGpuFlops = 1e10;
  // InputError naming --device for a name other than the three, or for cuda where no GPU is usable.
  explicit ReferenceDevice(std::string name = "cpu");
  // The products for a case of this config and token count; nullptr: this CPU.
  WeightProducts* for_case(const MoeConfig& c, int64_t tokens);
  const std::string& name() const { return name_; }
  // auto: why the GPU is not used (empty when it is, or before a large case asked).
  std::string why_not_gpu() const;

 private:
  std::string name_;
  std::unique_ptr<WeightProducts> gpu_;
  bool tried_ = false;
  std::string why_not_;
  mutable std::mutex m_;
};

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
// products: where the products run when it is computed, called only then (so a reused stored
// reference never starts the GPU); empty or returning nullptr: this CPU.
using ProductsSource = std::function<WeightProducts*()>;
ForwardResult quantized_reference(const CaseProblem& cp, const std::string& input_hash, const std::string& model_name,
                                  bool progress, bool* reused, bool requant_terms = false,
                                  const ProductsSource& products = {});

}  // namespace moecheck::judge
