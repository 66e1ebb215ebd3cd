// FP8 weight panel decoding (reference/weight_panel.hpp): every code under scales that reach the
// corners of the formats (float subnormal, tiny, huge, zero, negative, NaN, inf), checked value
// by value against decode(q) * s and the float operands dec = decode(q), mag = |dec| or NaN and
// maga = max(|dec|, 2^-6) or NaN (as moe_forward computed it before the panel did). Runs
// whichever form this build compiled (the AVX2 decode on machines that have it, the table else),
// with K not a multiple of 8 so that the tail path is covered as well.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/fp8_formats.hpp"
#include "reference/weight_panel.hpp"

namespace moecheck {
namespace {

bool same(double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; }
bool same(float x, float y) { return (std::isnan(x) && std::isnan(y)) || std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y); }

TEST(WeightPanel, EveryCodeUnderEveryScaleMatchesTheScalarDefinition) {
  const int64_t B = 128, K = 3 * B - 5, N = 2;  // the last block column has 123 columns
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> scale_set = {1.0f, 0.37f, -2.5f, 1e-23f, 0x1p-140f, 0x1p-149f, 3e38f, big, 0.0f,
                                        std::numeric_limits<float>::quiet_NaN(), INFINITY};
  std::vector<uint8_t> codes(N * K);
  for (int64_t i = 0; i < N * K; ++i) codes[i] = uint8_t((i * 37 + i / 256) & 0xFF);  // all 256 codes in each block column
  std::vector<double> w(N * K), wa(N * K), lut;
  std::vector<float> dec(N * K), mag(N * K), maga(N * K);
  int checked = 0;
  for (float s0 : scale_set)
    for (float s1 : scale_set) {
      const std::vector<float> scales = {s0, s1, s0 == s1 ? 1.0f : s0};  // [1, 3]: one block row
      dequant_panel(codes.data(), scales.data(), K, B, 0, N, {w.data(), wa.data(), dec.data(), mag.data(), maga.data()}, lut);
      for (int64_t r = 0; r < N; ++r)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t i = r * K + k;
          const double want = double(e4m3_decode(codes[i])) * double(scales[k / B]);
          const float d = e4m3_decode(codes[i]), m = d != 0 ? std::fabs(d) : NAN;
          const float ma = std::isnan(m) ? m : std::max(m, 0x1p-6f);
          ASSERT_TRUE(same(w[i], want)) << "code " << int(codes[i]) << " scale " << scales[k / B] << ": " << w[i];
          ASSERT_TRUE(same(wa[i], std::fabs(want))) << "code " << int(codes[i]) << " scale " << scales[k / B];
          ASSERT_TRUE(same(dec[i], d)) << "code " << int(codes[i]) << ": " << dec[i];
          ASSERT_TRUE(same(mag[i], m)) << "code " << int(codes[i]) << ": " << mag[i];
          ASSERT_TRUE(same(maga[i], ma)) << "code " << int(codes[i]) << ": " << maga[i];
          ++checked;
        }
    }
  EXPECT_EQ(checked, int(scale_set.size() * scale_set.size()) * N * K);
  // Only the main panel: the optional outputs stay untouched.
  std::vector<double> w2(N * K, -7.0);
  const std::vector<float> one = {1.0f, 1.0f, 1.0f};
  dequant_panel(codes.data(), one.data(), K, B, 0, N, {w2.data()}, lut);
  for (int64_t i = 0; i < N * K; ++i) ASSERT_TRUE(same(w2[i], double(e4m3_decode(codes[i])))) << i;
}

TEST(WeightPanel, RowsOfALaterBlockRowUseTheirOwnScales) {
  const int64_t B = 128, K = 256;
  std::vector<uint8_t> codes(3 * B * K, 0x38);  // 1.0
  const std::vector<float> scales = {1, 2, 3, 4, 5, 6};  // [3, 2]
  std::vector<double> w(2 * K), lut;
  dequant_panel(codes.data(), scales.data(), K, B, 2 * B + 5, 2, {w.data()}, lut);
  EXPECT_EQ(w[0], 5.0);
  EXPECT_EQ(w[B], 6.0);
  EXPECT_EQ(w[K + B + 3], 6.0);
}

}  // namespace
}  // namespace moecheck
