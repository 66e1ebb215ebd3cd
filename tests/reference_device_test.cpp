// --device auto's choice per case (tools/judge/reference_store.hpp ReferenceDevice): the GPU is
// only asked for at kAutoGpuFlops of float64 products or more, and a machine without one says why.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "golden/model_presets.hpp"
#include "reference/errors.hpp"
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

}  // namespace
}  // namespace moecheck
