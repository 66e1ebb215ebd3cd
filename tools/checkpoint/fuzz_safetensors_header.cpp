// libFuzzer target for the safetensors header parser (tools/checkpoint/safetensors.cpp): the
// input is a whole file. The contract under test: any byte string either parses or gives an
// InputError; anything else (another exception, a crash, a sanitizer report, a leak, more than
// -rss_limit_mb of memory) is a bug. A parsed header must also be self-consistent.
//
// Built two ways: by tests/checkpoint_fuzz.sh with clang++ -fsanitize=fuzzer,address (a bounded
// fuzzing run, when clang can), and into tests/checkpoint_fuzz_replay_test with g++ (the seed
// corpus tools/checkpoint/fuzz_corpus/ replayed on every test run).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "tools/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moecheck;
  try {
    const ckpt::SafetensorsHeader h = ckpt::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz-input");
    // What a parsed header promises: every tensor inside the data region, byte count right.
    if (h.data_start + h.data_bytes != size) std::abort();
    for (const auto& [name, t] : h.tensors)
      if (t.begin > t.end || t.end > h.data_bytes || name.empty()) std::abort();
  } catch (const InputError&) {
    // the expected outcome for a malformed input
  }
  return 0;
}
