// `moecheck probe`'s measurement, end to end: the test vectors run on the device's bare FP8
// instructions (or the outputs of an earlier run read back with `--from`), the raw outputs
// dumped (`--dump`), the bit-level model fitted per instruction form and checked per family, and
// for wgmma how cuBLASLt's block-scaled GEMM composes the fitted instruction (probe_gemm.hpp).
//
// Running on the device needs a CUDA build and a GPU that can run sm_90a code: otherwise an
// InputError naming "probe" (exit 2) that points to --from. The device's name goes to stderr
// ("probe: device NAME") before the vectors run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/mma_probe.hpp"
#include "tools/probe/probe_fit.hpp"
#include "tools/probe/probe_gemm.hpp"

namespace moecheck::probe {

struct ProbeRequest {
  std::string instruction = "all";  // wgmma | mma-sync | all
  int64_t dot_products = int64_t(1) << 20;  // per instruction form
  uint64_t seed = 1;                // of the test vectors (with `from`: the dump's seed is used)
  std::string dump;                 // also write the raw outputs here
  std::string from;                 // fit the outputs dumped here instead of running on the device
  int threads = 0;                  // CPU threads for the fit; 0: all
};

struct FamilyCheck {
  std::string family;
  int64_t k = 0;
  Mismatches mismatches;  // of the instruction's fitted model
};

struct InstructionFit {
  kernels::ProbeInstruction instruction = kernels::ProbeInstruction::wgmma;
  FitResult fit;
  std::vector<FamilyCheck> families;
  bool exact() const { return fit.best_mismatches == 0; }
};

struct GemmFit {
  int64_t m = 0, n = 0, k = 0;
  std::string algo;                                   // what cuBLASLt chose
  std::vector<GemmCompositionResult> compositions;    // best first
};

struct ProbeResult {
  uint64_t seed = 0;
  std::vector<InstructionFit> instructions;  // wgmma first, then mma.sync; those that ran
  std::vector<GemmFit> gemms;                // only when wgmma ran (the compositions build on its model)
  // Whether the model reproduces every wgmma output (true when wgmma did not run): mma.sync is
  // informational (sm_90 lowers it to an f16 unpack and HMMA, which the model does not describe).
  bool wgmma_exact() const;
};

ProbeResult run_probe(const ProbeRequest& req);

// The --json document: seed, per instruction the model, its fields, the counts, the models that
// reproduce every output and the per-family counts; "cublaslt" with the GEMM compositions.
nlohmann::json probe_report_json(const ProbeResult& r);

}  // namespace moecheck::probe
