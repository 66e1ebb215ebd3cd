// FP8 quantization recipes (contract, rounding steps and sources: fp8_quant.hpp).
//
// Where rounding happens, and why each line computes exactly what the header says:
//  - amax is a max of |x| over floats: exact. A NaN anywhere in the group makes amax NaN (it is
//    propagated, not skipped), so the scale and the whole group come out NaN instead of hiding it.
//  - s = fl32(max(amax, eps) / 448) is computed as fl32(fl64(max(amax, eps) / 448)). That is the
//    once-rounded quotient: (a) when amax wins, amax and 448 are floats, and for floats a, b
//    fl32(fl64(a / b)) equals the correctly rounded float division because double has
//    53 >= 2*24 + 2 bits (the double-rounding theorem for +-*/ and sqrt); (b) when eps (a double)
//    wins, fl64 cannot move the quotient q = eps/448 across a float rounding midpoint m: m has
//    <= 25 significant bits, so 448 m is a multiple of ulp(eps) and, unless q = m (then fl64 is
//    exact), |eps - 448 m| >= ulp(eps) >= 2^8 ulp(q) (448 >= 2^8), i.e. |q - m| >= 2^8 ulp(q) / 448
//    > ulp(q) / 2: round-to-nearest keeps fl64(q) on the same side of m as q.
//  - An infinite amax gives s = inf (f32: codes 0x00 or NaN) or 2^127 (ue8m0): non-finite input
//    stays visible downstream.
//  - ue8m0: s = 2^ceil(log2(that fp32 quotient)), exact powers of two, exponent clamped to
//    [-127, 127] (ue8m0_encode_ceil).
//  - q = e4m3_satfinite(fl32(x / s)): the float division x / s is IEEE correctly rounded, i.e.
//    fl32 of the exact quotient (equivalently fl32(double(x) / double(s)) by the theorem above).
//  - dequantization decode(q) * s is exact in double (4-bit times 24-bit significands).
#include "reference/fp8_quant.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "reference/fp8_formats.hpp"

namespace moecheck {

namespace {

constexpr double kE4m3Max = 448.0;

// amax of n floats with stride; NaN-propagating.
float abs_max(const float* x, int64_t n, int64_t stride = 1) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i * stride]);
    if (std::isnan(a)) return std::numeric_limits<float>::quiet_NaN();
    if (a > m) m = a;
  }
  return m;
}

void check_eps(double eps) {
  // eps must keep every scale finite and > 0: fl32(eps / 448) must not underflow to zero.
  if (!(eps > 0.0) || !std::isfinite(eps) || static_cast<float>(eps / kE4m3Max) == 0.0f)
    throw std::invalid_argument("fp8 quantization: eps must be finite and >= 448 * 2^-149 (got " +
                                std::to_string(eps) + ")");
}

void check_shape(int64_t rows, int64_t cols, int64_t group, const char* what) {
  if (rows < 0 || cols < 0 || group <= 0)
    throw std::invalid_argument(std::string(what) + ": need rows >= 0, cols >= 0, group/block > 0 (got " +
                                std::to_string(rows) + ", " + std::to_string(cols) + ", " + std::to_string(group) + ")");
}

// Codes of n elements with one scale: q = e4m3_satfinite(fl32(x / s)).
void quantize_span(const float* x, int64_t n, float s, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) codes[i] = e4m3_encode_satfinite(x[i] / s);
}

// The recipe's form (fp8_quant.hpp): a zero scale gives zero codes; reciprocal multiplies by
// fl32(1/s) (the float product x * r is exact in double, fl32 rounds it once).
void quantize_span(const float* x, int64_t n, float s, QuantDivide d, uint8_t* codes) {
  if (s == 0.0f) {
    std::fill_n(codes, n, uint8_t(0));
  } else if (d == QuantDivide::divide) {
    quantize_span(x, n, s, codes);
  } else {
    const float r = fl32(1.0 / double(s));
    for (int64_t i = 0; i < n; ++i) codes[i] = e4m3_encode_satfinite(fl32(double(x[i]) * double(r)));
  }
}

}  // namespace

void quantize_with_scale(const float* x, int64_t n, float s, QuantDivide d, uint8_t* codes) {
  quantize_span(x, n, s, d, codes);
}

float group_scale(float amax, ScaleFormat fmt, double eps) {
  check_eps(eps);
  const double floored = std::isnan(amax) ? static_cast<double>(amax) : std::max(static_cast<double>(amax), eps);
  const float s = fl32(floored / kE4m3Max);  // one rounding of the exact quotient (file comment)
  if (fmt == ScaleFormat::f32) return s;
  return static_cast<float>(ue8m0_decode(ue8m0_encode_ceil(s)));
}

ActQuantRule act_quant_rule(const MoeConfig& c) {
  return {c.scale_format, c.act_eps, c.recipe.act_scale_floor, c.recipe.quant_divide};
}

