// Philox-4x32-10 and the portable log / cos / sin behind CounterRng::normal (counter_rng.hpp).
//
// Every floating-point operation below is +, -, *, / or sqrt on doubles (correctly rounded by
// IEEE 754), or exact bit manipulation and power-of-two scaling; the library is compiled with
// -ffp-contract=off. So normal(i) is the same double on every x86-64/ARM machine and compiler.
#include "reference/counter_rng.hpp"

#include <bit>
#include <cmath>

namespace moecheck {

// --- Philox-4x32-10 ------------------------------------------------------------------
// Round: two 32x32->64 products of words 0 and 2 with the multipliers; the outputs mix the high
// halves with words 1, 3 and the round key. Key schedule: a Weyl sequence (golden ratio and
// sqrt(3)-1 constants). Constants from the Philox paper (SC'11), as in Random123.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kWeyl0;
      k[1] += kWeyl1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

// --- log -----------------------------------------------------------------------------------
// x = m * 2^k with m in [sqrt(1/2), sqrt(2)) (exact, from the bits); log m = 2 atanh(s),
// s = (m-1)/(m+1), |s| <= 0.1716, atanh s = s (1 + s^2/3 + s^4/5 + ...), truncated after s^22
// (next term < 0.1716^24/25 ~ 1e-20 relative). log x = k ln2 + log m with ln2 split in a hi part
// of 32 significant bits (k * hi exact for |k| < 2^21) and the rest.
double portable_log(double x) {
  if (!(x > 0.0)) return x == 0.0 ? -HUGE_VAL : std::nan("");
  if (std::isinf(x)) return x;
  uint64_t u = std::bit_cast<uint64_t>(x);
  int k = 0;
  if ((u >> 52) == 0) {  // subnormal: scale by 2^54 exactly first
    u = std::bit_cast<uint64_t>(x * 0x1p54);
    k = -54;
  }
  k += static_cast<int>(u >> 52) - 1022;                                           // x = m' 2^k, m' in [0.5, 1)
  double m = std::bit_cast<double>((u & 0x000F'FFFF'FFFF'FFFFull) | (1022ull << 52));  // m' exactly
  if (m < 0.70710678118654752) {
    m *= 2.0;
    k -= 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double z = s * s;
  double p = 1.0 / 23.0;
  for (int j = 21; j >= 1; j -= 2) p = p * z + 1.0 / j;  // Horner: sum z^n / (2n+1)
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1, kLn2Lo = 0x1.a39ef35793c76p-33;
  const double logm = 2.0 * s * p;
  return static_cast<double>(k) * kLn2Hi + (static_cast<double>(k) * kLn2Lo + logm);
}

double portable_exp(double x) {
  if (std::isnan(x)) return x;
  if (x > 700.0) return HUGE_VAL;
  if (x < -700.0) return 0.0;
  constexpr double kLn2Hi = 0x1.62e42fee00000p-1, kLn2Lo = 0x1.a39ef35793c76p-33, kInvLn2 = 0x1.71547652b82fep0;
  const double n = std::nearbyint(x * kInvLn2);  // the current rounding mode: to nearest
  const double r = (x - n * kLn2Hi) - n * kLn2Lo;  // n * kLn2Hi is exact (kLn2Hi has 32 bits)
  double p = 1.0;
  for (int j = 15; j >= 1; --j) p = 1.0 + p * r / j;  // Horner: sum r^j / j!, |r|^16/16! < 1e-20
  return std::ldexp(p, static_cast<int>(n));
}

// --- cos / sin of 2 pi u ---------------------------------------------------------------------
// 4u = q + r exactly (q quadrant, r in [0, 1)); angle within the quadrant phi = (pi/2) r, folded to
// [0, pi/4] through the complement 1 - r (exact for r >= 1/2). Taylor series on [0, pi/4]: the
// first omitted terms are (pi/4)^19/19! and (pi/4)^20/20!, both < 1e-19.
namespace {

void sin_cos_small(double x, double* s, double* c) {
  const double z = x * x;
  double ps = 1.0, pc = 1.0;
  // sin x = x (1 - z/(2*3) (1 - z/(4*5) (1 - ...))); cos x = 1 - z/(1*2) (1 - z/(3*4) (1 - ...)).
  for (int n = 17; n >= 3; n -= 2) ps = 1.0 - z / (static_cast<double>(n) * (n - 1)) * ps;
  for (int n = 18; n >= 2; n -= 2) pc = 1.0 - z / (static_cast<double>(n) * (n - 1)) * pc;
  *s = x * ps;
  *c = pc;
}

}  // namespace

void portable_cos_sin_2pi(double u, double* c, double* s) {
  constexpr double kHalfPi = 0x1.921fb54442d18p+0;
  const double t = 4.0 * u;  // exact
  const int q = static_cast<int>(t) & 3;
  const double r = t - static_cast<double>(static_cast<int>(t));  // exact
  double sp, cp;                                                   // sin, cos of (pi/2) r
  if (r <= 0.5) {
    sin_cos_small(kHalfPi * r, &sp, &cp);
  } else {
    sin_cos_small(kHalfPi * (1.0 - r), &cp, &sp);  // sin(pi/2 - y) = cos y
  }
  switch (q) {
    case 0: *c = cp; *s = sp; break;
    case 1: *c = -sp; *s = cp; break;
    case 2: *c = -cp; *s = -sp; break;
    default: *c = sp; *s = -cp; break;
  }
}

double CounterRng::normal(uint64_t i) const {
  const auto b = block(i >> 1);
  const uint64_t w01 = static_cast<uint64_t>(b[0]) | (static_cast<uint64_t>(b[1]) << 32);
  const uint64_t w23 = static_cast<uint64_t>(b[2]) | (static_cast<uint64_t>(b[3]) << 32);
  const double u1 = static_cast<double>((w01 >> 11) + 1) * 0x1p-53;  // (0, 1]: log finite
  const double u2 = static_cast<double>(w23 >> 11) * 0x1p-53;        // [0, 1)
  const double r = std::sqrt(-2.0 * portable_log(u1));
  double c, s;
  portable_cos_sin_2pi(u2, &c, &s);
  return (i & 1) ? r * s : r * c;
}

}  // namespace moecheck
