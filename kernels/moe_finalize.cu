// Finalize: the weighted combine of each token's slot outputs into the bf16 layer output
// (docs/DEVICE-ALGORITHM.md §6), and optionally the per-slot outputs themselves.
//
//   acc = 0; for j = 0..k-1 (slot order): if slot j's expert is local: acc = fmaf(w_j, y_j, acc)
//   out = bf16_rn(acc)
// The first FFMA from +0 is exactly fl32(w_0 * y_0); a token with no local slot gives +0.
// expert_outputs[t, j, :] = y_j (GEMM2's float32 row of that slot), 0 for non-local slots.
// One block per token, 4 consecutive hidden columns per thread and step (16-byte loads).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const uint32_t a = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return a | (b << 16);
}

__global__ void __launch_bounds__(kThreads)
    moe_finalize_kernel(const float* __restrict__ y, const int32_t* __restrict__ slot_to_row,
                        const float* __restrict__ weights, int64_t top_k, int64_t hidden,
                        uint16_t* __restrict__ out, float* __restrict__ expert_outputs) {
  wait_for_previous_grid();  // first: dependent_launch.cuh
  let_dependents_start();
  const int64_t t = blockIdx.x;
  for (int64_t h = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * 4; h < hidden;
       h += static_cast<int64_t>(gridDim.y) * kThreads * 4) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t row = slot_to_row[t * top_k + j];
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row >= 0) {
        const float w = weights[t * top_k + j];
        v = *reinterpret_cast<const float4*>(y + static_cast<int64_t>(row) * hidden + h);
        acc.x = __fmaf_rn(w, v.x, acc.x);
        acc.y = __fmaf_rn(w, v.y, acc.y);
        acc.z = __fmaf_rn(w, v.z, acc.z);
        acc.w = __fmaf_rn(w, v.w, acc.w);
      }
      if (expert_outputs != nullptr)
        *reinterpret_cast<float4*>(expert_outputs + (t * top_k + j) * hidden + h) = v;
    }
    *reinterpret_cast<uint2*>(out + t * hidden + h) = make_uint2(pack_bf16x2(acc.x, acc.y), pack_bf16x2(acc.z, acc.w));
  }
}

}  // namespace

void launch_moe_finalize(const float* gemm2_out, const int32_t* slot_to_row, const float* topk_weights,
                         int64_t tokens, int64_t top_k, int64_t hidden, uint16_t* out_bf16, float* expert_outputs,
                         cudaStream_t stream) {
  const char* who = "moe_finalize";
  require(hidden > 0 && hidden % kScaleBlock == 0, who, "hidden size must be a positive multiple of 128");
  require(tokens >= 0 && top_k >= 1, who, "need tokens >= 0 and top_k >= 1");
  if (tokens == 0) return;
  require_ptr(gemm2_out, who, "gemm2_out", 16);
  require_ptr(slot_to_row, who, "slot_to_row", 4);
  require_ptr(topk_weights, who, "topk_weights", 4);
  require_ptr(out_bf16, who, "output", 8);
  if (expert_outputs != nullptr) require_ptr(expert_outputs, who, "expert_outputs", 16);
  // One block per token and 1024 columns: a decode step's few tokens still fill several SMs.
  const dim3 grid(grid_x(tokens, who), static_cast<unsigned>((hidden + kThreads * 4 - 1) / (kThreads * 4)));
  launch_dependent("moe_finalize_kernel", moe_finalize_kernel, grid, kThreads, 0, stream, gemm2_out,
                   slot_to_row, topk_weights, top_k, hidden, out_bf16, expert_outputs);
}

}  // namespace moecheck::kernels
