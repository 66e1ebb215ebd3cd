// The case reader's libFuzzer target (golden/fuzz_case_reader.cpp) built with the normal compiler
// and driven over its committed seed corpus golden/fuzz_corpus/ plus a deterministic set of
// mutations of each seed, so the reader's rules meet the corpus on every test run even where
// tests/case_reader_fuzz.sh cannot fuzz (no clang). The target lets only InputError through;
// any other exception or a crash fails this test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "reference/counter_rng.hpp"
#include "tests/golden_test_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace moecheck {
namespace {

TEST(CaseReaderFuzzReplay, SeedCorpusAndMutations) {
  std::vector<std::vector<uint8_t>> seeds;
  for (const auto& f : std::filesystem::directory_iterator(test::source_path("golden/fuzz_corpus"))) {
    std::ifstream in(f.path(), std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GE(seeds.size(), 12u) << "seed corpus missing";
  const CounterRng rng{2026, 15};
  uint64_t draw = 0;
  size_t runs = 0;
  for (const auto& s : seeds) {
    LLVMFuzzerTestOneInput(s.data(), s.size()), ++runs;
    test::for_each_mutation(s, 40, rng, &draw, [&](const std::vector<uint8_t>& b) {
      LLVMFuzzerTestOneInput(b.data(), b.size()), ++runs;
    });
  }
  EXPECT_GT(runs, 400u);
}

// The seeds do what their names say: those named valid* leave a valid case (an output's expert
// id out of range is the output's defect, judged by compare as a routing mismatch, not refused
// by the reader), every other one breaks a rule.
TEST(CaseReaderFuzzReplay, EverySeedButTheEmptyOneBreaksARule) {
  setenv("MOECHECK_FUZZ_VERBOSE", "1", 1);
  for (const auto& f : std::filesystem::directory_iterator(test::source_path("golden/fuzz_corpus"))) {
    std::ifstream in(f.path(), std::ios::binary);
    const std::vector<uint8_t> s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    testing::internal::CaptureStderr();
    LLVMFuzzerTestOneInput(s.data(), s.size());
    const std::string said = testing::internal::GetCapturedStderr();
    const bool valid = f.path().filename().string().rfind("valid", 0) == 0;
    EXPECT_EQ(said.rfind(valid ? "valid" : "InputError: ", 0), 0u) << f.path().filename() << ": " << said;
  }
  unsetenv("MOECHECK_FUZZ_VERBOSE");
}

}  // namespace
}  // namespace moecheck
