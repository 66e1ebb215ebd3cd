// Properties of FP8 group and block quantization (reference/fp8_quant.hpp), RapidCheck.
// Replay a failure with the RC_PARAMS="reproduce=..." string RapidCheck prints.
//
// Round-trip bound (derived). x float, s the scale, y = fl32(x/s), d = e4m3_satfinite(y) decoded,
// x_hat = d * s (exact in double). |x - x_hat| <= |x - s y| + s |y - d|, with
//   |x - s y| <= 2^-24 |x| (+ 2^-150 s if y is a float subnormal)     (one fp32 rounding)
//   |y - d|   <= |y| u/(1+u) = |y|/17, u = 2^-4, if |y| >= 2^-6       (RNE, e4m3 normal range;
//                 saturation only moves y <= 448 (1 + 2^-23) to 448, far inside this)
//   |y - d|   <= 2^-10 (half the subnormal spacing 2^-9)              if |y| < 2^-6
// and s |y| <= |x| (1 + 2^-24). Hence, with |x| >= 2^-6 s (exactly checkable, and then y >= 2^-6):
//   |x - x_hat| <= ((1 + 2^-24)/17 + 2^-24) |x|          (< 2^-4 |x|, the textbook u8 bound)
// and otherwise
//   |x - x_hat| <= 2^-10 s + 2^-24 |x| + 2^-150 s.
// |x| <= amax <= 448 s (1 + 2^-23) holds for both scale formats (f32: one rounding of amax/448;
// ue8m0: rounded up), so the overflow region beyond 464 is never reached.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "tests/generators.hpp"

