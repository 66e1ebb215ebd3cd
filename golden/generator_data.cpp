// The distributions of `moecheck make-case` (generator_data.hpp; the prose is GENERATOR.md).
//
// Portability: only CounterRng draws, +, -, *, /, sqrt, std::ldexp and std::nextafter (exact),
// integer arithmetic, and the float32 / bfloat16 / e4m3 roundings of reference/. This file is
// compiled with -ffp-contract=off (golden/CMakeLists.txt), so no a*b+c becomes an FMA.
// The one libm-dependent step is the reference routing (std::exp in the sigmoid / softmax),
// used to find where to plant ties and which experts are dead: its choices only depend on
// comparisons of scores that differ by far more than a last-bit difference of exp, except on
// exact ties, which compare equal on every machine.
#include "golden/generator_data.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"

namespace moecheck {

void fill_normals(const CounterRng& rng, uint64_t first, size_t n, double* out) {
  // Mirrors CounterRng::normal (counter_rng.cpp) step by step; tests check bit equality.
  const uint64_t end = first + n;
  for (uint64_t pair = first >> 1; pair <= (end - 1) >> 1 && n > 0; ++pair) {
    const auto b = rng.block(pair);
    const uint64_t w01 = static_cast<uint64_t>(b[0]) | (static_cast<uint64_t>(b[1]) << 32);
    const uint64_t w23 = static_cast<uint64_t>(b[2]) | (static_cast<uint64_t>(b[3]) << 32);
    const double u1 = static_cast<double>((w01 >> 11) + 1) * 0x1p-53;
    const double u2 = static_cast<double>(w23 >> 11) * 0x1p-53;
    const double r = std::sqrt(-2.0 * portable_log(u1));
    double c, s;
    portable_cos_sin_2pi(u2, &c, &s);
    const uint64_t even = 2 * pair, odd = even + 1;
    if (even >= first) out[even - first] = r * c;
    if (odd < end) out[odd - first] = r * s;
  }
}

namespace gen {

namespace {

// Rates of the planted features per distribution (GENERATOR.md, "Distributions").
struct Rates {
  double tail = 0;          // fraction of activations with a Student-t(3) tail
  double outliers = 0;      // fraction of hidden channels scaled by 20..100
  double tiny_token = 0;    // fraction of tokens (t >= 4) scaled by 1e-6
  double huge_token = 0;    // fraction of tokens (t >= 4) scaled by 1e3
  double zero_group = 0;    // fraction of (token, 128-group) pairs set to 0
  double tiny_block = 0;    // fraction of weight blocks with scales ~1e-8
  double extreme_block = 0; // fraction of weight blocks with scales ~1e-29..1e-26
  double negative_bias = 0; // fraction of experts with bias in [-2, -1] (scores < 0)
  double glm_bias = 0;      // fraction of experts with bias ~12 and logits ~-17 (docs/BUG-CLASSES.md #18)
  double gate_mean = 0;     // gate weights ~ sigma * (N(0,1) - gate_mean)
  bool planted = false;     // tokens 1, 2, 3 (zero group, tiny, huge) and dead experts
};

Rates rates_of(Distribution d) {
  Rates r;
  if (d == Distribution::uniform) return r;
  r = {0.1, 0.01, 1.0 / 32, 1.0 / 32, 1.0 / 64, 1.0 / 64, 0.0, 1.0 / 8, 0.0, 0.5, true};
  if (d == Distribution::adversarial) r = {0.3, 0.05, 1.0 / 8, 1.0 / 8, 1.0 / 8, 1.0 / 8, 1.0 / 32, 0.4, 0.2, 0.5, true};
  return r;
}

constexpr int64_t kSigmaBlock = 128;  // the blocks over which weight magnitudes vary
constexpr double kUniformSigma = 0.02;

// Bias class of expert e: 0 plain N(0, 0.1), 1 negative, 2 GLM-like large. With near-ties, the
// pairs (2j, 2j+1) share class and value, so that an exact tie in the logits is an exact tie of
// the biased scores.
// One even expert id per seed is always negative and another always GLM-like (when the
// distribution has the class), so that small layers have both.
int bias_class(const DataSpec& s, const Rates& r, int64_t e) {
  if (!s.routing_bias) return 0;
  const int64_t src = s.near_ties ? (e & ~int64_t(1)) : e, E = s.layer.num_experts;
  const CounterRng rng{s.seed, kBiasClass};
  if (E >= 4) {
    const int64_t neg = 2 * int64_t(rng.bits(uint64_t(1) << 40) % uint64_t(E / 2));
    const int64_t glm = (neg + 2 + 2 * int64_t(rng.bits((uint64_t(1) << 40) + 1) % uint64_t(E / 2 - 1))) % (E / 2 * 2);
    if (r.negative_bias > 0 && src == neg) return 1;
    if (r.glm_bias > 0 && src == glm) return 2;
  }
  const double u = rng.uniform(uint64_t(src));
  if (u < r.negative_bias) return 1;
  if (u < r.negative_bias + r.glm_bias) return 2;
  return 0;
}

// The cold group of a planted distribution with grouped, biased routing (GENERATOR.md "Cold
// group", docs/BUG-CLASSES.md #19): one group, drawn per seed, whose plain-class experts have
// biases in [-0.43, -0.03], below -sigmoid(-4), so that the cold token's scores in it are negative
// (a group the load balancer has pushed down). -1 where there is none.
int64_t cold_group(const DataSpec& s, const Rates& r) {
  const MoeConfig& c = s.layer;
  if (!s.routing_bias || !r.planted || c.routing != RoutingMethod::deepseek_v3 || c.n_group <= 1) return -1;
  const CounterRng rng{s.seed, kBiasClass};
  return int64_t(rng.bits((uint64_t(1) << 40) + 2) % uint64_t(c.n_group));
}

bool is_chosen(const TokenRouting& r, int64_t e) { return std::find(r.ids.begin(), r.ids.end(), int32_t(e)) != r.ids.end(); }

bool is_candidate(const MoeConfig& c, const TokenRouting& r, int64_t e) {
  if (r.kept_groups.empty()) return true;
  const int64_t g = e / (c.num_experts / c.n_group);
  return std::find(r.kept_groups.begin(), r.kept_groups.end(), int32_t(g)) != r.kept_groups.end();
}

// Ties at the k-th place of token t (GENERATOR.md "Near-ties"): expert b, rejected, takes the
// logit of a, the last chosen: exactly (t % 4 == 1) or one float32 ulp above (t % 4 == 3).
void plant_tie(const DataSpec& s, int64_t t, float* row, const std::vector<float>& bias) {
  const MoeConfig& c = s.layer;
  const float* b = bias.empty() ? nullptr : bias.data();
  const TokenRouting r = route_token(c, row, b);
  const int64_t k = c.top_k, E = c.num_experts;
  const int64_t a = r.ids[size_t(k - 1)];
  auto usable = [&](int64_t e) {
    if (e < 0 || e >= E || !is_candidate(c, r, e)) return false;
    if (is_chosen(r, e)) return false;
    return !b || b[e] == b[a];
  };
  int64_t pick = usable(a ^ 1) ? (a ^ 1) : -1;
  for (int64_t e = 0; e < E && pick < 0; ++e)
    if (usable(e)) pick = e;
  if (pick < 0) return;  // nothing rejected with an equal bias: no tie possible here
  row[pick] = (t % 4 == 1) ? row[a] : std::nextafter(row[a], HUGE_VALF);
}

constexpr int64_t kColdToken = 6;

// Token 6 of a planted distribution with grouped, biased routing (GENERATOR.md "Cold token",
// docs/BUG-CLASSES.md #19): every logit -4 (sigmoid 0.018: an expert's biased score is negative where its
// bias is below -0.018, and its weight, a few % of an anchor's, still shows in the output),
// except one anchor per group in the topk_group groups with the fewest non-negative scores, at
// +8. The anchored groups are kept (unless a group's two largest biases outscore an anchor, as
// GLM-like biases do); the anchor is its group's largest bias, so the other top_k - topk_group
// choices come from the kept groups' remaining experts. Masking the excluded groups with 0
// instead of -inf then picks an excluded expert (score 0) over every negative one: it changes
// this token's choice whenever fewer than top_k kept experts score >= 0.
constexpr float kColdLogit = -4.0f;
constexpr double kColdSigmoid = 0.01798620996209156;  // 1 / (1 + e^4), a constant: no libm here
void plant_cold_token(const MoeConfig& c, float* row, const std::vector<float>& bias) {
  const int64_t E = c.num_experts, per = E / c.n_group;
  std::vector<int64_t> anchor(size_t(c.n_group)), positives(size_t(c.n_group), 0);
  for (int64_t g = 0; g < c.n_group; ++g) {
    int64_t best = g * per;
    for (int64_t e = g * per; e < (g + 1) * per; ++e)
      if (bias[size_t(e)] > bias[size_t(best)]) best = e;
    anchor[size_t(g)] = best;
    for (int64_t e = g * per; e < (g + 1) * per; ++e)
      positives[size_t(g)] += e != best && kColdSigmoid + double(bias[size_t(e)]) >= 0;
  }
  std::vector<int64_t> groups(size_t(c.n_group));
  for (int64_t g = 0; g < c.n_group; ++g) groups[size_t(g)] = g;
  std::stable_sort(groups.begin(), groups.end(),
                   [&](int64_t a, int64_t b) { return positives[size_t(a)] < positives[size_t(b)]; });
  std::fill_n(row, E, kColdLogit);
  for (int64_t i = 0; i < c.topk_group; ++i) row[anchor[size_t(groups[size_t(i)])]] = 8.0f;
}

// sigmoid(x) from portable_exp: the generator's stored values may not depend on libm.
double portable_sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + portable_exp(-x));
  const double e = portable_exp(x);
  return e / (1.0 + e);
}

constexpr int64_t kBiasRoundToken = 4;

// Token 4 of a planted distribution with a float32 routing bias (GENERATOR.md "Bias-rounding
// token", docs/BUG-CLASSES.md #17): among the rejected candidates b, the one whose bias moves up
// the most relative to the last chosen expert a's when both are rounded to bf16 (d = (bf16(b_b) -
// b_b) - (bf16(b_a) - b_a) > 0) gets the logit that puts its biased score d/2 below a's. Routing
// with the float32 bias still rejects b (by d/2, far beyond the float32 roundoff of the scores);
// routing with the bias rounded to bf16 chooses b over a. Nothing is planted where no candidate
// has d > 0 (a bias already bf16-exact) or the needed sigmoid is outside [0.01, 0.99].
void plant_bias_rounding(const MoeConfig& c, float* row, const std::vector<float>& bias) {
  const TokenRouting r = route_token(c, row, bias.data());
  const int64_t k = c.top_k, E = c.num_experts, a = r.ids[size_t(k - 1)];
  auto shift = [&](int64_t e) { return double(bf16_round(bias[size_t(e)])) - double(bias[size_t(e)]); };
  const double sel_a = portable_sigmoid(double(row[a])) + double(bias[size_t(a)]);
  int64_t pick = -1;
  double best = 0x1p-14, target = 0;  // d/2 >= 2^-15: beyond the near-tie tolerance (BUDGETS.md §6)
  for (int64_t e = 0; e < E; ++e) {
    if (!is_candidate(c, r, e) || is_chosen(r, e)) continue;
    const double d = shift(e) - shift(a), g = sel_a - double(bias[size_t(e)]) - d / 2;
    if (d > best && g >= 0.01 && g <= 0.99) pick = e, best = d, target = g;
  }
  if (pick < 0) return;
  const float before = row[pick];
  row[pick] = fl32(portable_log(target / (1 - target)));
  // Kept only where the two roundings of the bias really disagree on this token.
  std::vector<float> rounded(bias);
  for (float& v : rounded) v = bf16_round(v);
  const TokenRouting f32 = route_token(c, row, bias.data()), b16 = route_token(c, row, rounded.data());
  if (is_chosen(f32, pick) || !is_chosen(b16, pick)) row[pick] = before;
}

bool has_bias_rounding_token(const DataSpec& s, const std::vector<float>& bias) {
  return rates_of(s.dist).planted && !bias.empty() && s.bias_dtype == Precision::f32 && s.layer.top_k < s.layer.num_experts;
}

bool has_cold_token(const DataSpec& s, const std::vector<float>& bias) {
  const MoeConfig& c = s.layer;
  return rates_of(s.dist).planted && c.routing == RoutingMethod::deepseek_v3 && !bias.empty() &&
         c.n_group > 1 && c.topk_group < c.n_group && c.top_k > c.topk_group;
}

}  // namespace

