// The float path's x86 kernels (contract: truncation_kernels.hpp, truncation_bound.hpp).
#include "reference/truncation_kernels.hpp"

#include <algorithm>
#include <cmath>

#if defined(__AVX2__) && defined(__FMA__)
#define MOECHECK_TRUNC_AVX2 1
#include <immintrin.h>
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define MOECHECK_TRUNC_AVX512 1
#endif
#endif

namespace moecheck::truncation_detail {

#ifdef MOECHECK_TRUNC_AVX2
namespace {
// Horizontal reductions of four 8-lane vectors (one per weight row) to one 4-lane vector.
inline __m128 hmax4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m128 a4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 b4 = _mm_max_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  __m128 c4 = _mm_max_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
  __m128 d4 = _mm_max_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
  _MM_TRANSPOSE4_PS(a4, b4, c4, d4);
  return _mm_max_ps(_mm_max_ps(a4, b4), _mm_max_ps(c4, d4));
}
// Three roundings per term: the halves, then two horizontal adds.
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  const __m128 c4 = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
  const __m128 d4 = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
  return _mm_hadd_ps(_mm_hadd_ps(a4, b4), _mm_hadd_ps(c4, d4));
}
inline __m128i hsum4i(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// All four lanes finite (x - x is 0 exactly for finite x, NaN otherwise).
inline bool all_finite4(__m256d x) {
  return _mm256_movemask_pd(_mm256_cmp_pd(_mm256_sub_pd(x, x), _mm256_setzero_pd(), _CMP_EQ_OQ)) == 0xF;
}

constexpr int kMaxBlockChunks = 8;  // blocks of up to 256 = 8 chunks of 32 take the AVX2 kernel

// The scale of one K block as the kernel uses it.
struct BlockScale {
  __m256d s, abs_s;  // s, |s|
  __m256d thr_mul;   // 256 (1 + 2^-22) / |s|: thresholds in units of dec
  __m256d sum_abs;   // 2^-134 |s|
  __m256d bmax[2];   // |s| max |dec| over the block, per weight row (the drift D), per quad of the call
};

// One input row's operands in a block: float rows af, hf, lf and the deviation sums dcum.
struct RowPtrs {
  const float* af;
  const float* hf;
  const float* lf;
  const double* dc;
  const float* in;  // the magnitude product's input, rounded up (nullptr: none)
  // The noise model's per-term losses (RowCodes): the row's code and field, and the block's scale
  // product |s| s_a (0: the whole-step model for this row and block).
  const float* code;
  const float* field;
  double cs;
  bool known;  // every code of the block known: no unknown-term fallback to test
};

// The block kernel's per-chunk quantities, per input row r and chunk j of the block (four weight
// rows per __m256d; thr and gvf per weight row as float).
template <int NR>
struct BlockChunks {
  __m256d mh[NR][kMaxBlockChunks], P[NR][kMaxBlockChunks], Q[NR][kMaxBlockChunks], nlow[NR][kMaxBlockChunks];
  alignas(16) float thr[NR][kMaxBlockChunks][4];
  // Per-term losses (RowCodes): the chunks' largest alignment powers (code units), variance grids
  // (code units, float, and value units) and loss sums.
  __m256d mf[NR][kMaxBlockChunks], loss[NR][kMaxBlockChunks], U[NR][kMaxBlockChunks];
  alignas(16) float gvf[NR][kMaxBlockChunks][4];
  __m256d absum[NR];
  bool exact[NR];
};

#ifdef MOECHECK_TRUNC_AVX512
// GCC 12 spells _mm512_undefined_ps as a self-initialised variable, which -Wmaybe-uninitialized
// reports in every intrinsic that uses it (broadcast, shuffle, extract): not a defect here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The AVX-512 form of steps 1 and 4 for two input rows whose codes are used: row 0 in the low
// 256-bit half of each register, row 1 in the high half, the weights broadcast to both. Each half
// performs exactly the AVX2 form's lane operations on the same operands in the same order (no
// operation is contracted or reassociated; the horizontal reductions keep the AVX2 trees), so
// the results are the AVX2 form's bit for bit (tests/truncation_bound_test.cpp checks it).
inline __m512 pair_load(const float* r0, const float* r1) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(r0)), _mm256_loadu_ps(r1), 1);
}
inline __m512 pair_set(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }
inline __m512 both_halves(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
// The two forms of the pair kernels. Row pair (WP false): rows[0] in the low half, rows[1] in the
// high half, one quad of weight rows w[0..3] in both. Weight pair (WP true): one input row in
// both halves (rows[0] = rows[1]), the quad w[0..3] in the low half and a second quad w[4..7] in
// the high one, so that a row left over from the pairs still fills the register. Either way each
// half sees one (row, quad) and performs the AVX2 form's lane operations on it.
template <bool WP>
inline __m512 row_operand(const float* r0, const float* r1) {
  return WP ? both_halves(r0) : pair_load(r0, r1);
}
template <bool WP>
inline __m512 weight_operand(const float* const* w, int q, int64_t k) {
  return WP ? pair_load(w[q] + k, w[4 + q] + k) : both_halves(w[q] + k);
}
// hsum4 / hmax4 / hsum4i on both halves: per half its two 128-bit lanes combined, then two
// pairwise steps ([x0 + x1, x2 + x3, y0 + y1, y2 + y3] per 128-bit lane, as _mm_hadd_ps). Row 0's
// four results end in 128-bit lane 0, row 1's in lane 2.
inline __m512 fold(__m512 x) { return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)); }
inline __m512 evens(__m512 x, __m512 y) { return _mm512_shuffle_ps(x, y, 0x88); }
inline __m512 odds(__m512 x, __m512 y) { return _mm512_shuffle_ps(x, y, 0xDD); }
template <class Op>
inline __m512 combine4_pair(const __m512* v, Op op) {
  __m512 a[4];
  for (int q = 0; q < 4; ++q) a[q] = op(v[q], fold(v[q]));
  const __m512 ab = op(evens(a[0], a[1]), odds(a[0], a[1]));
  const __m512 cd = op(evens(a[2], a[3]), odds(a[2], a[3]));
  return op(evens(ab, cd), odds(ab, cd));
}
inline __m512 hsum4_pair(const __m512* v) {
  return combine4_pair(v, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
}
inline __m512 hmax4_pair(const __m512* v) {
  return combine4_pair(v, [](__m512 x, __m512 y) { return _mm512_max_ps(x, y); });
}
inline __m512i hsum4i_pair(const __m512i* v) {  // integer counts: any order is exact
  __m512 a[4];
  for (int q = 0; q < 4; ++q) {
    const __m512 x = _mm512_castsi512_ps(v[q]);
    a[q] = _mm512_castsi512_ps(_mm512_add_epi32(v[q], _mm512_castps_si512(fold(x))));
  }
  auto step = [](__m512 x, __m512 y) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(evens(x, y)), _mm512_castps_si512(odds(x, y))));
  };
  return _mm512_castps_si512(step(step(a[0], a[1]), step(a[2], a[3])));
}
inline __m128 half_of(__m512 x, int r) { return r ? _mm512_extractf32x4_ps(x, 2) : _mm512_castps512_ps128(x); }
inline __m128i half_of(__m512i x, int r) {
  return r ? _mm512_extracti32x4_epi32(x, 2) : _mm512_castsi512_si128(x);
}