namespace moecheck {
namespace {

using testgen::Matrix;

ScaleFormat fmt_of(bool ue8m0) { return ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32; }

// The derived bound above, asserted for one element; returns the class of x/s for tagging.
const char* check_round_trip(float x, uint8_t code, float s) {
  const double d = e4m3_decode(code);
  const double xhat = d * static_cast<double>(s);
  const double ax = std::fabs(static_cast<double>(x));
  const double err = std::fabs(static_cast<double>(x) - xhat);  // exact (Sterbenz: xhat ~ x)
  const double slack = 1 + 0x1p-50;                             // rounding of the bound itself
  const bool normal = ax >= 0x1p-6 * static_cast<double>(s);
  const double bound = normal ? ((1 + 0x1p-24) / 17 + 0x1p-24) * ax
                              : 0x1p-10 * s + 0x1p-24 * ax + 0x1p-150 * s;
  if (!(err <= bound * slack)) {
    RC_LOG() << "x = " << std::hexfloat << x << " s = " << s << " code = 0x" << std::hex << int(code)
             << " xhat = " << std::hexfloat << xhat << " err/bound = " << std::defaultfloat << err / bound << "\n";
  }
  RC_ASSERT(err <= bound * slack);
  if (normal) RC_ASSERT(err < 0x1p-4 * ax);
  // The code is the header's recipe, recomputed through other paths: the double quotient rounded
  // once to float (equal to the float division: 53 >= 2*24 + 2), then the generic encoder.
  RC_ASSERT(code == fp8_encode(fl32(static_cast<double>(x) / static_cast<double>(s)), Fp8Format::e4m3fn));
  return testgen::classify_scaled(x, s);
}

// Exact amax of the real elements of a rectangle of a row-major matrix.
float rect_amax(const Matrix& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  float a = 0;
  for (int64_t r = r0; r < r0 + nr; ++r)
    for (int64_t c = c0; c < c0 + nc; ++c) a = std::max(a, std::fabs(m.at(r, c)));
  return a;
}

// Scale rules checked without the implementation's arithmetic: f32 s is the nearest float to
// max(amax, eps)/448 (compared exactly through 448 s, which double holds); ue8m0 s is a power of
// two with max(amax, eps)/s in (224, 448] (exact: s is a power of two).
void check_scale(float amax, float s, bool ue8m0, double eps) {
  RC_ASSERT(std::isfinite(s));
  RC_ASSERT(s > 0.0f);
  const double a = std::max(static_cast<double>(amax), eps);
  if (!ue8m0) {
    const double e = std::fabs(a - 448.0 * s);
    RC_ASSERT(e <= std::fabs(a - 448.0 * std::nextafter(s, 0.0f)));
    RC_ASSERT(e <= std::fabs(a - 448.0 * std::nextafter(s, HUGE_VALF)));
  } else {
    int ex = 0;
    RC_ASSERT(std::frexp(s, &ex) == 0.5f);
    if (static_cast<double>(amax) >= eps) {
      RC_ASSERT(a / s > 224.0);
      RC_ASSERT(a / s <= 448.0);
    }
  }
}

const auto kGroup = rc::gen::element<int64_t>(1, 3, 16, 128);
const auto kEps = rc::gen::element(1e-12, 1e-10, 1e-4);

RC_GTEST_PROP(Fp8GroupQuant, RoundTripWithinDerivedBound, ()) {
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 300);
  const int64_t group = *kGroup;
  const int b = *rc::gen::inRange(-40, 41);
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const double eps = *kEps;
  const Matrix x = *testgen::matrix(rows, cols, testgen::groupValue(b));
  const GroupQuantized q = group_quantize(x.data.data(), rows, cols, group, fmt_of(ue8m0), eps);
  bool seen[5] = {};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const std::string cls = check_round_trip(x.at(r, c), q.codes[r * cols + c], q.scale(r, c / group));
      seen[cls == "zero" ? 0 : cls == "near 448" ? 1 : cls == "normal" ? 2 : cls == "subnormal" ? 3 : 4] = true;
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < q.groups(); ++g) {
      const int64_t c0 = g * group, n = std::min(group, cols - c0);
      const float amax = rect_amax(x, r, 1, c0, n);
      check_scale(amax, q.scale(r, g), ue8m0, eps);
    }
  RC_CLASSIFY(seen[0], "zero");
  RC_CLASSIFY(seen[1], "near 448");
  RC_CLASSIFY(seen[2], "normal");
  RC_CLASSIFY(seen[3], "subnormal");
  RC_CLASSIFY(seen[4], "underflow");
  RC_CLASSIFY(cols % group != 0, "ragged last group");
  RC_TAG(ue8m0 ? "ue8m0" : "f32");
}

// x * 2^k gives the same codes and scales * 2^k while nothing under- or overflows: data stay in
// [2^-90, 2^52) (normal floats), amax >= 2^-70 >> eps, scales stay normal floats.
RC_GTEST_PROP(Fp8GroupQuant, ScaleInvarianceByPowersOfTwo, ()) {
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 3);
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 260);
  const int64_t group = *kGroup;
  const int b = *rc::gen::inRange(-30, 31);
  const int k = *rc::gen::inRange(-20, 21);
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const double eps = 1e-30;
  const Matrix x = *testgen::matrix(rows, cols, testgen::groupValue(b));
  Matrix y = x;
  for (float& v : y.data) v = std::ldexp(v, k);
  const GroupQuantized qx = group_quantize(x.data.data(), rows, cols, group, fmt_of(ue8m0), eps);
  const GroupQuantized qy = group_quantize(y.data.data(), rows, cols, group, fmt_of(ue8m0), eps);
  RC_ASSERT(qx.codes == qy.codes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < qx.groups(); ++g) {
      const bool zero = rect_amax(x, r, 1, g * group, std::min(group, cols - g * group)) == 0.0f;
      RC_ASSERT(qy.scale(r, g) == (zero ? qx.scale(r, g) : std::ldexp(qx.scale(r, g), k)));
    }
  RC_TAG(ue8m0 ? "ue8m0" : "f32");
}

