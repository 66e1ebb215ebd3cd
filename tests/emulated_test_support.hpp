// Stage-by-stage float64 checks of an emulated run (tests/emulated_test.cpp,
// tests/emulated_faults_test.cpp). Plain loops written from docs/DEVICE-ALGORITHM.md, not from
// the backend's code: every stage of the emulated trace is recomputed in double from the
// emulated value of the stage before it, so an FP8 re-quantization flip upstream cannot make a
// downstream comparison fragile, and each stage is held to a bound derived for it.
//
// Bounds (u = 2^-24, float32 unit roundoff; S = sum of |a_i| |w_i| over the dot product):
//   quantization (act and intermediate)  bitwise: scale fl32(max(amax, eps) / 448) (ue8m0: next
//       power of two, >= 2^-127) and codes e4m3(fl32(x / s)) are single correctly rounded
//       operations, which double arithmetic reproduces exactly (float a / b computed in double
//       and rounded once is the float32 quotient).
//   GEMM (both)  |emu - exact| <= (L + 4 + 1 + KB + 2) u S: L = ceil(G/16) sequential adds per
//       lane, 4 tree levels, the scale product, KB promotions, +2 for second-order terms; plus,
//       for a bf16 intermediate, the rounding 2^-8 |emu|.
//   SiLU * up    |emu - exact(g, u)| <= 8 u |h| + 4 * 2^-149 (expf within 1 ulp, 1 + e, the
//       division, the product, each one rounding), plus 2^-8 |emu| for bf16; exactly 0 where
//       expf(-g) overflows float32 (g < -88.72: the formula gives g / inf).
//   finalize     |out - sum_j w_j y_j| <= (2k + 1) u sum |w_j y_j| + 2^-8 (|sum| + that): k
//       products and k sums in float32, then the bf16 rounding.
//   routing      ids equal to the float64 reference except at near-ties (margin below
//       1e-5 * scale), weights within (k + 8) u |w| (+ 2^-8 |w| for bf16 weights).
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/emulated/emulated_moe.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_routing.hpp"
#include "tests/small_layer.hpp"

namespace moecheck::testing {

constexpr double kU = 0x1p-24;
constexpr double kBf16U = 0x1p-8;

// What a stage check found: count of violations, the worst ratio error / bound, first message.
struct StageReport {
  int64_t violations = 0, compared = 0;
  double worst_ratio = 0;
  std::string first;
  void note(double err, double bound, const std::string& where) {
    ++compared;
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
    if (ratio > worst_ratio || std::isnan(err)) worst_ratio = std::isnan(err) ? INFINITY : ratio;
    if (!(err <= bound)) {
      if (violations++ == 0) first = where;
    }
  }
  void exact(bool same, const std::string& where) { note(same ? 0 : 1, 0, where); }
  std::string str() const {
    std::ostringstream os;
    os << violations << " of " << compared << " violate (worst ratio " << worst_ratio << ")";
    if (violations) os << "; first: " << first;
    return os.str();
  }
};

inline double dec(uint8_t c) { return fp8_decode(c, Fp8Format::e4m3fn); }

// The contract's scale of a group (double arithmetic, one rounding to float).
inline float contract_scale(double amax, const MoeConfig& c) {
  const double q = amax >= c.act_eps ? amax / 448.0 : c.act_eps / 448.0;
  float s = static_cast<float>(q);
  if (c.scale_format == ScaleFormat::ue8m0) s = static_cast<float>(std::max(std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(double(s))))), 0x1p-127));
  return s;
}

