#include "reference/tail_bound.hpp"

#include <algorithm>
#include <cmath>

namespace moecheck {

namespace {
// phi(u) = e^u - 1 - u, u >= 0, by its series below 1e-4 where the closed form cancels.
double phi(double u) { return u < 1e-4 ? u * u * (0.5 + u * (1.0 / 6 + u / 24)) : std::expm1(u) - u; }

// n log(1 - r + r e^u) - n r u, r = P / n: n centred Bernoulli(r) terms of size 1 at lambda = u.
// For u > 0 written as n (u + log(r + (1 - r) e^-u)) - P u, which neither overflows nor loses
// the small difference where r e^u is large.
double binomial_cumulant(double n, double P, double u) {
  const double r = P / n;
  if (u < 1) return n * std::log1p(r * std::expm1(u)) - P * u;
  return n * (u + std::log(r + (1 - r) * std::exp(-u))) - P * u;
}

double bin_top(int q) { return std::exp2(double(q) / 4); }
}  // namespace

double FlipTail::bin_bound(double a_max, int64_t b) { return a_max * std::exp2(-double(b) / 2); }

void FlipTail::add_to_bin(double pp, double a) {
  const double r = -2 * std::log2(a / a_max_);
  const int64_t b = std::clamp<int64_t>(int64_t(std::floor(std::max(r, 0.0))), 0, kFlipTailBins - 1);
  n_[b] += 1, p_[b] += pp, v_[b] += pp * (1 - pp) * a * a;
}

void FlipTail::add(double p, double a) {
  if (!(p > 0) || !(a > 0) || !(a_max_ > 0)) return;
  double pp = std::min(p, 1 - p);
  // Insert into the exact list (a descending); what falls off its end goes to the bins.
  for (int64_t i = 0; i < kFlipTailExact; ++i)
    if (exact_p_[i] == 0 || a >= exact_a_[i]) {
      std::swap(pp, exact_p_[i]), std::swap(a, exact_a_[i]);
      if (pp == 0) return;
    }
  add_to_bin(pp, a);
}

void FlipTail::write(double* out) const {
  out[0] = a_max_;
  for (int64_t i = 0; i < kFlipTailExact; ++i) out[1 + 2 * i] = exact_p_[i], out[2 + 2 * i] = exact_a_[i];
  double* bins = out + 1 + 2 * kFlipTailExact;
  for (int64_t b = 0; b < kFlipTailBins; ++b) bins[3 * b] = n_[b], bins[3 * b + 1] = p_[b], bins[3 * b + 2] = v_[b];
}

double FlipTail::variance(const double* tail) {
  double v = 0;
  for_each(tail, [&](double, double, double V, double) { v += V; });
  return v;
}

int TailBound::bin_key(double a) {
  int q = int(std::ceil(4 * std::log2(a)));
  while (bin_top(q) < a) ++q;
  while (bin_top(q - 1) >= a) --q;
  return q;
}

void TailBound::add_crossings(double n, double P, double V, double a) {
  if (!(P > 0) || !(V > 0)) return;
  if (!std::isfinite(a) || !std::isfinite(V)) {
    infinite_ = true;
    return;
  }
  if (!(a > 0)) return;
  if (n == 1) {
    exact_.push_back({a, P});
    return;
  }
  Bin& b = bins_[bin_key(a)];
  b.n += n, b.P += P, b.V += V;
}

void TailBound::add_slot_tail(const double* tail, double f, double rare_cut, double c) {
  const double s = std::fabs(f);
  FlipTail::for_each(tail, [&](double n, double P, double V, double a) {
    if (rare_score(P, a, c) <= rare_cut)
      shift_ += P * a * s;
    else
      add_crossings(n, P, f * f * V, a * s);
  });
}

double TailBound::variance() const {
  double v = gauss_;
  for (const auto& [q, b] : bins_) v += b.V;
  for (const auto& [a, p] : exact_) v += p * (1 - p) * a * a;
  return v;
}

// K at lambda with the first `exact` single terms exact and `bins` for the rest.
double TailBound::K(double l, const std::map<int, Bin>& bins, size_t exact) const {
  double s = l * l * gauss_ / 2;
  for (size_t i = 0; i < exact; ++i) s += binomial_cumulant(1, exact_[i].second, l * exact_[i].first);
  for (const auto& [q, b] : bins) {
    const double a = bin_top(q), u = l * a;
    s += std::min(b.V * phi(u) / (a * a), binomial_cumulant(b.n, b.P, u));
  }
  return s;
}

double TailBound::threshold(double x) const {
  if (infinite_) return INFINITY;
  const double var = variance();
  if (!(var > 0)) return shift_;
  if (bins_.empty() && exact_.empty()) return std::sqrt(2 * x * gauss_) + shift_;
  // The 64 largest single terms exactly, the others binned.
  constexpr size_t kExact = 64;
  std::sort(exact_.begin(), exact_.end(), [](const auto& u, const auto& v) { return u.first > v.first; });
  std::map<int, Bin> bins = bins_;
  for (size_t i = kExact; i < exact_.size(); ++i) {
    const auto [a, p] = exact_[i];
    Bin& b = bins[bin_key(a)];
    b.n += 1, b.P += p, b.V += p * (1 - p) * a * a;
  }
  const size_t exact = std::min(exact_.size(), kExact);
  // Every lambda gives a valid bound: the best on a grid of ratio 2^(1/16) (within 0.3% of the
  // minimum where that lies inside it) from 2^-12 to 2^4 times the Gaussian optimum of the same
  // variance, lambda_G (rare large terms move the optimum below lambda_G).
  const double lg = std::sqrt(2 * x / var);
  double best = INFINITY;
  for (int i = -192; i <= 64; ++i) {
    const double l = lg * std::exp2(double(i) / 16);
    best = std::min(best, (K(l, bins, exact) + x) / l);
  }
  return best + shift_;
}

}  // namespace moecheck