RC_GTEST_PROP(Fp8GroupQuant, AllZeroGroupsGiveFiniteScalesAndZeroCodes, ()) {
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 300);
  const int64_t group = *kGroup;
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const double eps = *rc::gen::element(1e-12, 1e-10, 1e-4, 1.0);
  const Matrix x = *testgen::matrix(rows, cols, testgen::signedZero());
  const GroupQuantized q = group_quantize(x.data.data(), rows, cols, group, fmt_of(ue8m0), eps);
  for (uint8_t c : q.codes) RC_ASSERT(e4m3_decode(c) == 0.0f);
  for (float s : q.scales) check_scale(0.0f, s, ue8m0, eps);
  RC_ASSERT(q.scales[0] == group_scale(0.0f, fmt_of(ue8m0), eps));
}

// Finite inputs of any magnitude (float subnormals up to FLT_MAX): no NaN code, finite scales.
RC_GTEST_PROP(Fp8GroupQuant, SaturationNeverProducesNaNForFiniteInputs, ()) {
  const auto wild = rc::gen::weightedOneOf<float>({
      {4, testgen::exactFloat(-126, 127)},
      {1, rc::gen::element(std::numeric_limits<float>::max(), -std::numeric_limits<float>::max())},
      {1, rc::gen::map(rc::gen::inRange<uint32_t>(1, 1u << 23), [](uint32_t u) { return std::bit_cast<float>(u); })},
      {1, testgen::signedZero()},
  });
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 300);
  const int64_t group = *kGroup;
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const Matrix x = *testgen::matrix(2, cols, wild);
  const GroupQuantized q = group_quantize(x.data.data(), 2, cols, group, fmt_of(ue8m0), 1e-12);
  for (uint8_t c : q.codes) RC_ASSERT((c & 0x7F) != 0x7F);
  for (float s : q.scales) RC_ASSERT(std::isfinite(s) && s > 0);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < cols; ++c)
      RC_ASSERT(std::isfinite(static_cast<double>(e4m3_decode(q.codes[r * cols + c])) * q.scale(r, c / group)));
}

RC_GTEST_PROP(Fp8GroupQuant, ScaleLayoutsAgree, ()) {
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 6);
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 200);
  const int64_t group = *kGroup;
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const Matrix x = *testgen::matrix(rows, cols, testgen::groupValue(*rc::gen::inRange(-20, 21)));
  const auto rm = group_quantize(x.data.data(), rows, cols, group, fmt_of(ue8m0), 1e-10, ScaleLayout::row_major);
  const auto tr = group_quantize(x.data.data(), rows, cols, group, fmt_of(ue8m0), 1e-10, ScaleLayout::transposed);
  RC_ASSERT(rm.codes == tr.codes);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < rm.groups(); ++g) RC_ASSERT(rm.scale(r, g) == tr.scale(r, g));
  RC_ASSERT(transpose_scales(rm.scales, rows, rm.groups(), ScaleLayout::row_major) == tr.scales);
  RC_ASSERT(transpose_scales(tr.scales, rows, rm.groups(), ScaleLayout::transposed) == rm.scales);
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  std::vector<float> scales(static_cast<size_t>(rm.groups()));
  for (int64_t r = 0; r < rows; ++r) {  // the one-row entry point agrees too
    group_quantize_row(x.data.data() + r * cols, cols, group, fmt_of(ue8m0), 1e-10, codes.data(), scales.data());
    RC_ASSERT(std::equal(codes.begin(), codes.end(), rm.codes.begin() + r * cols));
    RC_ASSERT(std::equal(scales.begin(), scales.end(), rm.scales.begin() + r * rm.groups()));
  }
}

