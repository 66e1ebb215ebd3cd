// Device fills of the benchmark's synthetic layer (bench_fill.hpp): a counter hash per element
// (splitmix64's finaliser of seed ^ index * odd constant), so a seed gives the same layer on
// every run. Bench data only: not the make-case generator's distributions, which a timing does
// not need (and 11 GB of DeepSeek-V3 weights would take minutes to draw on the host).
#include "kernels/bench_fill.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_check.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kThreads = 256;

__host__ __device__ inline uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ inline float unit(uint64_t h, int part) {  // [0, 1) from 16 bits of h
  return static_cast<float>((h >> (16 * part)) & 0xFFFF) * (1.0f / 65536.0f);
}
// Sum of four uniforms, centred and scaled to unit variance (Irwin-Hall, |x| <= 2 sqrt 3).
__device__ inline float normalish(uint64_t h) {
  return (unit(h, 0) + unit(h, 1) + unit(h, 2) + unit(h, 3) - 2.0f) * 1.7320508f;
}

// Random e4m3 codes; the NaN codes S.1111.111 become zero.
__global__ void fill_fp8_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const auto c = static_cast<uint8_t>(mix64(seed ^ (i * 0xD1B54A32D192ED03ull)) >> 24);
    p[i] = (c & 0x7F) == 0x7F ? 0 : c;
  }
}
__global__ void fill_float_kernel(float* p, size_t n, uint64_t seed, float base, bool positive) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed ^ (i * 0xD1B54A32D192ED03ull));
    p[i] = positive ? base * (0.5f + unit(h, 0)) : base * normalish(h);
  }
}
__global__ void fill_bf16_kernel(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(normalish(mix64(seed ^ (i * 0xD1B54A32D192ED03ull)))));
}

// Reads n16 16-byte words; writes *sink only if their xor is a value it never is in practice,
// so the loads are not dead code. What stays in L2 afterwards is clean (no write-back owed).
__global__ void read_through_kernel(const uint4* p, size_t n16, uint32_t* sink) {
  uint32_t x = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(p + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9E3779B9u) *sink = x;
}

int grid_for(size_t n) { return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

}  // namespace

void fill_fp8(void* p, size_t n, uint64_t seed) {
  if (n == 0) return;
  fill_fp8_kernel<<<grid_for(n), kThreads>>>(static_cast<uint8_t*>(p), n, mix64(seed));
  MOECHECK_CUDA_CHECK_LAUNCH("fill_fp8_kernel");
}
void fill_float(void* p, size_t n, uint64_t seed, float base, bool positive) {
  if (n == 0) return;
  fill_float_kernel<<<grid_for(n), kThreads>>>(static_cast<float*>(p), n, mix64(seed), base, positive);
  MOECHECK_CUDA_CHECK_LAUNCH("fill_float_kernel");
}
void fill_bf16(void* p, size_t n, uint64_t seed) {
  if (n == 0) return;
  fill_bf16_kernel<<<grid_for(n), kThreads>>>(static_cast<uint16_t*>(p), n, mix64(seed));
  MOECHECK_CUDA_CHECK_LAUNCH("fill_bf16_kernel");
}

void read_through(const void* p, size_t bytes, uint32_t* sink, cudaStream_t stream) {
  const size_t n16 = bytes / 16;
  if (n16 == 0) return;
  read_through_kernel<<<grid_for(n16), kThreads, 0, stream>>>(static_cast<const uint4*>(p), n16, sink);
  MOECHECK_CUDA_CHECK_LAUNCH("read_through_kernel");
}

}  // namespace moecheck::kernels
