// Narrow number formats (see fp8_formats.hpp for the contract and its sources).
//
// How the encoders work: every format here is "sign + E exponent bits + M mantissa bits" with a
// subnormal range below 2^emin. Rounding the exact value |x| (a double) to such a grid is done on
// the integer significand of the double: with |x| = sig * 2^(e-52), sig in [2^52, 2^53), the
// grid spacing at |x| is 2^(max(e, emin) - M), so the code's integer significand is
// n = RNE(sig / 2^shift), shift = 52 - M + max(0, emin - e). Integer RNE on the dropped bits is
// exact (no intermediate rounding), and the code is then ((e + bias) << M) + n - 2^M for normal
// inputs (a carry of n into 2^(M+1) lands on the next binade by itself) or n for inputs below
// 2^emin (n = 2^M is the smallest normal, whose bits are the same). A code above the largest
// finite code is an overflow, handled by the saturation mode.
#include "reference/fp8_formats.hpp"

#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace moecheck {

namespace {

// One binary format's parameters. max_code is the largest finite magnitude code.
struct Spec {
  int mbits;        // stored mantissa bits (M)
  int bias;         // exponent bias; emin = 1 - bias
  int max_code;     // magnitude code of the largest finite value
  int inf_code;     // magnitude code of +inf (-1: the format has none)
  int nan_code;     // the code NaN input gives (full code, sign included)
  int sign_shift;   // position of the sign bit (7 for fp8, 15 for bf16)
  bool signed_zero; // false for e4m3fnuz: -0 does not exist, its code is NaN
};

constexpr Spec kE4m3fn{3, 7, 0x7E, -1, 0x7F, 7, true};
constexpr Spec kE5m2{2, 15, 0x7B, 0x7C, 0x7F, 7, true};
constexpr Spec kE4m3fnuz{3, 8, 0x7F, -1, 0x80, 7, false};
// bfloat16: 8 exponent bits, bias 127, 7 mantissa bits, max 0x7F7F, inf 0x7F80; NaN -> 0x7FFF
// (the canonical quiet NaN that CUDA's __float2bfloat16 also produces).
constexpr Spec kBf16{7, 127, 0x7F7F, 0x7F80, 0x7FFF, 15, true};

const Spec& spec(Fp8Format f) {
  switch (f) {
    case Fp8Format::e4m3fn: return kE4m3fn;
    case Fp8Format::e5m2: return kE5m2;
    case Fp8Format::e4m3fnuz: return kE4m3fnuz;
  }
  return kE4m3fn;
}

// Round x to the format, ties to even, on the exact value (see the file comment). The format is a
// template parameter so that each instance folds its constants (this runs 2^32 times per format
// in the exhaustive test and in the reference's hot loops).
template <Spec S>
uint32_t encode_exact(double x, Saturation sat) {
  const uint64_t u = std::bit_cast<uint64_t>(x);
  const uint32_t sign = static_cast<uint32_t>(u >> 63) << S.sign_shift;
  const uint64_t a = u & 0x7FFF'FFFF'FFFF'FFFFull;
  if (a > 0x7FF0'0000'0000'0000ull) return static_cast<uint32_t>(S.nan_code);  // NaN in, NaN out

  constexpr int emin = 1 - S.bias;
  const int e = static_cast<int>(a >> 52) - 1023;  // double subnormals (e = -1023) land in n = 0 below
  int64_t mag;                                     // magnitude code, unbounded above (> max_code: overflow)
  if (e >= emin) {
    // Normal range of the format: drop 52 - M bits.
    constexpr int shift = 52 - S.mbits;
    const uint64_t sig = (a & 0x000F'FFFF'FFFF'FFFFull) | (1ull << 52);
    const uint64_t n = (sig + (1ull << (shift - 1)) - 1 + ((sig >> shift) & 1u)) >> shift;  // RNE
    mag = (static_cast<int64_t>(e + S.bias) << S.mbits) + static_cast<int64_t>(n) - (int64_t{1} << S.mbits);
  } else {
    // Below 2^emin: spacing of the subnormals, 2^(emin - M); drop shift = 52 - M + (emin - e) bits.
    const int shift = 52 - S.mbits + (emin - e);
    if (shift > 60) {
      mag = 0;  // |x| < 2^(emin-M-8): far below half the smallest subnormal
    } else {
      const uint64_t sig = (a & 0x000F'FFFF'FFFF'FFFFull) | (1ull << 52);
      mag = static_cast<int64_t>((sig + (1ull << (shift - 1)) - 1 + ((sig >> shift) & 1u)) >> shift);
    }
  }

  if (mag > S.max_code) {  // overflow (inf included: its e is 1024)
    if (sat == Saturation::finite) return sign | static_cast<uint32_t>(S.max_code);
    if constexpr (S.inf_code >= 0) return sign | static_cast<uint32_t>(S.inf_code);
    // No infinity: the NaN code. e4m3fn keeps the sign (S.1111.111, as CUDA's __NV_NOSAT does);
    // e4m3fnuz has a single NaN code.
    return S.signed_zero ? sign | 0x7Fu : static_cast<uint32_t>(S.nan_code);
  }
  if constexpr (!S.signed_zero) {
    if (mag == 0) return 0;  // e4m3fnuz: a negative value rounding to zero is +0
  }
  return sign | static_cast<uint32_t>(mag);
}

double decode_exact(uint32_t code, const Spec& s) {
  const bool neg = (code >> s.sign_shift) & 1u;
  const uint32_t mag = code & ((1u << s.sign_shift) - 1);
  if (code == static_cast<uint32_t>(s.nan_code) && !s.signed_zero) return std::numeric_limits<double>::quiet_NaN();
  if (static_cast<int>(mag) > s.max_code) {
    if (static_cast<int>(mag) == s.inf_code) return neg ? -HUGE_VAL : HUGE_VAL;
    return std::numeric_limits<double>::quiet_NaN();
  }
  const uint32_t m = mag & ((1u << s.mbits) - 1);
  const int ebits = static_cast<int>(mag >> s.mbits);
  // value = (2^M * [e != 0] + m) * 2^(max(e, 1) - bias - M): exact in double.
  const double v = std::ldexp(static_cast<double>((ebits != 0 ? (1u << s.mbits) : 0u) + m),
                              (ebits != 0 ? ebits : 1) - s.bias - s.mbits);
  return neg ? -v : v;
}

std::array<float, 256> build_table(Fp8Format f) {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) t[c] = static_cast<float>(fp8_decode(static_cast<uint8_t>(c), f));
  return t;
}

}  // namespace

std::string_view to_string(Fp8Format f) {
  switch (f) {
    case Fp8Format::e4m3fn: return "float8_e4m3fn";
    case Fp8Format::e5m2: return "float8_e5m2";
    case Fp8Format::e4m3fnuz: return "float8_e4m3fnuz";
  }
  return "?";
}

std::optional<Fp8Format> parse_fp8_format(std::string_view s) {
  for (Fp8Format f : {Fp8Format::e4m3fn, Fp8Format::e5m2, Fp8Format::e4m3fnuz})
    if (s == to_string(f)) return f;
  return std::nullopt;
}

double fp8_decode(uint8_t code, Fp8Format f) { return decode_exact(code, spec(f)); }

const float* fp8_table(Fp8Format f) {
  // Function-local statics: initialised once, thread-safe (C++11 [stmt.dcl]/4).
  static const std::array<float, 256> e4m3fn = build_table(Fp8Format::e4m3fn);
  static const std::array<float, 256> e5m2 = build_table(Fp8Format::e5m2);
  static const std::array<float, 256> e4m3fnuz = build_table(Fp8Format::e4m3fnuz);
  switch (f) {
    case Fp8Format::e4m3fn: return e4m3fn.data();
    case Fp8Format::e5m2: return e5m2.data();
    case Fp8Format::e4m3fnuz: return e4m3fnuz.data();
  }
  return e4m3fn.data();
}

uint8_t fp8_encode(double x, Fp8Format f, Saturation s) {
  switch (f) {
    case Fp8Format::e4m3fn: return static_cast<uint8_t>(encode_exact<kE4m3fn>(x, s));
    case Fp8Format::e5m2: return static_cast<uint8_t>(encode_exact<kE5m2>(x, s));
    case Fp8Format::e4m3fnuz: return static_cast<uint8_t>(encode_exact<kE4m3fnuz>(x, s));
  }
  return 0x7F;
}

double fp8_max(Fp8Format f) { return decode_exact(static_cast<uint32_t>(spec(f).max_code), spec(f)); }

// Fast path on the float's bits (float has 24-bit significands, so the same integer RNE as
// encode_exact works in 32 bits). Proven equal to fp8_encode(x, e4m3fn, finite) on all 2^32
// floats by tests/fp8_conversion_exhaustive_test.cpp.
uint8_t e4m3_encode_satfinite(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFF'FFFFu;
  if (a > 0x7F80'0000u) return 0x7F;                            // NaN
  if (a > 0x43E8'0000u) return static_cast<uint8_t>(sign | 0x7E);  // |x| > 464 (inf included): 448
  if (a >= 0x3C80'0000u) {
    // |x| in [2^-6, 464]: keep 3 of the 23 mantissa bits, RNE on the other 20; rebias 127 -> 7.
    const uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
    return static_cast<uint8_t>(sign | (r - (120u << 3)));
  }
  if (a <= 0x3A80'0000u) return static_cast<uint8_t>(sign);  // |x| <= 2^-10 (half of 2^-9): +-0
  // |x| in (2^-10, 2^-6): subnormal codes n = RNE(|x| / 2^-9), n in [1, 8] (8 = smallest normal).
  // Float exponent E in [117, 120]: |x| = sig * 2^(E-150), so n = RNE(sig >> (141 - E)).
  const uint32_t shift = 141u - (a >> 23);
  const uint32_t sig = (a & 0x7F'FFFFu) | 0x80'0000u;
  const uint32_t n = (sig + (1u << (shift - 1)) - 1u + ((sig >> shift) & 1u)) >> shift;
  return static_cast<uint8_t>(sign | n);
}

double ue8m0_decode(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, static_cast<int>(code) - 127);
}

uint8_t ue8m0_encode_ceil(double x) {
  // On the double's bits: x = 1.f * 2^e (normal) -> k = e + (f != 0); every double below 2^-127
  // (subnormals included) clamps to k = -127, every one from 2^127 up (inf included) to 127.
  const uint64_t u = std::bit_cast<uint64_t>(x);
  if ((u & 0x7FFF'FFFF'FFFF'FFFFull) > 0x7FF0'0000'0000'0000ull) return 0xFF;  // NaN
  if ((u >> 63) || u == 0) return 0x00;                                        // x <= 0
  const int e = static_cast<int>(u >> 52) - 1023;
  int k = e + ((u & 0x000F'FFFF'FFFF'FFFFull) != 0 ? 1 : 0);  // smallest k with 2^k >= x
  if (k < -127) k = -127;
  if (k > 127) k = 127;
  return static_cast<uint8_t>(k + 127);
}

float bf16_decode(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t bf16_encode(double x) { return static_cast<uint16_t>(encode_exact<kBf16>(x, Saturation::none)); }

}  // namespace moecheck
