// The threshold of an aggregate test whose noise holds rare, large terms (BUDGETS.md §10.8).
//
// A test statistic S is a sum of independent zero-mean terms: a sub-Gaussian part of variance
// proxy G (log E e^(lambda S_G) <= lambda^2 G / 2), and re-quantization crossings: a code that
// crosses a rounding boundary with probability p moves the statistic by a (the code's step
// projected on the statistic), the centred term X = a (B - p), B ~ Bernoulli(p). A Gaussian tail
// of the variance p (1 - p) a^2 treats such a term as impossible at a, though it happens with
// probability p (a gate false alarm: BUDGETS.md §10.8). Chernoff's bound keeps each term's own
// (p, a):
//   P(S >= t) <= exp(K(lambda) - lambda t),  K = lambda^2 G / 2 + sum_i K_i(lambda)
// for every lambda > 0, so the threshold at tail probability e^-x is the minimum over lambda of
// (K(lambda) + x) / lambda; with no crossings it is sqrt(2 x G), the Gaussian z sigma at
// x = z^2 / 2. Each K_i(lambda) = log(1 - p + p e^(lambda a)) - lambda p a, for the sign of a not
// known, with p' = min(p, 1 - p) in place of p (for p <= 1/2 the upper tail's cumulant is the
// larger one: K_p(u) >= K_p(-u), u >= 0, and X for p and -X for 1 - p are the same term).
//
// The largest single terms are kept exactly (up to 64 per test; 8 per slot as stored). The
// others are grouped by a, rounded up (the cumulant grows with a), and per group bounded two
// ways, the smaller taken: by concavity in p, n terms of sum p' P are at most n times the
// cumulant at p' = P / n (exact for one term: a single rare crossing costs a, not a Poisson
// tail); and by Bennett's inequality, V phi(lambda a) / a^2, V their variance, phi(u) = e^u - 1
// - u (tight for many small terms).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace moecheck {

// A slot's crossings as stored with the reference (/reference/quantized/slot_flip_tail,
// golden/FORMAT.md): entry 0 the largest a, a_max; then the kFlipTailExact largest crossings of
// p' >= kFlipTailExactP as (p', a) pairs, a descending ((0, 0) where the slot has fewer); then per bin b =
// 0..kFlipTailBins-1, of the other terms with a in (a_max 2^(-(b+1)/2), a_max 2^(-b/2)] (the last
// bin also everything smaller), their count, sum of p' and sum of p' (1 - p') a^2.
inline constexpr int64_t kFlipTailExact = 8;
inline constexpr double kFlipTailExactP = 1e-12;  // the smallest p' kept exactly
inline constexpr int64_t kFlipTailBins = 16;
inline constexpr int64_t kFlipTailWidth = 1 + 2 * kFlipTailExact + 3 * kFlipTailBins;
// The energy test's summary (ForwardResult::slot_energy_tail): a FlipTail of the crossings of
// p <= 1/2, then the sum of the sizes of those of p > 1/2.
inline constexpr int64_t kEnergyTailWidth = kFlipTailWidth + 1;

// Builds one slot's summary (a_max first: the largest a of the terms to come).
class FlipTail {
 public:
  explicit FlipTail(double a_max) : a_max_(a_max) {}
  void add(double p, double a);  // a crossing of probability p moving the slot's statistic by a
  void write(double* out) const;  // kFlipTailWidth entries
  static double bin_bound(double a_max, int64_t b);  // a_max 2^(-b/2)
  static double variance(const double* tail);        // the sum of the terms' variances
  // Writes the summary of the terms each(add) yields, add(p, a) once per term (those of p > 0
  // count): each is called twice, since the bins are placed against the largest a.
  template <class Each>
  static void write_terms(Each&& each, double* out) {
    double a_max = 0;
    each([&](double p, double a) {
      if (p > 0) a_max = std::max(a_max, a);
    });
    FlipTail ft(a_max);
    each([&](double p, double a) {
      if (p > 0) ft.add(p, a);
    });
    ft.write(out);
  }
  // Calls f(n, P, V, a) for every exact term (n = 1) and bin of a stored summary.
  template <class F>
  static void for_each(const double* tail, F&& f) {
    for (int64_t i = 0; i < kFlipTailExact; ++i) {
      const double p = tail[1 + 2 * i], a = tail[2 + 2 * i];
      if (p > 0) f(1.0, p, p * (1 - p) * a * a, a);
    }
    const double* bins = tail + 1 + 2 * kFlipTailExact;
    for (int64_t b = 0; b < kFlipTailBins; ++b)
      if (bins[3 * b + 1] > 0) f(bins[3 * b], bins[3 * b + 1], bins[3 * b + 2], bin_bound(tail[0], b));
  }

 private:
  void add_to_bin(double pp, double a);
  double a_max_;
  double exact_p_[kFlipTailExact] = {}, exact_a_[kFlipTailExact] = {};  // a descending
  double n_[kFlipTailBins] = {}, p_[kFlipTailBins] = {}, v_[kFlipTailBins] = {};
};

class TailBound {
 public:
  void add_gaussian(double var) { gauss_ += var; }
  // n crossings of a at most `a`, of sum p' P and sum of variances V (each term's p' <= 1/2);
  // n = 1 is kept exactly (with min(P, 1 - P)).
  void add_crossings(double n, double P, double V, double a);
  // A slot's stored summary (FlipTail) with the slot's terms scaled by f in the statistic. The
  // terms and bins of rare_score(P, a, c) <= rare_cut are left out (the caller has spent their
  // probability of happening elsewhere; c: the slot's flip projection), and their centred value
  // when none happens, at most P a, is added to the threshold.
  void add_slot_tail(const double* tail, double f, double rare_cut = -1, double c = 0);
  // The order in which rare crossings are left out: probability per size relative to the
  // slot's own flip projection c, so that the large rare terms, which cost Chernoff's bound
  // most, go first.
  static double rare_score(double P, double a, double c) { return a > 0 ? P * c / a : INFINITY; }
  // A t with P(S >= t) <= e^-x, and P(S <= -t) too, under the bound (x > 0): the smallest over a
  // search of lambda; infinite for an infinite term, NaN for a NaN one.
  double threshold(double x) const;
  // The sum of the variances: what a Gaussian model would use.
  double variance() const;

 private:
  struct Bin {
    double n = 0, P = 0, V = 0;
  };
  struct FlatBin {
    double a, n, P, V;
  };
  static int bin_key(double a);  // the smallest q with 2^(q/4) >= a
  double K(double lambda, const std::vector<FlatBin>& bins, size_t exact) const;
  double gauss_ = 0, shift_ = 0;
  bool infinite_ = false;
  std::map<int, Bin> bins_;  // key q: terms with a in (2^((q-1)/4), 2^(q/4)]
  struct Single {
    double a, p, V;  // bound, p', variance (at most p' (1 - p') a^2: a may be a bin's top)
  };
  mutable std::vector<Single> exact_;  // single terms, the largest kept exactly
};

}  // namespace moecheck
