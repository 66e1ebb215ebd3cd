// Routing on the GPU: router logits [T, E] (+ optional bias [E]) -> per token the top_k expert
// ids (rank order) and their weights, in float32 (docs/DEVICE-ALGORITHM.md §1; the methods and
// the ranking rule are those of reference/moe_routing.hpp).
//
// One warp per token, with no block-wide barrier: the token's E scores live in the warp's slice
// of shared memory, lane l owns experts l, l + 32, ... (and groups likewise), and every selection
// (top-2 inside a group, top-topk_group groups, top-k experts) is a warp-wide maximum of a 64-bit
// rank key, repeated once per pick:
//   key = (order-preserving bits of the float score) << 32 | (0xFFFFFFFF - index)
// so the larger score wins and, on equal scores, the lower index (FlashInfer's packed-index
// reduction, include/flashinfer/trtllm/fused_moe/RoutingKernelTopK.cuh). -0 counts as +0 (equal
// scores), NaN ranks below -inf. Chosen experts and kept groups are bits in the owning lane's
// registers.
//
// Float32 steps (each one rounding, correctly rounded unless named):
//   sigmoid(x) = 1 / (1 + expf(-x))             expf: CUDA libm, <= 2 ulp (no fast math)
//   softmax    = expf(l - max) / sum; sum: each lane adds its experts in ascending order, then a
//                butterfly over the 32 lanes (an order the contract leaves unspecified)
//   sel        = sigmoid + bias (when a bias is given)
//   group      = fl32(top1 + top2) of the group's sel (top1 alone for one-expert groups)
//   excluded groups' experts get sel = -inf (never 0)
//   weight     = fl32(gate / sum of the chosen gates in rank order) (renormalizing methods),
//                then fl32(w * rsf), then bf16 RNE if routing_weight_dtype is bf16.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/moe_routing.cuh"

namespace moecheck::kernels {

namespace routing {

namespace {

int method_code(RoutingMethod m) {
  switch (m) {
    case RoutingMethod::deepseek_v3: return kDeepseek;
    case RoutingMethod::renormalize: return kRenormalize;
    case RoutingMethod::softmax_topk: return kSoftmaxTopk;
    case RoutingMethod::sigmoid_renormalize: return kSigmoidRenormalize;
    case RoutingMethod::llama4: return kLlama4;
  }
  throw std::invalid_argument("moe_routing: unknown routing method");
}

}  // namespace

RoutingParams routing_params(const MoeConfig& c, const float* bias, int64_t tokens) {
  if (c.num_experts < 1 || c.num_experts > kMaxExperts)
    throw std::invalid_argument("moe_routing: num_experts must be in [1, " + std::to_string(kMaxExperts) +
                                "], got " + std::to_string(c.num_experts));
  if (c.top_k < 1 || c.top_k > kMaxTopK || c.top_k > c.num_experts)
    throw std::invalid_argument("moe_routing: top_k must be in [1, min(num_experts, " + std::to_string(kMaxTopK) +
                                ")], got " + std::to_string(c.top_k));
  const bool grouped = routing_group_count(c) > 1;
  if (grouped && (c.num_experts % c.n_group != 0 || c.topk_group < 1 || c.topk_group > c.n_group ||
                  c.top_k > c.topk_group * (c.num_experts / c.n_group)))
    throw std::invalid_argument("moe_routing: invalid grouping (n_group " + std::to_string(c.n_group) +
                                ", topk_group " + std::to_string(c.topk_group) + ")");
  if (bias != nullptr && c.routing != RoutingMethod::deepseek_v3 && c.routing != RoutingMethod::sigmoid_renormalize)
    throw std::invalid_argument("moe_routing: a routing bias is only defined for deepseek_v3 and "
                                "sigmoid_renormalize routing, not " + std::string(to_string(c.routing)));
  if (tokens < 0 || tokens > 0x7FFFFFFF) throw std::invalid_argument("moe_routing: token count out of range");

  RoutingParams p{};
  p.experts = static_cast<int>(c.num_experts);
  p.top_k = static_cast<int>(c.top_k);
  p.n_group = routing_group_count(c);
  p.topk_group = grouped ? static_cast<int>(c.topk_group) : 1;
  p.method = method_code(c.routing);
  p.rsf = static_cast<float>(c.routed_scaling_factor);
  p.bf16_weights = c.routing_weight_dtype == Precision::bf16;
  p.tokens = tokens;
  return p;
}

}  // namespace routing

namespace {

using namespace routing;

constexpr int kMaxWarps = 8;  // tokens per block

__global__ void __launch_bounds__(32 * kMaxWarps) moe_routing_kernel(const float* __restrict__ logits,
                                                                     const float* __restrict__ bias, RoutingParams p,
                                                                     int32_t* __restrict__ topk_ids,
                                                                     float* __restrict__ topk_weights) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= p.tokens) return;  // whole warps leave together
  route_token(p, logits + t * p.experts, bias, warp_scratch(smem, p, warp),
              topk_ids + t * p.top_k, topk_weights + t * p.top_k);
}

}  // namespace

void launch_moe_routing(const MoeConfig& c, const float* logits, const float* bias, int64_t tokens,
                        int32_t* topk_ids, float* topk_weights, cudaStream_t stream) {
  const RoutingParams p = routing_params(c, bias, tokens);
  if (tokens == 0) return;
  if (logits == nullptr || topk_ids == nullptr || topk_weights == nullptr)
    throw std::invalid_argument("moe_routing: null logits or output pointer");
  // Tokens per block: up to kMaxWarps, as many as the default 48 KiB of shared memory holds. One
  // always fits: E <= 4096 and n_group <= E give at most 3 * 4096 floats.
  static_assert(3 * kMaxExperts * 4 <= 48 * 1024, "one warp's scores must fit without an opt-in");
  const size_t per_warp = warp_smem_bytes(p);
  const int64_t fit = static_cast<int64_t>((48 * 1024) / per_warp);
  const int warps = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({kMaxWarps, tokens, fit})));
  const size_t smem = per_warp * static_cast<size_t>(warps);
  const int64_t blocks = (tokens + warps - 1) / warps;
  moe_routing_kernel<<<static_cast<unsigned>(blocks), 32 * warps, smem, stream>>>(logits, bias, p, topk_ids,
                                                                                  topk_weights);
  MOECHECK_CUDA_CHECK_LAUNCH("moe_routing_kernel");
}

}  // namespace moecheck::kernels
