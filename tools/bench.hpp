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
int bench_reference(const BenchShape& shape, int64_t tokens, uint64_t seed, int threads);

}  // namespace moecheck::cli
