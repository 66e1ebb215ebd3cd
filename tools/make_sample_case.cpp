// make_sample_case OUT.h5: writes the committed sample case golden/cases/sample.h5.
//
// A small DeepSeek-V3-style layer: E = 8 experts, top_k = 2, H = 256, I = 256 (2 weight blocks
// along every dimension), T = 16 tokens, deepseek_v3 routing with n_group = 2, topk_group = 1,
// routed_scaling_factor = 2.5 and a routing bias. All data comes from integer arithmetic
// (splitmix64), never from std distributions, so every machine writes the same values:
//  - hidden states: bfloat16 values k/64 * 2^(t mod 5 - 2), k in [-127, 127] (exact in bf16);
//  - router logits: float32 multiples of 1/512 in [-3.9, 3.9]; bias: multiples of 1/16;
//  - weight codes: float8_e4m3fn of a bell-shaped integer sum, saturated to +-448 (never the NaN
//    codes 0x7F/0xFF); block scales of distinct magnitudes 2^-(9..15) * (1 + j/8), so a wrong
//    block index changes the result. Weights are written one expert at a time.
// A later part replaces this program with `moecheck make-case`.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "golden/case_file.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"

namespace {

using namespace moecheck;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A deterministic 64-bit value for element i of tensor `stream`.
uint64_t draw(uint64_t stream, uint64_t i) { return splitmix64(splitmix64(stream) ^ i); }

std::vector<uint8_t> weight_codes(uint64_t stream, int64_t n) {
  std::vector<uint8_t> q(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = draw(stream, uint64_t(i));
    // Sum of four 16-bit uniforms, centred: a bell shape over [-2^17, 2^17).
    const int64_t s = int64_t(r & 0xFFFF) + int64_t((r >> 16) & 0xFFFF) + int64_t((r >> 32) & 0xFFFF) +
                      int64_t(r >> 48) - 2 * 65536;
    q[size_t(i)] = e4m3_encode_satfinite(float(s) * (600.0f / 131072.0f));
  }
  return q;
}

std::vector<float> block_scales(int64_t expert, int64_t rows, int64_t cols, int64_t which) {
  std::vector<float> s(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t e = 9 + (expert * 5 + r * 3 + c + which) % 7;
      const int64_t j = (expert + 2 * r + 3 * c + which) % 8;
      s[size_t(r * cols + c)] = std::ldexp(1.0f + float(j) / 8.0f, -int(e));
    }
  return s;
}

void make_sample(const std::string& path) {
  CaseHeader h;
  MoeConfig& c = h.config;
  c.num_experts = 8;
  c.top_k = 2;
  c.hidden_size = 256;
  c.intermediate_size = 256;
  c.routing = RoutingMethod::deepseek_v3;
  c.n_group = 2;
  c.topk_group = 1;
  c.routed_scaling_factor = 2.5;
  h.tokens = 16;
  h.description = "moecheck sample case: E=8 top_k=2 H=256 I=256 T=16, deepseek_v3 routing (n_group 2, "
                  "topk_group 1, routed_scaling_factor 2.5) with a routing bias";
  h.source = "tools/make_sample_case.cpp (deterministic integer data)";
  h.hidden_dtype = Precision::bf16;
  h.routing_bias = true;
  h.deflate = 9;
  const int64_t T = h.tokens, H = c.hidden_size, I = c.intermediate_size, E = c.num_experts;

  CaseWriter w(path, h);
  std::vector<uint16_t> x(size_t(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) {
      const int64_t k = int64_t(draw(1, uint64_t(t * H + i)) % 255) - 127;
      x[size_t(t * H + i)] = bf16_encode(std::ldexp(double(k) / 64.0, int(t % 5) - 2));
    }
  w.write_hidden_states_bf16(x);
  std::vector<float> logits(size_t(T * E));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(int64_t(draw(2, i) % 4001) - 2000) / 512.0f;
  w.write_router_logits(logits);
  std::vector<float> bias(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) bias[size_t(e)] = float((e * 37) % 11 - 5) / 16.0f;
  w.write_routing_bias(bias);
  const int64_t B = c.weight_block;
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights ew;
    ew.w13 = weight_codes(100 + uint64_t(e), 2 * I * H);
    ew.w13_scale = block_scales(e, ceil_div(2 * I, B), ceil_div(H, B), 0);
    ew.w2 = weight_codes(200 + uint64_t(e), H * I);
    ew.w2_scale = block_scales(e, ceil_div(H, B), ceil_div(I, B), 1);
    w.write_expert(e, ew);
  }
  w.commit();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_sample_case OUT.h5\n");
    return 2;
  }
  try {
    make_sample(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_sample_case: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