// Values placed on e4m3 rounding midpoints after scaling: x = fl32(m * s) for midpoints m between
// consecutive e4m3 codes, in a group whose amax A fixes s. Here fl32(x / s) lands within an fp32
// ulp of a tie, so the order of operations decides the code (x * (1/s), a double quotient or a
// skipped fl32 would each change some codes): the recipe must be followed exactly.
RC_GTEST_PROP(Fp8GroupQuant, TiesAfterScalingFollowTheRecipe, ()) {
  const float amax = std::fabs(*testgen::exactFloat(-30, 30));
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const int64_t cols = *rc::gen::inRange<int64_t>(2, 129);
  const float s = group_scale(amax, fmt_of(ue8m0), 1e-12);
  std::vector<float> x(static_cast<size_t>(cols));
  x[0] = amax;
  for (int64_t i = 1; i < cols; ++i) {
    const unsigned c = *rc::gen::inRange(0u, 0x7Eu);  // midpoint between codes c and c + 1
    const double m = (e4m3_decode(static_cast<uint8_t>(c)) + static_cast<double>(e4m3_decode(static_cast<uint8_t>(c + 1)))) / 2;
    x[static_cast<size_t>(i)] = fl32(m * s) * (*rc::gen::arbitrary<bool>() ? -1.0f : 1.0f);
  }
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  float got_s = 0;
  group_quantize_row(x.data(), cols, cols, fmt_of(ue8m0), 1e-12, codes.data(), &got_s);
  RC_ASSERT(got_s == s);
  for (int64_t i = 0; i < cols; ++i) check_round_trip(x[static_cast<size_t>(i)], codes[static_cast<size_t>(i)], s);
  RC_TAG(ue8m0 ? "ue8m0" : "f32");
}

// Block quantization of w [N, K]: per block, the scale follows the rules from the block's real
// elements only (ragged edges), the block's amax element decodes to +-448 (f32) or into
// [224, 448] (ue8m0), every element meets the round-trip bound, and block_dequantize is exactly
// decode(code) * scale.
void check_blocks(const Matrix& w, int64_t block, bool ue8m0, double eps) {
  const BlockQuantized q = block_quantize(w.data.data(), w.rows, w.cols, block, fmt_of(ue8m0), eps);
  RC_ASSERT(q.block_rows() == ceil_div(w.rows, block));
  RC_ASSERT(q.block_cols() == ceil_div(w.cols, block));
  RC_ASSERT(static_cast<int64_t>(q.scales.size()) == q.block_rows() * q.block_cols());
  std::vector<double> deq(w.data.size());
  block_dequantize(q.codes.data(), q.scales.data(), w.rows, w.cols, block, deq.data());
  for (int64_t i = 0; i < q.block_rows(); ++i)
    for (int64_t j = 0; j < q.block_cols(); ++j) {
      const int64_t r0 = i * block, nr = std::min(block, w.rows - r0), c0 = j * block, nc = std::min(block, w.cols - c0);
      const float s = q.scales[static_cast<size_t>(i * q.block_cols() + j)];
      const float amax = rect_amax(w, r0, nr, c0, nc);
      check_scale(amax, s, ue8m0, eps);
      for (int64_t r = r0; r < r0 + nr; ++r)
        for (int64_t c = c0; c < c0 + nc; ++c) {
          const uint8_t code = q.codes[static_cast<size_t>(r * w.cols + c)];
          check_round_trip(w.at(r, c), code, s);
          RC_ASSERT(deq[static_cast<size_t>(r * w.cols + c)] == static_cast<double>(e4m3_decode(code)) * s);
          if (std::fabs(w.at(r, c)) == amax && amax >= eps) {
            const float d = std::fabs(e4m3_decode(code));
            const bool ok = ue8m0 ? (d >= 224.0f && d <= 448.0f) : d == 448.0f;  // amax/s > 224 may round to 224
            RC_ASSERT(ok);
          }
        }
    }
}