// Group quantization of row x[n]: compares codes/scales bitwise with the emulated ones.
inline void check_quant_row(const float* x, int64_t n, const MoeConfig& c, const uint8_t* codes, const float* scales,
                            StageReport& rep, const std::string& where) {
  const int64_t G = c.group_size;
  for (int64_t k0 = 0, b = 0; k0 < n; k0 += G, ++b) {
    const int64_t k1 = std::min(n, k0 + G);
    double amax = 0;
    for (int64_t i = k0; i < k1; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    const float s = contract_scale(amax, c);
    rep.exact(std::bit_cast<uint32_t>(s) == std::bit_cast<uint32_t>(scales[b]), where + " scale group " + std::to_string(b));
    for (int64_t i = k0; i < k1; ++i) {
      const uint8_t q = fp8_encode(double(static_cast<float>(double(x[i]) / double(s))), Fp8Format::e4m3fn);
      rep.exact(q == codes[i], where + " code " + std::to_string(i));
    }
  }
}

inline double gemm_gamma(int64_t K, int64_t G) {
  const int64_t L = (G + 15) / 16, KB = (K + G - 1) / G;
  return double(L + 4 + 1 + KB + 2) * kU;
}

// One dot product row: exact value and sum of magnitudes. a: codes [K] with scales [KB];
// w: codes [N, K] with block scales [ceil(N/G), KB]; row n.
inline void exact_dot(const uint8_t* a, const float* sa, const uint8_t* w, const float* sw, int64_t K, int64_t G,
                      int64_t n, double* value, double* mag) {
  const int64_t KB = (K + G - 1) / G;
  double v = 0, m = 0;
  for (int64_t i = 0; i < K; ++i) {
    const double x = dec(a[i]) * double(sa[i / G]) * dec(w[n * K + i]) * double(sw[(n / G) * KB + i / G]);
    v += x;
    m += std::fabs(x);
  }
  *value = v, *mag = m;
}

// All stages of one run; `out` must hold expert_outputs, `tr` the trace.
inline std::vector<StageReport> check_stages(const SmallLayer& L, const BackendOutput& out, const EmulatedTrace& tr) {
  const MoeConfig& c = L.config;
  const int64_t T = L.tokens, H = c.hidden_size, I = c.intermediate_size, k = c.top_k, G = c.group_size;
  const int64_t KBH = (H + G - 1) / G, KBI = (I + G - 1) / G;
  const bool bf16i = c.intermediate_dtype == Precision::bf16;
  std::vector<StageReport> r(6);  // 0 act quant, 1 gemm1, 2 silu, 3 h quant, 4 gemm2, 5 finalize
  for (int64_t t = 0; t < T; ++t)
    check_quant_row(L.hidden.data() + t * H, H, c, tr.act_codes.data() + t * H, tr.act_scales.data() + t * KBH, r[0],
                    "token " + std::to_string(t));
  const bool gate_first = c.gate_up_layout == GateUpLayout::gate_up;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> acc(H, 0.0), mag(H, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j, e = out.topk_ids[s];
      const std::string where = "token " + std::to_string(t) + " slot " + std::to_string(j) + " expert " + std::to_string(e);
      if (!c.is_local(e)) {
        bool zero = true;
        for (int64_t i = 0; i < H; ++i) zero = zero && out.expert_outputs[s * H + i] == 0.0f;
        r[4].exact(zero, where + ": non-local slot output not 0");
        continue;
      }
      size_t si = 0;
      while (L.stored[si] != e) ++si;
      // GEMM1 from the emulated activation operand.
      const float* x = tr.gemm1.data() + s * 2 * I;
      for (int64_t n = 0; n < 2 * I; ++n) {
        double v, m;
        exact_dot(tr.act_codes.data() + t * H, tr.act_scales.data() + t * KBH, L.w13[si].data(), L.w13_scale[si].data(), H,
                  G, n, &v, &m);
        r[1].note(std::fabs(double(x[n]) - v), gemm_gamma(H, G) * m + (bf16i ? kBf16U * std::fabs(x[n]) : 0),
                  where + " row " + std::to_string(n));
      }
      // SiLU * up from the emulated GEMM1 output.
      const float* h = tr.h.data() + s * I;
      for (int64_t i = 0; i < I; ++i) {
        const double g = x[gate_first ? i : I + i], u = x[gate_first ? I + i : i];
        if (std::isinf(static_cast<float>(std::exp(-g)))) {
          // The contract's float32 formula: expf(-g) overflows for g < -88.72, silu = g / inf = -0
          // (the exact value, down to ~1e-43, is lost: that is what the device computes too).
          r[2].exact(h[i] == 0.0f, where + " h " + std::to_string(i) + ": expf overflow must give 0");
          continue;
        }
        const double want = g / (1 + std::exp(-g)) * u;
        r[2].note(std::fabs(double(h[i]) - want), 8 * kU * std::fabs(want) + 4 * 0x1p-149 + (bf16i ? kBf16U * std::fabs(h[i]) : 0),
                  where + " h " + std::to_string(i));
      }
      // Re-quantization of the emulated h.
      check_quant_row(h, I, c, tr.h_codes.data() + s * I, tr.h_scales.data() + s * KBI, r[3], where);
      // GEMM2 from the emulated intermediate operand.
      const float* y = out.expert_outputs.data() + s * H;
      const double w = out.topk_weights[s];
      for (int64_t n = 0; n < H; ++n) {
        double v, m;
        exact_dot(tr.h_codes.data() + s * I, tr.h_scales.data() + s * KBI, L.w2[si].data(), L.w2_scale[si].data(), I, G,
                  n, &v, &m);
        r[4].note(std::fabs(double(y[n]) - v), gemm_gamma(I, G) * m, where + " out " + std::to_string(n));
        acc[n] += w * double(y[n]);
        mag[n] += std::fabs(w * double(y[n]));
      }
    }
    // Finalize from the emulated slot outputs and weights.
    for (int64_t n = 0; n < H; ++n) {
      const double got = bf16_decode(out.output_bf16[t * H + n]);
      const double fb = (2 * k + 1) * kU * mag[n];
      r[5].note(std::fabs(got - acc[n]), fb + kBf16U * (std::fabs(acc[n]) + fb),
                "token " + std::to_string(t) + " h " + std::to_string(n));
      if (mag[n] == 0) r[5].exact(out.output_bf16[t * H + n] == 0, "token without local slots: output not +0");
    }
  }
  return r;
}

inline const char* stage_name(size_t i) {
  static const char* names[] = {"act quant", "gemm1", "silu*up", "h quant", "gemm2", "finalize"};
  return names[i];
}

// Routing against the float64 reference: ids equal except at near-ties, weights within bound.
inline StageReport check_routing(const SmallLayer& L, const BackendOutput& out, int64_t* skipped) {
  const MoeConfig& c = L.config;
  const int64_t k = c.top_k;
  const Routing ref = route(c, L.logits.data(), L.bias.empty() ? nullptr : L.bias.data(), L.tokens);
  StageReport rep;
  *skipped = 0;
  for (int64_t t = 0; t < L.tokens; ++t) {
    const bool near_tie = ref.margin[t] <= 1e-5 * ref.margin_scale[t] || ref.group_margin[t] <= 1e-5 * ref.group_margin_scale[t];
    if (near_tie) {
      ++*skipped;
      continue;
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      rep.exact(out.topk_ids[s] == ref.ids[s], "token " + std::to_string(t) + " slot " + std::to_string(j) + " id");
      const double w = ref.weights[s];
      const double bound = (k + 8) * kU * std::fabs(w) + (c.routing_weight_dtype == Precision::bf16 ? kBf16U * std::fabs(w) : 0);
      rep.note(std::fabs(double(out.topk_weights[s]) - w), bound, "token " + std::to_string(t) + " slot " + std::to_string(j) + " weight");
    }
  }
  return rep;
}

}  // namespace moecheck::testing
