// Dequantization of FP8 block-scale weight panels for the reference's GEMMs: a few rows of an
// [N, K] e4m3 weight with [ceil(N/B), ceil(K/B)] fp32 scales, decoded to double (and, for the
// budgets, their magnitudes and the float operands of the truncation bound's fast path).
//
// Exactness: decode(q) has 4 significant bits and the scale 24, so decode(q) * scale is exact in
// double; |w| is exact too. The float operands are the codes' values without the scale, exact in
// float: dec = decode(q), mag = dec != 0 ? |dec| : NaN (truncation_bound.hpp: NaN marks a
// product known to be zero) and the alignment magnitude maga = dec != 0 ? max(|dec|, 2^-6) : NaN
// (an e4m3 subnormal code aligns as 2^-6, truncation_bound.hpp; NaN codes stay NaN). The NaN codes (S.1111.111) decode to NaN, which the callers' checks
// then see. Every form (the portable table lookup, the AVX2 arithmetic decode) produces the same
// values (NaN payloads aside); tests/weight_panel_test.cpp checks all 256 codes.
#pragma once

#include <cstdint>
#include <vector>

namespace moecheck {

// Destinations of one panel, each [nr, K] row-major; null pointers are skipped (wabs, dec with
// mag together, and maga with them, are optional).
struct WeightPanelOut {
  double* w = nullptr;
  double* wabs = nullptr;
  float* dec = nullptr;
  float* mag = nullptr;
  float* maga = nullptr;
};

// Rows [r0, r0 + nr) of the weight, all in one block row (r0 / B == (r0 + nr - 1) / B).
// lut is scratch (per block column tables).
void dequant_panel(const uint8_t* codes, const float* scales, int64_t K, int64_t B, int64_t r0, int64_t nr,
                   const WeightPanelOut& out, std::vector<double>& lut);

}  // namespace moecheck
