// Checked CUDA runtime calls for the GPU path (kernels/): every runtime call and every kernel
// launch goes through one of the macros below, so a failure surfaces as a moecheck::CudaError
// naming the call, the runtime's message and the source location, never as a silently wrong
// (or unwritten) output.
//
//   MOECHECK_CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream));
//   my_kernel<<<grid, block, 0, stream>>>(...);
//   MOECHECK_CUDA_CHECK_LAUNCH("my_kernel");   // cudaGetLastError right after the launch
//
// Plain C++ header: includes only cuda_runtime_api.h, so host .cpp files compiled by g++ use it.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace moecheck {

// A CUDA runtime call or a kernel launch failed. what() = "<call> failed: <message> (file:line)".
class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& call, cudaError_t code, const char* file, int line)
      : std::runtime_error(call + " failed: " + cudaGetErrorString(code) + " (" + file + ":" +
                           std::to_string(line) + ")"),
        code_(code) {}
  // A CUDA library call (cuBLASLt, kernels/cublaslt_moe.cu) failed: `message` names the call
  // and the library's status; code() is cudaErrorUnknown unless the runtime reported one.
  CudaError(const std::string& message, cudaError_t code) : std::runtime_error(message), code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

namespace detail {
inline void cuda_check(cudaError_t code, const char* call, const char* file, int line) {
  if (code != cudaSuccess) throw CudaError(call, code, file, line);
}
}  // namespace detail

}  // namespace moecheck

#define MOECHECK_CUDA_CHECK(call) ::moecheck::detail::cuda_check((call), #call, __FILE__, __LINE__)
// After a <<<...>>> launch: configuration errors (bad grid, too much shared memory) are reported
// by cudaGetLastError; `name` says which launch it was.
#define MOECHECK_CUDA_CHECK_LAUNCH(name) \
  ::moecheck::detail::cuda_check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

namespace moecheck {

// The current device's SM count, asked once per process (the launchers that size persistent or
// one-wave grids by it assume one device per process, as the rest of the GPU path does).
inline int current_device_sm_count() {
  static const int n = [] {
    int device = 0, count = 0;
    MOECHECK_CUDA_CHECK(cudaGetDevice(&device));
    MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return n;
}

}  // namespace moecheck
