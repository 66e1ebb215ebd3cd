// The chunked truncation bound (reference/truncation_bound.hpp, BUDGETS.md §2.1) against a
// simulated device that obeys the accumulator model: RapidCheck properties, plus the two facts
// the derivation rests on. Replay a failure with the RC_PARAMS="reproduce=..." string printed.
//
// The simulated instruction (one of m products per step, codes in e4m3, all values exact in
// double): terms = the register (when nonzero) and the chunk's products; E = the exponent of the
// largest |term|; every term truncated to the grid 2^(E - p + 1), toward zero or toward -inf (both
// are tried: the model does not say which the hardware does); the exact sum truncated once more
// to p significant bits, then rounded to float32 (the register). The bound must hold for every
// variant, for device operands that deviate from the reference's by up to da.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_budget.hpp"
#include "reference/truncation_bound.hpp"

namespace moecheck {
namespace {

enum class Trunc { toward_zero, toward_minus_inf };

double trunc_to_grid(double x, double g, Trunc mode) {
  const double q = x / g;  // exact: g is a power of two
  return (mode == Trunc::toward_zero ? std::trunc(q) : std::floor(q)) * g;
}

double trunc_bits(double x, int p, Trunc mode) {
  if (x == 0) return 0;
  const double g = std::ldexp(1.0, std::ilogb(x) - p + 1);
  return trunc_to_grid(x, g, mode);
}

// One block of the simulated device: products qa[k] * qw[k], k < n, in instructions of m.
double device_block(const std::vector<double>& qa, const std::vector<double>& qw, int64_t k0, int64_t n, int m,
                    int p, Trunc mode) {
  double reg = 0;
  for (int64_t c0 = 0; c0 < n; c0 += m) {
    const int64_t c1 = std::min<int64_t>(n, c0 + m);
    double mx = std::fabs(reg);
    for (int64_t k = c0; k < c1; ++k) mx = std::max(mx, std::fabs(qa[k0 + k] * qw[k0 + k]));
    if (mx == 0) continue;
    const double g = std::ldexp(1.0, std::ilogb(mx) - p + 1);
    double sum = trunc_to_grid(reg, g, mode);
    for (int64_t k = c0; k < c1; ++k) sum += trunc_to_grid(qa[k0 + k] * qw[k0 + k], g, mode);
    reg = double(static_cast<float>(trunc_bits(sum, p, mode)));
  }
  return reg;
}

// A random e4m3 value: wide dynamic range (random code), or a narrow one around 1 (many
// products near the largest, where cancellation in the running sum is strongest).
double random_e4m3(const CounterRng& r, uint64_t i, bool wide) {
  if (wide) {
    uint8_t c = static_cast<uint8_t>(r.bits(i) & 0xFF);
    if ((c & 0x7F) == 0x7F) c = 0;  // no NaN
    return e4m3_decode(c);
  }
  const double v = (1.0 + 7 * r.uniform(i)) * (r.bits(i + 1) & 1 ? -1 : 1);
  return e4m3_decode(e4m3_encode_satfinite(static_cast<float>(v)));
}

TEST(TruncationBound, ProductsOfTwoCodesAreExactOnGridsBelowOne256th) {
  // The product rule of the derivation, exhaustively: |p| / 256 <= the largest power of two
  // dividing p (the product's own ulp), so truncating p to any grid <= |p| / 256 is exact.
  int checked = 0;
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b) {
      if ((a & 0x7F) == 0x7F || (b & 0x7F) == 0x7F) continue;
      const double p = double(e4m3_decode(uint8_t(a))) * double(e4m3_decode(uint8_t(b)));
      if (p == 0) continue;
      const double g = std::ldexp(1.0, std::ilogb(std::fabs(p) / 256));
      ASSERT_EQ(trunc_to_grid(p, g, Trunc::toward_zero), p) << a << " " << b;
      ASSERT_EQ(trunc_to_grid(p, g, Trunc::toward_minus_inf), p) << a << " " << b;
      ++checked;
    }
  EXPECT_GT(checked, 60000);
}

TEST(TruncationBound, ChunkLayoutNeverCrossesABlock) {
  const ChunkLayout L(300, 128, 32);  // blocks 128, 128, 44: chunks 4 + 4 + 2
  ASSERT_EQ(L.chunks(), 10);
  EXPECT_EQ(L.start[4], 128);
  EXPECT_EQ(L.start[9], 288);
  EXPECT_EQ(L.start[10], 300);
  EXPECT_TRUE(L.first_in_block[8]);
  EXPECT_EQ(L.block_of[9], 2);
}

// Bound and simulated device on one random (a, w) pair; returns the device's worst error / bound.
struct Trial {
  double worst_ratio = 0;
  double chunked = 0, magnitude = 0;  // the two bounds, for the tightness comparison
};

Trial run_trial(uint64_t seed, int64_t K, int p, bool wide, bool deviate) {
  const CounterRng r{seed, 77};
  const int64_t B = 128;
  const int m = 32;
  std::vector<double> qw(K), qdev(K), a(K), da(K, 0.0);
  for (int64_t k = 0; k < K; ++k) {
    qw[k] = random_e4m3(r, 4 * k, wide);
    qdev[k] = random_e4m3(r, 4 * k + 2, wide);
    a[k] = qdev[k];
    if (deviate && r.uniform(8 * K + k) < 0.3) {
      // The reference's value is off the device's code by up to da (a re-quantization flip).
      da[k] = std::fabs(qdev[k]) * 0.125 + 0x1p-9;
      a[k] = qdev[k] + (2 * r.uniform(9 * K + k) - 1) * da[k];
    }
  }
  const ChunkLayout L(K, B, m);
  AccumulatorModel acc{p, true, m};
  std::vector<double> hi(K), lo(K), dcum(L.chunks()), wabs(K), scratch;
  for (int64_t k = 0; k < K; ++k) wabs[k] = std::fabs(qw[k]);
  truncation_row_inputs(L, a.data(), deviate ? da.data() : nullptr, hi.data(), lo.data(), dcum.data());
  double bound = 0;
  truncation_bound_panel(L, acc, a.data(), hi.data(), lo.data(), K, dcum.data(), 1, qw.data(), wabs.data(), K, 1,
                         &bound, 1, scratch);
  Trial t;
  for (Trunc mode : {Trunc::toward_zero, Trunc::toward_minus_inf}) {
    double err = 0, mag = 0;
    for (int64_t b0 = 0; b0 < K; b0 += B) {
      const int64_t n = std::min(B, K - b0);
      double exact = 0;  // exact in double: <= 128 products of <= 8 significant bits, close exponents not needed
      for (int64_t k = b0; k < b0 + n; ++k) exact += qdev[k] * qw[k];
      err += std::fabs(device_block(qdev, qw, b0, n, m, p, mode) - exact);
    }
    for (int64_t k = 0; k < K; ++k) mag += (std::fabs(a[k]) + da[k]) * wabs[k];
    t.worst_ratio = std::max(t.worst_ratio, bound > 0 ? err / bound : (err > 0 ? INFINITY : 0));
    t.magnitude = (dot_product_bound(acc, K, B, true) - promotion_bound(K, B, true)) * mag;
  }
  t.chunked = bound;
  return t;
}

RC_GTEST_PROP(TruncationBound, HoldsForTheSimulatedDevice, ()) {
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const int64_t K = *rc::gen::inRange<int64_t>(1, 700);
  const int p = *rc::gen::element(8, 11, 14, 17);
  const bool wide = *rc::gen::arbitrary<bool>();
  const bool deviate = *rc::gen::arbitrary<bool>();
  const Trial t = run_trial(seed, K, p, wide, deviate);
  RC_TAG(wide ? "wide codes" : "narrow codes", deviate ? "deviating operands" : "same operands");
  if (!(t.worst_ratio <= 1.0))
    RC_LOG() << "K=" << K << " p=" << p << " error / bound = " << t.worst_ratio << "\n";
  RC_ASSERT(t.worst_ratio <= 1.0);
}

TEST(TruncationBound, TighterThanTheMagnitudeBoundAndNotVacuous) {
  // On i.i.d. data of K = 7168 (DeepSeek-V3's H) with p = 14 the chunked bound must be well below
  // c_blk sum |a||w| (the derivation predicts a factor of several), and a simulated device must
  // reach a visible fraction of it (a bound 1e6 times too large would also "hold").
  double ratio_sum = 0, worst = 0;
  const int n = 20;
  for (int i = 0; i < n; ++i) {
    const Trial t = run_trial(1000 + i, 7168, 14, false, false);
    ratio_sum += t.magnitude / t.chunked;
    worst = std::max(worst, t.worst_ratio);
  }
  const double tighter = ratio_sum / n;
  std::printf("chunked bound is %.1fx tighter than the magnitude bound; worst device error / bound %.3g\n", tighter,
              worst);
  EXPECT_GT(tighter, 3.0);
  EXPECT_GT(worst, 1e-3);
  EXPECT_LE(worst, 1.0);
}

}  // namespace
}  // namespace moecheck
