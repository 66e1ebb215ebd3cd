// Benchmarks of the moecheck CLI (`moecheck bench ...`): commands that print figures, not tests.
#pragma once

#include <string>

#include "reference/moe_config.hpp"

namespace moecheck::cli {

struct BenchShape {
  std::string name;
  MoeConfig config;
  bool uses_bias = false;
};

// Float64 reference on a synthetic in-memory layer of this shape (bench_reference.cpp).
// with_compare: also time what `moecheck compare` adds (budgeted forward + judging one output).
int bench_reference(const BenchShape& shape, int64_t tokens, uint64_t seed, int threads, bool with_compare);

}  // namespace moecheck::cli
