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
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kMaxWarps = 8;  // tokens per block
constexpr int kOwnWords = static_cast<int>((kMaxExperts + 32 * 32 - 1) / (32 * 32));  // bits per lane: E / 32

enum Method : int { kDeepseek, kRenormalize, kSoftmaxTopk, kSigmoidRenormalize, kLlama4 };

struct RoutingParams {
  int experts, top_k, n_group, topk_group, method;
  float rsf;
  bool bf16_weights;
  int64_t tokens;
};

// Shared memory per warp: sel[E], gate[E], group_score[n_group] floats.
size_t warp_smem_bytes(const RoutingParams& p) { return (2 * static_cast<size_t>(p.experts) + p.n_group) * 4; }

__device__ __forceinline__ float sigmoid_f32(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

// Rank key: larger is better; see the file comment. 0 means "no candidate".
__device__ __forceinline__ unsigned long long rank_key(float v, int idx) {
  uint32_t ord;
  if (v != v) {
    ord = 0;
  } else {
    if (v == 0.0f) v = 0.0f;  // -0 -> +0: equal scores must tie
    const uint32_t b = __float_as_uint(v);
    ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  }
  return (static_cast<unsigned long long>(ord) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(idx));
}
__device__ __forceinline__ int key_index(unsigned long long key) {
  return static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(key & 0xFFFFFFFFull));
}

__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long key) {
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, key, off);
    key = o > key ? o : key;
  }
  return key;
}
template <bool kSum>
__device__ __forceinline__ float warp_reduce(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kSum ? __fadd_rn(v, o) : fmaxf(v, o);
  }
  return v;
}

// Bit i / 32 of a lane's own set: the lane's i-th item (index lane + 32 i).
struct OwnBits {
  uint32_t w[kOwnWords] = {};
  __device__ __forceinline__ bool has(int i) const { return (w[i >> 5] >> (i & 31)) & 1u; }
  __device__ __forceinline__ void set(int i) { w[i >> 5] |= 1u << (i & 31); }
};

// The best key among this lane's items of [0, n) not in `skip`, by score(index).
template <class Score>
__device__ __forceinline__ unsigned long long lane_best(int n, const OwnBits& skip, Score score) {
  const int lane = threadIdx.x & 31;
  unsigned long long best = 0;
  for (int e = lane, i = 0; e < n; e += 32, ++i) {
    const unsigned long long k = skip.has(i) ? 0ull : rank_key(score(e), e);
    best = k > best ? k : best;
  }
  return best;
}

// Token t by one warp; sel, gate, group_score: the warp's shared memory.
__device__ void route_token(const RoutingParams& p, const float* __restrict__ l, const float* __restrict__ bias,
                            float* sel, float* gate, float* group_score, int32_t* __restrict__ ids,
                            float* __restrict__ weights) {
  const int E = p.experts, lane = threadIdx.x & 31;

  // Scores
  if (p.method == kRenormalize || p.method == kSoftmaxTopk) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    m = warp_reduce<false>(m);
    float s = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float x = expf(__fsub_rn(l[e], m));
      gate[e] = x;
      s = __fadd_rn(s, x);
    }
    s = warp_reduce<true>(s);
    for (int e = lane; e < E; e += 32) {
      const float prob = __fdiv_rn(gate[e], s);
      gate[e] = prob;
      sel[e] = prob;
    }
  } else {
    for (int e = lane; e < E; e += 32) {
      const float x = l[e];
      const float g = sigmoid_f32(x);
      gate[e] = g;
      if (p.method == kLlama4) sel[e] = x;
      else sel[e] = bias != nullptr ? __fadd_rn(g, bias[e]) : g;
    }
  }
  __syncwarp();

  // Grouped top-k (deepseek_v3, n_group > 1): group score = sum of the group's two best sel.
  if (p.method == kDeepseek && p.n_group > 1) {
    const int gs = E / p.n_group;
    for (int g = lane; g < p.n_group; g += 32) {
      unsigned long long k1 = 0, k2 = 0;
      for (int e = g * gs; e < (g + 1) * gs; ++e) {
        const unsigned long long k = rank_key(sel[e], e);
        if (k > k1) {
          k2 = k1;
          k1 = k;
        } else if (k > k2) {
          k2 = k;
        }
      }
      const float top1 = sel[key_index(k1)];
      group_score[g] = gs >= 2 ? __fadd_rn(top1, sel[key_index(k2)]) : top1;
    }
    OwnBits kept;
    for (int i = 0; i < p.topk_group; ++i) {  // each lane scores its own groups: no sharing needed
      const int g = key_index(warp_max_key(lane_best(p.n_group, kept, [&](int x) { return group_score[x]; })));
      if ((g & 31) == lane) kept.set(g >> 5);
    }
    for (int g = lane, i = 0; g < p.n_group; g += 32, ++i)
      if (!kept.has(i))
        for (int e = g * gs; e < (g + 1) * gs; ++e) sel[e] = -INFINITY;
    __syncwarp();
  }

  // Top-k experts by sel, one warp-wide maximum per pick; lane j keeps pick j.
  OwnBits taken;
  int mine = -1;
  for (int j = 0; j < p.top_k; ++j) {
    const int idx = key_index(warp_max_key(lane_best(E, taken, [&](int e) { return sel[e]; })));
    if ((idx & 31) == lane) taken.set(idx >> 5);
    if (lane == j) mine = idx;
  }

  // Weights in rank order: the denominator is the sum of the chosen gates in rank order.
  const bool renorm = p.method == kDeepseek || p.method == kRenormalize || p.method == kSigmoidRenormalize;
  const float g = lane < p.top_k ? gate[mine] : 0.0f;
  float denom = 0.0f;
  if (renorm)
    for (int j = 0; j < p.top_k; ++j) denom = __fadd_rn(denom, __shfl_sync(0xffffffffu, g, j));
  if (lane < p.top_k) {
    float w = renorm ? __fdiv_rn(g, denom) : g;
    w = __fmul_rn(w, p.rsf);
    if (p.bf16_weights) w = __bfloat162float(__float2bfloat16_rn(w));
    ids[lane] = mine;
    weights[lane] = w;
  }
}