// Step 1, two rows with codes (chunk_pass with exact rows), or one row and two quads (WP).
template <bool WP>
inline void chunk_pass_pair(BlockChunks<2>& st, int nch, int64_t k0, const RowPtrs* rows, const float* const* dec,
                            const float* const* maga, const BlockScale& bs, bool with_abs) {
  const __m256d mrel = _mm256_set1_pd(kMaxRel), mabs = _mm256_set1_pd(kAbs);
  const __m512 fexp = _mm512_castsi512_ps(_mm512_set1_epi32(int32_t(0xFF800000u)));
  const __m512 fabsmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512 zero = _mm512_setzero_ps();
  for (int j = 0; j < nch; ++j) {
    const int64_t k = k0 + 32 * j;
    __m512 mx[4], dt[4], ab[4], fm[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t ki = k + 8 * i;
      const __m512 h = row_operand<WP>(rows[0].hf + ki, rows[1].hf + ki);
      const __m512 x = row_operand<WP>(rows[0].af + ki, rows[1].af + ki);
      const __m512 f = row_operand<WP>(rows[0].field + ki, rows[1].field + ki);
      const __m512 y = with_abs ? row_operand<WP>(rows[0].in + ki, rows[1].in + ki) : zero;
      for (int q = 0; q < 4; ++q) {
        const __m512 u = weight_operand<WP>(maga, q, ki), v = weight_operand<WP>(dec, q, ki);
        const __m512 fw = _mm512_maskz_and_ps(_mm512_cmp_ps_mask(u, u, _CMP_ORD_Q), u, fexp);
        const __m512 hu = _mm512_mul_ps(h, u), ff = _mm512_mul_ps(f, fw), av = _mm512_and_ps(v, fabsmask);
        if (i == 0) {
          mx[q] = _mm512_max_ps(hu, zero), dt[q] = _mm512_mul_ps(x, v), fm[q] = _mm512_max_ps(ff, zero);
          if (with_abs) ab[q] = _mm512_mul_ps(y, av);
        } else {
          mx[q] = _mm512_max_ps(hu, mx[q]), dt[q] = _mm512_fmadd_ps(x, v, dt[q]), fm[q] = _mm512_max_ps(ff, fm[q]);
          if (with_abs) ab[q] = _mm512_fmadd_ps(y, av, ab[q]);
        }
      }
    }
    const __m512 mxs = hmax4_pair(mx), dts = hsum4_pair(dt), fms = hmax4_pair(fm);
    const __m512 abs = with_abs ? hsum4_pair(ab) : zero;
    for (int r = 0; r < 2; ++r) {
      if (with_abs) st.absum[r] = _mm256_add_pd(st.absum[r], _mm256_cvtps_pd(half_of(abs, r)));
      st.mf[r][j] = _mm256_cvtps_pd(half_of(fms, r));
      st.mh[r][j] = _mm256_mul_pd(bs.abs_s, _mm256_fmadd_pd(_mm256_cvtps_pd(half_of(mxs, r)), mrel, mabs));
      st.Q[r][j] = _mm256_mul_pd(bs.s, _mm256_cvtps_pd(half_of(dts, r)));
    }
  }
}

