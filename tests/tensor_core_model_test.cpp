// The measured Hopper FP8 instruction model (reference/tensor_core_model.hpp) against outputs of
// the real hardware committed in golden/probe/h200 (a slice of `moecheck probe --seed 2 --dump`
// on an H200: wgmma.m64n8k32 e4m3 over every test-vector family, and one cuBLASLt block-scaled
// GEMM), plus hand-derived vectors that each isolate one property of the model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "reference/tensor_core_model.hpp"
#include "tools/probe/probe_fit.hpp"
#include "tools/probe/probe_gemm.hpp"

namespace moecheck {
namespace {

std::string fixture() {
  const char* src = std::getenv("MOECHECK_SOURCE_DIR");
  return std::string(src ? src : ".") + "/golden/probe/h200";
}

// e4m3fn codes of a few exact values.
constexpr uint8_t k16 = 0x58, k256 = 0x78, kEighth = 0x20, kQuarter = 0x28, kMinSub = 0x01;
constexpr uint8_t neg(uint8_t c) { return uint8_t(c | 0x80); }

float one_instruction(std::vector<uint8_t> a, std::vector<uint8_t> b, float c,
                      const TensorCoreModel& m = TensorCoreModel::hopper_wgmma()) {
  a.resize(32, 0), b.resize(32, 0);
  return tc_instruction(m, a.data(), b.data(), 32, c);
}

TEST(TensorCoreModel, ReproducesTheH200WgmmaOutputsBitForBit) {
  uint64_t seed = 0;
  const auto runs = probe::read_probe_dump(fixture(), &seed);
  ASSERT_FALSE(runs.empty());
  int64_t checked = 0;
  for (const auto& r : runs) {
    const probe::Mismatches m = probe::check_model(TensorCoreModel::hopper_wgmma(), r);
    EXPECT_EQ(m.values, 0) << r.family.name << " K=" << r.tiles.k() << ": first at output " << m.first;
    EXPECT_EQ(m.zero_sign, 0) << r.family.name;
    checked += m.checked;
  }
  EXPECT_GE(checked, 65536);
}

TEST(TensorCoreModel, ModelsOneBitOffDisagreeWithTheHardware) {
  // The fixture can tell the measured model from its neighbours (each differs in one parameter).
  uint64_t seed = 0;
  const auto runs = probe::read_probe_dump(fixture(), &seed);
  TensorCoreModel wider = TensorCoreModel::hopper_wgmma(), longer = wider, exact_exp = wider, floor_cut = wider;
  wider.frac_bits = 14;
  longer.out_bits = 15;
  exact_exp.exponent = TensorCoreModel::Exponent::exact;
  floor_cut.cut = TensorCoreModel::Cut::toward_minus_inf;
  for (const TensorCoreModel& m : {wider, longer, exact_exp, floor_cut}) {
    int64_t bad = 0;
    for (const auto& r : runs) bad += probe::check_model(m, r).values;
    EXPECT_GT(bad, 0) << m.describe();
  }
}

TEST(TensorCoreModel, CublasLtIsFourChainedWgmmaThenOneFfmaPerBlock) {
  auto cases = probe::read_gemm_dump(fixture());
  ASSERT_EQ(cases.size(), 1u);
  const auto fits = probe::fit_gemm_composition(cases[0], TensorCoreModel::hopper_wgmma(), 2);
  ASSERT_FALSE(fits.empty());
  EXPECT_EQ(fits[0].composition, "ffma");
  EXPECT_EQ(fits[0].mismatches, 0);
  EXPECT_GT(fits[1].mismatches, 0);  // the alternatives are distinguishable on this data
}

TEST(TensorCoreModel, TermsAreCut13BitsBelowTheLargestExponent) {
  // 256 = 16 x 16 sets the exponent 8, so the grid is 2^-5: 2^-6 vanishes, 2^-5 survives.
  EXPECT_EQ(one_instruction({k16, kEighth}, {k16, kEighth}, 0.0f), 256.0f);
  EXPECT_EQ(one_instruction({k16, kEighth}, {k16, kQuarter}, 0.0f), 256.0f + 0x1p-5f);
  // Cut toward zero: a negative term below the grid also vanishes (toward -inf would give 256 - 2^-5).
  EXPECT_EQ(one_instruction({k16, neg(kEighth)}, {k16, kEighth}, 0.0f), 256.0f);
}

TEST(TensorCoreModel, AlignmentUsesTheExponentFieldSumOfSubnormals) {
  // 2^-9 (subnormal, field exponent -6) x 256 = 0.5, but its exponent-field sum is 2: the grid is
  // 2^-11 and an accumulator of 2^-12 is cut away. Aligned to the product's own exponent (-1)
  // it would survive.
  EXPECT_EQ(one_instruction({kMinSub}, {k256}, 0x1p-12f), 0.5f);
  TensorCoreModel own = TensorCoreModel::hopper_wgmma();
  own.exponent = TensorCoreModel::Exponent::exact;
  EXPECT_EQ(one_instruction({kMinSub}, {k256}, 0x1p-12f, own), 0.5f + 0x1p-12f);
}

TEST(TensorCoreModel, TheResultKeeps14SignificantBits) {
  // No products: the accumulator alone is cut to 14 bits (e8m13).
  EXPECT_EQ(one_instruction({}, {}, 1.0f + 0x1p-13f), 1.0f + 0x1p-13f);
  EXPECT_EQ(one_instruction({}, {}, 1.0f + 0x1p-14f), 1.0f);
  EXPECT_EQ(one_instruction({}, {}, -(1.0f + 0x1p-14f)), -1.0f);
}

}  // namespace
}  // namespace moecheck