std::vector<float> hidden_states(const DataSpec& s, int64_t T) {
  const Rates r = rates_of(s.dist);
  const int64_t H = s.layer.hidden_size, G = ceil_div(H, s.layer.group_size);
  const CounterRng base{s.seed, kHiddenBase}, tail{s.seed, kHiddenTail}, pick{s.seed, kHiddenPick};
  const CounterRng chan{s.seed, kOutlierChannel}, role{s.seed, kTokenRole}, zero{s.seed, kZeroGroup};
  std::vector<double> factor(size_t(H), 1.0);
  const int64_t n_out = r.outliers > 0 ? std::max<int64_t>(1, int64_t(double(H) * r.outliers)) : 0;
  for (int64_t j = 0; j < n_out; ++j)
    factor[size_t(chan.bits(uint64_t(2 * j)) % uint64_t(H))] = 20.0 + 80.0 * chan.uniform(uint64_t(2 * j + 1));
  const int64_t zero_group_of_token1 = int64_t(zero.bits(0) % uint64_t(G));

  std::vector<float> x(static_cast<size_t>(T * H));
  std::vector<double> z(static_cast<size_t>(H)), chi(3, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double scale = 1.0;
    if (r.planted) {
      const double u = role.uniform(uint64_t(t));
      if (t == 2 || (t >= 4 && u < r.tiny_token)) scale = 1e-6;
      if (t == 3 || (t >= 4 && u >= r.tiny_token && u < r.tiny_token + r.huge_token)) scale = 1e3;
    }
    fill_normals(base, uint64_t(t * H), size_t(H), z.data());
    for (int64_t h = 0; h < H; ++h) {
      const uint64_t i = uint64_t(t * H + h);
      double v = z[size_t(h)];
      if (r.tail > 0 && pick.uniform(i) < r.tail) {
        fill_normals(tail, 3 * i, 3, chi.data());
        v /= std::max(std::sqrt((chi[0] * chi[0] + chi[1] * chi[1] + chi[2] * chi[2]) / 3.0), 1e-3);
      }
      x[size_t(i)] = fl32(v * factor[size_t(h)] * scale);
    }
    for (int64_t g = 0; g < G && r.planted; ++g) {
      const bool zero_it = (t == 1 && g == zero_group_of_token1) || zero.uniform(uint64_t(1 + t * G + g)) < r.zero_group;
      if (!zero_it) continue;
      const int64_t h1 = std::min(H, (g + 1) * s.layer.group_size);
      for (int64_t h = g * s.layer.group_size; h < h1; ++h) x[size_t(t * H + h)] = 0.0f;
    }
  }
  // Adversarial token 4: per group an element +-448 * 2^k (so a float32 group scale is exactly
  // 2^k) and the others at exact midpoints between adjacent e4m3 values times 2^k: every x/s
  // is a rounding tie (RNE must pick the even code). Midpoints have 4 significant bits: exact
  // in bfloat16.
  if (s.dist == Distribution::adversarial && T > 4) {
    const CounterRng mid{s.seed, kMidpoint};
    const int64_t t = 4, gs = s.layer.group_size;
    for (int64_t g = 0; g < G; ++g) {
      const int kexp = int(mid.bits(uint64_t(t * H + g * gs)) % 16) - 10;
      for (int64_t h = g * gs; h < std::min(H, (g + 1) * gs); ++h) {
        const uint64_t bits = mid.bits(uint64_t(t * H + h));
        const uint8_t code = uint8_t(bits % 0x7E);  // 0x00 .. 0x7D: a next code exists below 448
        double v = h == g * gs ? 448.0 : 0.5 * (e4m3_decode(code) + e4m3_decode(uint8_t(code + 1)));
        if ((bits >> 8) & 1) v = -v;
        x[size_t(t * H + h)] = float(std::ldexp(v, kexp));
      }
    }
  }
  return x;
}

