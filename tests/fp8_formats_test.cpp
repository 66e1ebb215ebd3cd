// Number formats (reference/fp8_formats.hpp) against the format definitions, not against the
// implementation: every FP8 / UE8M0 code is decoded here independently from its bit fields
// (sign, exponent, mantissa, bias, subnormal rule, NaN/inf codes of the OCP FP8 specification;
// e4m3fnuz: LLVM APFloat.h), then the encoders are checked on hand-picked boundary cases (ties,
// overflow thresholds, subnormals, signed zeros, NaN/inf) and on every midpoint between
// consecutive codes.
// The all-float32 comparison with CUDA's own conversions is fp8_conversion_exhaustive_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "reference/fp8_formats.hpp"

namespace moecheck {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The format definitions (OCP FP8 specification; e4m3fnuz: LLVM APFloat.h), as data.
struct Def {
  Fp8Format f;
  int ebits, mbits, bias;
  const char* name;
};
constexpr Def kDefs[] = {{Fp8Format::e4m3fn, 4, 3, 7, "float8_e4m3fn"},
                         {Fp8Format::e5m2, 5, 2, 15, "float8_e5m2"},
                         {Fp8Format::e4m3fnuz, 4, 3, 8, "float8_e4m3fnuz"}};

// Independent decoder: (-1)^S * 2^(E - bias) * (1 + M / 2^m), or 2^(1 - bias) * (M / 2^m) for
// E = 0; specials per format: e4m3fn NaN = S.1111.111 only; e5m2 E = 11111 is inf (M = 0) or
// NaN; e4m3fnuz 0x80 ("negative zero") is the only NaN.
double spec_value(const Def& d, unsigned code) {
  const unsigned s = code >> 7, e = (code >> d.mbits) & ((1u << d.ebits) - 1), m = code & ((1u << d.mbits) - 1);
  const unsigned emax_field = (1u << d.ebits) - 1;
  if (d.f == Fp8Format::e4m3fn && e == emax_field && m == (1u << d.mbits) - 1) return kNaN;
  if (d.f == Fp8Format::e5m2 && e == emax_field) return m == 0 ? (s ? -kInf : kInf) : kNaN;
  if (d.f == Fp8Format::e4m3fnuz && code == 0x80) return kNaN;
  const double frac = static_cast<double>(m) / std::pow(2.0, d.mbits);
  const double mag = e == 0 ? std::pow(2.0, 1 - d.bias) * frac : std::pow(2.0, static_cast<int>(e) - d.bias) * (1 + frac);
  return s ? -mag : mag;
}

bool same(double a, double b) {  // equal including the sign of zero, or both NaN
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

TEST(Fp8Formats, EveryCodeDecodesToItsSpecValue) {
  for (const Def& d : kDefs) {
    const float* table = fp8_table(d.f);
    for (unsigned c = 0; c < 256; ++c) {
      const double want = spec_value(d, c);
      EXPECT_TRUE(same(fp8_decode(static_cast<uint8_t>(c), d.f), want))
          << d.name << " code 0x" << std::hex << c << ": got " << fp8_decode(static_cast<uint8_t>(c), d.f)
          << ", spec " << want;
      EXPECT_TRUE(same(table[c], want)) << d.name << " table code 0x" << std::hex << c;
    }
  }
  EXPECT_EQ(fp8_max(Fp8Format::e4m3fn), 448.0);
  EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.0);
  EXPECT_EQ(fp8_max(Fp8Format::e4m3fnuz), 240.0);
  for (unsigned c = 0; c < 256; ++c)
    EXPECT_TRUE(same(e4m3_decode(static_cast<uint8_t>(c)), spec_value(kDefs[0], c)));
}

TEST(Fp8Formats, NamesRoundTrip) {
  for (const Def& d : kDefs) {
    EXPECT_EQ(to_string(d.f), d.name);
    EXPECT_EQ(parse_fp8_format(d.name), d.f);
  }
  EXPECT_EQ(parse_fp8_format("e4m3"), std::nullopt);
  EXPECT_EQ(parse_fp8_format("float8_e4m3fn "), std::nullopt);
}

TEST(Fp8Formats, TableIsBuiltOnceAcrossThreads) {
  std::vector<const float*> seen(8);
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) ts.emplace_back([&seen, t] { seen[t] = fp8_table(Fp8Format::e5m2); });
  for (auto& t : ts) t.join();
  for (const float* p : seen) EXPECT_EQ(p, fp8_table(Fp8Format::e5m2));
}