// Step 4, two rows with codes (count_pass with exact rows): a row whose block has unknown codes
// takes the unknown-term form in its half.
template <bool WP>
inline void count_pass_pair(BlockChunks<2>& st, int nch, int64_t k0, const RowPtrs* rows, const float* const* dec,
                            const float* const* mag) {
  const __m512 fabsmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  const __m512i one = _mm512_set1_epi32(1);
  const __mmask16 unknown = __mmask16((rows[0].known ? 0 : 0x00FF) | (rows[1].known ? 0 : 0xFF00));
  for (int j = 0; j < nch; ++j) {
    const int64_t k = k0 + 32 * j;
    __m512 t[4], g[4], gi[4], g3[4];
    for (int q = 0; q < 4; ++q) {
      const float a = st.gvf[0][j][q], b = st.gvf[1][j][q];
      t[q] = pair_set(st.thr[0][j][q], st.thr[1][j][q]);
      g[q] = pair_set(a, b), gi[q] = pair_set(a > 0 ? 1 / a : 0.0f, b > 0 ? 1 / b : 0.0f);
      g3[q] = pair_set(a * a / 3, b * b / 3);
    }
    __m512i cnt[4];
    __m512 ls[4];
    for (int q = 0; q < 4; ++q) cnt[q] = _mm512_setzero_si512(), ls[q] = _mm512_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      const int64_t ki = k + 8 * i;
      const __m512 l = row_operand<WP>(rows[0].lf + ki, rows[1].lf + ki);
      const __m512 cd = row_operand<WP>(rows[0].code + ki, rows[1].code + ki);
      for (int q = 0; q < 4; ++q) {
        const __m512 u = weight_operand<WP>(mag, q, ki), v = weight_operand<WP>(dec, q, ki);
        const __mmask16 low = _mm512_cmp_ps_mask(_mm512_mul_ps(l, u), t[q], _CMP_LT_OQ);
        cnt[q] = _mm512_mask_add_epi32(cnt[q], low, cnt[q], one);
        const __m512 p = _mm512_mul_ps(cd, v);
        const __m512 ap = _mm512_and_ps(p, fabsmask);
        const __m512 lo = _mm512_fnmadd_ps(_mm512_floor_ps(_mm512_mul_ps(ap, gi[q])), g[q], ap);
        const __m512 kn = _mm512_fmadd_ps(lo, lo, ls[q]);
        if (!unknown) {
          ls[q] = kn;
        } else {
          const __m512 term = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), _mm512_maskz_mov_ps(low, g3[q]),
                                                   _mm512_mul_ps(lo, lo));
          ls[q] = _mm512_mask_blend_ps(unknown, kn, _mm512_add_ps(ls[q], term));
        }
      }
    }
    const __m512i cs = hsum4i_pair(cnt);
    const __m512 lss = hsum4_pair(ls);
    for (int r = 0; r < 2; ++r) {
      st.nlow[r][j] = _mm256_cvtepi32_pd(half_of(cs, r));
      st.loss[r][j] = _mm256_cvtps_pd(half_of(lss, r));
    }
  }
}
#pragma GCC diagnostic pop
#endif

// Step 1: the chunk maxima and sums (independent work; the weight loads serve all NR rows). The
// sums go through P and Q; they are stashed in Q here.
template <int NR>
inline void chunk_pass(BlockChunks<NR>& st, int nch, int64_t k0, const RowPtrs* rows, const float* const* dec,
                       const float* const* maga, const BlockScale& bs, bool any_exact, bool with_abs) {
  const __m256d mrel = _mm256_set1_pd(kMaxRel), mabs = _mm256_set1_pd(kAbs);
  const __m256 fexp = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0xFF800000u)));
  const __m256 fabsmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int j = 0; j < nch; ++j) {
    const int64_t k = k0 + 32 * j;
    __m256 mx[NR][4], dt[NR][4], ab[NR][4], fm[NR][4];
    for (int q = 0; q < 4; ++q) {
      __m256 u[4], v[4], fw[4] = {};
      for (int i = 0; i < 4; ++i) u[i] = _mm256_loadu_ps(maga[q] + k + 8 * i), v[i] = _mm256_loadu_ps(dec[q] + k + 8 * i);
      if (any_exact)  // the weights' alignment powers (0 where the weight is 0: maga NaN)
        for (int i = 0; i < 4; ++i) fw[i] = _mm256_and_ps(_mm256_and_ps(u[i], fexp), _mm256_cmp_ps(u[i], u[i], _CMP_ORD_Q));
      for (int r = 0; r < NR; ++r) {
        const float* h = rows[r].hf + k;
        const float* x = rows[r].af + k;
        __m256 m = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(h), u[0]), _mm256_setzero_ps());
        __m256 d = _mm256_mul_ps(_mm256_loadu_ps(x), v[0]);
        for (int i = 1; i < 4; ++i) {
          m = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(h + 8 * i), u[i]), m);  // NaN: keep m
          d = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8 * i), v[i], d);
        }
        mx[r][q] = m, dt[r][q] = d;
        if (st.exact[r]) {
          const float* f = rows[r].field + k;
          __m256 x = _mm256_setzero_ps();
          for (int i = 0; i < 4; ++i) x = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(f + 8 * i), fw[i]), x);  // NaN: keep x
          fm[r][q] = x;
        }
        if (with_abs) {
          const float* y = rows[r].in + k;
          __m256 a = _mm256_mul_ps(_mm256_loadu_ps(y), _mm256_and_ps(v[0], fabsmask));
          for (int i = 1; i < 4; ++i) a = _mm256_fmadd_ps(_mm256_loadu_ps(y + 8 * i), _mm256_and_ps(v[i], fabsmask), a);
          ab[r][q] = a;
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      if (with_abs) st.absum[r] = _mm256_add_pd(st.absum[r], _mm256_cvtps_pd(hsum4(ab[r][0], ab[r][1], ab[r][2], ab[r][3])));
      if (st.exact[r]) st.mf[r][j] = _mm256_cvtps_pd(hmax4(fm[r][0], fm[r][1], fm[r][2], fm[r][3]));
      st.mh[r][j] = _mm256_mul_pd(bs.abs_s, _mm256_fmadd_pd(_mm256_cvtps_pd(hmax4(mx[r][0], mx[r][1], mx[r][2], mx[r][3])),
                                                           mrel, mabs));
      st.Q[r][j] = _mm256_mul_pd(bs.s, _mm256_cvtps_pd(hsum4(dt[r][0], dt[r][1], dt[r][2], dt[r][3])));
    }
  }
}

