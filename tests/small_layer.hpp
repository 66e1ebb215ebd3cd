// Small in-memory MoE layers for reference tests: every value from CounterRng, so a seed
// reproduces a layer exactly on any machine. Not the make-case generator (golden/): only what
// the forward and routing tests need (random FP8 codes with per-block scales of distinct
// magnitudes, bf16-exact hidden states, router logits, optional bias).
#pragma once

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <vector>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_compare.hpp"
#include "reference/moe_forward.hpp"
#include "kernels/backend_output.hpp"

namespace moecheck::testing {

struct SmallLayer {
  MoeConfig config;
  int64_t tokens = 0;
  std::vector<float> hidden, logits, bias;  // bias empty = none
  // Per stored expert (index = global id - first_stored): codes and scales.
  std::vector<std::vector<uint8_t>> w13, w2;
  std::vector<std::vector<float>> w13_scale, w2_scale;
  std::vector<int64_t> stored;  // global ids

  MoeProblem problem() const {
    MoeProblem p;
    p.config = config;
    p.tokens = tokens;
    p.hidden = hidden.data();
    p.logits = logits.data();
    p.bias = bias.empty() ? nullptr : bias.data();
    p.stored_experts = stored;
    p.source = "small_layer";
    p.load_expert = [this](int64_t e) {
      for (size_t i = 0; i < stored.size(); ++i)
        if (stored[i] == e) return ExpertView{w13[i].data(), w13_scale[i].data(), w2[i].data(), w2_scale[i].data(), {}};
      throw std::logic_error("expert not stored");
    };
    return p;
  }
};

// A small DeepSeek-V3-style layer: 16 experts in 4 groups (top-2 groups), top-4, H = 256,
// routed scaling factor 2.5; I as given (1024 splits into 8 tensor-parallel slices of one block).
inline MoeConfig dsv3_small(int64_t intermediate = 256) {
  MoeConfig c;
  c.num_experts = 16, c.top_k = 4, c.hidden_size = 256, c.intermediate_size = intermediate;
  c.routing = RoutingMethod::deepseek_v3, c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5;
  return c;
}

// A random FP8 code that is not NaN, magnitudes spread over the whole e4m3 range.
inline uint8_t random_code(const CounterRng& r, uint64_t i) {
  uint8_t c = static_cast<uint8_t>(r.bits(i) & 0xFF);
  if ((c & 0x7F) == 0x7F) c ^= 0x01;  // NaN code -> 0x7E (448)
  return c;
}

// Layer of config c with T tokens. Weight block scales are 2^-(6..11) times a per-block factor
// in [1, 2): distinct per block, so a transposed or shifted scale changes the result.
inline SmallLayer make_small_layer(const MoeConfig& c, int64_t T, uint64_t seed, bool with_bias) {
  SmallLayer L;
  L.config = c;
  L.tokens = T;
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, B = c.weight_block;
  CounterRng hid{seed, 1}, lg{seed, 2}, bs{seed, 3};
  L.hidden.resize(T * H);
  for (int64_t i = 0; i < T * H; ++i) L.hidden[i] = bf16_round(hid.normal(2 * i) * 2.0);
  L.logits.resize(T * E);
  for (int64_t i = 0; i < T * E; ++i) L.logits[i] = static_cast<float>(lg.normal(2 * i));
  if (with_bias) {
    L.bias.resize(E);
    for (int64_t i = 0; i < E; ++i) L.bias[i] = static_cast<float>(bs.normal(2 * i) * 0.5);
  }
  const int64_t first = c.local_expert_offset, n = c.local_experts();
  for (int64_t e = first; e < first + n; ++e) {
    CounterRng wr{seed, 100 + static_cast<uint64_t>(e) * 4};
    CounterRng sr{seed, 101 + static_cast<uint64_t>(e) * 4};
    auto codes = [&](int64_t count, uint64_t off) {
      std::vector<uint8_t> v(count);
      for (int64_t i = 0; i < count; ++i) v[i] = random_code(wr, off + i);
      return v;
    };
    auto scales = [&](int64_t rows, int64_t cols, uint64_t off) {
      std::vector<float> v(ceil_div(rows, B) * ceil_div(cols, B));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = std::ldexp(1.0f + static_cast<float>(sr.uniform(off + i)), -6 - static_cast<int>(sr.bits(off + i + 1000) % 6));
      return v;
    };
    L.w13.push_back(codes(2 * I * H, 0));
    L.w2.push_back(codes(H * I, uint64_t(1) << 40));
    L.w13_scale.push_back(scales(2 * I, H, 0));
    L.w2_scale.push_back(scales(H, I, 5000));
    L.stored.push_back(e);
  }
  return L;
}

// The seeds a random-case test runs: MOECHECK_SEED=<s> replays seed s alone, MOECHECK_CASES=<n>
// runs n seeds from 0, else default_count.
struct SeedRange {
  uint64_t first = 0, count = 0;
};
inline SeedRange seed_range(uint64_t default_count) {
  const char* env_seed = std::getenv("MOECHECK_SEED");
  const char* env_cases = std::getenv("MOECHECK_CASES");
  if (env_seed) return {std::strtoull(env_seed, nullptr, 10), 1};
  return {0, env_cases ? std::strtoull(env_cases, nullptr, 10) : default_count};
}

// A backend's run as the judge's Observation (its bf16 output decoded, ids, slot outputs).
inline Observation observe(const BackendOutput& b) {
  Observation o;
  o.name = b.backend;
  for (uint16_t v : b.output_bf16) o.output.push_back(bf16_decode(v));
  o.topk_ids = b.topk_ids;
  o.expert_outputs = b.expert_outputs;
  return o;
}

}  // namespace moecheck::testing
