// The two FP8 tensor-core instruction forms of Hopper, run bare on test vectors (mma_probe.hpp).
//
// Nothing here rounds or scales: each kernel feeds A, B and C to the instruction and stores its
// float32 D, so D is what the tensor core computed. The CPU model (reference/tensor_core_model.hpp)
// is then fitted to and checked against these outputs.
//
// NOTES:
//  - wgmma operands come from shared memory through matrix descriptors, here in the layout
//    without swizzle: "core matrices" of 8 rows x 16 bytes, each 128 contiguous bytes (row r at
//    byte 16 r). For a K-major 64 x 32 A slice, the two core matrices of a row group lie along K
//    (the leading dimension) and the eight row groups along M (the stride dimension); for the
//    8 x 32 B slice only the K pair exists. Which of the descriptor's two byte offsets is which
//    is checked at run time (probe_layout below): a layout mistake then shows as an error, not as
//    a numerical finding.
//  - Ordinary stores to shared memory become visible to wgmma (the async proxy) only after
//    fence.proxy.async in the writing threads, then a barrier.
//  - The D fragment of m64n8 f32 (and of each m16n8 mma.sync): thread 32 w + 4 g + t holds rows
//    16 w + g and 16 w + g + 8, columns 2 t and 2 t + 1, in registers {row g: 2t, 2t+1; row g+8:
//    2t, 2t+1}.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda_check.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/mma_probe.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kSliceA = kProbeTileM * kProbeInstrK;  // bytes of one 64 x 32 A slice
constexpr int kSliceB = kProbeTileN * kProbeInstrK;  // bytes of one 8 x 32 B slice
constexpr int kMaxNk = 8;

// The descriptor's two byte offsets. The shared-memory layout itself is fixed (core_offset):
// which field names the K step and which the row-group step is what the variants try.
struct DescOffsets {
  uint32_t lead = 128;    // descriptor bits 16-29: the K step (128 bytes in core_offset)
  uint32_t stride = 256;  // descriptor bits 32-45: the row-group step (256 bytes in core_offset)
};

// Byte of element (row, kk) of one 32-wide slice: core matrices of 128 bytes, the K pair 128
// bytes apart, row groups 256 bytes apart.
__device__ __forceinline__ int core_offset(int row, int kk) {
  return (row / 8) * 256 + (kk / 16) * 128 + (row % 8) * 16 + (kk % 16);
}

__device__ __forceinline__ uint64_t smem_desc(const void* p, DescOffsets o) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  uint64_t d = uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t((o.lead >> 4) & 0x3FFF) << 16;
  d |= uint64_t((o.stride >> 4) & 0x3FFF) << 32;
  return d;  // base offset 0, no swizzle (bits 62-63 = 0)
}

__global__ void wgmma_probe_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                                   const float* __restrict__ c, float* __restrict__ d, int64_t tiles, int nk,
                                   DescOffsets o_a, DescOffsets o_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) uint8_t smem[kMaxNk * (kSliceA + kSliceB)];
  uint8_t* sa = smem;                   // nk slices of A, 2048 bytes each
  uint8_t* sb = smem + kMaxNk * kSliceA;  // nk slices of B, 256 bytes each
  const int K = kProbeInstrK * nk;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = 16 * warp + lane / 4, col0 = 2 * (lane % 4);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    // Operands to shared memory
    const uint8_t* ta = a + t * kProbeTileM * K;
    const uint8_t* tb = b + t * kProbeTileN * K;
    for (int i = tid; i < kProbeTileM * K; i += blockDim.x) {
      const int m = i / K, k = i % K;
      sa[(k / kProbeInstrK) * kSliceA + core_offset(m, k % kProbeInstrK)] = ta[i];
    }
    for (int i = tid; i < kProbeTileN * K; i += blockDim.x) {
      const int n = i / K, k = i % K;
      sb[(k / kProbeInstrK) * kSliceB + core_offset(n, k % kProbeInstrK)] = tb[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    // Accumulator from C, then nk chained instructions
    const float* tc = c + t * kProbeTileM * kProbeTileN;
    float d0 = tc[row0 * 8 + col0], d1 = tc[row0 * 8 + col0 + 1];
    float d2 = tc[(row0 + 8) * 8 + col0], d3 = tc[(row0 + 8) * 8 + col0 + 1];
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int i = 0; i < nk; ++i) {
      const uint64_t da = smem_desc(sa + i * kSliceA, o_a), db = smem_desc(sb + i * kSliceB, o_b);
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
          : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
          : "l"(da), "l"(db), "r"(1));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float* td = d + t * kProbeTileM * kProbeTileN;
    td[row0 * 8 + col0] = d0;
    td[row0 * 8 + col0 + 1] = d1;
    td[(row0 + 8) * 8 + col0] = d2;
    td[(row0 + 8) * 8 + col0 + 1] = d3;
    __syncthreads();  // shared memory is rewritten by the next tile
  }