__global__ void __launch_bounds__(32 * kMaxWarps) moe_routing_kernel(const float* __restrict__ logits,
                                                                     const float* __restrict__ bias, RoutingParams p,
                                                                     int32_t* __restrict__ topk_ids,
                                                                     float* __restrict__ topk_weights) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= p.tokens) return;  // whole warps leave together
  float* sel = smem + static_cast<size_t>(warp) * (2 * p.experts + p.n_group);
  route_token(p, logits + t * p.experts, bias, sel, sel + p.experts, sel + 2 * p.experts, topk_ids + t * p.top_k,
              topk_weights + t * p.top_k);
}

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

void launch_moe_routing(const MoeConfig& c, const float* logits, const float* bias, int64_t tokens,
                        int32_t* topk_ids, float* topk_weights, cudaStream_t stream) {
  if (c.num_experts < 1 || c.num_experts > kMaxExperts)
    throw std::invalid_argument("moe_routing: num_experts must be in [1, " + std::to_string(kMaxExperts) +
                                "], got " + std::to_string(c.num_experts));
  if (c.top_k < 1 || c.top_k > kMaxTopK || c.top_k > c.num_experts)
    throw std::invalid_argument("moe_routing: top_k must be in [1, min(num_experts, " + std::to_string(kMaxTopK) +
                                ")], got " + std::to_string(c.top_k));
  const bool grouped = c.routing == RoutingMethod::deepseek_v3 && c.n_group > 1;
  if (grouped && (c.num_experts % c.n_group != 0 || c.topk_group < 1 || c.topk_group > c.n_group ||
                  c.top_k > c.topk_group * (c.num_experts / c.n_group)))
    throw std::invalid_argument("moe_routing: invalid grouping (n_group " + std::to_string(c.n_group) +
                                ", topk_group " + std::to_string(c.topk_group) + ")");
  if (bias != nullptr && c.routing != RoutingMethod::deepseek_v3 && c.routing != RoutingMethod::sigmoid_renormalize)
    throw std::invalid_argument("moe_routing: a routing bias is only defined for deepseek_v3 and "
                                "sigmoid_renormalize routing, not " + std::string(to_string(c.routing)));
  if (tokens < 0 || tokens > 0x7FFFFFFF) throw std::invalid_argument("moe_routing: token count out of range");
  if (tokens == 0) return;
  if (logits == nullptr || topk_ids == nullptr || topk_weights == nullptr)
    throw std::invalid_argument("moe_routing: null logits or output pointer");

  RoutingParams p{};
  p.experts = static_cast<int>(c.num_experts);
  p.top_k = static_cast<int>(c.top_k);
  p.n_group = grouped ? static_cast<int>(c.n_group) : 1;
  p.topk_group = grouped ? static_cast<int>(c.topk_group) : 1;
  p.method = method_code(c.routing);
  p.rsf = static_cast<float>(c.routed_scaling_factor);
  p.bf16_weights = c.routing_weight_dtype == Precision::bf16;
  p.tokens = tokens;
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