// encode(decode(c)) == c for every non-NaN code; midpoints go to the even code, one double ulp
// either side goes to the nearer code. Values from the independent decoder.
TEST(Fp8Formats, EncodeRoundTripsAndMidpoints) {
  for (const Def& d : kDefs) {
    for (unsigned c = 0; c < 256; ++c) {
      const double v = spec_value(d, c);
      if (std::isnan(v)) continue;
      for (Saturation s : {Saturation::finite, Saturation::none}) {
        if (std::isinf(v) && s == Saturation::finite) continue;  // inf saturates to max
        EXPECT_EQ(fp8_encode(v, d.f, s), c) << d.name << " code 0x" << std::hex << c;
      }
      if (d.f == Fp8Format::e4m3fn) {
        EXPECT_EQ(e4m3_encode_satfinite(static_cast<float>(v)), c);
      }
    }
    int checked = 0;
    for (unsigned c = 0; c + 1 < 0x80; ++c) {  // positive codes c, c+1, both finite
      const double lo = spec_value(d, c), hi = spec_value(d, c + 1);
      if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo < hi)) continue;
      const double mid = (lo + hi) / 2;  // exact: both have few bits
      const unsigned even = (c & 1u) ? c + 1 : c;
      for (double sign : {1.0, -1.0}) {
        const unsigned sbit = sign < 0 ? 0x80u : 0u;
        auto code = [&](unsigned mag) { return (d.f == Fp8Format::e4m3fnuz && mag == 0) ? 0u : (mag | sbit); };
        EXPECT_EQ(fp8_encode(sign * mid, d.f), code(even)) << d.name << " midpoint " << sign * mid;
        EXPECT_EQ(fp8_encode(sign * std::nextafter(mid, kInf), d.f), code(c + 1)) << d.name << " above " << mid;
        EXPECT_EQ(fp8_encode(sign * std::nextafter(mid, 0.0), d.f), code(c)) << d.name << " below " << mid;
      }
      ++checked;
    }
    EXPECT_GT(checked, 100) << d.name;
  }
}

TEST(Fp8Formats, E4m3fnHandPickedEncodes) {
  const auto fn = Fp8Format::e4m3fn;
  const auto none = Saturation::none;
  struct C { double x; unsigned sat, nosat; };
  const C cases[] = {
      {1.0, 0x38, 0x38},
      {1.0 + 0x1p-4, 0x38, 0x38},            // tie between 1 (0x38, even) and 1.125 (0x39)
      {1.0 + 3 * 0x1p-4, 0x3A, 0x3A},        // tie between 0x39 and 0x3A (even)
      {1.0 + 0x1p-4 + 0x1p-40, 0x39, 0x39},  // just above the tie (not a float)
      {432.0, 0x7E, 0x7E},                   // tie between 416 (0x7D) and 448 (0x7E, even)
      {448.0, 0x7E, 0x7E},
      {449.0, 0x7E, 0x7E},
      {464.0, 0x7E, 0x7E},                   // midpoint to the non-existent 480: even is 448
      {464.0001, 0x7E, 0x7F},
      {-464.0001, 0xFE, 0xFF},               // overflow to NaN keeps the sign (S.1111.111)
      {kInf, 0x7E, 0x7F},
      {-kInf, 0xFE, 0xFF},
      {kNaN, 0x7F, 0x7F},
      {-kNaN, 0x7F, 0x7F},
      {0.0, 0x00, 0x00},
      {-0.0, 0x80, 0x80},
      {0x1p-9, 0x01, 0x01},                  // smallest subnormal
      {0x1p-10, 0x00, 0x00},                 // half of it: tie to even (zero)
      {0x1p-10 + 0x1p-60, 0x01, 0x01},
      {-0x1p-10, 0x80, 0x80},
      {1e-30, 0x00, 0x00},
      {3 * 0x1p-10, 0x02, 0x02},             // 1.5 * 2^-9: tie between 0x01 and 0x02
      {7 * 0x1p-9, 0x07, 0x07},              // largest subnormal
      {7.5 * 0x1p-9, 0x08, 0x08},            // tie between 0x07 and 0x08 (smallest normal, even)
      {0x1p-6, 0x08, 0x08},
      {-1.75, 0xBE, 0xBE},
  };
  for (const C& c : cases) {
    EXPECT_EQ(fp8_encode(c.x, fn), c.sat) << "x = " << c.x;
    EXPECT_EQ(fp8_encode(c.x, fn, none), c.nosat) << "x = " << c.x;
    const float xf = static_cast<float>(c.x);
    if (static_cast<double>(xf) == c.x || std::isnan(c.x)) {
      EXPECT_EQ(e4m3_encode_satfinite(xf), c.sat) << "fast path, x = " << c.x;
    }
  }
}

