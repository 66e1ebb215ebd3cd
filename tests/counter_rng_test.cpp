// CounterRng (reference/counter_rng.hpp): the Philox-4x32-10 core against Random123's published
// known-answer vectors, regression pins of the derived draws, determinism, the accuracy of the
// portable log / cos / sin, and statistical sanity of 10^6 draws (all within 5 sigma).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "reference/counter_rng.hpp"

namespace moecheck {
namespace {

// Random123 tests/kat_vectors, "philox4x32 10" lines: counter, key -> output.
TEST(CounterRng, PhiloxKnownAnswerVectors) {
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Regression pins: values this implementation produced when it was written, cross-checked then
// with an independent Python model (Philox in integers, Box-Muller with libm log/cos/sin: the
// normals agreed to all printed digits, -1.0744911932, 0.5522812957, -1.7377031282, -1.3020698120). They pin the counter layout, the 53-bit
// conversion and the portable Box-Muller; a change means every generated case changes.
TEST(CounterRng, RegressionPins) {
  const CounterRng rng{0x5EEDull, 7};
  const uint64_t bits[3] = {0x7b658eee01f2e80dull, 0x183b6b53c43dcdaeull, 0x5a8c3cd5dccd6a79ull};
  const double uni[3] = {0x1.ed963bb807cbap-2, 0x1.83b6b53c43dc8p-4, 0x1.6a30f3577335ap-2};
  const double nor[4] = {-0x1.1311dad6b2f27p+0, 0x1.1ac49d2e3f4e9p-1, -0x1.bcda1cb9b8e1ep+0, -0x1.4d54727b99112p+0};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rng.bits(i), bits[i]) << i;
    EXPECT_EQ(rng.uniform(i), uni[i]) << i;
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rng.normal(i), nor[i]) << std::hexfloat << rng.normal(i);
}

TEST(CounterRng, DeterministicAndOrderFree) {
  const CounterRng a{42, 1}, b{42, 1}, other_stream{42, 2}, other_seed{43, 1};
  std::vector<double> fwd(1000), par(1000);
  for (int i = 0; i < 1000; ++i) fwd[i] = a.normal(i);
  std::thread t1([&] { for (int i = 999; i >= 500; --i) par[i] = b.normal(i); });
  std::thread t2([&] { for (int i = 0; i < 500; ++i) par[i] = b.normal(i); });
  t1.join();
  t2.join();
  EXPECT_EQ(fwd, par);
  int same_stream = 0, same_seed = 0;
  for (int i = 0; i < 1000; ++i) {
    same_stream += a.bits(i) == other_stream.bits(i);
    same_seed += a.bits(i) == other_seed.bits(i);
  }
  EXPECT_EQ(same_stream, 0);
  EXPECT_EQ(same_seed, 0);
}

TEST(CounterRng, PortableLogAccuracy) {
  const CounterRng rng{7, 7};
  double worst = 0;
  for (uint64_t i = 0; i < 200000; ++i) {
    // Positive doubles over the whole exponent range, subnormals included.
    const double x = std::bit_cast<double>(rng.bits(i) & 0x7FEF'FFFF'FFFF'FFFFull);
    if (!(x > 0)) continue;
    const double want = std::log(x);
    const double ulp = std::fabs(std::nextafter(want, HUGE_VAL) - want);
    worst = std::max(worst, std::fabs(portable_log(x) - want) / (want == 0 ? 1 : ulp));
  }
  for (int i = 0; i < 200000; ++i) {  // (0, 1]: the Box-Muller range, near 1 included
    const double x = rng.uniform(1000000 + i) * std::ldexp(1.0, -(i % 60));
    if (!(x > 0)) continue;
    const double want = std::log(x);
    if (want == 0) continue;
    const double ulp = std::fabs(std::nextafter(want, HUGE_VAL) - want);
    worst = std::max(worst, std::fabs(portable_log(x) - want) / ulp);
  }
  std::printf("portable_log: worst error %.2f ulp vs std::log\n", worst);
  EXPECT_LE(worst, 3.0);  // measured: 2 ulp (the rounding of s = (m-1)/(m+1) and of the sum)
  EXPECT_EQ(portable_log(1.0), 0.0);
  EXPECT_EQ(portable_log(0.0), -HUGE_VAL);
  EXPECT_TRUE(std::isnan(portable_log(-1.0)));
}

TEST(CounterRng, PortableExpAccuracy) {
  const CounterRng rng{8, 8};
  double worst = 0;
  for (uint64_t i = 0; i < 200000; ++i) {
    const double x = (2 * rng.uniform(i) - 1) * (i % 2 ? 700.0 : 20.0);  // the whole range, and the sigmoid's
    const double want = std::exp(x);
    const double ulp = std::fabs(std::nextafter(want, HUGE_VAL) - want);
    worst = std::max(worst, std::fabs(portable_exp(x) - want) / ulp);
  }
  std::printf("portable_exp: worst error %.2f ulp vs std::exp\n", worst);
  EXPECT_LE(worst, 4.0);
  EXPECT_EQ(portable_exp(0.0), 1.0);
  EXPECT_EQ(portable_exp(800.0), HUGE_VAL);
  EXPECT_EQ(portable_exp(-800.0), 0.0);
}

TEST(CounterRng, PortableCosSinAccuracy) {
  const long double two_pi = 2 * std::acos(-1.0L);
  const CounterRng rng{9, 9};
  double worst = 0;
  for (uint64_t i = 0; i < 200000; ++i) {
    const double u = i < 16 ? i / 16.0 : rng.uniform(i);
    double c, s;
    portable_cos_sin_2pi(u, &c, &s);
    worst = std::max({worst, std::fabs(c - static_cast<double>(std::cos(two_pi * u))),
                      std::fabs(s - static_cast<double>(std::sin(two_pi * u)))});
  }
  std::printf("portable_cos_sin_2pi: worst abs error %.3g vs long double\n", worst);
  EXPECT_LE(worst, 4e-16);
}

TEST(CounterRng, StatisticsOfAMillionDraws) {
  const CounterRng rng{20250101, 5};
  const int n = 1000000;
  double s1 = 0, s2 = 0, s4 = 0, pair = 0, u1 = 0, u2 = 0;
  int tail = 0;
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal(i);
    ASSERT_TRUE(std::isfinite(z) && std::fabs(z) < 8.6) << "normal(" << i << ") = " << z;
    s1 += z;
    s2 += z * z;
    s4 += z * z * z * z;
    tail += std::fabs(z) > 3;
    if (i & 1) pair += z * rng.normal(i - 1);
  }
  const CounterRng urng{20250101, 6};
  for (int i = 0; i < n; ++i) {
    const double u = urng.uniform(i);
    ASSERT_TRUE(u >= 0 && u < 1);
    u1 += u;
    u2 += (u - 0.5) * (u - 0.5);
  }
  const double mean = s1 / n, var = s2 / n - mean * mean, m4 = s4 / n, corr = pair / (n / 2);
  const double p3 = 0.0026997960632601866;  // P(|Z| > 3)
  std::printf("normals: mean %.5f var %.5f m4 %.4f P(|z|>3) %.6f pair corr %.5f; uniform mean %.5f var %.6f\n",
              mean, var, m4, static_cast<double>(tail) / n, corr, u1 / n, u2 / n);
  EXPECT_LE(std::fabs(mean), 5 / std::sqrt(n));
  EXPECT_LE(std::fabs(var - 1), 5 * std::sqrt(2.0 / n));
  EXPECT_LE(std::fabs(m4 - 3), 5 * std::sqrt(96.0 / n));
  EXPECT_LE(std::fabs(static_cast<double>(tail) / n - p3), 5 * std::sqrt(p3 * (1 - p3) / n));
  EXPECT_LE(std::fabs(corr), 5 / std::sqrt(n / 2.0));
  EXPECT_LE(std::fabs(u1 / n - 0.5), 5 * std::sqrt(1.0 / 12 / n));
  EXPECT_LE(std::fabs(u2 / n - 1.0 / 12), 5 * std::sqrt(1.0 / 180 / n));
}

}  // namespace
}  // namespace moecheck
