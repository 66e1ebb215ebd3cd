// What the GPU's float64 products share (fp64_weight_products.cpp, fp64_product.cpp): a
// context per concurrent product (stream, cuBLAS handle in pedantic math mode, buffers grown to the
// largest request), checked cuBLAS calls, and staged uploads from pageable memory. Internal to
// kernels/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <fmt/format.h>

#include "kernels/cuda_check.hpp"

namespace moecheck::kernels::fp64 {

inline void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(fmt::format("{} failed: {} ({}) ({}:{})", call, cublasGetStatusName(s), cublasGetStatusString(s),
                                file, line),
                    cudaErrorUnknown);
}
#define FP64_CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)

// Where a Grown buffer lives: device memory, or page-locked host memory (copies from it run at
// the bus's rate and asynchronously, where copies from pageable memory go through the driver's
// own staging).
struct DeviceMemory {
  static void* allocate(size_t n) {
    void* p = nullptr;
    MOECHECK_CUDA_CHECK(cudaMalloc(&p, n));
    return p;
  }
  static cudaError_t release(void* p) { return cudaFree(p); }
};
struct PinnedMemory {
  static void* allocate(size_t n) {
    void* p = nullptr;
    MOECHECK_CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocDefault));
    return p;
  }
  static cudaError_t release(void* p) { return cudaFreeHost(p); }
};

// A buffer grown to the largest request (contents not kept across growth).
template <class Memory>
struct Grown {
  void* p = nullptr;
  size_t bytes = 0;
  ~Grown() {
    if (p) Memory::release(p);
  }
  template <class T>
  T* at_least(size_t count) {
    const size_t need = count * sizeof(T);
    if (need > bytes) {
      if (p) MOECHECK_CUDA_CHECK(Memory::release(p));
      p = nullptr, bytes = 0;
      p = Memory::allocate(need);
      bytes = need;
    }
    return static_cast<T*>(p);
  }
};
using GrownDevice = Grown<DeviceMemory>;
using GrownPinned = Grown<PinnedMemory>;

// Copies n bytes from pageable src to device dst through the pinned buffer stage, in pieces, so
// that the CPU's copy of one piece overlaps the bus transfer of the previous one.
inline void upload_staged(void* dst, const void* src, size_t n, GrownPinned& stage, cudaStream_t stream) {
  constexpr size_t kPiece = size_t(4) << 20;
  char* pin = stage.at_least<char>(n);
  for (size_t off = 0; off < n; off += kPiece) {
    const size_t len = std::min(kPiece, n - off);
    std::memcpy(pin + off, static_cast<const char*>(src) + off, len);
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, pin + off, len, cudaMemcpyHostToDevice, stream));
  }
}

struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  // One product (fp64_product.cpp): the weight's codes, scales and float64 values, its other
  // forms for the budget's extras, and every input and output packed into one buffer each way.
  GrownDevice codes, scales, w, wabs, wsq, wf, in_pack, out_pack;
  GrownPinned pin_codes, pin_in_pack, pin_out_pack;
  cudaEvent_t upload_start = nullptr;                           // before the first copy up
  cudaEvent_t compute_start = nullptr, compute_end = nullptr;  // around the product's kernels and GEMMs
  cudaEvent_t trunc_start = nullptr, trunc_end = nullptr;      // around the truncation pass
  Context() {
    try {
      MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&upload_start));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&compute_start));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&compute_end));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&trunc_start));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&trunc_end));
      FP64_CUBLAS_CHECK(cublasCreate(&handle));
      FP64_CUBLAS_CHECK(cublasSetStream(handle, stream));
      // Pedantic: the prescribed precision in every phase (no TF32-like or emulated FP64 paths).
      FP64_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
    } catch (...) {
      release_handles();
      throw;
    }
  }
  ~Context() { release_handles(); }
  void release_handles() {
    if (upload_start) cudaEventDestroy(upload_start), upload_start = nullptr;
    if (compute_start) cudaEventDestroy(compute_start), compute_start = nullptr;
    if (compute_end) cudaEventDestroy(compute_end), compute_end = nullptr;
    if (trunc_start) cudaEventDestroy(trunc_start), trunc_start = nullptr;
    if (trunc_end) cudaEventDestroy(trunc_end), trunc_end = nullptr;
    if (handle) cublasDestroy(handle), handle = nullptr;
    if (stream) cudaStreamDestroy(stream), stream = nullptr;
  }
};

}  // namespace moecheck::kernels::fp64