// Step 2: P, Q and U from the prefix sums of the chunk sums, Delta and D (no E involved).
template <int NR>
inline void prefix_pass(BlockChunks<NR>& st, int nch, __m256d g1, const RowPtrs* rows, const BlockScale& bs) {
  const __m256d zero = _mm256_setzero_pd(), srel = _mm256_set1_pd(kSumRel);
  const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL));
  const __m256d expmask = _mm256_castsi256_pd(_mm256_set1_epi64x(int64_t(0xFFF0000000000000ULL)));
  for (int r = 0; r < NR; ++r) {
    __m256d S = zero, Dl = zero, prev = zero;
    for (int j = 0; j < nch; ++j) {
      S = _mm256_add_pd(S, st.Q[r][j]);
      Dl = _mm256_add_pd(Dl, _mm256_fmadd_pd(st.mh[r][j], srel, bs.sum_abs));
      const __m256d D = _mm256_mul_pd(_mm256_set1_pd(rows[r].dc[j]), bs.bmax[r]);
      st.P[r][j] = prev;
      st.U[r][j] = _mm256_and_pd(_mm256_mul_pd(g1, _mm256_and_pd(S, absmask)), expmask);  // 2^(1-p) pow2_floor |S_j|
      st.Q[r][j] = _mm256_add_pd(_mm256_add_pd(_mm256_and_pd(S, absmask), Dl), D);
      prev = st.Q[r][j];
    }
  }
}

// Step 3: the count-free recurrence of G^ (every product counted), the thresholds 256 G^ and the
// variance grids.
template <int NR>
inline void grid_pass(BlockChunks<NR>& st, int nch, __m256d g1, __m256d r1, const RowPtrs* rows, const BlockScale& bs) {
  const __m256d zero = _mm256_setzero_pd(), one_r1 = _mm256_add_pd(_mm256_set1_pd(1.0), r1), mabs = _mm256_set1_pd(kAbs);
  const __m256d expmask = _mm256_castsi256_pd(_mm256_set1_epi64x(int64_t(0xFFF0000000000000ULL)));
  __m256d E[NR];
  for (int r = 0; r < NR; ++r) E[r] = zero;
  for (int j = 0; j < nch; ++j) {
    const __m256d N = _mm256_mul_pd(g1, _mm256_set1_pd(j ? 33.0 : 32.0));
    for (int r = 0; r < NR; ++r) {
      const __m256d reg = _mm256_add_pd(st.P[r][j], E[r]);  // 0 for j = 0
      const __m256d Gh = _mm256_mul_pd(g1, _mm256_max_pd(st.mh[r][j], reg));
      _mm_store_ps(st.thr[r][j], _mm256_cvtpd_ps(_mm256_fmadd_pd(Gh, bs.thr_mul, mabs)));
      if (st.exact[r]) {  // variance_grid, four lanes: pow2_floor as the sign and exponent bits
        const __m256d csv = _mm256_mul_pd(bs.abs_s, _mm256_set1_pd(rows[r].cs));
        const __m256d regc = _mm256_div_pd(_mm256_mul_pd(reg, _mm256_set1_pd(1 + 0x1p-40)), csv);
        const __m256d gv = _mm256_mul_pd(g1, _mm256_max_pd(st.mf[r][j], _mm256_and_pd(regc, expmask)));
        _mm_store_ps(st.gvf[r][j], _mm256_cvtpd_ps(gv));
      }
      const __m256d Th = _mm256_max_pd(_mm256_mul_pd(N, st.mh[r][j]), _mm256_mul_pd(N, reg));  // NaN in reg propagates
      E[r] = _mm256_fmadd_pd(one_r1, _mm256_add_pd(E[r], Th), _mm256_mul_pd(r1, st.Q[r][j]));
    }
  }
}