TEST(Fp8Formats, E5m2AndFnuzHandPickedEncodes) {
  const auto e5 = Fp8Format::e5m2, uz = Fp8Format::e4m3fnuz;
  const auto none = Saturation::none;
  EXPECT_EQ(fp8_encode(57344.0, e5, none), 0x7B);
  EXPECT_EQ(fp8_encode(61440.0 - 0x1p-30, e5, none), 0x7B);
  EXPECT_EQ(fp8_encode(61440.0, e5, none), 0x7C);  // tie: max (mantissa 11) vs 2^16 = inf (even)
  EXPECT_EQ(fp8_encode(61440.0, e5), 0x7B);
  EXPECT_EQ(fp8_encode(-kInf, e5, none), 0xFC);
  EXPECT_EQ(fp8_encode(-kInf, e5), 0xFB);
  EXPECT_EQ(fp8_encode(kNaN, e5), 0x7F);
  EXPECT_EQ(fp8_encode(0x1p-16, e5), 0x01);
  EXPECT_EQ(fp8_encode(0x1p-17, e5), 0x00);
  EXPECT_EQ(fp8_encode(-0x1p-17, e5), 0x80);
  EXPECT_EQ(fp8_encode(-0.0, e5), 0x80);

  EXPECT_EQ(fp8_encode(240.0, uz, none), 0x7F);
  EXPECT_EQ(fp8_encode(248.0 - 0x1p-40, uz, none), 0x7F);
  EXPECT_EQ(fp8_encode(248.0, uz, none), 0x80);  // tie: 240 has an odd mantissa -> 256: overflow
  EXPECT_EQ(fp8_encode(248.0, uz), 0x7F);
  EXPECT_EQ(fp8_encode(-kInf, uz), 0xFF);
  EXPECT_EQ(fp8_encode(-kInf, uz, none), 0x80);
  EXPECT_EQ(fp8_encode(kNaN, uz), 0x80);
  EXPECT_EQ(fp8_encode(-0.0, uz), 0x00);      // no negative zero
  EXPECT_EQ(fp8_encode(-1e-5, uz), 0x00);     // negative underflow -> +0
  EXPECT_EQ(fp8_encode(-0x1p-11, uz), 0x00);  // tie with zero -> +0
  EXPECT_EQ(fp8_encode(-0x1p-10, uz), 0x81);  // smallest subnormal 2^-10
  EXPECT_EQ(fp8_encode(1.0, uz), 0x40);
}

TEST(Ue8m0, EveryCodeAndCeil) {
  for (unsigned c = 0; c < 256; ++c) {
    const double v = ue8m0_decode(static_cast<uint8_t>(c));
    if (c == 0xFF) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(v, std::pow(2.0, static_cast<int>(c) - 127)) << "code " << c;
    if (c == 0xFE) continue;  // 2^127 is the largest: 0xFE is the clamp, not the exact value
    EXPECT_EQ(ue8m0_encode_ceil(v), c);
    EXPECT_EQ(ue8m0_encode_ceil(v * (1 + 0x1p-52)), c + 1) << "just above 2^" << static_cast<int>(c) - 127;
    EXPECT_EQ(ue8m0_encode_ceil(v * (1 - 0x1p-53)), c == 0 ? 0u : c) << "just below";
  }
  EXPECT_EQ(ue8m0_encode_ceil(0x1p127), 0xFE);
  EXPECT_EQ(ue8m0_encode_ceil(3.0), 0x81);
  EXPECT_EQ(ue8m0_encode_ceil(448.0 / 448.0), 0x7F);
  EXPECT_EQ(ue8m0_encode_ceil(0.0), 0x00);
  EXPECT_EQ(ue8m0_encode_ceil(-5.0), 0x00);
  EXPECT_EQ(ue8m0_encode_ceil(1e-300), 0x00);
  EXPECT_EQ(ue8m0_encode_ceil(1e300), 0xFE);
  EXPECT_EQ(ue8m0_encode_ceil(kInf), 0xFE);
  EXPECT_EQ(ue8m0_encode_ceil(kNaN), 0xFF);
}

TEST(Bf16, SampleValuesAndRounding) {
  EXPECT_EQ(bf16_decode(0x3F80), 1.0f);
  EXPECT_EQ(bf16_decode(0xC000), -2.0f);
  EXPECT_EQ(bf16_decode(0x0001), 0x1p-133f);
  EXPECT_EQ(bf16_decode(0x7F7F), 0x1.FEp127f);
  EXPECT_TRUE(std::isinf(bf16_decode(0x7F80)));
  EXPECT_EQ(bf16_encode(1.0 + 0x1p-8), 0x3F80);      // tie -> even
  EXPECT_EQ(bf16_encode(1.0 + 3 * 0x1p-8), 0x3F82);  // tie -> even
  EXPECT_EQ(bf16_encode(1.0 + 0x1p-8 + 0x1p-40), 0x3F81);
  EXPECT_EQ(bf16_encode(0x1.FEp127 + 0x1p119), 0x7F80);  // midpoint to 2^128: even is inf
  EXPECT_EQ(bf16_encode(0x1.FEp127 + 0x1p119 - 0x1p80), 0x7F7F);
  EXPECT_EQ(bf16_encode(-kInf), 0xFF80);
  EXPECT_EQ(bf16_encode(-0.0), 0x8000);
  EXPECT_EQ(bf16_encode(0x1p-134), 0x0000);  // half the smallest subnormal: tie -> 0
  EXPECT_EQ(bf16_encode(0x1p-134 + 0x1p-150), 0x0001);
  const uint16_t nan = bf16_encode(-kNaN);
  EXPECT_TRUE(std::isnan(bf16_decode(nan)));
  EXPECT_NE(nan & 0x0040, 0) << "NaN must be quiet";
  EXPECT_EQ(bf16_round(1.0 / 3.0), 0x1.56p-2f);
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every non-NaN pattern round-trips
    const float v = bf16_decode(static_cast<uint16_t>(b));
    if (!std::isnan(v)) {
      EXPECT_EQ(bf16_encode(v), b) << std::hex << b;
    }
  }
}

}  // namespace
}  // namespace moecheck
