// The one-launch prologue of small batches (moe_stages.hpp): routing, the bf16 entry's
// activation quantization and the permutation in one block of 1024 threads, where the stages
// would take three launches whose work is a few microseconds of latency each at decode sizes.
//
//   warp w < T           routes token w (moe_routing.cuh, route_token)
//   every warp           then quantizes groups (t, g) = items w, w + 32, ... of the T H/128
//                        (fp8_quant_device.cuh, quantize_group; scales transposed [H/128, T])
//   barrier              the ids, written to global memory by this block, are visible to it
//   the whole block      builds the plan (moe_permute.cuh, permute_block)
//
// Every value is computed by the same device functions, with the same operands and order, as
// the stages' kernels compute it, so the results are their bits (tested:
// GpuPrologue.GivesTheBitsOfTheStagesItFuses). Shared memory holds the routing's scores, then
// (after the barrier) the permutation's counts, in one buffer.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/fp8_quant_device.cuh"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_permute.cuh"
#include "kernels/moe_routing.cuh"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kThreads = permute::kFusedThreads;
constexpr int kWarps = kThreads / 32;
// Dynamic shared memory the prologue may take: the default 48 KiB less the static 128 bytes of
// permute_block's scan, rounded down to whole KiB.
constexpr size_t kSmemLimit = 47 * 1024;
static_assert(kPrologueMaxTokens <= kWarps, "one routing warp per token");

struct PrologueArgs {
  const float* logits;
  const float* bias;
  const __nv_bfloat16* hidden;  // null: the fp8 entry (no quantization)
  int32_t* ids;
  float* weights;
  uint8_t* codes;
  float* scales;
  int64_t hidden_size;
  double eps;
  float eps_scale;
  bool ue8m0;
  int32_t offset, local;
  int64_t max_tiles;
};

size_t prologue_smem_bytes(const routing::RoutingParams& rp, int64_t local) {
  return std::max(static_cast<size_t>(rp.tokens) * routing::warp_smem_bytes(rp),
                  permute::permute_block_smem_bytes(local, rp.tokens * rp.top_k));
}

// One block per SM is all there is: without the 1, ptxas held the kernel to 32 registers and spilled.
__global__ void __launch_bounds__(kThreads, 1) moe_prologue_kernel(routing::RoutingParams rp, PrologueArgs a,
                                                                PermutePlan plan) {
  let_dependents_start();  // the gather's blocks may be scheduled; they wait for this grid (dependent_launch.cuh)
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5;
  const int64_t T = rp.tokens;
  if (warp < T)
    routing::route_token(rp, a.logits + warp * static_cast<int64_t>(rp.experts), a.bias,
                         routing::warp_scratch(smem, rp, warp), a.ids + warp * rp.top_k,
                         a.weights + warp * rp.top_k);
  if (a.hidden != nullptr) {
    const int64_t groups = a.hidden_size / device::kGroup;
    for (int64_t item = warp; item < T * groups; item += kWarps) {
      const int64_t t = item / groups, g = item % groups, off = t * a.hidden_size + g * device::kGroup;
      const float s = device::quantize_group(a.hidden + off, a.eps, a.eps_scale, a.ue8m0, a.codes + off);
      if ((threadIdx.x & 31) == 0) a.scales[g * T + t] = s;
    }
  }
  __syncthreads();  // the routing's shared memory is free, its ids in global memory visible to the block
  permute::permute_block(a.ids, static_cast<int32_t>(T * rp.top_k), a.offset, a.local, a.max_tiles,
                         reinterpret_cast<int32_t*>(smem), plan);
}

}  // namespace

bool moe_prologue_fits(const MoeConfig& c, int64_t tokens) {
  if (tokens < 1 || tokens > kPrologueMaxTokens || tokens * c.top_k > permute::kFusedMaxSlots) return false;
  const size_t per_warp = routing::warp_scratch_floats(c.num_experts, routing::routing_group_count(c)) * 4;
  const size_t smem = std::max(static_cast<size_t>(tokens) * per_warp,
                               permute::permute_block_smem_bytes(c.local_experts(), tokens * c.top_k));
  return smem <= kSmemLimit;
}

void launch_moe_prologue(const MoeConfig& c, const float* logits, const float* bias, const void* hidden_bf16,
                         int64_t tokens, int32_t* topk_ids, float* topk_weights, uint8_t* hidden_codes,
                         float* hidden_scales, const PermuteCapacity& cap, const PermutePlan& plan,
                         cudaStream_t stream) {
  const char* who = "moe_prologue";
  const routing::RoutingParams rp = routing::routing_params(c, bias, tokens);
  require(moe_prologue_fits(c, tokens), who,
          "the batch does not fit the one-block prologue (moe_prologue_fits): T = " + std::to_string(tokens));
  require(c.hidden_size % kScaleBlock == 0, who, "hidden_size must be a multiple of 128");
  const int64_t E_local = c.local_experts();
  permute::require_permute_args(who, topk_ids, tokens, c.top_k, c.local_expert_offset, E_local, cap, plan);
  require_ptr(logits, who, "routing_logits", 4);
  require_ptr(topk_weights, who, "topk_weights", 4);
  if (hidden_bf16 != nullptr) {
    require_ptr(hidden_bf16, who, "hidden_states_bf16", 16);
    require_ptr(hidden_codes, who, "hidden codes", 16);
    require_ptr(hidden_scales, who, "hidden scales", 4);
  }
  PrologueArgs a{};
  a.logits = logits;
  a.bias = bias;
  a.hidden = static_cast<const __nv_bfloat16*>(hidden_bf16);
  a.ids = topk_ids;
  a.weights = topk_weights;
  a.codes = hidden_codes;
  a.scales = hidden_scales;
  a.hidden_size = c.hidden_size;
  a.eps = c.act_eps;
  a.eps_scale = eps_scale_or_throw(c.act_eps, who);
  a.ue8m0 = c.scale_format == ScaleFormat::ue8m0;
  a.offset = static_cast<int32_t>(c.local_expert_offset);
  a.local = static_cast<int32_t>(E_local);
  a.max_tiles = cap.max_tiles;
  moe_prologue_kernel<<<1, kThreads, prologue_smem_bytes(rp, E_local), stream>>>(rp, a, plan);
  MOECHECK_CUDA_CHECK_LAUNCH("moe_prologue_kernel");
}

}  // namespace moecheck::kernels
