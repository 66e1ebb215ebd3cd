// The aggregate tests' threshold with rare bounded terms (reference/tail_bound.hpp, BUDGETS.md
// §10.8): it reduces to z sigma without them, stays a valid bound where a simulation can check
// it, and prices a single rare term at its size, not as a Gaussian.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/counter_rng.hpp"
#include "reference/tail_bound.hpp"

namespace moecheck {
namespace {

TEST(TailBound, GaussianOnlyIsZSigma) {
  TailBound tb;
  tb.add_gaussian(4.0);
  const double z = 6.0;
  EXPECT_DOUBLE_EQ(tb.threshold(z * z / 2), z * 2.0);
  EXPECT_DOUBLE_EQ(tb.variance(), 4.0);
}

// One crossing of probability p and size a beside a small Gaussian part: with p above the tail
// probability the threshold must reach about a (it happens that often), and no more than a plus
// the Gaussian part's own threshold; with p far below it, it costs almost nothing.
TEST(TailBound, OneRareTermCostsItsSizeOnlyWhenLikely) {
  const double x = 19.0;  // e^-19 = 5.6e-9
  for (const double p : {3e-3, 1e-6}) {
    TailBound tb;
    tb.add_gaussian(1.0);
    tb.add_crossings(1, p, p * (1 - p) * 100.0, 10.0);  // a = 10 sigma
    const double t = tb.threshold(x), g = std::sqrt(2 * x);
    EXPECT_GT(t, 10.0) << p;
    EXPECT_LT(t, 10.0 + g + 0.5) << p;
  }
  // Far below it, Chernoff's bound alone still charges it (e^(lambda a) outgrows any p), so the
  // judge leaves such terms out and spends their probability by a union bound (rare_p).
  FlipTail ft(10.0);
  ft.add(1e-15, 10.0);
  std::vector<double> stored(kFlipTailWidth);
  ft.write(stored.data());
  TailBound kept, left_out;
  kept.add_gaussian(1.0), left_out.add_gaussian(1.0);
  kept.add_slot_tail(stored.data(), 1.0);
  left_out.add_slot_tail(stored.data(), 1.0, TailBound::rare_score(1e-15, 10.0, 1.0), 1.0);
  EXPECT_GT(kept.threshold(x), std::sqrt(2 * x) * 1.1);
  EXPECT_NEAR(left_out.threshold(x), std::sqrt(2 * x), 1e-12);
}

// Many small terms: the threshold tends to the Gaussian one of the same variance (Bennett).
TEST(TailBound, ManySmallTermsAreNearlyGaussian) {
  TailBound tb;
  const double n = 1e6, p = 0.1, a = 1e-3;
  tb.add_crossings(n, n * p, n * p * (1 - p) * a * a, a);
  const double g = std::sqrt(2 * 19.0 * tb.variance());
  EXPECT_GT(tb.threshold(19.0), g * 0.999);
  EXPECT_LT(tb.threshold(19.0), g * 1.05);
}

// Simulated: sums of centred Bernoulli terms with mixed p and a (signs random) exceed the
// threshold at x = ln(1000) in at most 1 of 1000 draws on average: count over 20000 draws.
TEST(TailBound, HoldsOnSimulatedSums) {
  struct Term {
    double p, a;
  };
  std::vector<Term> terms;
  const CounterRng shape{7, 1};
  for (int i = 0; i < 200; ++i) terms.push_back({0.5 * std::pow(shape.uniform(2 * i), 6), 1 + 20 * shape.uniform(2 * i + 1)});
  TailBound tb;
  for (const Term& t : terms) tb.add_crossings(1, t.p, t.p * (1 - t.p) * t.a * t.a, t.a);
  const double x = std::log(1000.0), thr = tb.threshold(x);
  const CounterRng r{8, 2};
  int over = 0;
  const int draws = 20000;
  for (int d = 0; d < draws; ++d) {
    double s = 0;
    for (size_t i = 0; i < terms.size(); ++i) {
      const uint64_t c = uint64_t(d) * terms.size() + i;
      const double sign = r.bits(2 * c) & 1 ? 1.0 : -1.0;
      const double b = r.uniform(2 * c + 1) < terms[i].p ? 1.0 : 0.0;
      s += sign * terms[i].a * (b - terms[i].p);
    }
    over += s >= thr;
  }
  // Expected at most 20 (the bound is not tight); 60 would be a broken bound.
  EXPECT_LE(over, 60) << "threshold " << thr << " variance " << tb.variance();
}

// A slot's stored summary gives the same threshold as its terms added one by one, up to the
// bins' rounding of a (a factor at most 2^(1/2) 2^(1/4) on a term's size).
TEST(TailBound, SlotSummaryBoundsItsTerms) {
  const std::vector<std::pair<double, double>> terms = {{0.01, 3.0}, {0.2, 1.0}, {0.05, 0.4}, {1e-4, 2.5}};
  double a_max = 0;
  for (const auto& [p, a] : terms) a_max = std::max(a_max, a);
  FlipTail ft(a_max);
  for (const auto& [p, a] : terms) ft.add(p, a);
  std::vector<double> stored(kFlipTailWidth);
  ft.write(stored.data());
  TailBound one, summary;
  for (const auto& [p, a] : terms) one.add_crossings(1, p, p * (1 - p) * a * a, a);
  summary.add_slot_tail(stored.data(), 1.0);
  EXPECT_NEAR(summary.variance(), one.variance(), 1e-12);
  EXPECT_GE(summary.threshold(10.0), one.threshold(10.0) * 0.999);
  EXPECT_LE(summary.threshold(10.0), one.threshold(10.0) * 1.7);
  // Scaled by f: every size and the threshold scale with |f|.
  TailBound scaled;
  scaled.add_slot_tail(stored.data(), -0.5);
  EXPECT_NEAR(scaled.threshold(10.0), 0.5 * summary.threshold(10.0), 1e-9 * summary.threshold(10.0));
}

}  // namespace
}  // namespace moecheck
