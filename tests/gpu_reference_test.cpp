// The float64 reference with its weight products on the GPU (`moecheck reference --device cuda`,
// kernels/fp64_weight_products.hpp) against the CPU's, both tiers, on the gate's sweep cases and
// a small-deepseek layer: every output element and slot output of both must lie in the
// agreement interval of BUDGETS.md §11 (tests/reference_agreement.hpp computes it independently
// of either). Also reports how many outputs are bit-identical.
#include <gtest/gtest.h>

#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <unistd.h>

#include "golden/case_generator.hpp"
#include "golden/case_problem.hpp"
#include "kernels/fp64_weight_products.hpp"
#include "tests/gpu_test_support.hpp"
#include "tests/reference_agreement.hpp"
#include "tools/sweep/gate_sweep.hpp"

namespace moecheck {
namespace {

using testing::AgreementTally;

void run_case(const GeneratorOptions& g, WeightProducts& gpu, const std::string& replay, AgreementTally& tally) {
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("moecheck-gpu-reference-{}.h5", getpid())).string();
  write_case(plan_case(g, path), path);
  {
    const CaseProblem cp(path);
    testing::check_engines_agree(cp.problem(), gpu, replay, tally);
  }
  std::filesystem::remove(path);
}

TEST(GpuReference, AgreesWithTheCpuReferenceOnTheGateSweep) {
  MOECHECK_REQUIRE_GPU();
  const auto gpu = kernels::make_cuda_weight_products();
  const char* env = std::getenv("MOECHECK_CASES");
  const int64_t cases = env ? std::atoll(env) : 100;
  const uint64_t seed = 46;
  AgreementTally tally;
  const std::vector<std::string> presets = sweep::default_sweep_presets(false);
  for (int64_t i = 0; i < cases && !HasFatalFailure(); ++i) {
    const GeneratorOptions g = sweep::sweep_case(seed, i, presets);
    run_case(g, *gpu,
             fmt::format("sweep seed {} case {} of MOECHECK_CASES={}: {}", seed, i, cases, make_case_command(g, "case.h5")),
             tally);
  }
  std::cout << tally.summary(fmt::format("{} sweep cases x 2 tiers on {}", cases, gpu->describe())) << "\n";
  EXPECT_EQ(tally.outside, 0) << tally.first_outside;
  EXPECT_GT(tally.elements, 0) << "MOECHECK_CASES=" << cases << ": nothing was compared";
}

TEST(GpuReference, AgreesWithTheCpuReferenceOnALargerLayer) {
  MOECHECK_REQUIRE_GPU();
  const auto gpu = kernels::make_cuda_weight_products();
  GeneratorOptions g;
  g.preset = "small-deepseek";
  g.tokens = 24;
  g.seed = 3;
  AgreementTally tally;
  run_case(g, *gpu, make_case_command(g, "case.h5"), tally);
  std::cout << tally.summary("small-deepseek T=24 x 2 tiers") << "\n";
  EXPECT_EQ(tally.outside, 0) << tally.first_outside;
}

}  // namespace
}  // namespace moecheck
