// The pipeline commands end to end through the binary: make-case, reference (stored and then
// reused by compare), run (emulated, faulty, and cuda without a GPU), compare's exit codes and
// report files, bench reference.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "golden/case_file.hpp"
#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

using test::run_process;

const auto moecheck = test::run_moecheck;

TEST(CliPipeline, ReferenceRunCompare) {
  test::TempDir dir("cli-pipeline");
  const std::string c = dir.file("c.h5");
  ASSERT_EQ(moecheck({"make-case", "--preset", "tiny-deepseek", "--tokens", "12", "--seed", "4", "-q", "-o", c}).exit_code, 0);
  auto r = moecheck({"reference", c, "-q"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  {
    const CaseReader rd(c);
    const auto q = rd.read_reference("quantized");
    ASSERT_TRUE(q.has_value());
    EXPECT_FALSE(q->input_hash.empty());
    EXPECT_EQ(q->budget.size(), size_t(12 * 256));
    EXPECT_TRUE(rd.read_reference("ideal").has_value());
  }
  ASSERT_EQ(moecheck({"run", c, "--backend", "emulated"}).exit_code, 0);
  r = moecheck({"compare", c, "--json", dir.file("r.json"), "--html", dir.file("r.html")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("reused from /reference/quantized"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("0 of "), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(dir.file("r.json")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("r.html")));
  // A planted bug fails with exit 1.
  ASSERT_EQ(moecheck({"run", c, "--backend", "faulty:scaling_factor_twice"}).exit_code, 0);
  r = moecheck({"compare", c, "--output", "faulty:scaling_factor_twice", "-q"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  // The ideal tier judges the correct output too.
  r = moecheck({"compare", c, "--output", "emulated", "--tier", "ideal", "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST(CliPipeline, BadInputsExitTwo) {
  test::TempDir dir("cli-bad");
  const std::string c = dir.file("c.h5");
  ASSERT_EQ(moecheck({"make-case", "--preset", "tiny-qwen", "--tokens", "4", "--seed", "1", "-q", "-o", c}).exit_code, 0);
  auto r = moecheck({"run", c, "--backend", "faulty:no_such_fault"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown fault"), std::string::npos) << r.err;
  r = moecheck({"compare", c});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/outputs"), std::string::npos) << r.err;
  r = moecheck({"reference", c, "--budget-model", "bits:99"});
  EXPECT_EQ(r.exit_code, 2);
  // Without a usable GPU the GPU backends say why and exit 2 (on a GPU machine they run).
  r = moecheck({"run", c, "--backend", "cuda", "-o", dir.file("gpu.h5")});
  if (r.exit_code != 0) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--backend"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("gpu.h5")));
  }
  r = moecheck({"reference", c, "--device", "cuda", "-q", "-o", dir.file("ref-gpu.h5")});
  if (r.exit_code != 0) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--device: cuda: "), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.file("ref-gpu.h5")));
  }
  // An unknown device is a usage error; auto runs wherever it can and stores the budget.
  r = moecheck({"compare", c, "--device", "tpu"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  r = moecheck({"reference", c, "--device", "auto", "--budget-model", "hopper", "-o", dir.file("ref-auto.h5")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("weight products and the budget's on "), std::string::npos) << r.err;
}

TEST(CliPipeline, BenchReferencePrintsFigures) {
  const auto r = moecheck({"bench", "reference", "--preset", "tiny-deepseek", "--tokens", "16"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GFLOP/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak RSS"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace moecheck