// Step 4: the counts at the thresholds (independent again) and, for rows with codes, the per-term
// losses (chunk_loss, eight terms at a time: a known code's (|p| mod gv)^2, an unknown one's
// gv^2 / 3 where it may lose bits).
template <int NR>
inline void count_pass(BlockChunks<NR>& st, int nch, int64_t k0, const RowPtrs* rows, const float* const* dec,
                       const float* const* mag, bool any_exact) {
  const __m256 fabsmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int j = 0; j < nch; ++j) {
    const int64_t k = k0 + 32 * j;
    __m256i cnt[NR][4];
    __m256 ls[NR][4];
    for (int q = 0; q < 4; ++q) {
      __m256 u[4], v[4] = {};
      for (int i = 0; i < 4; ++i) u[i] = _mm256_loadu_ps(mag[q] + k + 8 * i);
      if (any_exact)
        for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(dec[q] + k + 8 * i);
      for (int r = 0; r < NR; ++r) {
        const __m256 t = _mm256_set1_ps(st.thr[r][j][q]);
        const float* l = rows[r].lf + k;
        __m256i c = _mm256_setzero_si256();
        if (!st.exact[r]) {
          for (int i = 0; i < 4; ++i)
            c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(_mm256_mul_ps(_mm256_loadu_ps(l + 8 * i), u[i]), t,
                                                                      _CMP_LT_OQ)));  // a true lane is -1
          cnt[r][q] = c;
          continue;
        }
        const float gq = st.gvf[r][j][q];
        const __m256 g = _mm256_set1_ps(gq), gi = _mm256_set1_ps(gq > 0 ? 1 / gq : 0.0f), g3 = _mm256_set1_ps(gq * gq / 3);
        const float* cd = rows[r].code + k;
        __m256 acc = _mm256_setzero_ps();
        if (rows[r].known) {
          for (int i = 0; i < 4; ++i) {
            c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(_mm256_mul_ps(_mm256_loadu_ps(l + 8 * i), u[i]), t,
                                                                      _CMP_LT_OQ)));
            const __m256 ap = _mm256_and_ps(_mm256_mul_ps(_mm256_loadu_ps(cd + 8 * i), v[i]), fabsmask);
            const __m256 lo = _mm256_fnmadd_ps(_mm256_floor_ps(_mm256_mul_ps(ap, gi)), g, ap);
            acc = _mm256_fmadd_ps(lo, lo, acc);
          }
        } else {
          for (int i = 0; i < 4; ++i) {
            const __m256 low = _mm256_cmp_ps(_mm256_mul_ps(_mm256_loadu_ps(l + 8 * i), u[i]), t, _CMP_LT_OQ);
            c = _mm256_sub_epi32(c, _mm256_castps_si256(low));
            const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(cd + 8 * i), v[i]);
            const __m256 ap = _mm256_and_ps(p, fabsmask);
            const __m256 lo = _mm256_fnmadd_ps(_mm256_floor_ps(_mm256_mul_ps(ap, gi)), g, ap);
            acc = _mm256_add_ps(acc, _mm256_blendv_ps(_mm256_and_ps(low, g3), _mm256_mul_ps(lo, lo),
                                                      _mm256_cmp_ps(p, p, _CMP_ORD_Q)));
          }
        }
        cnt[r][q] = c, ls[r][q] = acc;
      }
    }
    for (int r = 0; r < NR; ++r) {
      st.nlow[r][j] = _mm256_cvtepi32_pd(hsum4i(cnt[r][0], cnt[r][1], cnt[r][2], cnt[r][3]));
      if (st.exact[r]) st.loss[r][j] = _mm256_cvtps_pd(hsum4(ls[r][0], ls[r][1], ls[r][2], ls[r][3]));
    }
  }
}

