// The budget's extra products on the GPU (WeightProducts::multiply_with_extras of
// kernels/fp64_weight_products.hpp; ProductExtras, reference/weight_products.hpp):
//   - the truncation pass gives this CPU's portable loop's bits (reference/truncation_pair.hpp),
//     err, the variance with and without the rows' codes, and the fused magnitude product;
//   - the float64 products (main, magnitudes, back) lie within the float64 error of any
//     summation order of the CPU's, the float32 ones within float32's, the column norms keep the
//     CPU loop's bits; layouts the GPU does not take are declined;
//   - a forward with the budget on the GPU keeps the CPU's budgets on the gate's sweep cases, but
//     for what the two engines' own roundings move (reported per array).
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <bit>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <map>
#include <unistd.h>

#include "golden/case_generator.hpp"
#include "golden/case_problem.hpp"
#include "kernels/fp64_weight_products.hpp"
#include "reference/budget_model.hpp"
#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/truncation_bound.hpp"
#include "tests/gpu_test_support.hpp"
#include "tests/reference_agreement.hpp"
#include "tools/sweep/gate_sweep.hpp"

namespace moecheck {
namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

uint8_t random_code(const CounterRng& r, uint64_t i) {
  if (r.uniform(i) < 0.05) return 0;
  uint8_t c = uint8_t(r.uniform(i + 1) * 256);
  if ((c & 0x7F) == 0x7F) c &= 0xF7;  // not NaN
  return c;
}

// A truncation problem: n input rows of FP8 codes with group scales per block (some rows with
// deviations that make codes unknown), an [N, K] weight, the rows' float inputs and codes.
struct Operands {
  int64_t n, N, K, B;
  ChunkLayout L;
  std::vector<uint8_t> wc;
  std::vector<float> ws;  // [ceil(N/B), ceil(K/B)]
  std::vector<double> a, da, hi, lo, dcum, bscale, in_d;
  std::vector<uint8_t> known;
  std::vector<float> af, hf, lf, in, rcode, rfield;
  RowCodes rc{};
  Operands(uint64_t seed, int64_t n_, int64_t N_, int64_t K_, int64_t B_, int64_t m)
      : n(n_), N(N_), K(K_), B(B_), L(K_, B_, m) {
    const CounterRng r{seed, 71};
    const float* table = fp8_table(Fp8Format::e4m3fn);
    const int64_t nb = ceil_div(K, B);
    wc.resize(size_t(N * K));
    for (int64_t i = 0; i < N * K; ++i) wc[i] = random_code(r, 2 * i);
    ws.resize(size_t(ceil_div(N, B) * nb));
    for (size_t i = 0; i < ws.size(); ++i) ws[i] = float((1 + r.uniform(9000001 + i)) * 0x1p-9);
    std::vector<uint8_t> ac(size_t(n * K));
    std::vector<float> sa(size_t(n * nb));
    for (int64_t i = 0; i < n * K; ++i) ac[i] = random_code(r, 5000001 + 2 * i);
    for (int64_t i = 0; i < n * nb; ++i) sa[i] = float((1 + r.uniform(7000003 + i)) * 0x1p-8);
    a.resize(size_t(n * K)), da.resize(a.size()), hi.resize(a.size()), lo.resize(a.size()), in_d.resize(a.size());
    dcum.resize(size_t(n * L.chunks())), bscale.resize(size_t(n * nb)), known.resize(size_t(n * nb));
    af.resize(a.size()), hf.resize(a.size()), lf.resize(a.size()), in.resize(a.size());
    rcode.resize(a.size()), rfield.resize(a.size());
    std::vector<double> floor(a.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t j = i * K + k;
        a[j] = double(table[ac[j]]) * double(sa[i * nb + k / B]);
        floor[j] = 0x1p-6 * double(sa[i * nb + k / B]);
        const bool dev = (i % 2 == 1) && (k / B + i) % 3 == 0 && r.uniform(3000001 + j) < 0.3;
        da[j] = dev ? 0.1 * std::fabs(a[j]) + 0x1p-12 : 0.0;
      }
      truncation_row_inputs(L, &a[i * K], &da[i * K], &hi[i * K], &lo[i * K], &dcum[i * L.chunks()], &floor[i * K]);
      truncation_row_inputs_f32(K, &a[i * K], &hi[i * K], &lo[i * K], &af[i * K], &hf[i * K], &lf[i * K]);
      truncation_row_codes(L, &ac[i * K], &sa[i * nb], &da[i * K], &hi[i * K], &rcode[i * K], &rfield[i * K],
                           &bscale[i * nb], &known[i * nb]);
      for (int64_t k = 0; k < K; ++k) {
        in_d[i * K + k] = 0x1p-23 * std::fabs(a[i * K + k]) + da[i * K + k];
        in[i * K + k] = f32_up(in_d[i * K + k]);
      }
    }
    rc = {rcode.data(), rfield.data(), bscale.data(), nb, known.data()};
  }
};