RC_GTEST_PROP(Fp8BlockQuant, SmallBlocksRaggedEdges, ()) {
  const int64_t block = *rc::gen::element<int64_t>(1, 2, 3, 8, 16);
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 2 * block + block / 2 + 2);
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 2 * block + block / 2 + 2);
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const Matrix w = *testgen::matrix(rows, cols, testgen::groupValue(*rc::gen::inRange(-30, 31)));
  check_blocks(w, block, ue8m0, 1e-12);
  RC_CLASSIFY(rows % block != 0 || cols % block != 0, "ragged");
  RC_TAG(ue8m0 ? "ue8m0" : "f32");
}

// 128 x 128 blocks (the DeepSeek-V3 recipe) with N, K in [1, 300]: too many elements for
// element-wise RapidCheck generation, so RapidCheck draws the shape and a seed, and CounterRng
// fills the matrix with the groupValue classes around a per-block exponent.
RC_GTEST_PROP(Fp8BlockQuant, Blocks128RaggedEdges, ()) {
  const int64_t rows = *rc::gen::inRange<int64_t>(1, 301);
  const int64_t cols = *rc::gen::inRange<int64_t>(1, 301);
  const uint64_t seed = *rc::gen::arbitrary<uint64_t>();
  const bool ue8m0 = *rc::gen::arbitrary<bool>();
  const CounterRng rng{seed, 3};
  Matrix w{rows, cols, std::vector<float>(static_cast<size_t>(rows * cols))};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t blk = rng.bits(static_cast<uint64_t>((r / 128) * 8 + c / 128) + (uint64_t{1} << 40));
      const int b = static_cast<int>(blk % 61) - 30;  // per-block top binade
      const uint64_t u = rng.bits(static_cast<uint64_t>(r * cols + c));
      const int cls = static_cast<int>((u >> 32) % 14);  // weights 8/2/2/1/1 as groupValue
      const int e = cls < 8 ? b - static_cast<int>((u >> 40) % 14) : cls < 10 ? b
                  : cls < 12 ? b - 14 - static_cast<int>((u >> 40) % 7) : b - 24 - static_cast<int>((u >> 40) % 17);
      const float v = cls == 13 ? 0.0f : testgen::float_from_parts(u & 1, static_cast<uint32_t>((u >> 1) & 0x7F'FFFF) | (1u << 23), e);
      w.data[static_cast<size_t>(r * cols + c)] = v;
    }
  check_blocks(w, 128, ue8m0, 1e-12);
  RC_CLASSIFY(rows % 128 != 0 || cols % 128 != 0, "ragged");
  RC_CLASSIFY(rows > 128 && cols > 128, "several blocks each way");
}

TEST(Fp8Quant, RejectsBadArguments) {
  const float x[4] = {1, 2, 3, 4};
  EXPECT_THROW(group_quantize(x, 1, 4, 0, ScaleFormat::f32, 1e-10), std::invalid_argument);
  EXPECT_THROW(group_quantize(x, 1, 4, 2, ScaleFormat::f32, 0.0), std::invalid_argument);
  EXPECT_THROW(group_quantize(x, 1, 4, 2, ScaleFormat::f32, 1e-50), std::invalid_argument);  // eps/448 underflows
  EXPECT_THROW(transpose_scales({1, 2, 3}, 2, 2, ScaleLayout::row_major), std::invalid_argument);
  EXPECT_THROW(block_quantize(x, 2, 2, -1, ScaleFormat::ue8m0), std::invalid_argument);
}

TEST(Fp8Quant, NaNInputPropagatesToItsGroupOnly) {
  const float x[4] = {1, std::numeric_limits<float>::quiet_NaN(), 3, 4};
  const GroupQuantized q = group_quantize(x, 1, 4, 2, ScaleFormat::f32, 1e-10);
  EXPECT_TRUE(std::isnan(q.scales[0]));
  EXPECT_EQ(q.scales[1], fl32(4.0 / 448.0));
  EXPECT_EQ(q.codes[2], e4m3_encode_satfinite(3.0f / fl32(4.0 / 448.0)));
}

}  // namespace
}  // namespace moecheck
