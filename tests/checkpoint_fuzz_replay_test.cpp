// The libFuzzer target (tools/checkpoint/fuzz_safetensors_header.cpp) built with the normal
// compiler and driven over the committed seed corpus tools/checkpoint/fuzz_corpus/, plus every
// truncation and a deterministic set of byte mutations of each seed, so the corpus is exercised
// on every test run even where tests/checkpoint_fuzz.sh cannot fuzz (no clang). The target
// aborts on anything but "parses" or InputError; a crash fails this test.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "reference/counter_rng.hpp"
#include "tests/golden_test_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace moecheck {
namespace {

std::vector<std::vector<uint8_t>> corpus() {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& f : std::filesystem::directory_iterator(test::source_path("tools/checkpoint/fuzz_corpus"))) {
    std::ifstream in(f.path(), std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

TEST(SafetensorsFuzzReplay, SeedCorpusTruncationsAndMutations) {
  const auto seeds = corpus();
  ASSERT_GE(seeds.size(), 10u) << "seed corpus missing";
  size_t runs = 0;
  const CounterRng rng{2024, 1};
  uint64_t draw = 0;
  for (const auto& s : seeds) {
    LLVMFuzzerTestOneInput(s.data(), s.size());
    for (size_t n = 0; n < s.size(); ++n, ++runs) LLVMFuzzerTestOneInput(s.data(), n);
    test::for_each_mutation(s, 200, rng, &draw, [&](const std::vector<uint8_t>& b) {
      LLVMFuzzerTestOneInput(b.data(), b.size()), ++runs;
    });
  }
  EXPECT_GT(runs, 1000u);
}

}  // namespace
}  // namespace moecheck
