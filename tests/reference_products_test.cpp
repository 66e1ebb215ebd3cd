// The forward's weight products on another engine (ForwardOptions::products,
// reference/weight_products.hpp), without a GPU: a float64 engine that sums in the opposite order
// agrees with the CPU reference within BUDGETS.md §11's interval on the gate's sweep cases; an
// engine one part in 10^9 off is caught; budgets refuse another engine.
#include <gtest/gtest.h>

#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <unistd.h>

#include "golden/case_generator.hpp"
#include "golden/case_problem.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_budget.hpp"
#include "reference/fp8_quant.hpp"
#include "tests/reference_agreement.hpp"
#include "tools/sweep/gate_sweep.hpp"

namespace moecheck {
namespace {

// out = a W^T with every dot product summed from the last k to the first (Eigen's order differs),
// then scaled by (1 + skew).
class ReversedSums final : public WeightProducts {
 public:
  explicit ReversedSums(double skew = 0) : skew_(skew) {}
  void multiply(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
                double* out) override {
    const std::vector<double> w = testing::dequantize_weight(codes, scales, N, K, B);
    for (int64_t o = 0; o < N; ++o)
      for (int64_t r = 0; r < n; ++r) {
        double acc = 0;
        for (int64_t c = K - 1; c >= 0; --c) acc += a[r * K + c] * w[size_t(o * K + c)];
        out[r * N + o] = acc * (1 + skew_);
      }
  }
  std::string describe() const override { return "reversed sums"; }

 private:
  double skew_;
};

testing::AgreementTally run_sweep(WeightProducts& engine, int64_t cases) {
  testing::AgreementTally tally;
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("moecheck-products-{}.h5", getpid())).string();
  for (int64_t i = 0; i < cases; ++i) {
    const GeneratorOptions g = sweep::sweep_case(46, i, sweep::default_sweep_presets(false));
    write_case(plan_case(g, path), path);
    {
      const CaseProblem cp(path);
      testing::check_engines_agree(cp.problem(), engine, fmt::format("sweep seed 46 case {}", i), tally);
    }
    std::filesystem::remove(path);
  }
  return tally;
}

TEST(ReferenceProducts, AnotherSummationOrderAgreesWithinTheStatedInterval) {
  ReversedSums engine;
  const testing::AgreementTally t = run_sweep(engine, 40);
  std::cout << t.summary("40 sweep cases x 2 tiers, reversed sums") << "\n";
  EXPECT_EQ(t.outside, 0) << t.first_outside;
  EXPECT_GT(t.elements, 0);
}

TEST(ReferenceProducts, AnEngineOnePartInTenToTheNineOffIsOutside) {
  ReversedSums engine(1e-9);
  const testing::AgreementTally t = run_sweep(engine, 10);
  std::cout << t.summary("10 sweep cases x 2 tiers, products scaled by 1 + 1e-9") << "\n";
  EXPECT_GT(t.outside, 0) << "a skew of 1e-9 is 10^3 times the float64 error the interval allows";
}

TEST(ReferenceProducts, BudgetsStayOnTheCpu) {
  ReversedSums engine;
  const GeneratorOptions g = sweep::sweep_case(46, 0, sweep::default_sweep_presets(false));
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("moecheck-products-b-{}.h5", getpid())).string();
  write_case(plan_case(g, path), path);
  {
    const CaseProblem cp(path);
    BudgetModel m;
    ForwardOptions opt;
    opt.products = &engine;
    opt.budget = &m;
    EXPECT_THROW(moe_forward(cp.problem(), opt), std::invalid_argument);
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace moecheck
