// The block-scaled GEMM half of `moecheck probe`: how a library's FP8 GEMM (cuBLASLt's today)
// composes the tensor-core instruction (reference/tensor_core_model.hpp) into a K-long dot product
// with per-128 scales. Each candidate composition is emulated bit for bit from the measured
// instruction model and compared with the library's float32 outputs:
//   p_b    = the chain of 4 k32 instructions over K block b, started from zero;
//   one of
//     "ffma"       acc = fmaf(fl(sa sw), p_b, acc)           (DeepGEMM's promotion: one FMUL, one FFMA)
//     "mul-add"    acc = fl(acc + fl(fl(sa sw) p_b))
//     "split-K S"  the blocks in S contiguous ranges, each promoted by "ffma" from zero, the S
//                  partial results summed in float32 in order
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/tensor_core_model.hpp"

namespace moecheck::probe {

struct GemmProbeCase {
  int64_t m = 64, n = 256, k = 1024;
  uint64_t seed = 1;
  std::vector<uint8_t> a, w;  // [m, k], [n, k] e4m3 codes
  std::vector<float> sa, sw;  // [m][k/128], [n/128][k/128]
  std::vector<float> d;       // the library's outputs [m, n]
  std::string algo;           // what the library chose
};

// The shapes probed by default: an expert's rows against GEMM1 and GEMM2 panels of real layers,
// including DeepSeek-V3's GEMM1 shape, where cuBLASLt was seen to pick split-K 2.
std::vector<GemmProbeCase> default_gemm_probe_cases(uint64_t seed);

// Fills a, w, sa, sw (activations quantized per token per 128 channels from N(0,1) data with
// per-token magnitudes, weights per 128 x 128 block, both scales amax / 448 in float32).
void make_gemm_probe_inputs(GemmProbeCase& c);

struct GemmCompositionResult {
  std::string composition;  // "ffma", "mul-add", "split-K 2", ...
  int64_t mismatches = 0, outputs = 0;
};

// Every candidate composition against c.d, best first.
std::vector<GemmCompositionResult> fit_gemm_composition(const GemmProbeCase& c, const TensorCoreModel& instr,
                                                        int threads);

}  // namespace moecheck::probe

namespace moecheck::probe {

// DIR/probe-gemm.json (shapes, seed, the library's algorithm) and DIR/probe-gemm.bin (the
// outputs one case after another); reading regenerates the inputs from the seed.
void write_gemm_dump(const std::string& dir, const std::vector<GemmProbeCase>& cases);
std::vector<GemmProbeCase> read_gemm_dump(const std::string& dir);  // empty when DIR has none

}  // namespace moecheck::probe
