// FP8 weight panels decoded for the reference's GEMMs (contract: weight_panel.hpp).
#include "reference/weight_panel.hpp"

#include <cmath>

#include "reference/fp8_quant.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/truncation_bound.hpp"
#if defined(__AVX2__)
#define MOECHECK_PANEL_AVX2 1
#include <immintrin.h>
#endif

namespace moecheck {

namespace {

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

// Eight 64-bit compare masks (two vectors of four) as eight 32-bit masks, in order.
inline __m256i narrow_masks(__m256d lo, __m256d hi) {
  const __m256 pairs = _mm256_shuffle_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi), _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_si256(_mm256_permute4x64_pd(_mm256_castps_pd(pairs), _MM_SHUFFLE(3, 1, 2, 0)));
}

// One row segment [k0, k1) of a block column with scale s, eight codes at a time (the tail by
// the table). float(|w|) is computed as the float product |decode(q)| * s: the exact product
// rounded once, the same float as rounding the exact double |w|; the step to the neighbour
// pattern follows from comparing it back in double (truncation_bound.cpp's f32_up, f32_down).
void segment_avx2(const uint8_t* q, int64_t k0, int64_t k1, float s, double* o, double* oa, float* wu, float* wc,
                  const double* l, const float* lf) {
  const __m256d sd = _mm256_set1_pd(double(s));
  const __m256 sf = _mm256_set1_ps(s);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const bool s_dead = !(std::fabs(s) > 0);  // zero or NaN scale: every |w| is "zero" for wc
  int64_t k = k0;
  for (; k + 8 <= k1; k += 8) {
    const __m256 dec = decode8(q + k);
    const __m256d w0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(dec)), sd);
    const __m256d w1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(dec, 1)), sd);
    _mm256_storeu_pd(o + k, w0);
    _mm256_storeu_pd(o + k + 4, w1);
    if (!oa) continue;
    const __m256d sign = _mm256_set1_pd(-0.0);
    const __m256d a0 = _mm256_andnot_pd(sign, w0), a1 = _mm256_andnot_pd(sign, w1);
    _mm256_storeu_pd(oa + k, a0);
    _mm256_storeu_pd(oa + k + 4, a1);
    if (!wu) continue;
    const __m256 adec = _mm256_and_ps(dec, absmask);
    const __m256 f = _mm256_and_ps(_mm256_mul_ps(adec, sf), absmask);  // round(|w|)
    const __m256d b0 = _mm256_cvtps_pd(_mm256_castps256_ps128(f)), b1 = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
    const __m256i below = narrow_masks(_mm256_cmp_pd(b0, a0, _CMP_LT_OQ), _mm256_cmp_pd(b1, a1, _CMP_LT_OQ));
    const __m256i above = narrow_masks(_mm256_cmp_pd(b0, a0, _CMP_GT_OQ), _mm256_cmp_pd(b1, a1, _CMP_GT_OQ));
    const __m256i fb = _mm256_castps_si256(f);
    _mm256_storeu_ps(wu + k, _mm256_castsi256_ps(_mm256_sub_epi32(fb, below)));  // a true mask is -1
    const __m256 down = _mm256_castsi256_ps(_mm256_add_epi32(fb, above));
    // |w| > 0 fails for a zero (or NaN) code or scale: +inf there, as truncation_weight_f32 does.
    const __m256 dead = s_dead ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : _mm256_cmp_ps(adec, _mm256_setzero_ps(), _CMP_NGT_UQ);
    _mm256_storeu_ps(wc + k, _mm256_blendv_ps(down, inf, dead));
  }
  for (; k < k1; ++k) {
    o[k] = l[q[k]];
    if (oa) oa[k] = l[256 + q[k]];
    if (wu) wu[k] = lf[q[k]], wc[k] = lf[256 + q[k]];
  }
}
#endif

}  // namespace

void dequant_panel(const uint8_t* codes, const float* scales, int64_t K, int64_t B, int64_t r0, int64_t nr,
                   const WeightPanelOut& out, std::vector<double>& lut, std::vector<float>& flut) {
  const int64_t kb = ceil_div(K, B);
  const float* table = fp8_table(Fp8Format::e4m3fn);
  const float* srow = scales + (r0 / B) * kb;
  const bool f32 = out.wu != nullptr;
  // The tables: per block column the 256 values decode(q) * s, then their magnitudes; the float
  // operands likewise. The AVX2 form uses them only for a row's tail (K not a multiple of 8).
  lut.resize(static_cast<size_t>(kb) * 512);
  if (f32) flut.resize(lut.size());
  for (int64_t c = 0; c < kb; ++c) {
    const double s = srow[c];
    for (int i = 0; i < 256; ++i) lut[c * 512 + i] = double(table[i]) * s, lut[c * 512 + 256 + i] = std::fabs(lut[c * 512 + i]);
    if (f32)
      for (int i = 0; i < 256; ++i) truncation_weight_f32(lut[c * 512 + 256 + i], &flut[c * 512 + i], &flut[c * 512 + 256 + i]);
  }
  for (int64_t r = 0; r < nr; ++r) {
    const uint8_t* q = codes + (r0 + r) * K;
    double* o = out.w + r * K;
    double* oa = out.wabs ? out.wabs + r * K : nullptr;
    float* wu = f32 ? out.wu + r * K : nullptr;
    float* wc = f32 ? out.wc + r * K : nullptr;
    for (int64_t c = 0; c < kb; ++c) {
      const double* l = lut.data() + c * 512;
      const float* lf = f32 ? flut.data() + c * 512 : nullptr;
      const int64_t k0 = c * B, k1 = std::min(K, (c + 1) * B);
#ifdef MOECHECK_PANEL_AVX2
      segment_avx2(q, k0, k1, srow[c], o, oa, wu, wc, l, lf);
#else
      for (int64_t k = k0; k < k1; ++k) {
        o[k] = l[q[k]];
        if (oa) oa[k] = l[256 + q[k]];
        if (wu) wu[k] = lf[q[k]], wc[k] = lf[256 + q[k]];
      }
#endif
    }
  }
}

}  // namespace moecheck