// The CPU's portable loop over the whole weight, block row by block row (one scale row each).
void cpu_truncation(const Operands& x, const AccumulatorModel& acc, bool var, bool codes, std::vector<double>& err,
                    std::vector<double>& v, std::vector<double>& abs_out) {
  const float* table = fp8_table(Fp8Format::e4m3fn);
  std::vector<float> dec(x.wc.size()), mag(dec.size()), maga(dec.size());
  for (size_t i = 0; i < dec.size(); ++i) {
    dec[i] = table[x.wc[i]];
    mag[i] = dec[i] != 0 ? std::fabs(dec[i]) : NAN;
    maga[i] = dec[i] != 0 ? std::max(std::fabs(dec[i]), 0x1p-6f) : NAN;
  }
  err.assign(size_t(x.n * x.N), -1), v.assign(err.size(), -1), abs_out.assign(err.size(), -1);
  set_truncation_kernel(TruncationKernel::portable);
  for (int64_t r0 = 0; r0 < x.N; r0 += x.B) {
    const int64_t nr = std::min(x.B, x.N - r0);
    ASSERT_TRUE(truncation_bound_panel_f32(x.L, acc, x.af.data(), x.hf.data(), x.lf.data(), x.K, x.dcum.data(), x.n,
                                           &dec[r0 * x.K], &mag[r0 * x.K], x.K,
                                           x.ws.data() + (r0 / x.B) * ceil_div(x.K, x.B), nr, err.data() + r0, x.N,
                                           x.in.data(), abs_out.data() + r0, &maga[r0 * x.K],
                                           var ? v.data() + r0 : nullptr, codes ? &x.rc : nullptr));
  }
  set_truncation_kernel(TruncationKernel::widest);
}

TEST(GpuBudgetProducts, TruncationPassHasThePortableLoopsBits) {
  MOECHECK_REQUIRE_GPU();
  const auto gpu = kernels::make_cuda_weight_products(1);
  const AccumulatorModel acc = AccumulatorModel::hopper_tensor_core();
  int64_t compared = 0;
  for (const int64_t K : {int64_t(512), int64_t(7 * 128), int64_t(300)}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      // 3, 5 and 13 input rows: the tiled pass takes 8 per block, so 13 spans two.
      const Operands x(seed, seed == 3 ? 13 : 1 + int64_t(seed) * 2, 200, K, 128, 32);
      for (const bool var : {false, true})
        for (const bool codes : {false, true}) {
          if (codes && !var) continue;
          std::vector<double> want_err, want_var, want_abs;
          cpu_truncation(x, acc, var, codes, want_err, want_var, want_abs);
          std::vector<double> out(size_t(x.n * x.N)), err(out.size(), -1), v(out.size(), -1), ab(out.size(), -1);
          ProductExtras::Truncation t;
          t.layout = &x.L, t.acc = &acc, t.af = x.af.data(), t.hf = x.hf.data(), t.lf = x.lf.data();
          t.dcum = x.dcum.data(), t.abs_in = x.in.data(), t.codes = codes ? &x.rc : nullptr;
          t.err = err.data(), t.var = var ? v.data() : nullptr, t.abs_out = ab.data();
          ProductExtras ex;
          ex.trunc = &t;
          ASSERT_TRUE(gpu->multiply_with_extras(x.a.data(), x.n, x.wc.data(), x.ws.data(), x.N, x.K, x.B, out.data(), ex));
          const std::string where = fmt::format("K {} seed {} var {} codes {}", K, seed, var, codes);
          for (size_t i = 0; i < err.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint64_t>(err[i]), std::bit_cast<uint64_t>(want_err[i]))
                << where << " err " << i << ": gpu " << err[i] << " cpu " << want_err[i];
            ASSERT_EQ(std::bit_cast<uint64_t>(ab[i]), std::bit_cast<uint64_t>(want_abs[i]))
                << where << " magnitude " << i << ": gpu " << ab[i] << " cpu " << want_abs[i];
            if (var) {
              ASSERT_EQ(std::bit_cast<uint64_t>(v[i]), std::bit_cast<uint64_t>(want_var[i]))
                  << where << " var " << i << ": gpu " << v[i] << " cpu " << want_var[i];
            }
          }
          compared += int64_t(err.size());
        }
    }
  }
  std::cout << "[ trunc    ] " << compared << " (row, weight row) pairs bit-identical with the portable loop on "
            << gpu->describe() << "\n";
  // 32 chunks per block (4 products per instruction): more than the GPU keeps; declined.
  const Operands x(1, 2, 64, 256, 128, 4);
  std::vector<double> out(size_t(x.n * x.N)), err(out.size());
  ProductExtras::Truncation t;
  t.layout = &x.L, t.acc = &acc, t.af = x.af.data(), t.hf = x.hf.data(), t.lf = x.lf.data(), t.dcum = x.dcum.data();
  t.err = err.data();
  ProductExtras ex;
  ex.trunc = &t;
  EXPECT_FALSE(gpu->multiply_with_extras(x.a.data(), x.n, x.wc.data(), x.ws.data(), x.N, x.K, x.B, out.data(), ex));
}

