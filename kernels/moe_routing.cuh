// Routing of one token by one warp (device code), shared by the routing stage (moe_routing.cu)
// and the one-launch prologue of small batches (moe_prologue.cu). The method, the ranking rule
// and every float32 rounding: moe_routing.cu's header comment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/moe_stages.hpp"

namespace moecheck::kernels::routing {

constexpr int kOwnWords = static_cast<int>((kMaxExperts + 32 * 32 - 1) / (32 * 32));  // bits per lane: E / 32

enum Method : int { kDeepseek, kRenormalize, kSoftmaxTopk, kSigmoidRenormalize, kLlama4 };

struct RoutingParams {
  int experts, top_k, n_group, topk_group, method;
  float rsf;
  bool bf16_weights;
  int64_t tokens;
};

// The groups the routing ranks by: deepseek_v3's n_group when it groups (n_group > 1), else one
// group of every expert. RoutingParams::n_group holds this count.
inline int routing_group_count(const MoeConfig& c) {
  return c.routing == RoutingMethod::deepseek_v3 && c.n_group > 1 ? static_cast<int>(c.n_group) : 1;
}

// Shared memory route_token takes per warp: sel[E], gate[E], group_score[groups] floats, one such
// scratch per warp, warp w's from float w * warp_scratch_floats.
__host__ __device__ inline size_t warp_scratch_floats(int64_t experts, int64_t groups) {
  return static_cast<size_t>(2 * experts + groups);
}
inline size_t warp_smem_bytes(const RoutingParams& p) { return warp_scratch_floats(p.experts, p.n_group) * 4; }
__device__ __forceinline__ float* warp_scratch(float* smem, const RoutingParams& p, int warp) {
  return smem + static_cast<size_t>(warp) * warp_scratch_floats(p.experts, p.n_group);
}

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

// The k best experts by sel, pick j held by lane j (-1 for lanes >= k): k warp-wide maxima, each
// over every lane's best key among the experts it owns that are not taken yet.
__device__ __forceinline__ int pick_top_k(const RoutingParams& p, const float* sel) {
  const int lane = threadIdx.x & 31;
  OwnBits taken;
  int mine = -1;
  for (int j = 0; j < p.top_k; ++j) {
    const int idx = key_index(warp_max_key(lane_best(p.experts, taken, [&](int e) { return sel[e]; })));
    if ((idx & 31) == lane) taken.set(idx >> 5);
    if (lane == j) mine = idx;
  }
  return mine;
}

// The same picks for E <= 32 * kRegisterKeys (256): each lane's keys are computed once into registers and
// a taken key becomes 0 ("no candidate"), so a pick is a maximum over registers instead of shared
// memory reads and key computations. At decode sizes the routing is one warp's chain of dependent
// instructions, and these loops were most of it.
constexpr int kRegisterKeys = 8;
__device__ __forceinline__ int pick_top_k_in_registers(const RoutingParams& p, const float* sel) {
  const int E = p.experts, lane = threadIdx.x & 31;
  unsigned long long key[kRegisterKeys];
#pragma unroll
  for (int i = 0; i < kRegisterKeys; ++i) {
    const int e = lane + 32 * i;
    key[i] = e < E ? rank_key(sel[e], e) : 0ull;
  }
  int mine = -1;
  for (int j = 0; j < p.top_k; ++j) {
    unsigned long long best = 0;
#pragma unroll
    for (int i = 0; i < kRegisterKeys; ++i) best = key[i] > best ? key[i] : best;
    const int idx = key_index(warp_max_key(best));
    const int slot = (idx & 31) == lane ? idx >> 5 : -1;  // the owner's register of the pick
#pragma unroll
    for (int i = 0; i < kRegisterKeys; ++i) key[i] = i == slot ? 0ull : key[i];
    if (lane == j) mine = idx;
  }
  return mine;
}

// One token by one warp: logits l [E], its k ids and weights out; `scratch`: the warp's
// warp_smem_bytes(p) of shared memory.
__device__ __forceinline__ void route_token(const RoutingParams& p, const float* __restrict__ l,
                                            const float* __restrict__ bias, float* scratch, int32_t* ids,
                                            float* weights) {
  const int E = p.experts, lane = threadIdx.x & 31;
  float *sel = scratch, *gate = scratch + E, *group_score = scratch + 2 * E;

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
  const int mine = E <= 32 * kRegisterKeys ? pick_top_k_in_registers(p, sel) : pick_top_k(p, sel);

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

// The launch's parameters from c, with c's routing rules checked (std::invalid_argument):
// expert and top-k counts, grouping, a bias only for the methods that take one.
RoutingParams routing_params(const MoeConfig& c, const float* bias, int64_t tokens);

}  // namespace moecheck::kernels::routing
