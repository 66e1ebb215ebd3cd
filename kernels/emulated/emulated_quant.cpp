// Number formats and group quantization of the emulated backend (DEVICE-ALGORITHM.md §2, §4):
// the float32 scale rule and the exact e4m3 decode written here; the correctly rounded e4m3 and
// UE8M0 encoders come from reference/fp8_formats.hpp (exhaustively tested there).
#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/emulated/emulated_internal.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck::emulated {

void decode_e4m3(const uint8_t* codes, int64_t n, float* out) {
  // An e4m3fn magnitude code EEEE.MMM with E > 0 is (1 + M/8) 2^(E-7): placed at float bits
  // 20..26 and rebiased by +120 in the exponent field it is that float, by integer arithmetic
  // alone. E = 0 codes are M 2^-9 (exact float conversion and product). No float subnormal is
  // ever an operand: x86 cores without fast denormal hardware would take a microcode assist on
  // each. Code 0x7F is NaN in e4m3fn; the sign bit moves from bit 7 to bit 31.
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t c = codes[i];
    const uint32_t mag = c & 0x7Fu;
    uint32_t bits = mag >= 8u ? (mag << 20) + (120u << 23) : std::bit_cast<uint32_t>(static_cast<float>(mag) * 0x1p-9f);
    bits = mag == 0x7Fu ? 0x7FC0'0000u : bits;
    out[i] = std::bit_cast<float>(bits | ((c & 0x80u) << 24));
  }
}

float group_scale_f32(float amax, const QuantRule& r, float* quant_scale) {
  float s;
  if (r.no_eps || r.no_floor) {
    // faulty zero_group_nan: docs/BUG-CLASSES.md #1/#2 (no amax floor: an all-zero group gets s = 0);
    // also the recipe act_scale_floor = none, whose zero groups quantize_row guards.
    s = amax / 448.0f;
  } else {
    // fl32(max(amax, eps) / 448): for amax >= eps the float32 division is that one rounding;
    // below eps the quotient is the constant eps / 448, rounded once to float32.
    s = static_cast<double>(amax) >= r.eps ? amax / 448.0f : static_cast<float>(r.eps / 448.0);
  }
  float sq = s;
  // ue8m0: the smallest power of two >= s (>= 2^-127; a zero scale of the fault stays 0).
  if (r.format == ScaleFormat::ue8m0 && s != 0.0f) sq = static_cast<float>(ue8m0_decode(ue8m0_encode_ceil(s)));
  *quant_scale = sq;
  // faulty ue8m0_mismatch: docs/BUG-CLASSES.md #9 (quantized with the ue8m0 scale, dequantized with fp32)
  return r.ue8m0_mismatch ? s : sq;
}

void quantize_row(const float* x, int64_t n, int64_t g, const QuantRule& r, uint8_t* codes, float* scales) {
  for (int64_t k0 = 0, b = 0; k0 < n; k0 += g, ++b) {
    const int64_t k1 = std::min(n, k0 + g);
    float amax = 0.0f;
    for (int64_t i = k0; i < k1; ++i) amax = std::max(amax, std::fabs(x[i]));
    float qs;
    scales[b] = group_scale_f32(amax, r, &qs);
    if (qs == 0.0f && !r.no_eps) {
      // Recipe act_scale_floor = none: a zero scale codes the group as 0 (the reference's rule,
      // reference/fp8_quant.hpp), where the fault divides 0 / 0.
      std::fill(codes + k0, codes + k1, uint8_t(0));
    } else if (r.reciprocal) {
      // Recipe quant_divide = reciprocal: q = e4m3_satfinite(fl32(x * fl32(1 / s))).
      const float inv = 1.0f / qs;
      for (int64_t i = k0; i < k1; ++i) codes[i] = e4m3_encode_satfinite(x[i] * inv);
    } else {
      // q = e4m3_satfinite(x / s): a float32 division, then RNE to e4m3.
      for (int64_t i = k0; i < k1; ++i) codes[i] = e4m3_encode_satfinite(x[i] / qs);
    }
  }
}

}  // namespace moecheck::emulated
