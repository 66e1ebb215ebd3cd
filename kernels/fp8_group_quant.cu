// Activation group quantization on the GPU: x [rows, cols] (float32 or bf16) -> e4m3 codes and
// one float32 scale per (row, 128 columns), bit-exact with reference group_quantize
// (docs/DEVICE-ALGORITHM.md §2; rounding steps in kernels/fp8_quant_device.cuh).
//
// One warp per (row, group): lane l holds columns 4l..4l+3 of the group, the warp reduces the
// amax, every lane computes the same scale and writes its 4 codes as one 32-bit store.
// Scales go to [rows, cols/128] (row_major) or [cols/128, rows] (transposed, FlashInfer's
// hidden_states_scale layout).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/fp8_quant_device.cuh"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kWarpsPerBlock = 8;

struct QuantParams {
  int64_t rows, cols;
  double eps;
  float eps_scale;
  bool ue8m0, transposed;
};

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    fp8_group_quant_kernel(const T* __restrict__ x, QuantParams p, uint8_t* __restrict__ codes,
                           float* __restrict__ scales) {
  const int64_t groups = p.cols / device::kGroup;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= p.rows * groups) return;  // whole warps leave together
  const int64_t r = item / groups, g = item % groups;
  const int64_t off = r * p.cols + g * device::kGroup;
  const float s = device::quantize_group(x + off, p.eps, p.eps_scale, p.ue8m0, codes + off);
  if ((threadIdx.x & 31) == 0) scales[p.transposed ? g * p.rows + r : r * groups + g] = s;
}

}  // namespace

void launch_fp8_group_quant(const void* x, ActivationDtype dtype, int64_t rows, int64_t cols, ScaleFormat fmt,
                            double eps, ScaleLayout layout, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (rows < 0 || cols <= 0 || cols % device::kGroup != 0)
    throw std::invalid_argument("fp8_group_quant: need rows >= 0 and cols a positive multiple of 128, got [" +
                                std::to_string(rows) + ", " + std::to_string(cols) + "]");
  QuantParams p{rows, cols, eps, eps_scale_or_throw(eps, "fp8_group_quant"), fmt == ScaleFormat::ue8m0,
                layout == ScaleLayout::transposed};
  if (rows == 0) return;
  require_ptr(x, "fp8_group_quant", "x", 16);
  require_ptr(codes, "fp8_group_quant", "codes", 4);
  require_ptr(scales, "fp8_group_quant", "scales", 4);
  const int64_t items = rows * (cols / device::kGroup);
  const unsigned blocks = grid_x((items + kWarpsPerBlock - 1) / kWarpsPerBlock, "fp8_group_quant");
  if (dtype == ActivationDtype::f32) {
    fp8_group_quant_kernel<float><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<const float*>(x), p, codes, scales);
  } else {
    fp8_group_quant_kernel<__nv_bfloat16><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x), p, codes, scales);
  }
  MOECHECK_CUDA_CHECK_LAUNCH("fp8_group_quant_kernel");
}

}  // namespace moecheck::kernels
