// --device auto's choice per case (tools/judge/reference_store.hpp ReferenceDevice): the GPU is
// only asked for at kAutoGpuFlops of float64 products or more, and a machine without one says why.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "golden/case_problem.hpp"
#include "golden/model_presets.hpp"
#include "reference/errors.hpp"
#include "tests/golden_test_support.hpp"
#include "tools/judge/reference_store.hpp"

namespace moecheck {
namespace {

using judge::ReferenceDevice;

const MoeConfig& preset(const char* name) {
  const ModelPreset* p = find_model_preset(name);
  if (!p) throw std::runtime_error(std::string("no preset ") + name);
  return p->config;
}

// The token count whose products (every slot routed) are just below the threshold.
int64_t tokens_below_threshold(const MoeConfig& c) {
  const double per_token = weight_product_flops(c, c.top_k);
  return static_cast<int64_t>(ReferenceDevice::kAutoGpuFlops / per_token) - (std::fmod(ReferenceDevice::kAutoGpuFlops, per_token) == 0);
}

TEST(ReferenceDevice, AutoKeepsSmallCasesOnTheCpuWithoutAskingForTheGpu) {
  const MoeConfig& c = preset("deepseek-v3");
  ReferenceDevice d("auto");
  EXPECT_EQ(d.for_case(preset("tiny-deepseek"), 16), nullptr);
  EXPECT_EQ(d.for_case(c, tokens_below_threshold(c)), nullptr);
  EXPECT_EQ(d.why_not_gpu(), "") << "the GPU was probed for a case below the threshold";
}

TEST(ReferenceDevice, AutoTakesTheGpuForLargeCasesOrSaysWhyNot) {
  const MoeConfig& c = preset("deepseek-v3");
  ReferenceDevice d("auto");
  const WeightProducts* w = d.for_case(c, tokens_below_threshold(c) + 1);
  if (w) {
    EXPECT_EQ(d.why_not_gpu(), "");
    EXPECT_NE(w->describe().find("cuBLAS"), std::string::npos) << w->describe();
  } else {
    EXPECT_NE(d.why_not_gpu().find("cuda"), std::string::npos)
        << "a large case stayed on the CPU without a reason: '" << d.why_not_gpu() << "'";
  }
  // Asked again, the same answer (the GPU is probed once).
  EXPECT_EQ(d.for_case(c, 4096), w);
}

TEST(ReferenceDevice, CpuNeverAndUnknownNamesAreUsageErrors) {
  ReferenceDevice cpu("cpu");
  EXPECT_EQ(cpu.for_case(preset("deepseek-v3"), 4096), nullptr);
  EXPECT_EQ(cpu.why_not_gpu(), "");
  EXPECT_THROW(ReferenceDevice("tpu"), InputError);
}

// A stored reference that is reused never asks where its products would run (so compare does not
// start the GPU for a case it will not compute); one that is computed asks once.
TEST(ReferenceDevice, AReusedStoredReferenceNeverAsksForTheProducts) {
  test::TempDir dir("reference-device");
  const std::string c = dir.file("c.h5");
  ASSERT_EQ(test::run_moecheck({"make-case", "--preset", "tiny-deepseek", "--tokens", "8", "--seed", "3", "-q", "-o", c})
                .exit_code,
            0);
  ASSERT_EQ(test::run_moecheck({"reference", c, "-q", "--budget-model", "hopper"}).exit_code, 0);
  const CaseProblem cp(c);
  int asked = 0;
  const judge::ProductsSource products = [&asked]() -> WeightProducts* {
    ++asked;
    return nullptr;
  };
  bool reused = false;
  judge::quantized_reference(cp, cp.input_hash(), "hopper", false, &reused, false, products);
  EXPECT_TRUE(reused) << "the stored hopper reference was not reused";
  EXPECT_EQ(asked, 0);
  judge::quantized_reference(cp, cp.input_hash(), "fp32", false, &reused, false, products);
  EXPECT_FALSE(reused) << "a reference of another budget model was reused";
  EXPECT_EQ(asked, 1);
}

}  // namespace
}  // namespace moecheck
