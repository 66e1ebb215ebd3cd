// The aggregate tests' threshold with rare bounded terms (reference/tail_bound.hpp, BUDGETS.md
// §10.8): it reduces to z sigma without them, stays a valid bound where a simulation can check
// it, and prices a single rare term at its size, not as a Gaussian.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/compare_stages.hpp"
#include "reference/counter_rng.hpp"
#include "reference/noise_model.hpp"
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
// the Gaussian part's own threshold; left out (rare_cut), it costs nothing.
TEST(TailBound, OneRareTermCostsItsSize) {
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
  // judge leaves such terms out and spends their probability by a union bound (rare_cut).
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

// The exact tail at the judge's level: a Gaussian part of variance 1, three crossings of p = 1e-3
// and a = 10, ten of p = 0.2 and a = 1 (each centred, a fixed sign each). Every outcome of the 13
// Bernoullis enumerated, the Gaussian part integrated: P(S >= t) = sum P(outcome) Q(t - s). The
// threshold holds its e^-19; the Gaussian z sigma of the same variance (the model before, BUDGETS.md
// §10.8) does not, by far.
TEST(TailBound, HoldsTheExactTailThatZSigmaMisses) {
  struct Term {
    double p, a;
  };
  std::vector<Term> terms(3, {1e-3, 10.0});
  for (int i = 0; i < 10; ++i) terms.push_back({0.2, i % 2 ? 1.0 : -1.0});
  TailBound tb;
  tb.add_gaussian(1.0);
  for (const Term& t : terms) tb.add_crossings(1, t.p, t.p * (1 - t.p) * t.a * t.a, std::fabs(t.a));
  auto tail = [&](double thr, double sign) {
    double prob = 0;
    for (uint32_t m = 0; m < (1u << terms.size()); ++m) {
      double pm = 1, sum = 0;
      for (size_t i = 0; i < terms.size(); ++i) {
        const bool fired = (m >> i) & 1;
        pm *= fired ? terms[i].p : 1 - terms[i].p;
        sum += terms[i].a * ((fired ? 1.0 : 0.0) - terms[i].p);
      }
      prob += pm * 0.5 * std::erfc((thr - sign * sum) / std::sqrt(2.0));
    }
    return prob;
  };
  const double x = 19.0, t = tb.threshold(x), zs = std::sqrt(2 * x * tb.variance());
  EXPECT_LE(tail(t, 1.0), std::exp(-x)) << "threshold " << t;
  EXPECT_LE(tail(t, -1.0), std::exp(-x)) << "threshold " << t;
  EXPECT_GT(tail(zs, 1.0), 1e3 * std::exp(-x)) << "z sigma " << zs;
  // Not wasteful either: two of the big terms firing (probability 3e-6) must stay above it, but
  // three (1e-9, below e^-19) need not.
  EXPECT_LT(t, 31.0);
}

// A slot's stored summary (8 terms exactly, the rest binned) never gives a smaller threshold than
// its terms one by one, and not much larger: 40 terms over the bins, down to the catch-all bin
// below a_max 2^-7.5, some with p > 1/2 (stored as 1 - p), scaled by a negative f.
TEST(TailBound, SlotSummaryBoundsItsTerms) {
  std::vector<std::pair<double, double>> terms;
  const CounterRng r{11, 3};
  for (int i = 0; i < 40; ++i) {
    const double a = 5.0 * std::exp2(-12.0 * r.uniform(2 * i)), u = r.uniform(2 * i + 1);
    terms.push_back({i % 7 == 0 ? 0.5 + 0.45 * u : 0.3 * u * u * u, a});
  }
  terms.push_back({0.01, 5.0});
  double a_max = 0;
  for (const auto& [p, a] : terms) a_max = std::max(a_max, a);
  FlipTail ft(a_max);
  for (const auto& [p, a] : terms) ft.add(p, a);
  std::vector<double> stored(kFlipTailWidth);
  ft.write(stored.data());
  for (const double f : {1.0, -0.5}) {
    TailBound one, summary;
    for (const auto& [p, a] : terms) {
      const double pp = std::min(p, 1 - p);
      one.add_crossings(1, pp, f * f * pp * (1 - pp) * a * a, std::fabs(f) * a);
    }
    summary.add_slot_tail(stored.data(), f);
    EXPECT_NEAR(summary.variance(), one.variance(), 1e-12 * one.variance());
    for (const double x : {5.0, 19.0}) {
      EXPECT_GE(summary.threshold(x), one.threshold(x) * 0.999) << f << " " << x;
      EXPECT_LE(summary.threshold(x), one.threshold(x) * 2.5) << f << " " << x;
    }
  }
}

// The rare crossings left out by the union bound: at most 0.1e-6 of probability in all, the large
// rare ones first (P c / a). 2000 slots each with a small crossing of p = 1e-9 to 2e-9 and one slot whose
// single crossing of p = 2e-8 is 50 times its slot's flip projection: that one is left out, and
// the small ones only as far as the budget goes.
TEST(TailBound, RareCrossingCutLeavesOutTheLargeRareOnesFirst) {
  const size_t slots = 2001;
  std::vector<double> tails(slots * kFlipTailWidth, 0.0), proj(slots, 1.0);
  auto put = [&](size_t s, double p, double a) {
    FlipTail ft(a);
    ft.add(p, a);
    ft.write(&tails[s * kFlipTailWidth]);
  };
  for (size_t s = 0; s < slots - 1; ++s) put(s, 1e-9 * (1 + double(s) / 2000), 0.01);
  put(slots - 1, 2e-8, 50.0);
  const double cut = compare::rare_crossing_cut(tails, proj);
  EXPECT_GE(cut, TailBound::rare_score(2e-8, 50.0, 1.0));
  double left_out = 0;
  for (size_t s = 0; s < slots; ++s)
    FlipTail::for_each(&tails[s * kFlipTailWidth], [&](double, double P, double, double a) {
      if (TailBound::rare_score(P, a, proj[s]) <= cut) left_out += P;
    });
  EXPECT_LE(left_out, kRareCrossingShare * kFalseAlarmPerOutput);
  EXPECT_GT(left_out, 0.5 * kRareCrossingShare * kFalseAlarmPerOutput);
  // Left out, the big term costs a test nothing beyond its centred value.
  TailBound with, without;
  with.add_gaussian(1.0), without.add_gaussian(1.0);
  with.add_slot_tail(&tails[(slots - 1) * kFlipTailWidth], 1.0);
  without.add_slot_tail(&tails[(slots - 1) * kFlipTailWidth], 1.0, cut, 1.0);
  EXPECT_GT(with.threshold(19.0), 10.0);
  EXPECT_NEAR(without.threshold(19.0), std::sqrt(38.0), 1e-5);
}


// The energy test's large crossings (BUDGETS.md §10.8): one crossing of probability p far above the
// tail level that moves a slot by a must fit under the limit when it happens (the energy then is
// at least a^2), where Bernstein's element-wise limit alone does not; one far below the level
// costs less than its size; small ones are left to Bernstein.
TEST(TailBound, EnergyLimitHoldsALargeCrossingThatMovesAWholeSlot) {
  MoeProblem p;
  p.tokens = 1;
  CompareOptions opt;
  opt.requant_test = false;
  const double en_pred = 1.0, b2 = 1.0 / 256, x = 14.0;  // 256 elements of variance 1/256
  auto limit_with = [&](double prob, double a) {
    compare::JudgedReference J;
    J.energy_tail.assign(size_t(kEnergyTailWidth), 0.0);
    FlipTail ft(a);
    ft.add(prob, a);
    ft.write(J.energy_tail.data());
    const double move = compare::large_crossings_move(J, {0}, true, en_pred, x);
    return std::pair{move, compare::energy_limit(en_pred, en_pred * b2 * 4, 4 * b2, p, 1, opt, move)};
  };
  const double bernstein = compare::energy_limit(en_pred, en_pred * b2 * 4, 4 * b2, p, 1, opt);
  const double a = 3.0;  // energy a^2 = 9 when it happens, with probability 0.117
  ASSERT_LT(bernstein, a * a) << "the case must be one Bernstein alone would fail";
  const auto [move, limit] = limit_with(0.117, a);
  EXPECT_GE(move, a);  // it happens far more often than e^-x: it counts whole
  EXPECT_GE(limit * en_pred, a * a);
  // A crossing far rarer than e^-x costs less than its whole size: Chernoff's bound for one term
  // is about a x / log(1 / p) (no union bound leaves it out here, as rare_cut does for the
  // scale tests).
  const auto [rare_move, rare_limit] = limit_with(1e-12, a);
  EXPECT_LT(rare_move, 0.7 * a);
  EXPECT_LT(rare_limit, limit);
  // Below half the predicted energy's root: left to Bernstein (no move, the same limit).
  const auto [small_move, small_limit] = limit_with(0.117, 0.4);
  EXPECT_EQ(small_move, 0.0);
  EXPECT_EQ(small_limit, bernstein);
}

}  // namespace
}  // namespace moecheck
