// Counter-based random numbers for test data that must be bit-identical on every machine.
//
// Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3",
// SC'11): a keyed bijection of a 128-bit counter. Value i of (seed, stream) is a pure function of
// (seed, stream, i): no state, any order, any thread split gives the same numbers.
//   key     = (seed low 32 bits, seed high 32 bits)
//   counter = (i low, i high, stream low, stream high)
// Checked against Random123's published known-answer vectors (tests/counter_rng_test.cpp).
//
// Derived values (all in plain IEEE double arithmetic: +, -, *, / and sqrt, which are correctly
// rounded everywhere; no libm transcendental, whose last bits differ between libraries; the
// reference library is built with -ffp-contract=off so no FMA changes a rounding):
//   bits(i)    = words 0,1 of block i (64 bits)
//   uniform(i) = (bits(i) >> 11) * 2^-53 in [0, 1)
//   normal(i)  = Box-Muller on block i/2: u1 = (53 bits of words 0,1 + 1) * 2^-53 in (0, 1],
//                u2 = 53 bits of words 2,3 * 2^-53 in [0, 1); r = sqrt(-2 log u1);
//                even i -> r cos(2 pi u2), odd i -> r sin(2 pi u2) (an independent N(0,1) pair).
// A stream serves one kind of draw: bits/uniform(j) and normal(2j) read the same block j, so
// draw a tensor's uniforms and its normals from different streams.
#pragma once

#include <array>
#include <cstdint>

namespace moecheck {

// One Philox-4x32-10 block (the raw bijection; words in Random123's order).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

struct CounterRng {
  uint64_t seed = 0;
  uint64_t stream = 0;

  std::array<uint32_t, 4> block(uint64_t i) const {
    return philox4x32_10({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(stream),
                          static_cast<uint32_t>(stream >> 32)},
                         {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  }
  uint64_t bits(uint64_t i) const {
    const auto b = block(i);
    return static_cast<uint64_t>(b[0]) | (static_cast<uint64_t>(b[1]) << 32);
  }
  double uniform(uint64_t i) const { return static_cast<double>(bits(i) >> 11) * 0x1p-53; }
  double normal(uint64_t i) const;
};

// The portable elementary functions behind normal(), exposed for their accuracy tests.
// log of a positive finite double (|error| within a few ulp), from frexp (exact) and a series.
double portable_log(double x);
// exp of a finite double in [-700, 700] (|error| within a few ulp): x = n ln2 + r with n an
// integer and |r| <= ln2 / 2, a Taylor series of degree 15 for e^r, then 2^n exactly.
double portable_exp(double x);
// cos(2 pi u) and sin(2 pi u) for u in [0, 1) (|error| ~ 1e-16), by exact octant reduction of u.
void portable_cos_sin_2pi(double u, double* c, double* s);

}  // namespace moecheck
