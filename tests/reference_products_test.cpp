// The forward's weight products on another engine (ForwardOptions::products,
// reference/weight_products.hpp), without a GPU: a float64 engine that sums in the opposite order
// agrees with the CPU reference within BUDGETS.md §11's interval on the gate's sweep cases; an
// engine one part in 10^9 off is caught; the budget's extra products on an engine keep the budgets.
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
#include "reference/budget_model.hpp"
#include "reference/truncation_bound.hpp"
#include <Eigen/Core>
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

// An engine that runs the budget's extras (ProductExtras) on this CPU by its own loop over the
// reference's panel shapes, so that every product but the back product has the CPU reference's
// bits: the main and magnitude products per 32-row panel with Eigen, the float32 products per
// panel, the truncation pass per panel, and, as the GPU's engine does, the whole back product and
// every column norm. `decline`: it answers false, and the CPU computes everything.
class PanelEngine final : public WeightProducts {
 public:
  explicit PanelEngine(bool decline = false) : decline_(decline) {}
  void multiply(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
                double* out) override {
    run(a, n, codes, scales, N, K, B, out, ProductExtras{});
  }
  bool multiply_with_extras(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K,
                            int64_t B, double* out, const ProductExtras& ex) override {
    ++calls_;
    if (decline_) return false;
    return run(a, n, codes, scales, N, K, B, out, ex);
  }
  std::string describe() const override { return "panel engine"; }
  int64_t calls() const { return calls_; }

 private:
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  bool run(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
           double* out, const ProductExtras& ex) {
    const float* table = fp8_table(Fp8Format::e4m3fn);
    const Mat W = Eigen::Map<const Mat>(testing::dequantize_weight(codes, scales, N, K, B).data(), N, K);
    const Eigen::Map<const Mat> A(a, n, K);
    Eigen::Map<Mat> O(out, n, N);
    std::vector<float> dec(size_t(N * K)), mag(dec.size()), maga(dec.size());
    for (size_t i = 0; i < dec.size(); ++i) {
      dec[i] = table[codes[i]];
      mag[i] = dec[i] != 0 ? std::fabs(dec[i]) : NAN;
      maga[i] = dec[i] != 0 ? std::max(std::fabs(dec[i]), 0x1p-6f) : NAN;
    }
    if (ex.back) Eigen::Map<Mat>(ex.back, n, K).setZero();
    if (ex.col_sq) std::fill_n(ex.col_sq, K, 0.0);
    const ProductExtras::Truncation* t = ex.trunc;
    for (int64_t r0 = 0; r0 < N;) {
      const int64_t nr = std::min<int64_t>(32, std::min(N, (r0 / B + 1) * B) - r0);
      const auto w = W.middleRows(r0, nr);
      O.middleCols(r0, nr).noalias() = A * w.transpose();
      const Mat wa = w.cwiseAbs();
      for (int i = 0; i < ex.n_abs; ++i)
        Eigen::Map<Mat>(ex.abs_out[i], n, N).middleCols(r0, nr).noalias() =
            Eigen::Map<const Mat>(ex.abs_in[i], n, K) * wa.transpose();
      if (ex.sq_in) {
        const MatF in = Eigen::Map<const Mat>(ex.sq_in, n, K).cast<float>();
        const MatF wf = w.array().square().cast<float>().matrix();
        const MatF o = in * wf.transpose();
        Eigen::Map<Mat>(ex.sq_out, n, N).middleCols(r0, nr) = o.cast<double>();
      }
      if (ex.lin_in) {
        const MatF in = Eigen::Map<const Mat>(ex.lin_in, n, K).cast<float>();
        const MatF wf = w.cast<float>();
        const MatF o = in * wf.transpose();
        Eigen::Map<Mat>(ex.lin_out, n, N).middleCols(r0, nr) = o.cast<double>();
      }
      if (ex.back) Eigen::Map<Mat>(ex.back, n, K).noalias() += O.middleCols(r0, nr) * w;
      if (ex.col_sq)
        for (int64_t o = 0; o < nr; ++o)
          for (int64_t c = 0; c < K; ++c) ex.col_sq[c] += w(o, c) * w(o, c);
      if (t && !truncation_bound_panel_f32(*t->layout, *t->acc, t->af, t->hf, t->lf, K, t->dcum, n, &dec[r0 * K],
                                           &mag[r0 * K], K, scales + (r0 / B) * ceil_div(K, B), nr, t->err + r0, N,
                                           t->abs_in, t->abs_in ? t->abs_out + r0 : nullptr, &maga[r0 * K],
                                           t->var ? t->var + r0 : nullptr, t->var ? t->codes : nullptr))
        return false;
      r0 += nr;
    }
    return true;
  }
  bool decline_;
  int64_t calls_ = 0;
};

ForwardResult budget_forward(const CaseProblem& cp, const BudgetModel& m, WeightProducts* engine) {
  ForwardOptions opt;
  opt.products = engine;
  opt.budget = &m;
  opt.requant_terms = true;
  return moe_forward(cp.problem(), opt);
}

// The budget's extras on an engine (ProductExtras, forward_panels.cpp's engine pass): with the
// CPU's own products every budget array keeps its bits, except the flip projections and their
// tails, which the engine takes from the whole back product (its group projections in double)
// where the CPU may take dot products at the flips' columns and group projections in float32 (a
// few float roundings apart: 1e-6 relative allows 2^4 of them); an engine that declines leaves every
// output and array as the CPU's. Under the measured hopper model (the truncation pass, the
// codes' variance, the fused magnitude product) and fp32 (magnitude products of their own).
TEST(ReferenceProducts, BudgetExtrasOnAnEngineKeepTheBudgets) {
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("moecheck-products-b-{}.h5", getpid())).string();
  int64_t compared = 0;
  for (int64_t i = 0; i < 12; ++i) {
    const GeneratorOptions g = sweep::sweep_case(46, i, sweep::default_sweep_presets(false));
    write_case(plan_case(g, path), path);
    {
      const CaseProblem cp(path);
      for (const char* model : {"hopper", "fp32"}) {
        const std::string replay = fmt::format("sweep seed 46 case {}, budget model {}", i, model);
        const BudgetModel m = parse_budget_model(model);
        const ForwardResult cpu = budget_forward(cp, m, nullptr);
        PanelEngine engine, declining(true);
        const ForwardResult on = budget_forward(cp, m, &engine), off = budget_forward(cp, m, &declining);
        if (cpu.experts_run > 0) {
          ASSERT_GT(engine.calls(), 0) << replay;
        }
        ASSERT_EQ(cpu.output, on.output) << replay;
        ASSERT_EQ(cpu.output, off.output) << replay;
        for (const auto& d : testing::budget_differences(cpu, on)) {
          const bool from_back = d.name == "slot_flip_projection" || d.name.find("tail") != std::string::npos;
          if (from_back)
            EXPECT_LE(d.largest_rel, 1e-6) << replay << ": " << d.describe();
          else
            EXPECT_EQ(d.identical, d.values) << replay << ": " << d.describe();
          compared += d.values;
        }
        for (const auto& d : testing::budget_differences(cpu, off))
          EXPECT_EQ(d.identical, d.values) << replay << ", declining engine: " << d.describe();
      }
    }
    std::filesystem::remove(path);
  }
  std::cout << "[ extras   ] " << compared << " budget values compared over 12 sweep cases x 2 models\n";
}

}  // namespace
}  // namespace moecheck
