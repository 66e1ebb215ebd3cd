// Benchmarks of the moecheck CLI (`moecheck bench ...`): commands that print figures, not tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/moe_config.hpp"
#include "reference/weight_products.hpp"

namespace moecheck::bench {

struct BenchShape {
  std::string name;
  MoeConfig config;
  bool uses_bias = false;
};

// Float64 reference on a synthetic in-memory layer of this shape (bench_reference.cpp).
// compare_models: budget models under which to also time what `moecheck compare` adds (the
// budgeted forward and the judging of one output); empty: none. repeat: timed runs of each, in
// turn (reference, then each model), reported as medians with their spread. products: also time
// the reference with its weight products there (`--device cuda`), beside the CPU's, and say how
// far the two outputs are apart.
int bench_reference(const BenchShape& shape, int64_t tokens, uint64_t seed, int threads,
                    const std::vector<std::string>& compare_models, int repeat, WeightProducts* products = nullptr);

// `moecheck bench --backend cuda|cublaslt`: the GPU backends' timing (bench_gpu.cpp).
struct GpuBenchRequest {
  std::vector<std::string> backends;  // cuda, cublaslt, or both (run in this order, then side by side)
  std::string preset = "deepseek-v3", output;
  std::vector<int64_t> tokens{1, 8, 64, 512, 4096};
  int64_t tp = 1;
  uint64_t seed = 1;
  int min_iters = 20, input_sets = 4;
  double min_seconds = 0.5;
};
int bench_gpu(const GpuBenchRequest& q);

}  // namespace moecheck::bench
