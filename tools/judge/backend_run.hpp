// Running one backend on a case in-process (what `moecheck run` records, and what gate, shrink
// and repro judge without writing the output first): the backend by name, and its output in the
// case format's /outputs/<name> record.
//
// Backends: emulated, faulty:<fault> (kernels/emulated/emulated_moe.hpp; with the suffix @hopper,
// their GEMM block sums are the Hopper wgmma instruction's, bit for bit), cuda and cublaslt
// (kernels/gpu_backend.hpp; only in a CUDA build, else an InputError naming --backend), and
// exec:CMD (tools/judge/exec_backend.hpp: an external command that reads the case and writes its
// output file; its failures are ExecFailure, the backend's).
#pragma once

#include <cstdint>
#include <string>

#include "golden/case_file.hpp"
#include "golden/case_problem.hpp"
#include "kernels/backend_output.hpp"

namespace moecheck::judge {

// The backend declines the case: it does not implement what the case asks (an engine recipe our
// GPU kernels lack; an exec:CMD command that exits with kExecUnsupported; a Python kernel raising
// moecheck.Unsupported). No verdict either way: `run` exits 2 with the message (it is an
// InputError), gate counts the case as unsupported (not judged), shrink keeps only candidates
// that still fail, faults does not count it as caught.
class BackendUnsupported : public InputError {
 public:
  using InputError::InputError;
};

// A backend name taken apart: base "emulated", "faulty:<fault>", "cuda" or "cublaslt", and
// whether "@hopper" followed (the emulated ones only). InputError naming --backend otherwise.
struct BackendName {
  std::string base;
  bool hopper = false;
  bool gpu() const { return base == "cuda" || base == "cublaslt"; }
  bool faulty() const { return base.rfind("faulty:", 0) == 0; }
  bool exec() const { return base.rfind("exec:", 0) == 0; }  // base is the whole "exec:CMD"
  // The correct backend with the same numerics: "emulated" (plus "@hopper").
  std::string correct() const { return hopper ? "emulated@hopper" : "emulated"; }
};
BackendName parse_backend_name(const std::string& name);

// Runs `backend` on the case. int32_threshold > 0: faulty:int32_overflow's wrap index (the
// emulation's default is 2^31, which tiny cases never reach). InputError for an unknown backend
// or fault, and for a GPU backend in a build without CUDA.
BackendOutput run_backend(const CaseProblem& cp, const std::string& backend, bool expert_outputs,
                          int64_t int32_threshold = 0);

// The /outputs/<name> record of a run: bf16 output, ids, weights, expert outputs, a sharded run's
// ranks (golden/FORMAT.md /outputs/<name>/ranks), and the attributes backend, device, created
// (UTC), tool_version and budget_model.
OutputData to_output_data(const BackendOutput& r);
// The hashes of the inputs an output was computed from, as its attributes input_hash (the
// combined hash of CaseProblem::input_hash) and input_hash:<part> per input (golden/FORMAT.md).
void record_input_hashes(const CaseProblem::InputHashes& h, OutputData& d);
// compare's check: an output that records input hashes must have been computed from the case's
// present inputs; otherwise InputError(path, "/outputs/<name>@input_hash", naming what changed).
void check_input_hashes(const CaseProblem::InputHashes& h, const OutputInfo& out, const std::string& path);

// Whether the GPU backends can run here, and why not (a CPU-only build says so).
struct GpuAvailability {
  bool usable = false;
  std::string device;  // when usable
  std::string why;     // when not
};
GpuAvailability gpu_availability();

}  // namespace moecheck::judge