#else
  (void)a, (void)b, (void)c, (void)d, (void)tiles, (void)nk, (void)o_a, (void)o_b;
  __trap();  // built without sm_90a: the host refuses before launching (probe_device_usable)
#endif
}

__device__ __forceinline__ uint32_t load4(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);  // 4-byte aligned: K is a multiple of 32 and the offsets multiples of 4
  return v;
}

// One warp per 16 rows of a tile: mma.sync m16n8k32, nk chained.
__global__ void mma_sync_probe_kernel(const uint8_t* __restrict__ a, const uint8_t* __restrict__ b,
                                      const float* __restrict__ c, float* __restrict__ d, int64_t tiles, int nk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const int K = kProbeInstrK * nk;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const uint8_t* ta = a + (t * kProbeTileM + 16 * warp) * K;
    const uint8_t* tb = b + t * kProbeTileN * K;
    const float* tc = c + (t * kProbeTileM + 16 * warp) * kProbeTileN;
    float d0 = tc[g * 8 + 2 * tg], d1 = tc[g * 8 + 2 * tg + 1];
    float d2 = tc[(g + 8) * 8 + 2 * tg], d3 = tc[(g + 8) * 8 + 2 * tg + 1];
    for (int i = 0; i < nk; ++i) {
      const int k0 = kProbeInstrK * i + 4 * tg;
      const uint32_t a0 = load4(ta + g * K + k0), a1 = load4(ta + (g + 8) * K + k0);
      const uint32_t a2 = load4(ta + g * K + k0 + 16), a3 = load4(ta + (g + 8) * K + k0 + 16);
      const uint32_t b0 = load4(tb + g * K + k0), b1 = load4(tb + g * K + k0 + 16);
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};\n"
          : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float* td = d + (t * kProbeTileM + 16 * warp) * kProbeTileN;
    td[g * 8 + 2 * tg] = d0;
    td[g * 8 + 2 * tg + 1] = d1;
    td[(g + 8) * 8 + 2 * tg] = d2;
    td[(g + 8) * 8 + 2 * tg + 1] = d3;
  }
#else
  (void)a, (void)b, (void)c, (void)d, (void)tiles, (void)nk;
  __trap();
#endif
}


std::vector<float> launch(const ProbeTiles& t, ProbeInstruction ins, DescOffsets o_a, DescOffsets o_b) {
  if (t.nk < 1 || t.nk > kMaxNk) throw std::runtime_error("probe: nk must be in [1, 8]");
  if (t.tiles <= 0) return {};
  DeviceBuffer a(t.a.size()), b(t.b.size()), c(t.c.size() * sizeof(float)), d(t.c.size() * sizeof(float));
  upload_all(a, t.a), upload_all(b, t.b), upload_all(c, t.c);
  d.poison();  // NaN
  const int grid = int(std::min<int64_t>(t.tiles, 132 * 8));
  if (ins == ProbeInstruction::wgmma) {
    wgmma_probe_kernel<<<grid, 128>>>(a.as<uint8_t>(), b.as<uint8_t>(), c.as<float>(), d.as<float>(), t.tiles, t.nk, o_a, o_b);
    MOECHECK_CUDA_CHECK_LAUNCH("wgmma_probe_kernel");
  } else {
    mma_sync_probe_kernel<<<grid, 128>>>(a.as<uint8_t>(), b.as<uint8_t>(), c.as<float>(), d.as<float>(), t.tiles, t.nk);
    MOECHECK_CUDA_CHECK_LAUNCH("mma_sync_probe_kernel");
  }
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> out;
  download(out, d, t.c.size());
  if (const long long i = first_poisoned(out); i >= 0)
    throw std::runtime_error("probe: output element " + std::to_string(i) + " was not written");
  return out;
}