std::vector<float> routing_bias(const DataSpec& s) {
  if (!s.routing_bias) return {};
  const Rates r = rates_of(s.dist);
  const int64_t E = s.layer.num_experts;
  const CounterRng n{s.seed, kBias};
  const int64_t cold = cold_group(s, r);
  std::vector<float> b(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t src = s.near_ties ? (e & ~int64_t(1)) : e;  // near-tie pairs share their draws
    const double z = n.normal(uint64_t(src));
    double v = 0.1 * z;                                 // N(0, 0.1): DeepSeek-V3-like magnitudes
    const int cls = bias_class(s, r, e);
    if (cls == 0 && cold >= 0 && src / (E / s.layer.n_group) == cold) v = -0.03 - std::min(std::fabs(z), 4.0) * 0.1;
    if (cls == 1) v = -1.0 - std::min(std::fabs(z), 4.0) * 0.25;  // [-2, -1]: sigmoid + bias < 0
    if (cls == 2) v = 12.0 + 0.1 * z;                   // GLM-5.2-like (docs/BUG-CLASSES.md #18)
    b[size_t(e)] = s.bias_dtype == Precision::bf16 ? bf16_round(v) : fl32(v);
  }
  return b;
}

std::vector<float> router_logits(const DataSpec& s, int64_t T, const std::vector<float>& bias) {
  const Rates r = rates_of(s.dist);
  const int64_t E = s.layer.num_experts;
  const CounterRng n{s.seed, kLogits}, off{s.seed, kExpertOffset};
  std::vector<double> offset(size_t(E), 0.0);
  for (int64_t e = 0; e < E && s.dist != Distribution::uniform; ++e) {
    offset[size_t(e)] = 0.7 * off.normal(uint64_t(e));  // expert popularity
    if (bias_class(s, r, e) == 2) offset[size_t(e)] = -17.0 + 0.5 * off.normal(uint64_t(e));  // sigmoid ~ 4e-8
  }
  std::vector<float> l(static_cast<size_t>(T * E));
  std::vector<double> z(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    float* row = l.data() + t * E;
    const bool zero_row = s.dist == Distribution::adversarial && t == 5;  // every score tied
    fill_normals(n, uint64_t(t * E), size_t(E), z.data());
    for (int64_t e = 0; e < E; ++e) row[e] = zero_row ? 0.0f : fl32(z[size_t(e)] + offset[size_t(e)]);
    if (s.near_ties && !zero_row && (t % 4 == 1 || t % 4 == 3)) plant_tie(s, t, row, bias);
    if (t == kBiasRoundToken && has_bias_rounding_token(s, bias)) plant_bias_rounding(s.layer, row, bias);
    if (t == kColdToken && has_cold_token(s, bias)) plant_cold_token(s.layer, row, bias);
  }
  return l;
}

