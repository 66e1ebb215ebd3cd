// Programmatic dependent launch (sm_90): the layer's stages after the first are launched so the
// GPU may schedule a stage's blocks while the stage before it is still finishing, instead of
// after that grid has drained and the next launch has been processed (about 7 us over the five
// boundaries of a T = 1 step as one CUDA graph on the H100: docs/bench/CUDA-GEMM-NOTES.md).
//
// The contract every kernel launched with launch_dependent keeps: its first statement is
// wait_for_previous_grid(), before it reads or writes any global memory. That instruction
// (griddepcontrol.wait) returns once every grid it depends on has completed and its memory
// operations are visible, so the stage sees exactly what a plain stream-ordered launch sees;
// a grid launched without the attribute has no such dependency and the wait returns at once.
// Transitivity: a stage's predecessor itself waited for its own predecessor before finishing,
// so every earlier stage is complete as well.
//
// let_dependents_start() (griddepcontrol.launch_dependents) lets the next stage's blocks be
// scheduled before this grid's blocks exit; they still wait for its completion. The hardware
// schedules them only after every block of this grid has issued it (or exited), so they never
// take resources a block of this grid still needs to start.
//
// Launches are dependent only inside a DependentLaunchScope that asks for it (below);
// MOECHECK_DEPENDENT_LAUNCH=off launches every stage plainly even there, for measurements.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda_check.hpp"

namespace moecheck::kernels {

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void let_dependents_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// MOECHECK_DEPENDENT_LAUNCH, read once: on unless set to off.
inline bool dependent_launch_allowed_by_environment() {
  static const bool on = [] {
    const char* v = std::getenv("MOECHECK_DEPENDENT_LAUNCH");
    if (v == nullptr || *v == '\0' || std::string(v) == "on") return true;
    if (std::string(v) == "off") return false;
    throw std::invalid_argument(std::string("MOECHECK_DEPENDENT_LAUNCH: '") + v + "' is not on or off");
  }();
  return on;
}

// Whether launch_dependent, on this host thread, adds the attribute: only inside a
// DependentLaunchScope that asks for it (the layer's small batches), never by default. Measured on
// the H100 (docs/bench/CUDA-GEMM-NOTES.md): the layer as one CUDA graph gains about 7 us at T = 1
// and loses about 5% at T = 4096, so the layer asks for it where it takes the one-launch prologue.
inline bool& dependent_launch_in_scope() {
  thread_local bool on = false;
  return on;
}

class DependentLaunchScope {
 public:
  // An unreadable MOECHECK_DEPENDENT_LAUNCH throws here, before the layer enqueues anything.
  explicit DependentLaunchScope(bool on) : previous_(dependent_launch_in_scope()) {
    if (on) (void)dependent_launch_allowed_by_environment();
    dependent_launch_in_scope() = on;
  }
  ~DependentLaunchScope() { dependent_launch_in_scope() = previous_; }
  DependentLaunchScope(const DependentLaunchScope&) = delete;
  DependentLaunchScope& operator=(const DependentLaunchScope&) = delete;

 private:
  bool previous_;
};

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the work before
// it in the stream where the scope asks for it. `kernel_name` names the kernel; a failed launch
// throws CudaError("launch of <kernel_name>").
template <typename... Params, typename... Args>
void launch_dependent(const char* kernel_name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = dependent_launch_in_scope() && dependent_launch_allowed_by_environment() ? 1 : 0;
  const cudaError_t code = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (code != cudaSuccess) throw CudaError(std::string("launch of ") + kernel_name, code, __FILE__, __LINE__);
}

}  // namespace moecheck::kernels
