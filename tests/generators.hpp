// Reusable RapidCheck generators for numerical tests: floats built from integers, so every
// generated value is exact, every edge class is reachable on purpose, and shrinking moves towards
// small integers and exponents (never rc::gen::arbitrary<float>(), which almost never produces
// subnormals, values near a format's max or exact zeros).
//
//   exactFloat(emin, emax)   sign * m * 2^(e-23), m in [2^23, 2^24), e in [emin, emax]:
//                            a float of magnitude in [2^e, 2^(e+1)).
//   fp8Value()               absolute-scale values for e4m3 encoders: classes normal / near 448 /
//                            e4m3-subnormal / zero, picked by gen::weightedOneOf.
//   groupValue(b)            values of a quantization group whose largest binade is 2^b: classes
//                            normal after scaling (x/s in e4m3's normal range), near the group max
//                            (x/s near 448), subnormal after scaling, below half the smallest
//                            subnormal (code 0), zero.
//   matrix(rows, cols, gen)  a row-major Matrix of such values (printed on failure).
//   classify_scaled(x, s)    the class of x/s, for RC_CLASSIFY / RC_TAG.
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

namespace moecheck::testgen {

// sign * m * 2^(e-23) with m in [2^23, 2^24): exact for e in [-126, 127].
inline float float_from_parts(bool negative, uint32_t m, int e) {
  const float v = std::ldexp(static_cast<float>(m), e - 23);
  return negative ? -v : v;
}

inline rc::Gen<float> exactFloat(int emin, int emax) {
  return rc::gen::apply(float_from_parts, rc::gen::arbitrary<bool>(),
                        rc::gen::inRange<uint32_t>(1u << 23, 1u << 24), rc::gen::inRange(emin, emax + 1));
}

inline rc::Gen<float> signedZero() { return rc::gen::element(0.0f, -0.0f); }

// Values for e4m3fn encoders at absolute scale.
inline rc::Gen<float> fp8Value() {
  return rc::gen::weightedOneOf<float>({
      {6, exactFloat(-6, 8)},                                        // normal range [2^-6, 2^9)
      {2, rc::gen::map(rc::gen::inRange(-96, 97), [](int k) {       // 448 + k/2: around the max
         return 448.0f + static_cast<float>(k) * 0.5f; })},
      {2, exactFloat(-12, -7)},                                      // subnormal range of e4m3
      {1, signedZero()},
  });
}

// Values of one quantization group whose largest binade is [2^b, 2^(b+1)). With s ~ amax/448,
// x/s lands in: normal (2^-6 .. 2^9 relative to 2^(b-8)), subnormal (|x/s| < 2^-6), below half
// the smallest subnormal, or exactly at the max binade.
inline rc::Gen<float> groupValue(int b) {
  return rc::gen::weightedOneOf<float>({
      {8, exactFloat(b - 13, b)},        // x/s in e4m3's normal range
      {2, exactFloat(b, b)},             // the top binade: x/s near 448
      {2, exactFloat(b - 20, b - 14)},   // x/s in e4m3's subnormal range
      {1, exactFloat(b - 40, b - 24)},   // far below: code 0
      {1, signedZero()},
  });
}

struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;  // row-major [rows, cols]
  float at(int64_t r, int64_t c) const { return data[static_cast<size_t>(r * cols + c)]; }
};

inline void showValue(const Matrix& m, std::ostream& os) {
  os << "Matrix " << m.rows << "x" << m.cols << " {";
  for (int64_t r = 0; r < m.rows && r < 16; ++r) {
    os << "\n  ";
    for (int64_t c = 0; c < m.cols && c < 16; ++c) os << std::hexfloat << m.at(r, c) << std::defaultfloat << ' ';
    if (m.cols > 16) os << "...";
  }
  if (m.rows > 16) os << "\n  ...";
  os << "\n}";
}

inline rc::Gen<Matrix> matrix(int64_t rows, int64_t cols, rc::Gen<float> elem) {
  return rc::gen::map(rc::gen::container<std::vector<float>>(static_cast<size_t>(rows * cols), std::move(elem)),
                      [rows, cols](std::vector<float> v) { return Matrix{rows, cols, std::move(v)}; });
}

// Class of x/s as the e4m3 encoder sees it.
inline const char* classify_scaled(float x, float s) {
  const double y = std::fabs(static_cast<double>(x) / static_cast<double>(s));
  if (y == 0) return "zero";
  if (y > 416) return "near 448";
  if (y >= 0x1p-6) return "normal";
  if (y > 0x1p-10) return "subnormal";
  return "underflow";
}

}  // namespace moecheck::testgen