std::vector<int64_t> dead_experts(const DataSpec& s, const TokenRouting& token0) {
  if (!rates_of(s.dist).planted) return {};
  const int64_t k = int64_t(token0.ids.size());
  std::set<int64_t> d = {token0.ids[size_t(k - 1)]};
  if (k >= 3) d.insert(token0.ids[1]);
  if (s.dist == Distribution::adversarial) d.insert(token0.ids[0]);
  return {d.begin(), d.end()};
}

namespace {

// Standard deviation of the float weights in one 128x128 block of the full layer
// (GENERATOR.md "Weights"): 2^k * (1 + f), k uniform in [-13, -4], f uniform in [0, 1).
struct SigmaTable {
  const DataSpec& s;
  Rates r;
  CounterRng rng;
  int64_t nb;  // blocks along the longest dimension: block ids are ((e*3+tensor)*nb + br)*nb + bc
  int64_t nbh, nbi;  // blocks along H and along the full I
  int64_t nbr(int tensor) const { return tensor == 2 ? nbh : nbi; }
  int64_t nbc(int tensor) const { return tensor == 2 ? nbi : nbh; }
  // Every expert (realistic, adversarial) has one planted tiny-scale block: tensor e % 3 (gate,
  // up, down), block row e % rows, block column (e / 3) % columns of the full layer.
  double sigma(int64_t e, int tensor, int64_t br, int64_t bc, bool dead) const {
    if (s.dist == Distribution::uniform) return kUniformSigma;
    const uint64_t blk = uint64_t(((e * 3 + tensor) * nb + br) * nb + bc);
    const uint64_t bits = rng.bits(4 * blk);
    const double f = 1.0 + rng.uniform(4 * blk + 1);
    if (dead) return std::ldexp(f, s.dist == Distribution::adversarial ? -70 - int(bits % 20) : -70);  // scales ~1e-23
    const bool planted_tiny = r.planted && tensor == int(e % 3) && br == e % nbr(tensor) && bc == (e / 3) % nbc(tensor);
    if (planted_tiny || rng.uniform(4 * blk + 2) < r.tiny_block) return std::ldexp(f, -20);          // scales ~1e-8
    if (rng.uniform(4 * blk + 3) < r.extreme_block) return std::ldexp(f, -90 + int(bits % 10));       // ~1e-29..1e-26
    return std::ldexp(f, -13 + int(bits % 10));
  }
};

}  // namespace