// Step 5: the recurrence of E and the variance proxy.
template <int NR>
inline void error_pass(const BlockChunks<NR>& st, int nch, __m256d g1, __m256d r1, const RowPtrs* rows,
                       const BlockScale& bs, __m256d* out, __m256d* var_out) {
  const __m256d zero = _mm256_setzero_pd(), one_r1 = _mm256_add_pd(_mm256_set1_pd(1.0), r1);
  const __m256d expmask = _mm256_castsi256_pd(_mm256_set1_epi64x(int64_t(0xFFF0000000000000ULL)));
  const __m256d third = _mm256_set1_pd(1.0 / 3);
  __m256d E[NR], V[NR];
  for (int r = 0; r < NR; ++r) E[r] = zero, V[r] = zero;
  for (int j = 0; j < nch; ++j) {
    const __m256d lead = j ? _mm256_set1_pd(1.0) : zero;  // the register's own truncation
    for (int r = 0; r < NR; ++r) {
      const __m256d N = _mm256_mul_pd(g1, _mm256_add_pd(st.nlow[r][j], lead));
      const __m256d reg = _mm256_add_pd(st.P[r][j], E[r]);
      const __m256d T = _mm256_max_pd(_mm256_mul_pd(N, st.mh[r][j]), _mm256_mul_pd(N, reg));
      if (st.exact[r]) {  // chunk_variance_codes
        const __m256d csv = _mm256_mul_pd(bs.abs_s, _mm256_set1_pd(rows[r].cs));
        const __m256d up = j ? st.U[r][j - 1] : zero, uc = st.U[r][j];
        const __m256d gd = _mm256_max_pd(_mm256_mul_pd(_mm256_mul_pd(g1, st.mf[r][j]), csv), up);
        const __m256d gd2 = _mm256_mul_pd(gd, gd);
        const __m256d lead2 = _mm256_mul_pd(lead, _mm256_max_pd(_mm256_fnmadd_pd(up, up, gd2), zero));
        const __m256d cut2 = _mm256_max_pd(_mm256_fmsub_pd(uc, uc, gd2), zero);
        const __m256d cuts = _mm256_mul_pd(_mm256_add_pd(lead2, cut2), third);
        V[r] = _mm256_add_pd(V[r], _mm256_fmadd_pd(_mm256_mul_pd(st.loss[r][j], csv), csv, cuts));
      } else if (var_out) {  // chunk_variance(G, T, r1 Q): T / G is the count, G = g1 max(mh, reg)
        const __m256d G = _mm256_mul_pd(g1, _mm256_max_pd(st.mh[r][j], reg));
        const __m256d gp = _mm256_and_pd(G, expmask), rp = _mm256_and_pd(_mm256_mul_pd(r1, st.Q[r][j]), expmask);
        const __m256d cnt = _mm256_add_pd(st.nlow[r][j], lead);
        V[r] = _mm256_fmadd_pd(_mm256_fmadd_pd(_mm256_mul_pd(cnt, gp), gp, _mm256_mul_pd(rp, rp)), third, V[r]);
      }
      E[r] = _mm256_fmadd_pd(one_r1, _mm256_add_pd(E[r], T), _mm256_mul_pd(r1, st.Q[r][j]));
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = E[r];
  if (var_out)
    for (int r = 0; r < NR; ++r) var_out[r] = V[r];
}

// E_b of one block (nch chunks of 32 from k0) for NR input rows against four weight rows, one
// weight row per lane of a __m256d: the same bound as the portable loop, in the contract's
// passes: the chunk maxima and sums (independent work), the count-free recurrence of G^, the
// counts at the thresholds 256 G^ (independent again), then the recurrence of E. No count sits
// on a latency chain, and the recurrences are written with their E-independent parts hoisted:
// with P_j = |S_{j-1}| + Delta_{j-1} + D_{j-1} (0 for j = 0) and Q_j = |S_j| + Delta_j + D_j,
//     T_j = max(N_j mh_j, N_j (P_j + E_{j-1})),   E_j = (1 + r1)(E_{j-1} + T_j) + r1 Q_j,
// where N_j = g1 (counted products + [j > 0]) (for E^: every product counted). That is the
// contract's G = g1 max(mh, reg), T = G N / g1, E += T + r1 (Q + E + T), reassociated (rounding
// differences of a few double ulps, 10^-15 relative); the chain per step is fma, max, add, fma.
// The NR rows' chains interleave.
// With rows[r].in also the block's magnitude sum sum_k in_k |w_k| (abs_out[r]; every term >= 0,
// so the float sum is within gamma_7 <= 2^-21 relative of the exact one, plus 2^-144 per chunk
// for underflow: widened by (1 + 2^-20) and that).
// Two rows whose codes are used (both exact) take the AVX-512 form of steps 1 and 4 where the
// build has it and `wide` asks for it (chunk_pass_pair, count_pass_pair: the same lane
// operations, bit for bit).
template <int NR>
inline void block4(int nch, int64_t k0, __m256d g1, __m256d r1, const RowPtrs* rows, const float* const* dec,
                   const float* const* mag, const float* const* maga, const BlockScale& bs, __m256d* out,
                   __m256d* abs_out, __m256d* var_out, bool wide) {
  BlockChunks<NR> st;
  bool any_exact = false;
  for (int r = 0; r < NR; ++r) st.exact[r] = var_out && rows[r].code && rows[r].cs > 0, any_exact |= st.exact[r];
  const bool with_abs = rows[0].in != nullptr;
  for (int r = 0; r < NR; ++r) st.absum[r] = _mm256_setzero_pd();
  bool pair = false;  // two rows with codes: the AVX-512 form of steps 1 and 4
#ifdef MOECHECK_TRUNC_AVX512
  if constexpr (NR == 2) pair = wide && st.exact[0] && st.exact[1];
#endif
  (void)wide;
  if (!pair) chunk_pass(st, nch, k0, rows, dec, maga, bs, any_exact, with_abs);
#ifdef MOECHECK_TRUNC_AVX512
  if constexpr (NR == 2)
    if (pair) chunk_pass_pair<false>(st, nch, k0, rows, dec, maga, bs, with_abs);
#endif
  prefix_pass(st, nch, g1, rows, bs);
  grid_pass(st, nch, g1, r1, rows, bs);
  if (!pair) count_pass(st, nch, k0, rows, dec, mag, any_exact);
#ifdef MOECHECK_TRUNC_AVX512
  if constexpr (NR == 2)
    if (pair) count_pass_pair<false>(st, nch, k0, rows, dec, mag);
#endif
  error_pass(st, nch, g1, r1, rows, bs, out, var_out);
  if (with_abs) {
    const __m256d rel = _mm256_set1_pd(1 + 0x1p-20), uf = _mm256_mul_pd(bs.abs_s, _mm256_set1_pd(nch * 0x1p-144));
    for (int r = 0; r < NR; ++r) abs_out[r] = _mm256_fmadd_pd(_mm256_mul_pd(bs.abs_s, st.absum[r]), rel, uf);
  }
}

#ifdef MOECHECK_TRUNC_AVX512
// E_b of one block for one input row with codes against eight weight rows (dec[0..7]: two quads,
// bs.bmax[q] the quad's drift): block4<1> for each quad, bit for bit, in one pass of the pair
// kernels (weight pair form). Slot q of out, abs_out and var_out is quad q.
inline void block8_row(int nch, int64_t k0, __m256d g1, __m256d r1, const RowPtrs& row, const float* const* dec,
                       const float* const* mag, const float* const* maga, const BlockScale& bs, __m256d* out,
                       __m256d* abs_out, __m256d* var_out) {
  BlockChunks<2> st;
  const RowPtrs rows[2] = {row, row};
  st.exact[0] = st.exact[1] = true;
  const bool with_abs = row.in != nullptr;
  for (int r = 0; r < 2; ++r) st.absum[r] = _mm256_setzero_pd();
  chunk_pass_pair<true>(st, nch, k0, rows, dec, maga, bs, with_abs);
  prefix_pass(st, nch, g1, rows, bs);
  grid_pass(st, nch, g1, r1, rows, bs);
  count_pass_pair<true>(st, nch, k0, rows, dec, mag);
  error_pass(st, nch, g1, r1, rows, bs, out, var_out);
  if (with_abs) {
    const __m256d rel = _mm256_set1_pd(1 + 0x1p-20), uf = _mm256_mul_pd(bs.abs_s, _mm256_set1_pd(nch * 0x1p-144));
    for (int r = 0; r < 2; ++r) abs_out[r] = _mm256_fmadd_pd(_mm256_mul_pd(bs.abs_s, st.absum[r]), rel, uf);
  }
}
#endif
}  // namespace
#endif

int64_t panel_f32_x86(const ChunkLayout& L, double g1, double r1, const float* af, const float* hf, const float* lf,
                      int64_t lda, const double* dcum, int64_t n, const float* dec, const float* mag, int64_t ldw,
                      const float* scale, int64_t nr, double* err, int64_t lderr, const float* in, double* abs_out,
                      const float* maga, double* var, const RowCodes* codes, const std::vector<int64_t>& bfirst,
                      const std::vector<double>& bmx, TruncationKernel kernel, bool& finite) {
  int64_t o_done = 0;
#ifdef MOECHECK_TRUNC_AVX2
  const int64_t C = L.chunks(), nb = int64_t(bfirst.size()) - 1;
  const bool wide = kernel == TruncationKernel::widest;
  bool all32 = kernel != TruncationKernel::portable;
  for (int64_t c = 0; c < C; ++c) all32 &= L.start[c + 1] - L.start[c] == 32;
  for (int64_t b = 0; b < nb; ++b) all32 &= bfirst[b + 1] - bfirst[b] <= kMaxBlockChunks;
  if (all32) {
    const __m256d vg1 = _mm256_set1_pd(g1), vr1 = _mm256_set1_pd(r1);
    // E_b and the magnitude sums, summed over the blocks, per row.
    std::vector<double> tot(static_cast<size_t>(n * 4)), tabs(static_cast<size_t>(n * 4)),
        tvar(static_cast<size_t>(var ? n * 4 : 0));
    auto add4 = [](double* t, __m256d v) { _mm256_storeu_pd(t, _mm256_add_pd(_mm256_loadu_pd(t), v)); };
    const bool with_codes = var && codes;
    auto row = [&](int64_t r, int64_t c0) {
      const int64_t b = L.block_of[c0];
      return RowPtrs{af + r * lda,
                     hf + r * lda,
                     lf + r * lda,
                     dcum + r * C + c0,
                     in ? in + r * lda : nullptr,
                     with_codes ? codes->code + r * lda : nullptr,
                     with_codes ? codes->field + r * lda : nullptr,
                     with_codes ? codes->scale[r * codes->nb + b] : 0.0,
                     with_codes && codes->known[r * codes->nb + b] != 0};
    };
    // Block-major: one block of four weight rows (4 KiB at 128 columns) stays in L1 while every
    // input row passes over it.
    // With an odd number of input rows and the AVX-512 form, eight weight rows (two quads) at a
    // time: the rows left over from the pairs then take the weight pair form (block8_row).
#ifdef MOECHECK_TRUNC_AVX512
    const bool octets = wide && n % 2 == 1;
#else
    const bool octets = false;
#endif
    tot.resize(size_t(n * 8)), tabs.resize(size_t(n * 8)), tvar.resize(var ? size_t(n * 8) : 0);
    while (o_done + 4 <= nr) {
      const int nq = octets && o_done + 8 <= nr ? 2 : 1;  // quads of weight rows in this step
      const float* dq[8];
      const float* mq[8];
      const float* aq[8];
      for (int q = 0; q < 4 * nq; ++q)
        dq[q] = dec + (o_done + q) * ldw, mq[q] = mag + (o_done + q) * ldw, aq[q] = maga + (o_done + q) * ldw;
      std::fill(tot.begin(), tot.end(), 0.0);
      std::fill(tabs.begin(), tabs.end(), 0.0);
      std::fill(tvar.begin(), tvar.end(), 0.0);
      // Per (quad, row) the four sums of E_b, the magnitude sums and the variances.
      auto slot = [&](int qd, int64_t r) { return size_t(4 * (qd * n + r)); };
      auto add = [&](int qd, int64_t r, __m256d e, __m256d ab, __m256d v) {
        add4(&tot[slot(qd, r)], e);
        if (in) add4(&tabs[slot(qd, r)], ab);
        if (var) add4(&tvar[slot(qd, r)], v);
      };
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = bfirst[b], k0 = L.start[c0];
        const int nch = int(bfirst[b + 1] - c0);
        const double s = scale[b], as = std::fabs(s);
        BlockScale bs{_mm256_set1_pd(s), _mm256_set1_pd(as), _mm256_set1_pd(256 * kMaxRel / as),
                      _mm256_set1_pd(kSumAbs * as), {}};
        __m256d quad_bmax[2];
        for (int qd = 0; qd < nq; ++qd) {
          const int64_t o = o_done + 4 * qd;
          quad_bmax[qd] = _mm256_mul_pd(_mm256_set1_pd(as), _mm256_setr_pd(bmx[size_t(o * nb + b)],
                                                                           bmx[size_t((o + 1) * nb + b)],
                                                                           bmx[size_t((o + 2) * nb + b)],
                                                                           bmx[size_t((o + 3) * nb + b)]));
        }
        for (int qd = 0; qd < nq; ++qd) {
          bs.bmax[0] = bs.bmax[1] = quad_bmax[qd];
          int64_t r = 0;
          for (; r + 2 <= n; r += 2) {  // two input rows share the weight loads and interleave their chains
            const RowPtrs rp[2] = {row(r, c0), row(r + 1, c0)};
            __m256d e[2], ab[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()}, v[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
            block4<2>(nch, k0, vg1, vr1, rp, dq + 4 * qd, mq + 4 * qd, aq + 4 * qd, bs, e, ab, var ? v : nullptr, wide);
            for (int i = 0; i < 2; ++i) add(qd, r + i, e[i], ab[i], v[i]);
          }
        }
        if (n % 2 == 0) continue;
        const int64_t r = n - 1;
        const RowPtrs rp[1] = {row(r, c0)};
#ifdef MOECHECK_TRUNC_AVX512
        if (nq == 2 && var && rp[0].code && rp[0].cs > 0) {  // block4<1> on each quad, in one pass
          bs.bmax[0] = quad_bmax[0], bs.bmax[1] = quad_bmax[1];
          __m256d e[2], ab[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()}, v[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
          block8_row(nch, k0, vg1, vr1, rp[0], dq, mq, aq, bs, e, ab, v);
          for (int qd = 0; qd < 2; ++qd) add(qd, r, e[qd], ab[qd], v[qd]);
          continue;
        }
#endif
        for (int qd = 0; qd < nq; ++qd) {
          bs.bmax[0] = bs.bmax[1] = quad_bmax[qd];
          __m256d e[1], ab[1] = {_mm256_setzero_pd()}, v[1] = {_mm256_setzero_pd()};
          block4<1>(nch, k0, vg1, vr1, rp, dq + 4 * qd, mq + 4 * qd, aq + 4 * qd, bs, e, ab, var ? v : nullptr, wide);
          add(qd, r, e[0], ab[0], v[0]);
        }
      }
      for (int qd = 0; qd < nq; ++qd)
        for (int64_t r = 0; r < n; ++r) {
          const int64_t o = o_done + 4 * qd;
          const __m256d res = _mm256_loadu_pd(&tot[slot(qd, r)]);
          _mm256_storeu_pd(err + r * lderr + o, res);
          finite &= all_finite4(res);
          if (var) _mm256_storeu_pd(var + r * lderr + o, _mm256_loadu_pd(&tvar[slot(qd, r)]));
          if (in) {
            const __m256d ab = _mm256_loadu_pd(&tabs[slot(qd, r)]);
            _mm256_storeu_pd(abs_out + r * lderr + o, ab);
            finite &= all_finite4(ab);
          }
        }
      o_done += 4 * nq;
    }
  }
#else
  (void)L, (void)g1, (void)r1, (void)af, (void)hf, (void)lf, (void)lda, (void)dcum, (void)n, (void)dec, (void)mag;
  (void)ldw, (void)scale, (void)nr, (void)err, (void)lderr, (void)in, (void)abs_out, (void)maga, (void)var;
  (void)codes, (void)bfirst, (void)bmx, (void)kernel, (void)finite;
#endif
  return o_done;
}

}  // namespace moecheck::truncation_detail
