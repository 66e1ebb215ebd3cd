// stream_probe: how fast G CTAs read contiguous 16 KiB blocks from DRAM into shared memory with D
// blocks in flight each, by cp.async (16 bytes per thread, one commit group per block) or by
// cp.async.bulk (one thread, completing on an mbarrier). The decode GEMMs stream weights this
// way; the table says how many CTAs and how deep a pipeline a grid needs to reach the copy rate
// (docs/bench/CUDA-GEMM-NOTES.md, "Decode variants"). Not a test: it prints figures.
//
//   stream_probe [MiB ...]      (default: 15 34 235: about the weights of GEMM2 and GEMM1 at TP 8, T = 1, and of GEMM1 at T = 1)
//
// Each figure is the median of 7 timed runs after 2 warm-up runs, CUDA events around the kernel
// alone; before each run a read of 4x the L2 leaves it holding other, clean lines.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/sm90_wgmma.cuh"

namespace {

using namespace moecheck::kernels::sm90;

constexpr int kBlock = 16384, kThreads = 256;

// D stages, D - 1 blocks ahead of the one being read (the small-batch GEMM's steady state).
template <int D>
__global__ void __launch_bounds__(kThreads) stream_cp_async(const uint8_t* src, int blocks, unsigned* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x;
  const uint8_t* base = src + static_cast<size_t>(blockIdx.x) * blocks * kBlock;
  auto load = [&](int b) {
    const uint32_t s = smem_addr(smem + (b % D) * kBlock);
    const uint8_t* g = base + static_cast<size_t>(b) * kBlock;
#pragma unroll
    for (int j = 0; j < kBlock / 16 / kThreads; ++j) cp_async_16(s + 16 * (tid + j * kThreads), g + 16 * (tid + j * kThreads));
  };
  for (int s = 0; s < D - 1; ++s) {
    if (s < blocks) load(s);
    cp_async_commit();
  }
  unsigned acc = 0;
  for (int b = 0; b < blocks; ++b) {
    cp_async_wait<D - 2>();
    __syncthreads();
    if (b + D - 1 < blocks) load(b + D - 1);
    cp_async_commit();
    acc += reinterpret_cast<const unsigned*>(smem + (b % D) * kBlock)[tid];
  }
  if (acc == 0x12345678u) sink[0] = acc;  // keeps the reads
}

// D stages, all D in flight: thread 0 refills a stage once every thread has read it.
template <int D>
__global__ void __launch_bounds__(kThreads) stream_bulk(const uint8_t* src, int blocks, unsigned* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ __align__(8) uint64_t full[D];
  const int tid = threadIdx.x;
  const uint8_t* base = src + static_cast<size_t>(blockIdx.x) * blocks * kBlock;
  if (tid == 0) {
    for (int s = 0; s < D; ++s) mbarrier_init(smem_addr(&full[s]), 1);
    fence_mbarrier_init();
  }
  __syncthreads();
  auto load = [&](int b) {
    const uint32_t bar = smem_addr(&full[b % D]);
    mbarrier_arrive_expect_tx(bar, kBlock);
    bulk_copy_g2s(smem_addr(smem + (b % D) * kBlock), base + static_cast<size_t>(b) * kBlock, kBlock, bar);
  };
  if (tid == 0)
    for (int s = 0; s < D && s < blocks; ++s) load(s);
  unsigned acc = 0;
  for (int b = 0; b < blocks; ++b) {
    mbarrier_wait(smem_addr(&full[b % D]), (b / D) & 1);
    acc += reinterpret_cast<const unsigned*>(smem + (b % D) * kBlock)[tid];
    __syncthreads();
    if (tid == 0 && b + D < blocks) load(b + D);
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

__global__ void read_through(const uint4* p, size_t n, unsigned* sink) {
  unsigned a = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    a ^= p[i].x;
  if (a == 0x12345678u) sink[1] = a;
}

struct Buffers {
  const uint8_t* src;
  const uint4* evict;
  size_t evict_words;
  unsigned* sink;
};

template <typename Kernel>
float median_ms(Kernel kernel, int grid, int smem, int blocks, const Buffers& b) {
  MOECHECK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t start, stop;
  MOECHECK_CUDA_CHECK(cudaEventCreate(&start));
  MOECHECK_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> t;
  for (int r = 0; r < 9; ++r) {
    read_through<<<1056, 256>>>(b.evict, b.evict_words, b.sink);
    MOECHECK_CUDA_CHECK(cudaEventRecord(start));
    kernel<<<grid, kThreads, smem>>>(b.src, blocks, b.sink);
    MOECHECK_CUDA_CHECK(cudaEventRecord(stop));
    MOECHECK_CUDA_CHECK(cudaEventSynchronize(stop));
    MOECHECK_CUDA_CHECK(cudaGetLastError());
    float ms = 0;
    MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 2) t.push_back(ms);
  }
  MOECHECK_CUDA_CHECK(cudaEventDestroy(start));
  MOECHECK_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <int D>
void sweep(const Buffers& b, size_t total_blocks) {
  for (int grid : {32, 64, 132, 264, 528}) {
    const int blocks = static_cast<int>(std::max<size_t>(1, total_blocks / grid));
    const double bytes = static_cast<double>(blocks) * grid * kBlock;
    const float t1 = median_ms(stream_cp_async<D>, grid, D * kBlock, blocks, b);
    const float t2 = median_ms(stream_bulk<D>, grid, D * kBlock, blocks, b);
    std::printf("depth %2d  ctas %3d  blocks/cta %5d  MB %7.1f | cp.async %8.1f us %6.0f GB/s | bulk %8.1f us %6.0f GB/s\n",
                D, grid, blocks, bytes / 1e6, t1 * 1e3, bytes / t1 / 1e6, t2 * 1e3, bytes / t2 / 1e6);
  }
}

// Prints the table for each size; a failed CUDA call throws moecheck::CudaError.
int probe(const std::vector<size_t>& sizes_mib) {
  cudaDeviceProp prop;
  MOECHECK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MiB; depth = stages per CTA (cp.async: depth - 1 blocks ahead, bulk: depth)\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const size_t src_bytes = 256ull << 20, evict_bytes = 4ull * prop.l2CacheSize;
  uint8_t* src = nullptr;
  uint4* evict = nullptr;
  unsigned* sink = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&src, src_bytes));
  MOECHECK_CUDA_CHECK(cudaMalloc(&evict, evict_bytes));
  MOECHECK_CUDA_CHECK(cudaMalloc(&sink, 64));
  MOECHECK_CUDA_CHECK(cudaMemset(src, 1, src_bytes));
  MOECHECK_CUDA_CHECK(cudaMemset(evict, 2, evict_bytes));
  const Buffers b{src, evict, evict_bytes / 16, sink};
  for (size_t mib : sizes_mib) {
    const size_t total_blocks = (mib << 20) / kBlock;
    std::printf("== %zu MiB\n", mib);
    sweep<2>(b, total_blocks);
    sweep<3>(b, total_blocks);
    sweep<4>(b, total_blocks);
    sweep<6>(b, total_blocks);
    sweep<8>(b, total_blocks);
    sweep<12>(b, total_blocks);
  }
  MOECHECK_CUDA_CHECK(cudaFree(src));
  MOECHECK_CUDA_CHECK(cudaFree(evict));
  MOECHECK_CUDA_CHECK(cudaFree(sink));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes_mib;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long v = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || v < 1 || v > 256) {
      std::fprintf(stderr, "stream_probe: '%s' is not a size in MiB from 1 to 256\n", argv[i]);
      return 2;
    }
    sizes_mib.push_back(static_cast<size_t>(v));
  }
  if (sizes_mib.empty()) sizes_mib = {15, 34, 235};
  try {
    return probe(sizes_mib);
  } catch (const std::exception& e) {  // a failed CUDA call (moecheck::CudaError names it)
    std::fprintf(stderr, "stream_probe: %s\n", e.what());
    return 1;
  }
}