ExpertWeights expert_weights(const DataSpec& s, const WeightSlice& w, int64_t e, bool dead) {
  const Rates r = rates_of(s.dist);
  const int64_t H = s.layer.hidden_size, If = w.full_intermediate, Il = w.local_intermediate, off = w.offset;
  const SigmaTable sig{s, r, CounterRng{s.seed, kBlockSigma}, ceil_div(std::max(H, If), kSigmaBlock),
                       ceil_div(H, kSigmaBlock), ceil_div(If, kSigmaBlock)};
  std::vector<double> z(size_t(std::max(H, Il)));
  std::vector<double> row_sigma(size_t(ceil_div(std::max(H, If), kSigmaBlock)));

  // w13 [2*Il, H]: gate (tensor 0) and up (tensor 1), each [Il, H], placed per the layout.
  std::vector<float> w13(size_t(2 * Il * H));
  for (int tensor = 0; tensor < 2; ++tensor) {
    const bool gate = tensor == 0;
    const int64_t row0 = (gate == (w.layout == GateUpLayout::gate_up)) ? 0 : Il;
    const CounterRng rng{s.seed, gate ? uint64_t(kGate) : uint64_t(kUp)};
    const double mean = gate ? r.gate_mean : 0.0;
    for (int64_t i = 0; i < Il; ++i) {
      const int64_t R = off + i;  // full-layer row
      if (i == 0 || R % kSigmaBlock == 0)
        for (int64_t bc = 0; bc < ceil_div(H, kSigmaBlock); ++bc) row_sigma[size_t(bc)] = sig.sigma(e, tensor, R / kSigmaBlock, bc, dead);
      fill_normals(rng, uint64_t((e * If + R) * H), size_t(H), z.data());
      float* dst = w13.data() + (row0 + i) * H;
      for (int64_t h = 0; h < H; ++h) dst[h] = fl32(row_sigma[size_t(h / kSigmaBlock)] * (z[size_t(h)] - mean));
    }
  }
  // Scales from amax (eps far below any block's amax: a dead expert keeps its ~1e-23 scales).
  constexpr double kEps = 1e-30;
  BlockQuantized q13 = block_quantize(w13.data(), 2 * Il, H, s.layer.weight_block, w.scale_format, kEps);
  w13 = {};

  // w2 [H, Il] (tensor 2): columns [off, off + Il) of the full [H, If].
  std::vector<float> w2(static_cast<size_t>(H * Il));
  const CounterRng down{s.seed, kDown};
  for (int64_t h = 0; h < H; ++h) {
    if (h % kSigmaBlock == 0)
      for (int64_t bc = 0; bc < ceil_div(If, kSigmaBlock); ++bc) row_sigma[size_t(bc)] = sig.sigma(e, 2, h / kSigmaBlock, bc, dead);
    fill_normals(down, uint64_t((e * H + h) * If + off), size_t(Il), z.data());
    for (int64_t i = 0; i < Il; ++i) w2[size_t(h * Il + i)] = fl32(row_sigma[size_t((off + i) / kSigmaBlock)] * z[size_t(i)]);
  }
  BlockQuantized q2 = block_quantize(w2.data(), H, Il, s.layer.weight_block, w.scale_format, kEps);

  ExpertWeights out;
  out.expert = e;
  out.w13 = std::move(q13.codes);
  out.w13_scale = std::move(q13.scales);
  out.w2 = std::move(q2.codes);
  out.w2_scale = std::move(q2.scales);
  return out;
}

}  // namespace gen
}  // namespace moecheck
