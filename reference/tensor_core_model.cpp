// Bit-level tensor-core inner product (tensor_core_model.hpp).
//
// Exactness: every term is a float32 or a product of two e4m3 values, so term / 2^q is exact in
// double for the grids used here, and cutting it to an integer is exact; the cut terms are summed
// in int64 (|sum| < 2^(frac_bits + 9) <= 2^49 for frac_bits <= 40), and sum 2^q is exact in double.
// Only the final cut to out_bits rounds, on that exact value.
#include "reference/tensor_core_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace moecheck {

namespace {

struct Term {
  double v = 0;  // exact value
  int lead = 0;  // exponent used for the alignment
};

// An e4m3fn code as sign * sig * 2^(e - 3), sig in [0, 15], e the exponent of its field (-6 for
// subnormals and zero).
struct E4m3Parts {
  int sig = 0, e = -6;
  bool neg = false, nan = false;
};

E4m3Parts e4m3_parts(uint8_t code) {
  E4m3Parts p;
  p.neg = code & 0x80;
  const int E = (code >> 3) & 0xF, M = code & 7;
  if (E == 15 && M == 7) p.nan = true;
  p.sig = E == 0 ? M : 8 + M;
  p.e = E == 0 ? -6 : E - 7;
  return p;
}

int ilog2_exact(double v) { return std::ilogb(v); }

double cut_to(double v, int bits, TensorCoreModel::Cut cut, bool nearest) {
  if (v == 0 || !std::isfinite(v)) return v;
  // float32's subnormal range: the spacing never goes below 2^-149.
  const int e = std::max(ilog2_exact(v), -126);
  const double unit = std::ldexp(1.0, e - bits + 1);
  const double x = v / unit;  // exact (power-of-two division)
  double r;
  if (nearest) r = std::nearbyint(x);  // default rounding mode: nearest, ties to even
  else if (cut == TensorCoreModel::Cut::toward_zero) r = std::trunc(x);
  else r = std::floor(x);
  return r * unit;
}

// Grid spacing of `bits` significant bits (float32 range) just below the magnitude x > 0 and at x.
double spacing_at(double x, int bits) { return std::ldexp(1.0, std::max(ilog2_exact(x), -126) - bits + 1); }
double spacing_below(double x, int bits) {
  const int e = std::max(ilog2_exact(x), -126);
  const bool pow2 = x == std::ldexp(1.0, e) && e > -126;
  return std::ldexp(1.0, e - bits + (pow2 ? 0 : 1));
}

// Cut of the exact value hi + lo (hi = fl(hi + lo), |lo| <= ulp(hi) / 2, TwoSum). A grid of
// <= 24 bits is far coarser than hi's ulp, so hi + lo and hi share a grid cell unless hi is a grid
// point; then lo decides whether the exact value lies below it.
double cut_pair(double hi, double lo, int bits, TensorCoreModel::Cut cut, bool nearest) {
  const double r = cut_to(hi, bits, cut, nearest);
  if (nearest || lo == 0 || r != hi || hi == 0) return r;  // (hi = 0 implies lo = 0)
  const double mag = std::fabs(hi);
  if (cut == TensorCoreModel::Cut::toward_zero)
    return (hi > 0) == (lo > 0) ? r : (hi > 0 ? r - spacing_below(mag, bits) : r + spacing_below(mag, bits));
  if (lo > 0) return r;
  return hi > 0 ? r - spacing_below(mag, bits) : r - spacing_at(mag, bits);
}

// Sum of the terms, aligned to their largest lead and cut to frac_bits below it.
double aligned_sum(const TensorCoreModel& m, const Term* t, int n) {
  int emax = std::numeric_limits<int>::min();
  for (int i = 0; i < n; ++i)
    if (t[i].v != 0) emax = std::max(emax, t[i].lead);
  if (emax == std::numeric_limits<int>::min()) return 0.0;
  const int q = emax - m.frac_bits;
  int64_t s = 0;
  for (int i = 0; i < n; ++i) {
    if (t[i].v == 0) continue;
    const double x = std::ldexp(t[i].v, -q);
    s += int64_t(m.cut == TensorCoreModel::Cut::toward_zero ? std::trunc(x) : std::floor(x));
  }
  return std::ldexp(double(s), q);
}

}  // namespace

std::string TensorCoreModel::describe() const {
  return fmt::format("group {}, {} bits below the {} exponent cut {}, c {}, result {} to {} bits", group, frac_bits,
                     exponent == Exponent::field_sum ? "field-sum" : "exact",
                     cut == Cut::toward_zero ? "toward zero" : "toward -inf", c_aligned ? "aligned" : "added after",
                     out_nearest ? "rounded to nearest" : (out_cut == Cut::toward_zero ? "cut toward zero" : "cut toward -inf"),
                     out_bits);
}

float tc_instruction(const TensorCoreModel& m, const uint8_t* a, const uint8_t* b, int n, float c) {
  if (m.frac_bits < 1 || m.frac_bits > 40) throw std::invalid_argument("tensor-core model: frac_bits must be in [1, 40]");
  if (m.group < 1) throw std::invalid_argument("tensor-core model: group must be >= 1");
  Term terms[65];
  double acc = c;
  if (std::isnan(acc)) return std::numeric_limits<float>::quiet_NaN();
  for (int g0 = 0; g0 < n; g0 += m.group) {
    const int gn = std::min(m.group, n - g0);
    if (gn > 64) throw std::invalid_argument("tensor-core model: group of more than 64 products");
    int nt = 0;
    for (int i = g0; i < g0 + gn; ++i) {
      const E4m3Parts pa = e4m3_parts(a[i]), pb = e4m3_parts(b[i]);
      if (pa.nan || pb.nan) return std::numeric_limits<float>::quiet_NaN();
      const int sig = pa.sig * pb.sig;
      if (sig == 0) continue;
      Term t;
      t.v = std::ldexp(double(pa.neg != pb.neg ? -sig : sig), pa.e + pb.e - 6);
      t.lead = m.exponent == TensorCoreModel::Exponent::field_sum ? pa.e + pb.e : ilog2_exact(std::fabs(t.v));
      terms[nt++] = t;
    }
    double r;
    if (m.c_aligned) {
      if (acc != 0) terms[nt++] = Term{acc, std::max(ilog2_exact(acc), -126)};
      r = cut_to(aligned_sum(m, terms, nt), m.out_bits, m.out_cut, m.out_nearest);
    } else {
      const double s = aligned_sum(m, terms, nt);
      const double hi = acc + s, lo = (acc - (hi - s)) + (s - (hi - (hi - s)));  // TwoSum: hi + lo = acc + s
      r = cut_pair(hi, lo, m.out_bits, m.out_cut, m.out_nearest);
    }
    acc = r;
  }
  return float(acc);  // exact: acc has at most out_bits <= 24 significant bits in float32 range
}

float tc_chain(const TensorCoreModel& m, const uint8_t* a, const uint8_t* b, int n, int nk, float c) {
  float d = c;
  for (int i = 0; i < nk; ++i) d = tc_instruction(m, a + i * n, b + i * n, n, d);
  return d;
}

}  // namespace moecheck
