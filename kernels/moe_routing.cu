// Routing on the GPU: router logits [T, E] (+ optional bias [E]) -> per token the top_k expert
// ids (rank order) and their weights, in float32 (docs/DEVICE-ALGORITHM.md §1; the methods and
// the ranking rule are those of reference/moe_routing.hpp).
//
// One thread block per token. The token's E scores live in shared memory; every selection
// (top-2 inside a group, top-topk_group groups, top-k experts) is a block-wide maximum of a
// 64-bit rank key, repeated once per pick:
//   key = (order-preserving bits of the float score) << 32 | (0xFFFFFFFF - index)
// so the larger score wins and, on equal scores, the lower index (FlashInfer's packed-index
// reduction, include/flashinfer/trtllm/fused_moe/RoutingKernelTopK.cuh). -0 counts as +0 (equal
// scores), NaN ranks below -inf.
//
// Float32 steps (each one rounding, correctly rounded unless named):
//   sigmoid(x) = 1 / (1 + expf(-x))             expf: CUDA libm, <= 2 ulp (no fast math)
//   softmax    = expf(l - max) / sum, sum by a block reduction (order unspecified)
//   sel        = sigmoid + bias (when a bias is given)
//   group      = fl32(top1 + top2) of the group's sel (top1 alone for one-expert groups)
//   excluded groups' experts get sel = -inf (never 0)
//   weight     = fl32(gate / sum of the chosen gates in rank order) (renormalizing methods),
//                then fl32(w * rsf), then bf16 RNE if routing_weight_dtype is bf16.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

enum Method : int { kDeepseek, kRenormalize, kSoftmaxTopk, kSigmoidRenormalize, kLlama4 };

struct RoutingParams {
  int experts, top_k, n_group, topk_group, method;
  float rsf;
  bool bf16_weights;
};

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

// Block-wide max of a key; every thread gets the result. `scratch` holds kWarps + 1 keys.
__device__ unsigned long long block_max_key(unsigned long long key, unsigned long long* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, key, off);
    key = o > key ? o : key;
  }
  if (lane == 0) scratch[warp] = key;
  __syncthreads();
  if (warp == 0) {
    key = lane < kWarps ? scratch[lane] : 0ull;
    for (int off = 16; off > 0; off >>= 1) {
      const unsigned long long o = __shfl_xor_sync(0xffffffffu, key, off);
      key = o > key ? o : key;
    }
    if (lane == 0) scratch[kWarps] = key;
  }
  __syncthreads();
  key = scratch[kWarps];
  __syncthreads();  // scratch may be reused right away
  return key;
}

// Block-wide float reduction (max or sum); every thread gets the result.
template <bool kSum>
__device__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = kSum ? __fadd_rn(v, o) : fmaxf(v, o);
  }
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? scratch[lane] : (kSum ? 0.0f : -INFINITY);
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, v, off);
      v = kSum ? __fadd_rn(v, o) : fmaxf(v, o);
    }
    if (lane == 0) scratch[kWarps] = v;
  }
  __syncthreads();
  v = scratch[kWarps];
  __syncthreads();
  return v;
}