TEST(GpuBudgetProducts, OtherProductsWithinTheirFormatsError) {
  MOECHECK_REQUIRE_GPU();
  const auto gpu = kernels::make_cuda_weight_products(1);
  const Operands x(5, 7, 300, 7 * 128, 128, 32);
  const int64_t n = x.n, N = x.N, K = x.K;
  const Mat W = Eigen::Map<const Mat>(testing::dequantize_weight(x.wc.data(), x.ws.data(), N, K, x.B).data(), N, K);
  const Eigen::Map<const Mat> A(x.a.data(), n, K), D(x.in_d.data(), n, K);
  std::vector<double> out(size_t(n * N)), ab0(out.size()), ab1(out.size()), sq(out.size()), lin(out.size());
  std::vector<double> back(size_t(n * K)), col(static_cast<size_t>(K));
  ProductExtras ex;
  // Magnitude products take any input (out = in |W|^T); the budget's are non-negative.
  ex.n_abs = 2, ex.abs_in[0] = x.a.data(), ex.abs_out[0] = ab0.data(), ex.abs_in[1] = x.in_d.data();
  ex.abs_out[1] = ab1.data();
  ex.sq_in = x.in_d.data(), ex.sq_out = sq.data(), ex.lin_in = x.a.data(), ex.lin_out = lin.data();
  ex.back = back.data(), ex.col_sq = col.data();
  ASSERT_TRUE(gpu->multiply_with_extras(x.a.data(), n, x.wc.data(), x.ws.data(), N, K, x.B, out.data(), ex));
  // Each float64 dot product of length L is within gamma_L sum |x||w| of the exact one (any
  // order, BUDGETS.md §11), so the GPU's and the CPU's within twice that; float32 likewise with
  // u = 2^-24, plus the inputs' rounding to float (one unit each, also 2^-24 relative).
  auto gamma = [](int64_t L, double u) { return double(L) * u / (1 - double(L) * u); };
  const Mat Wa = W.cwiseAbs();
  auto check = [&](const char* what, const Mat& want, const std::vector<double>& got, const Mat& mag, double tol) {
    int64_t worst = 0;
    double worst_ratio = 0;
    for (int64_t i = 0; i < want.size(); ++i) {
      const double ratio = std::fabs(got[size_t(i)] - want.data()[i]) / (tol * mag.data()[i] + 1e-300);
      if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
    std::cout << "[ products ] " << what << ": largest |gpu - cpu| / bound " << worst_ratio << "\n";
    EXPECT_LE(worst_ratio, 1.0) << what << " element " << worst << ": gpu " << got[size_t(worst)] << " cpu "
                                << want.data()[worst];
  };
  const Mat out_cpu = A * W.transpose(), mag_a = A.cwiseAbs() * Wa.transpose();
  check("main product", out_cpu, out, mag_a, 2 * gamma(K, 0x1p-53));
  check("magnitude product 1", A * Wa.transpose(), ab0, mag_a, 2 * gamma(K, 0x1p-53));
  check("magnitude product 2", D * Wa.transpose(), ab1, D * Wa.transpose(), 2 * gamma(K, 0x1p-53));
  const Mat Wsq = W.array().square().matrix();
  check("squares (float32)", D * Wsq.transpose(), sq, D * Wsq.transpose(), 2 * gamma(K, 0x1p-24) + 3 * 0x1p-24);
  check("linear (float32)", out_cpu, lin, mag_a, 2 * gamma(K, 0x1p-24) + 3 * 0x1p-24);
  const Eigen::Map<const Mat> O(out.data(), n, N);
  check("back product", O * W, back, O.cwiseAbs() * Wa, 2 * gamma(N, 0x1p-53));
  for (int64_t k = 0; k < K; ++k) {  // the CPU's loop: rows in order, each square rounded, then added
    double s = 0;
    for (int64_t o = 0; o < N; ++o) s += W(o, k) * W(o, k);
    ASSERT_EQ(std::bit_cast<uint64_t>(s), std::bit_cast<uint64_t>(col[size_t(k)])) << "column " << k;
  }
}

// The forward's budgets with their extra products on the GPU against the CPU's, under the
// measured hopper model with the re-quantization test's terms. The two differ where the engines'
// own roundings differ: the CPU's truncation pass runs its four-lane kernels (a few float
// roundings from the portable loop, truncation_bound.hpp), the float32 products sum in other
// orders, the group projections come from the whole back product; and where a float64 product's
// last bit moves a value across a rounding boundary (BUDGETS.md §11), a term may move by that
// format's step. Checked: every array the same size and finite where the CPU's is; reported per
// array, the share bit-identical and the largest relative difference.
TEST(GpuBudgetProducts, BudgetsOnTheGpuKeepTheCpusOnTheGateSweep) {
  MOECHECK_REQUIRE_GPU();
  const auto gpu = kernels::make_cuda_weight_products();
  const char* env = std::getenv("MOECHECK_CASES");
  const int64_t cases = env ? std::atoll(env) : 40;
  const BudgetModel model = parse_budget_model("hopper");
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("moecheck-gpu-budget-{}.h5", getpid())).string();
  std::map<std::string, testing::BudgetArrayDiff> total;
  std::map<std::string, int64_t> beyond;  // values more than 1e-3 relative apart
  for (int64_t i = 0; i < cases && !HasFatalFailure(); ++i) {
    const GeneratorOptions g = sweep::sweep_case(46, i, sweep::default_sweep_presets(false));
    write_case(plan_case(g, path), path);
    {
      const CaseProblem cp(path);
      ForwardOptions opt;
      opt.budget = &model;
      opt.requant_terms = true;
      const ForwardResult cpu = moe_forward(cp.problem(), opt);
      opt.products = gpu.get();
      const ForwardResult on = moe_forward(cp.problem(), opt);
      const std::string replay = fmt::format("sweep seed 46 case {}: {}", i, make_case_command(g, "case.h5"));
      for (const auto& d : testing::budget_differences(cpu, on)) {
        ASSERT_TRUE(std::isfinite(d.largest_rel)) << replay << ": " << d.describe();
        testing::BudgetArrayDiff& t = total[d.name];
        t.name = d.name, t.values += d.values, t.identical += d.identical;
        if (!(d.largest_rel <= t.largest_rel)) t.largest_rel = d.largest_rel, t.where = d.where, t.cpu = d.cpu, t.engine = d.engine;
        if (d.largest_rel > 1e-3) ++beyond[d.name];
      }
    }
    std::filesystem::remove(path);
  }
  std::cout << "[ budgets  ] " << cases << " sweep cases, hopper model, on " << gpu->describe() << "\n";
  std::cout << "[ budgets  ] " << gpu->activity() << "\n";
  int64_t values = 0;
  for (const auto& [name, t] : total) {
    std::cout << "[ budgets  ] " << t.describe() << "; cases with a value more than 1e-3 apart: " << beyond[name] << "\n";
    values += t.values;
  }
  EXPECT_GT(values, 0);
}

}  // namespace
}  // namespace moecheck