float group_scale(float amax, const ActQuantRule& r) {
  if (r.floor == ActScaleFloor::eps) return group_scale(amax, r.format, r.eps);
  const float s = fl32(static_cast<double>(amax) / kE4m3Max);  // floats: one correct rounding
  if (r.format == ScaleFormat::f32 || s == 0.0f || std::isnan(s)) return s;
  return static_cast<float>(ue8m0_decode(ue8m0_encode_ceil(s)));
}

void group_quantize_row(const float* x, int64_t cols, int64_t group, const ActQuantRule& r, uint8_t* codes,
                        float* scales) {
  check_shape(1, cols, group, "group_quantize_row");
  if (r.floor == ActScaleFloor::eps) check_eps(r.eps);
  for (int64_t g = 0, c0 = 0; c0 < cols; ++g, c0 += group) {
    const int64_t n = std::min(group, cols - c0);
    scales[g] = group_scale(abs_max(x + c0, n), r);
    quantize_span(x + c0, n, scales[g], r.divide, codes + c0);
  }
}

GroupQuantized group_quantize(const float* x, int64_t rows, int64_t cols, int64_t group, const ActQuantRule& r) {
  check_shape(rows, cols, group, "group_quantize");
  GroupQuantized out;
  out.rows = rows, out.cols = cols, out.group = group;
  out.codes.resize(static_cast<size_t>(rows * cols));
  out.scales.resize(static_cast<size_t>(rows * out.groups()));
  for (int64_t row = 0; row < rows; ++row)
    group_quantize_row(x + row * cols, cols, group, r, out.codes.data() + row * cols,
                       out.scales.data() + row * out.groups());
  return out;
}

void group_quantize_row(const float* x, int64_t cols, int64_t group, ScaleFormat fmt, double eps, uint8_t* codes,
                        float* scales) {
  check_eps(eps);
  group_quantize_row(x, cols, group, ActQuantRule{fmt, eps}, codes, scales);
}

GroupQuantized group_quantize(const float* x, int64_t rows, int64_t cols, int64_t group, ScaleFormat fmt,
                              double eps, ScaleLayout layout) {
  check_shape(rows, cols, group, "group_quantize");
  check_eps(eps);
  GroupQuantized out = group_quantize(x, rows, cols, group, ActQuantRule{fmt, eps});
  if (layout == ScaleLayout::transposed) out.scales = transpose_scales(out.scales, rows, out.groups(), ScaleLayout::row_major);
  out.layout = layout;
  return out;
}

std::vector<float> transpose_scales(const std::vector<float>& s, int64_t rows, int64_t groups, ScaleLayout from) {
  if (rows < 0 || groups < 0 || static_cast<int64_t>(s.size()) != rows * groups)
    throw std::invalid_argument("transpose_scales: scale count " + std::to_string(s.size()) + " != rows * groups (" +
                                std::to_string(rows) + " * " + std::to_string(groups) + ")");
  std::vector<float> out(s.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t rm = r * groups + g, tr = g * rows + r;
      if (from == ScaleLayout::row_major)
        out[static_cast<size_t>(tr)] = s[static_cast<size_t>(rm)];
      else
        out[static_cast<size_t>(rm)] = s[static_cast<size_t>(tr)];
    }
  return out;
}

BlockQuantized block_quantize(const float* w, int64_t rows, int64_t cols, int64_t block, ScaleFormat fmt,
                              double eps) {
  check_shape(rows, cols, block, "block_quantize");
  check_eps(eps);
  BlockQuantized out;
  out.rows = rows;
  out.cols = cols;
  out.block = block;
  const int64_t br = out.block_rows(), bc = out.block_cols();
  out.codes.resize(static_cast<size_t>(rows * cols));
  out.scales.resize(static_cast<size_t>(br * bc));
  for (int64_t i = 0; i < br; ++i) {
    const int64_t r0 = i * block, nr = std::min(block, rows - r0);
    for (int64_t j = 0; j < bc; ++j) {
      const int64_t c0 = j * block, nc = std::min(block, cols - c0);  // ragged edges: real elements only
      float amax = 0.0f;
      for (int64_t r = r0; r < r0 + nr; ++r) {
        const float m = abs_max(w + r * cols + c0, nc);
        if (std::isnan(m) || m > amax) amax = m;
        if (std::isnan(amax)) break;
      }
      const float s = group_scale(amax, fmt, eps);
      out.scales[static_cast<size_t>(i * bc + j)] = s;
      for (int64_t r = r0; r < r0 + nr; ++r) quantize_span(w + r * cols + c0, nc, s, out.codes.data() + r * cols + c0);
    }
  }
  return out;
}

void block_dequantize(const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t block,
                      double* out) {
  check_shape(rows, cols, block, "block_dequantize");
  const float* table = fp8_table(Fp8Format::e4m3fn);
  const int64_t bc = ceil_div(cols, block);
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scales + (r / block) * bc;
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = static_cast<double>(table[codes[r * cols + c]]) * static_cast<double>(srow[c / block]);
  }
}

}  // namespace moecheck
