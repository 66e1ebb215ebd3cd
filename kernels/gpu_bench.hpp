// Timing of the GPU backends (`moecheck bench --backend cuda|cublaslt`): a synthetic layer of a
// model's shape generated on the device, then, per batch size, repeated runs timed with CUDA
// events around the whole layer and between its stages (fp8_block_scale_moe.hpp's StageHook).
// Plain C++ header; CUDA stays in gpu_bench.cu. Figures only: no check here decides pass/fail
// except the output sanity check (finite, nonzero norm), which a benchmark of a broken kernel
// must not hide.
//
// Method (../shared device METHOD.md): warm-up runs first (module load, cuBLASLt heuristics);
// then runs until both min_iters and min_seconds are reached (at most max_iters); before each
// timed run the L2 is flushed by writing a buffer larger than it, and the run's inputs (hidden
// states, router logits) rotate among input_sets distinct sets, so neither the cache nor a
// repeated routing flatters the figures. Reported: medians (and the 10th / 90th percentiles of
// the total) over the timed runs. Each timed run is done twice, after its own L2 flush: launched
// kernel by kernel with a CUDA event between stages (the per-stage figures), and replayed as a
// CUDA graph without the events (the total an engine's decode step sees).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/gpu_backend.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::kernels {

struct GpuBenchOptions {
  MoeConfig config;            // the (TP-sliced) layer; every expert is local unless EP is set
  bool routing_bias = false;   // the method takes a correction bias (deepseek_v3 presets)
  std::vector<int64_t> tokens; // batch sizes, each run separately
  GpuBackend backend = GpuBackend::cuda;
  int warmup = 3;
  int min_iters = 20, max_iters = 200;
  double min_seconds = 0.5;    // per batch size
  int input_sets = 4;
  uint64_t seed = 1;
};

struct StageTiming {
  std::string stage;
  double median_ms = 0;
};

struct GpuBenchRow {
  int64_t tokens = 0;
  int64_t slots = 0;            // (token, slot) pairs routed to local experts, mean over the input sets
  double experts_hit = 0;       // distinct local experts with >= 1 slot, mean over the input sets
  int iters = 0;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;  // the pass launched kernel by kernel, stage marks between
  // The same pass replayed as one CUDA graph (captured once per input set after the warm-up,
  // no stage marks): the launch overhead engines see in decode, where they replay graphs.
  double graph_median_ms = 0, graph_p10_ms = 0, graph_p90_ms = 0;
  std::string graph_failed;     // why the pass could not be captured ("" when it was)
  std::vector<StageTiming> stages;  // in run order
  double flops = 0;             // 2 * slots * (2I*H + H*I): the useful GEMM work (padding rows excluded)
  double min_bytes = 0;         // weights + scales of the experts hit, plus the layer's inputs and output once
  bool output_ok = false;       // the last run's output: every element finite and the norm nonzero
  std::string output_check;     // what was found, in words
  std::string algorithms;       // cublaslt: cuBLASLt's choices in the last run
};

struct GpuBenchResult {
  std::string device;           // probe_gpu().device
  std::string backend;
  double hbm_copy_gbs = 0;      // device-to-device cudaMemcpy, (read + write bytes) / time, median
  double weight_gib = 0;        // resident FP8 weights + scales of the layer
  int64_t l2_bytes = 0;
  std::vector<GpuBenchRow> rows;
};

// Runs the benchmark on device 0. progress(line) is called with short status lines.
// InputError when no usable GPU; CudaError on CUDA failures; std::invalid_argument for a
// configuration the backend rejects.
GpuBenchResult run_gpu_bench(const GpuBenchOptions& o, const std::function<void(const std::string&)>& progress);

}  // namespace moecheck::kernels