__global__ void __launch_bounds__(kThreads) moe_routing_kernel(const float* __restrict__ logits,
                                                               const float* __restrict__ bias, RoutingParams p,
                                                               int32_t* __restrict__ topk_ids,
                                                               float* __restrict__ topk_weights) {
  // Shared memory: sel[E], gate[E], group_score[n_group] floats, then taken[E], group_kept[n_group].
  extern __shared__ float smem[];
  float* sel = smem;
  float* gate = sel + p.experts;
  float* group_score = gate + p.experts;
  unsigned char* taken = reinterpret_cast<unsigned char*>(group_score + p.n_group);
  unsigned char* group_kept = taken + p.experts;
  __shared__ unsigned long long key_scratch[kWarps + 1];
  __shared__ float red_scratch[kWarps + 1];
  __shared__ int chosen[kMaxTopK];

  const int E = p.experts;
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * E;

  // Scores
  if (p.method == kRenormalize || p.method == kSoftmaxTopk) {
    float m = -INFINITY;
    for (int e = threadIdx.x; e < E; e += kThreads) m = fmaxf(m, l[e]);
    m = block_reduce<false>(m, red_scratch);
    float s = 0.0f;
    for (int e = threadIdx.x; e < E; e += kThreads) {
      const float x = expf(__fsub_rn(l[e], m));
      gate[e] = x;
      s = __fadd_rn(s, x);
    }
    s = block_reduce<true>(s, red_scratch);
    for (int e = threadIdx.x; e < E; e += kThreads) {
      const float prob = __fdiv_rn(gate[e], s);
      gate[e] = prob;
      sel[e] = prob;
    }
  } else {
    for (int e = threadIdx.x; e < E; e += kThreads) {
      const float x = l[e];
      const float g = sigmoid_f32(x);
      gate[e] = g;
      if (p.method == kLlama4) sel[e] = x;
      else sel[e] = bias != nullptr ? __fadd_rn(g, bias[e]) : g;
    }
  }
  for (int e = threadIdx.x; e < E; e += kThreads) taken[e] = 0;
  __syncthreads();

  // Grouped top-k (deepseek_v3, n_group > 1): group score = sum of the group's two best sel.
  if (p.method == kDeepseek && p.n_group > 1) {
    const int gs = E / p.n_group;
    for (int g = threadIdx.x; g < p.n_group; g += kThreads) {
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
      group_kept[g] = 0;
    }
    __syncthreads();
    for (int i = 0; i < p.topk_group; ++i) {
      unsigned long long best = 0;
      for (int g = threadIdx.x; g < p.n_group; g += kThreads) {
        const unsigned long long k = group_kept[g] ? 0ull : rank_key(group_score[g], g);
        best = k > best ? k : best;
      }
      best = block_max_key(best, key_scratch);
      if (threadIdx.x == 0) group_kept[key_index(best)] = 1;
      __syncthreads();
    }
    for (int e = threadIdx.x; e < E; e += kThreads)
      if (!group_kept[e / gs]) sel[e] = -INFINITY;
    __syncthreads();
  }

  // Top-k experts by sel, one block-wide maximum per pick.
  for (int j = 0; j < p.top_k; ++j) {
    unsigned long long best = 0;
    for (int e = threadIdx.x; e < E; e += kThreads) {
      const unsigned long long k = taken[e] ? 0ull : rank_key(sel[e], e);
      best = k > best ? k : best;
    }
    best = block_max_key(best, key_scratch);
    if (threadIdx.x == 0) {
      const int idx = key_index(best);
      chosen[j] = idx;
      taken[idx] = 1;
    }
    __syncthreads();
  }

  // Weights, in rank order, by one thread (k <= 32).
  if (threadIdx.x == 0) {
    const bool renorm = p.method == kDeepseek || p.method == kRenormalize || p.method == kSigmoidRenormalize;
    float denom = 0.0f;
    if (renorm)
      for (int j = 0; j < p.top_k; ++j) denom = __fadd_rn(denom, gate[chosen[j]]);
    const int64_t base = static_cast<int64_t>(blockIdx.x) * p.top_k;
    for (int j = 0; j < p.top_k; ++j) {
      float w = gate[chosen[j]];
      if (renorm) w = __fdiv_rn(w, denom);
      w = __fmul_rn(w, p.rsf);
      if (p.bf16_weights) w = __bfloat162float(__float2bfloat16_rn(w));
      topk_ids[base + j] = chosen[j];
      topk_weights[base + j] = w;
    }
  }
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
  const size_t smem = (2 * static_cast<size_t>(p.experts) + p.n_group) * sizeof(float) + p.experts + p.n_group;
  moe_routing_kernel<<<static_cast<unsigned>(tokens), kThreads, smem, stream>>>(logits, bias, p, topk_ids,
                                                                                topk_weights);
  MOECHECK_CUDA_CHECK_LAUNCH("moe_routing_kernel");
}

}  // namespace moecheck::kernels
