// FP8 weight panels decoded for the reference's GEMMs (contract: weight_panel.hpp).
#include "reference/weight_panel.hpp"

#include <algorithm>
#include <cmath>

#include "reference/fp8_quant.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/truncation_pair.hpp"
#if defined(__AVX2__)
#define MOECHECK_PANEL_AVX2 1
#include <immintrin.h>
#endif

namespace moecheck {

namespace {

using truncation_pair::kSubnormalAlign;

#ifdef MOECHECK_PANEL_AVX2
// Eight e4m3 codes to float, by arithmetic instead of a table: the magnitude bits placed at the
// top of a float's mantissa (m << 20, exponent field e) read as 2^(e-127) (1 + m/8) for e > 0 and
// as m 2^-129 for e = 0; times 2^120 (exact) that is the e4m3 value 2^(e-7) (1 + m/8), or the
// subnormal m 2^-9. The sign bit goes to bit 31; S.1111.111 becomes NaN.
inline __m256 decode8(const uint8_t* q) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
  const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), _mm256_set1_ps(0x1p120f));
  const __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F)));  // all ones: a NaN
  return _mm256_or_ps(_mm256_or_ps(f, nan), _mm256_castsi256_ps(sign));
}

// One row segment [k0, k1) of a block column with scale s, eight codes at a time (the tail by
// the tables).
void segment_avx2(const uint8_t* q, int64_t k0, int64_t k1, float s, double* o, double* oa, float* dec, float* mag,
                  float* maga, const double* l, const float* lf) {
  const __m256d sd = _mm256_set1_pd(double(s));
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 nan = _mm256_set1_ps(NAN), sub = _mm256_set1_ps(kSubnormalAlign);
  int64_t k = k0;
  for (; k + 8 <= k1; k += 8) {
    const __m256 d = decode8(q + k);
    const __m256d w0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(d)), sd);
    const __m256d w1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(d, 1)), sd);
    _mm256_storeu_pd(o + k, w0);
    _mm256_storeu_pd(o + k + 4, w1);
    if (oa) {
      const __m256d sign = _mm256_set1_pd(-0.0);
      _mm256_storeu_pd(oa + k, _mm256_andnot_pd(sign, w0));
      _mm256_storeu_pd(oa + k + 4, _mm256_andnot_pd(sign, w1));
    }
    if (dec) {
      _mm256_storeu_ps(dec + k, d);
      // |dec|, NaN where dec is zero (and where it is NaN already)
      const __m256 a = _mm256_and_ps(d, absmask), zero = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_EQ_OQ);
      _mm256_storeu_ps(mag + k, _mm256_blendv_ps(a, nan, zero));
      // max(2^-6, a) takes its second operand where one is NaN: a NaN code's |dec| stays
      if (maga) _mm256_storeu_ps(maga + k, _mm256_blendv_ps(_mm256_max_ps(sub, a), nan, zero));
    }
  }
  for (; k < k1; ++k) {
    o[k] = l[q[k]];
    if (oa) oa[k] = l[256 + q[k]];
    if (dec) dec[k] = lf[q[k]], mag[k] = lf[256 + q[k]];
    if (maga) maga[k] = lf[512 + q[k]];
  }
}
#endif

}  // namespace

void dequant_panel(const uint8_t* codes, const float* scales, int64_t K, int64_t B, int64_t r0, int64_t nr,
                   const WeightPanelOut& out, std::vector<double>& lut) {
  const int64_t kb = ceil_div(K, B);
  const float* table = fp8_table(Fp8Format::e4m3fn);
  const float* srow = scales + (r0 / B) * kb;
  // The tables: per block column the 256 values decode(q) * s, then their magnitudes. The AVX2
  // form needs them only for segments whose length is not a multiple of 8, so it builds them only
  // when some block column is such a segment.
#ifdef MOECHECK_PANEL_AVX2
  const bool tables = B % 8 != 0 || K % 8 != 0;
#else
  const bool tables = true;
#endif
  lut.resize(static_cast<size_t>(kb) * 512);
  for (int64_t c = 0; tables && c < kb; ++c) {
    const double s = srow[c];
    for (int i = 0; i < 256; ++i) lut[c * 512 + i] = double(table[i]) * s, lut[c * 512 + 256 + i] = std::fabs(lut[c * 512 + i]);
  }
  float ftab[768];  // dec, then mag, then maga, per code
  for (int i = 0; i < 256; ++i) ftab[i] = table[i], ftab[256 + i] = truncation_pair::weight_mag(table[i]),
                              ftab[512 + i] = truncation_pair::weight_maga(table[i]);
  for (int64_t r = 0; r < nr; ++r) {
    const uint8_t* q = codes + (r0 + r) * K;
    double* o = out.w + r * K;
    double* oa = out.wabs ? out.wabs + r * K : nullptr;
    float* dec = out.dec ? out.dec + r * K : nullptr;
    float* mag = out.dec ? out.mag + r * K : nullptr;
    float* maga = out.dec && out.maga ? out.maga + r * K : nullptr;
    for (int64_t c = 0; c < kb; ++c) {
      const double* l = lut.data() + c * 512;
      const int64_t k0 = c * B, k1 = std::min(K, (c + 1) * B);
#ifdef MOECHECK_PANEL_AVX2
      segment_avx2(q, k0, k1, srow[c], o, oa, dec, mag, maga, l, ftab);
#else
      for (int64_t k = k0; k < k1; ++k) {
        o[k] = l[q[k]];
        if (oa) oa[k] = l[256 + q[k]];
        if (dec) dec[k] = ftab[q[k]], mag[k] = ftab[256 + q[k]];
        if (maga) maga[k] = ftab[512 + q[k]];
      }
#endif
    }
  }
}

}  // namespace moecheck
