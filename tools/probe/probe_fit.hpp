// Fitting and checking the tensor-core model (reference/tensor_core_model.hpp) against hardware
// outputs of the probe's test vectors (probe_vectors.hpp), and the raw-output files that let the
// fit run on a machine without a GPU (`moecheck probe --dump DIR` there, `--from DIR` here).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/mma_probe.hpp"
#include "reference/tensor_core_model.hpp"
#include "tools/probe/probe_vectors.hpp"

namespace moecheck::probe {

// One family's tiles and what one instruction form returned for them.
struct ProbeRun {
  ProbeFamily family;
  kernels::ProbeInstruction instruction = kernels::ProbeInstruction::wgmma;
  kernels::ProbeTiles tiles;
  std::vector<float> d;  // hardware outputs, [tiles][64][8]
};

struct Mismatches {
  int64_t checked = 0;
  int64_t values = 0;     // outputs whose value differs from the model's
  int64_t zero_sign = 0;  // outputs equal in value but for the sign of a zero
  int64_t first = -1;     // index of the first value mismatch (tile * 512 + m * 8 + n)
};

// Compares every output of `run` (or every `stride`-th) with the model; stops counting value
// mismatches once `stop_after` is exceeded (0: never).
Mismatches check_model(const TensorCoreModel& model, const ProbeRun& run, int64_t stride = 1,
                       int64_t stop_after = 0);

// The models searched: alignment group, kept bits, cut direction, exponent rule, where the
// accumulator enters, and the result's width and rounding.
std::vector<TensorCoreModel> candidate_models();

struct FitResult {
  std::vector<TensorCoreModel> exact;  // models with no value mismatch on every output given
  TensorCoreModel best;                // the first of `exact`, else the one with fewest mismatches
  int64_t best_mismatches = 0;
  int64_t checked = 0;
  int64_t searched = 0;  // candidate models screened
};

// Screens every candidate on a sample of each run, then checks the best few on every output.
FitResult fit_model(const std::vector<ProbeRun>& runs, int threads);

// The raw-output files: DIR/probe-<instruction>.bin holds, per family, its name, nk, tile count,
// an FNV-1a hash of the regenerated inputs, and D; DIR/probe-manifest.json the seed. Reading
// regenerates the inputs from the seed and refuses (InputError) a file whose input hash differs.
void write_probe_dump(const std::string& dir, uint64_t seed, const std::vector<ProbeRun>& runs);
std::vector<ProbeRun> read_probe_dump(const std::string& dir, uint64_t* seed);

uint64_t probe_input_hash(const kernels::ProbeTiles& t);

// f(i) for i < n on `threads` threads (an atomic counter hands out the indices).
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& f);

}  // namespace moecheck::probe
