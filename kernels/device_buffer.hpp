// A device allocation that frees itself, for the host side of the GPU code (backends, bench,
// probe): plain C++ (cuda_runtime_api.h only), every call checked (cuda_check.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "kernels/cuda_check.hpp"

namespace moecheck::kernels {

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n) MOECHECK_CUDA_CHECK(cudaMalloc(&p, n));
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  void upload(const void* src, size_t n, size_t offset = 0) {
    MOECHECK_CUDA_CHECK(cudaMemcpy(static_cast<char*>(p) + offset, src, n, cudaMemcpyHostToDevice));
  }
  void poison() {  // 0xFF bytes: NaN in float, bf16 and e4m3
    if (bytes) MOECHECK_CUDA_CHECK(cudaMemset(p, 0xFF, bytes));
  }
};

// A buffer holding a copy of v.
template <class T>
DeviceBuffer& upload_all(DeviceBuffer& b, const std::vector<T>& v) {
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <class T>
void download(std::vector<T>& dst, const DeviceBuffer& b, size_t count) {
  dst.resize(count);
  if (count) MOECHECK_CUDA_CHECK(cudaMemcpy(dst.data(), b.p, count * sizeof(T), cudaMemcpyDeviceToHost));
}

// Index of the first element still holding DeviceBuffer::poison()'s bytes (never written by the
// kernel), or -1.
template <class T>
long long first_poisoned(const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    const unsigned char* b = reinterpret_cast<const unsigned char*>(&v[i]);
    bool all = true;
    for (size_t j = 0; j < sizeof(T); ++j) all = all && b[j] == 0xFF;
    if (all) return static_cast<long long>(i);
  }
  return -1;
}

}  // namespace moecheck::kernels
