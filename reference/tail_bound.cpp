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
  if (!std::isfinite(r)) {  // a or a_max not finite: the largest bin (the judge's bound is then infinite)
    n_[0] += 1, p_[0] += pp, v_[0] += INFINITY;
    return;
  }
  const int64_t b = std::clamp<int64_t>(int64_t(std::floor(std::max(r, 0.0))), 0, kFlipTailBins - 1);
  n_[b] += 1, p_[b] += pp, v_[b] += pp * (1 - pp) * a * a;
}

void FlipTail::add(double p, double a) {
  if (!(p > 0) || !(a > 0) || !(a_max_ > 0)) return;
  double pp = std::min(p, 1 - p);
  if (!(pp > 0)) return;  // p = 1: a certain move, no crossing (its second moment stays Gaussian)
  // A crossing below kFlipTailExactP keeps no exact place: the largest sizes with so small a
  // probability would crowd out the terms that decide a test (the judge leaves the rarest out).
  if (pp < kFlipTailExactP) {
    add_to_bin(pp, a);
    return;
  }
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
  if (n == 1) {  // a single term: its own p' (min(p, 1 - p): the sign of a is not known)
    exact_.push_back({a, std::min(P, 1 - P), V});
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
  for (const Single& t : exact_) v += t.V;
  return v;
}

// K at lambda: the Gaussian part, the single terms exactly, the bins (a, n, P, V).
double TailBound::K(double l, const std::vector<FlatBin>& bins, size_t exact) const {
  double s = l * l * gauss_ / 2;
  for (size_t i = 0; i < exact; ++i) s += binomial_cumulant(1, exact_[i].p, l * exact_[i].a);
  for (const FlatBin& b : bins) {
    const double u = l * b.a;
    s += std::min(b.V * phi(u) / (b.a * b.a), binomial_cumulant(b.n, b.P, u));
  }
  return s;
}

double TailBound::threshold(double x) const {
  if (infinite_) return INFINITY;
  const double var = variance();
  if (std::isnan(var)) return NAN;  // no statement (a non-finite term of the reference)
  if (!(var > 0)) return shift_;
  if (bins_.empty() && exact_.empty()) return std::sqrt(2 * x * gauss_) + shift_;
  // The 64 largest single terms exactly, the others binned.
  constexpr size_t kExact = 64;
  std::sort(exact_.begin(), exact_.end(), [](const Single& u, const Single& v) { return u.a > v.a; });
  std::map<int, Bin> merged = bins_;
  for (size_t i = kExact; i < exact_.size(); ++i) {
    Bin& b = merged[bin_key(exact_[i].a)];
    b.n += 1, b.P += exact_[i].p, b.V += exact_[i].V;
  }
  std::vector<FlatBin> bins;
  double a_max = exact_.empty() ? 0.0 : exact_.front().a;
  for (const auto& [q, b] : merged) bins.push_back({bin_top(q), b.n, b.P, b.V}), a_max = std::max(a_max, bin_top(q));
  const size_t exact = std::min(exact_.size(), kExact);
  // Every lambda gives a valid bound. Searched on log lambda from below both 1 / a_max (where a
  // rare large term stops costing) and the Gaussian optimum of the same variance, lambda_G, to
  // 16 lambda_G: coarsely at ratio 2^(1/2), then at 2^(1/16) around the best coarse point
  // (within 0.3% of the minimum there; (K + x) / lambda need not be unimodal with min() bins,
  // which only makes the result a little larger, never invalid).
  const double lg = std::sqrt(2 * x / var);
  const double lo = std::min(lg * 0x1p-12, 0.25 / a_max);
  auto bound_at = [&](double l) { return (K(l, bins, exact) + x) / l; };
  const int coarse = int(std::ceil(2 * std::log2(16 * lg / lo)));
  double best = INFINITY;
  int best_i = 0;
  for (int i = 0; i <= coarse; ++i) {
    const double t = bound_at(lo * std::exp2(double(i) / 2));
    if (t < best) best = t, best_i = i;
  }
  for (int j = -7; j <= 7; ++j)
    if (j != 0) best = std::min(best, bound_at(lo * std::exp2(double(best_i) / 2 + double(j) / 16)));
  return best + shift_;
}

}  // namespace moecheck
