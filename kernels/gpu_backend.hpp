// Running a case's problem on the GPU (backends "cuda" and "cublaslt"): device discovery, upload
// of the inputs and of every local expert's weights into FlashInfer's layouts, one run, and the
// BackendOutput a backend records. Plain C++ header; CUDA stays behind it.
#pragma once

#include <string>

#include "kernels/backend_output.hpp"
#include "reference/moe_forward.hpp"

namespace moecheck::kernels {

enum class GpuBackend { cuda, cublaslt };

struct GpuInfo {
  bool usable = false;
  std::string why;     // when not usable: what is missing, in words
  std::string device;  // "NVIDIA H200 (sm_90, driver 13.0, runtime 13.0)"
};
// Whether this build and machine can run the GPU backends (a device of compute capability 9.x).
GpuInfo probe_gpu();

// Runs the problem. Hidden states: the problem's FP8 activations when it has them, else its
// values as bf16 (hidden_is_bf16: they are bf16-exact) through the bf16 entry, else float32
// quantized on the device by the activation-quantization stage. Experts of the local range that
// the problem does not store get zero weights and scale 1 (no token routes to them: the caller
// checks, as the reference does).
BackendOutput run_gpu_backend(const MoeProblem& p, bool hidden_is_bf16, GpuBackend backend, bool expert_outputs);

}  // namespace moecheck::kernels
