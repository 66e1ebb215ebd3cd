// SiLU(gate) * up and its re-quantization to FP8 per 128 along I, between the two GEMMs
// (docs/DEVICE-ALGORITHM.md §4).
//
// Input: GEMM1's output [rows, 2I] float32, already rounded to intermediate_dtype. gate_up
// layout: columns [0, I) are the gate, [I, 2I) up; up_gate (FlashInfer's w31): the reverse.
// Float32 steps per element, each one rounding:
//   d = fl32(1 + expf(-gate))      (expf: CUDA libm, <= 2 ulp; exp(-gate) = inf gives silu = -0)
//   silu = fl32(gate / d)          (correctly rounded division)
//   h = fl32(silu * up), then RNE to bf16 when intermediate_dtype is bf16
// then the group quantization of §2 (same eps and scale format as the activations): one warp per
// (row, 128-column group), codes [rows, I] and row-major scales [rows, I/128] for GEMM2.
// One warp per (slot, 128-column group): only the rows of routed slots (slot_to_row >= 0) are
// read and written, so neither padding rows nor the capacity's unused rows cost memory traffic.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/fp8_quant_device.cuh"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kWarpsPerBlock = 8;

struct SiluParams {
  int64_t inter;
  int64_t gate_col, up_col;  // first column of the gate half and of the up half
  double eps;
  float eps_scale;
  bool ue8m0, bf16_h;
};

__device__ __forceinline__ float silu_mul(float gate, float up, bool bf16_h) {
  const float d = __fadd_rn(1.0f, expf(-gate));
  const float h = __fmul_rn(__fdiv_rn(gate, d), up);
  return bf16_h ? device::round_bf16(h) : h;
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    silu_mul_quant_kernel(const float* __restrict__ x, const int32_t* __restrict__ slot_to_row, int64_t slots,
                          SiluParams p, uint8_t* __restrict__ codes, float* __restrict__ scales) {
  wait_for_previous_grid();  // first: dependent_launch.cuh
  let_dependents_start();
  const int64_t groups = p.inter / device::kGroup;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t slot = item / groups, g = item % groups;
  if (slot >= slots) return;  // whole warps leave together
  const int64_t r = slot_to_row[slot];
  if (r < 0) return;  // a non-local expert's slot
  const int lane = threadIdx.x & 31;
  const int64_t col = g * device::kGroup + lane * 4;
  const float* row = x + r * 2 * p.inter;
  const float4 gv = *reinterpret_cast<const float4*>(row + p.gate_col + col);
  const float4 uv = *reinterpret_cast<const float4*>(row + p.up_col + col);
  const float h[4] = {silu_mul(gv.x, uv.x, p.bf16_h), silu_mul(gv.y, uv.y, p.bf16_h), silu_mul(gv.z, uv.z, p.bf16_h),
                       silu_mul(gv.w, uv.w, p.bf16_h)};
  const float s =
      device::quantize_lane_values(h, p.eps, p.eps_scale, p.ue8m0, codes + r * p.inter + g * device::kGroup);
  if (lane == 0) scales[r * groups + g] = s;
}

}  // namespace

void launch_silu_mul_quant(const float* gemm1_out, const int32_t* slot_to_row, int64_t slots, int64_t inter,
                           GateUpLayout layout, Precision intermediate, ScaleFormat fmt, double eps,
                           uint8_t* codes, float* scales, cudaStream_t stream) {
  const char* who = "silu_mul_quant";
  require(inter > 0 && inter % kScaleBlock == 0, who,
          "intermediate_size must be a positive multiple of 128, got " + std::to_string(inter));
  require(slots >= 0, who, "slots must be >= 0");
  SiluParams p{};
  p.inter = inter;
  p.gate_col = layout == GateUpLayout::gate_up ? 0 : inter;
  p.up_col = layout == GateUpLayout::gate_up ? inter : 0;
  p.eps = eps;
  p.eps_scale = eps_scale_or_throw(eps, who);
  p.ue8m0 = fmt == ScaleFormat::ue8m0;
  p.bf16_h = intermediate == Precision::bf16;
  if (slots == 0) return;
  require_ptr(gemm1_out, who, "gemm1_out", 16);
  require_ptr(slot_to_row, who, "slot_to_row", 4);
  require_ptr(codes, who, "codes", 4);
  require_ptr(scales, who, "scales", 4);
  const int64_t items = slots * (inter / kScaleBlock);
  launch_dependent("silu_mul_quant_kernel", silu_mul_quant_kernel,
                   grid_x((items + kWarpsPerBlock - 1) / kWarpsPerBlock, who), kWarpsPerBlock * 32, 0, stream,
                   gemm1_out, slot_to_row, slots, p, codes, scales);
}

}  // namespace moecheck::kernels