// Small integers: every product and partial sum is exact in any accumulator of >= 10 bits, so D
// must equal the exact dot product; a layout mistake scrambles rows or K and shows here.
bool layout_ok(ProbeInstruction ins, DescOffsets o_a, DescOffsets o_b, std::string* why) {
  ProbeTiles t;
  t.resize(2, 2);
  const uint8_t codes[5] = {0x00, 0x38, 0x40, 0xB8, 0xC0};  // 0, 1, 2, -1, -2
  const float vals[5] = {0, 1, 2, -1, -2};
  std::vector<float> av(t.a.size()), bv(t.b.size());
  for (size_t i = 0; i < t.a.size(); ++i) {
    const int j = int(((i * 2654435761u + 12345) >> 7) % 5);
    t.a[i] = codes[j];
    av[i] = vals[j];
  }
  for (size_t i = 0; i < t.b.size(); ++i) {
    const int j = int(((i * 40503u + 7) >> 3) % 5);
    t.b[i] = codes[j];
    bv[i] = vals[j];
  }
  for (size_t i = 0; i < t.c.size(); ++i) t.c[i] = float(int(i % 7) - 3);
  const std::vector<float> d = launch(t, ins, o_a, o_b);
  const int64_t K = t.k();
  for (int64_t tile = 0; tile < t.tiles; ++tile)
    for (int m = 0; m < kProbeTileM; ++m)
      for (int n = 0; n < kProbeTileN; ++n) {
        double s = t.c[(tile * kProbeTileM + m) * kProbeTileN + n];
        for (int64_t k = 0; k < K; ++k) s += double(av[(tile * kProbeTileM + m) * K + k]) * bv[(tile * kProbeTileN + n) * K + k];
        const double got = d[(tile * kProbeTileM + m) * kProbeTileN + n];
        if (got != s) {
          if (why)
            *why = "tile " + std::to_string(tile) + " row " + std::to_string(m) + " column " + std::to_string(n) +
                   ": got " + std::to_string(got) + ", exact " + std::to_string(s);
          return false;
        }
      }
  return true;
}

}  // namespace

bool probe_device_usable(std::string* why, std::string* name) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = std::string("no CUDA device: ") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return false;
  }
  cudaDeviceProp prop{};
  MOECHECK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (name) *name = prop.name;
  if (prop.major != 9) {
    if (why) *why = std::string("the probe's wgmma needs compute capability 9.0 (sm_90a); device 0 is ") + prop.name;
    return false;
  }
  return true;
}

std::vector<float> run_probe_tiles(const ProbeTiles& t, ProbeInstruction ins) {
  // The descriptor offsets are settled once, by the exact small-integer tiles.
  static int layout = -1;  // 0: lead = K pair 128, stride = 256; 1: the two swapped
  const DescOffsets plain{128, 256}, swapped{256, 128};
  if (ins == ProbeInstruction::wgmma && layout < 0) {
    std::string why0, why1;
    if (layout_ok(ins, plain, plain, &why0)) layout = 0;
    else if (layout_ok(ins, swapped, swapped, &why1)) layout = 1;
    else
      throw std::runtime_error("probe: wgmma gave wrong results on exact small-integer tiles in both descriptor layouts (" +
                               why0 + "; " + why1 + ")");
  }
  std::string why;
  if (ins == ProbeInstruction::mma_sync && !layout_ok(ins, plain, plain, &why))
    throw std::runtime_error("probe: mma.sync gave wrong results on exact small-integer tiles (" + why + ")");
  const DescOffsets o = layout == 1 ? swapped : plain;
  return launch(t, ins, o, o);
}

}  // namespace moecheck::kernels
