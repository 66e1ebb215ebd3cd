// The chunked accumulation bound of a truncating accumulator (contract: truncation_bound.hpp,
// derivation: BUDGETS.md §2.1).
#include "reference/truncation_bound.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#if defined(__AVX2__) && defined(__FMA__)
#define MOECHECK_TRUNC_AVX2 1
#include <immintrin.h>
#endif

namespace moecheck {

namespace {
constexpr double kU32 = 0x1p-24;  // float32 register rounding

}  // namespace

bool uses_chunked_truncation(const AccumulatorModel& acc) { return acc.truncating && acc.kept_bits < 24; }

ChunkLayout::ChunkLayout(int64_t K_, int64_t block_, int64_t m_) : K(K_), block(block_), m(m_) {
  for (int64_t b0 = 0, b = 0; b0 < K; b0 += block, ++b) {
    const int64_t b1 = std::min(K, b0 + block);
    for (int64_t c0 = b0; c0 < b1; c0 += m) {
      start.push_back(c0);
      block_of.push_back(b);
      first_in_block.push_back(c0 == b0);
    }
  }
  start.push_back(K);
}

void truncation_row_inputs(const ChunkLayout& L, const double* a, const double* da, double* hi, double* lo,
                           double* dcum) {
  double run = 0;
  for (int64_t c = 0; c < L.chunks(); ++c) {
    if (L.first_in_block[c]) run = 0;
    for (int64_t k = L.start[c]; k < L.start[c + 1]; ++k) {
      const double d = da ? da[k] : 0.0, m = std::fabs(a[k]);
      hi[k] = m + d;
      lo[k] = std::max(m - d, 0.0);
      run += d;
    }
    dcum[c] = run;
  }
}

// The double evaluation, pair by pair as the contract reads. It serves operands beyond float
// range (the float path declines those) and is the reference the float path is tested against.
void truncation_bound_panel(const ChunkLayout& L, const AccumulatorModel& acc, const double* a, const double* hi,
                            const double* lo, int64_t lda, const double* dcum, int64_t n, const double* w,
                            const double* wabs, int64_t ldw, int64_t nr, double* err, int64_t lderr,
                            std::vector<double>& scratch) {
  const int64_t C = L.chunks();
  const int64_t nb = L.block_of.empty() ? 0 : L.block_of.back() + 1;
  const double g1 = std::ldexp(1.0, 1 - acc.kept_bits);  // grid / largest term
  const double r1 = g1 + kU32;                            // result truncation + register rounding
  scratch.resize(static_cast<size_t>(nb + 3 * C));        // per block: largest |w| (drift D)
  double* bmax = scratch.data();
  double* mhs = bmax + nb;  // per chunk: largest (|a| + da)|w|, sum of a w, the count's grid G^
  double* dots = mhs + C;
  double* ghat = dots + C;
  for (int64_t o = 0; o < nr; ++o) {
    const double* wr = w + o * ldw;
    const double* wa = wabs + o * ldw;
    for (int64_t c = 0; c < C; ++c)
      if (L.first_in_block[c]) {
        double x = 0;
        for (int64_t k = L.start[c], k1 = std::min(L.K, L.start[c] + L.block); k < k1; ++k) x = std::max(x, wa[k]);
        bmax[L.block_of[c]] = x;
      }
    for (int64_t r = 0; r < n; ++r) {
      const double* ar = a + r * lda;
      const double* hr = hi + r * lda;
      const double* lr = lo + r * lda;
      const double* dc = dcum + r * C;
      // Pass 1: the chunk maxima and sums, and the count-free recurrence of G^ (every product
      // counted). S is summed in double in its own order: the reference's rounding (~2^-53
      // relative to sum |a||w|) is 9 orders under the truncation terms (BUDGETS.md §2).
      double Eh = 0, S = 0, D = 0;
      for (int64_t c = 0; c < C; ++c) {
        const bool first = L.first_in_block[c];
        if (first) Eh = 0, S = 0, D = 0;
        const int64_t k0 = L.start[c], k1 = L.start[c + 1];
        double mh = 0, dot = 0;
        for (int64_t k = k0; k < k1; ++k) mh = std::max(mh, hr[k] * wa[k]), dot += ar[k] * wr[k];
        mhs[c] = mh, dots[c] = dot;
        const double Gh = g1 * std::max(mh, first ? 0.0 : std::fabs(S) + D + Eh);
        const double Th = Gh * double((first ? 0 : 1) + (k1 - k0));
        const double Sn = S + dot, Dn = dc[c] * bmax[L.block_of[c]];
        Eh += Th + r1 * (std::fabs(Sn) + Dn + Eh + Th);
        ghat[c] = Gh, S = Sn, D = Dn;
      }
      // Pass 2: the bound. A product that may be nonzero and lies below 256 G^ (>= 256 G) may
      // lose bits: less than one grid step (truncation toward zero or toward -inf alike).
      double total = 0, E = 0;
      S = 0, D = 0;
      for (int64_t c = 0; c < C; ++c) {
        const bool first = L.first_in_block[c];
        if (first) total += E, E = 0, S = 0, D = 0;
        const double G = g1 * std::max(mhs[c], first ? 0.0 : std::fabs(S) + D + E);
        int64_t cnt = 0;
        for (int64_t k = L.start[c]; k < L.start[c + 1]; ++k)
          cnt += hr[k] > 0 && wa[k] > 0 && lr[k] * wa[k] < 256 * ghat[c];
        const double T = (first ? 0.0 : G) + G * double(cnt);
        const double Sn = S + dots[c], Dn = dc[c] * bmax[L.block_of[c]];
        E += T + r1 * (std::fabs(Sn) + Dn + E + T);
        S = Sn, D = Dn;
      }
      err[r * lderr + o] = total + E;
    }
  }
}

// ---- float32 fast path (contract: truncation_bound.hpp) -----------------------------------

// Branch-free (these run once per operand): for f >= 0 the next float up is the next bit
// pattern (0 -> the least subnormal, FLT_MAX -> +inf), the next down the previous one.
float f32_up(double x) {
  const float f = static_cast<float>(x);  // round to nearest (+inf beyond range)
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) + uint32_t(double(f) < x));
}

float f32_down(double x) {
  const float f = static_cast<float>(x);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) - uint32_t(double(f) > x));
}

bool truncation_row_inputs_f32(int64_t K, const double* hi, const double* lo, float* hf, float* lf) {
  bool finite = true;
  for (int64_t k = 0; k < K; ++k) {
    hf[k] = f32_up(hi[k]);
    lf[k] = hi[k] > 0 ? f32_down(lo[k]) : std::numeric_limits<float>::quiet_NaN();
    finite &= std::isfinite(hf[k]);
  }
  return finite;
}

void truncation_weight_f32(double wabs, float* wu, float* wc) {
  *wu = f32_up(wabs);
  *wc = wabs > 0 ? f32_down(wabs) : std::numeric_limits<float>::infinity();
}

namespace {
// One chunk of one (row, weight row) pair: the float maximum of hf wu and the double sum of a w
// (chunk_sums), and the count of lf wc below thr (chunk_count). The common chunk of 32 has an
// AVX2 form; the portable loop does the same arithmetic (the float products are the same
// correctly rounded IEEE products either way; only the order of the double sum differs).
struct ChunkSums {
  float mx;
  double dot;
};
inline ChunkSums chunk_sums(const double* a, const float* hf, const double* w, const float* wu, int64_t m) {
#ifdef MOECHECK_TRUNC_AVX2
  if (m == 32) {
    // max_ps(p, acc) returns acc when p is NaN (0 * inf: a product known to be zero).
    __m256 mx = _mm256_setzero_ps();
    for (int j = 0; j < 32; j += 8)
      mx = _mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(hf + j), _mm256_loadu_ps(wu + j)), mx);
    __m256d d0 = _mm256_setzero_pd(), d1 = d0, d2 = d0, d3 = d0;
    for (int j = 0; j < 32; j += 16) {
      d0 = _mm256_fmadd_pd(_mm256_loadu_pd(a + j), _mm256_loadu_pd(w + j), d0);
      d1 = _mm256_fmadd_pd(_mm256_loadu_pd(a + j + 4), _mm256_loadu_pd(w + j + 4), d1);
      d2 = _mm256_fmadd_pd(_mm256_loadu_pd(a + j + 8), _mm256_loadu_pd(w + j + 8), d2);
      d3 = _mm256_fmadd_pd(_mm256_loadu_pd(a + j + 12), _mm256_loadu_pd(w + j + 12), d3);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256d d = _mm256_add_pd(_mm256_add_pd(d0, d1), _mm256_add_pd(d2, d3));
    __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
    s2 = _mm_add_sd(s2, _mm_unpackhi_pd(s2, s2));
    return {_mm_cvtss_f32(m4), _mm_cvtsd_f64(s2)};
  }
#endif
  float x = 0;
  double s = 0;
  for (int64_t j = 0; j < m; ++j) {
    const float p = hf[j] * wu[j];
    if (p > x) x = p;  // a NaN product (0 * inf, known zero) is skipped
    s += a[j] * w[j];
  }
  return {x, s};
}
inline int chunk_count(const float* lf, const float* wc, float thr, int64_t m) {
#ifdef MOECHECK_TRUNC_AVX2
  if (m == 32) {
    const __m256 t = _mm256_set1_ps(thr);
    __m256i c = _mm256_setzero_si256();
    for (int j = 0; j < 32; j += 8) {
      const __m256 lt = _mm256_cmp_ps(_mm256_mul_ps(_mm256_loadu_ps(lf + j), _mm256_loadu_ps(wc + j)), t, _CMP_LT_OQ);
      c = _mm256_sub_epi32(c, _mm256_castps_si256(lt));  // a true lane is -1
    }
    __m128i c4 = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, 0x4E));
    c4 = _mm_add_epi32(c4, _mm_shuffle_epi32(c4, 0xB1));
    return _mm_cvtsi128_si32(c4);
  }
#endif
  int t = 0;
  for (int64_t j = 0; j < m; ++j) t += lf[j] * wc[j] < thr;
  return t;
}
}  // namespace

namespace {
// max(0, x_0, ..., x_{n-1}) of non-negative floats (+inf stays +inf), in independent lanes.
inline float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  float r = 0;
#ifdef MOECHECK_TRUNC_AVX2
  __m256 m = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  alignas(32) float lane[8];
  _mm256_store_ps(lane, m);
  for (float v : lane) r = std::max(r, v);
#endif
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}
}  // namespace

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
inline __m256d hsum4(__m256d a, __m256d b, __m256d c, __m256d d) {
  const __m256d ab = _mm256_hadd_pd(a, b), cd = _mm256_hadd_pd(c, d);
  return _mm256_add_pd(_mm256_permute2f128_pd(ab, cd, 0x20), _mm256_permute2f128_pd(ab, cd, 0x31));
}
inline __m128i hsum4i(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

constexpr int kMaxBlockChunks = 8;  // blocks of up to 256 = 8 chunks of 32 take the AVX2 kernel

// E_b of one block (nch chunks of 32 from k0) for one input row against 4 NG weight rows, four
// weight rows in the lanes of each __m256d: the same arithmetic as the portable loop. The passes
// follow the contract: the chunk maxima and sums (independent work), the count-free recurrence
// of G^ (a short chain without loads), the counts at the thresholds 256 G^ (independent again),
// then the recurrence of E. No count sits on a latency chain, and the NG groups' chains
// interleave, so the out-of-order core overlaps them with the loads and products.
template <int NG>
inline void block_rows(int nch, int64_t k0, __m256d g1, __m256d r1, const double* ar, const float* hr, const float* lr,
                       const double* dc, const double* const* w, const float* const* wu, const float* const* wc,
                       const __m256d* bm, __m256d* out) {
  const __m256d mrel = _mm256_set1_pd(1 + 0x1p-22), mabs = _mm256_set1_pd(0x1p-148);
  const __m256d c256 = _mm256_set1_pd(256 * (1 + 0x1p-22)), zero = _mm256_setzero_pd();
  const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL));
  __m256d mh[kMaxBlockChunks][NG], dot[kMaxBlockChunks][NG], nlow[kMaxBlockChunks][NG];
  alignas(16) float thr[kMaxBlockChunks][NG][4];
  for (int j = 0; j < nch; ++j) {
    const int64_t k = k0 + 32 * j;
    __m256 h[4];
    for (int i = 0; i < 4; ++i) h[i] = _mm256_loadu_ps(hr + k + 8 * i);
    for (int g = 0; g < NG; ++g) {
      __m256 mx[4];
      __m256d dt[4];
      for (int q = 0; q < 4; ++q) {
        const float* u = wu[4 * g + q] + k;
        __m256 m = _mm256_max_ps(_mm256_mul_ps(h[0], _mm256_loadu_ps(u)), _mm256_setzero_ps());
        for (int i = 1; i < 4; ++i) m = _mm256_max_ps(_mm256_mul_ps(h[i], _mm256_loadu_ps(u + 8 * i)), m);  // NaN: keep m
        mx[q] = m;
        const double* x = ar + k;
        const double* y = w[4 * g + q] + k;
        __m256d d0 = _mm256_mul_pd(_mm256_loadu_pd(x), _mm256_loadu_pd(y));
        __m256d d1 = _mm256_mul_pd(_mm256_loadu_pd(x + 4), _mm256_loadu_pd(y + 4));
        for (int i = 8; i < 32; i += 8) {
          d0 = _mm256_fmadd_pd(_mm256_loadu_pd(x + i), _mm256_loadu_pd(y + i), d0);
          d1 = _mm256_fmadd_pd(_mm256_loadu_pd(x + i + 4), _mm256_loadu_pd(y + i + 4), d1);
        }
        dt[q] = _mm256_add_pd(d0, d1);
      }
      mh[j][g] = _mm256_fmadd_pd(_mm256_cvtps_pd(hmax4(mx[0], mx[1], mx[2], mx[3])), mrel, mabs);
      dot[j][g] = hsum4(dt[0], dt[1], dt[2], dt[3]);
    }
  }
  __m256d S[NG], D[NG], E[NG];
  for (int g = 0; g < NG; ++g) S[g] = zero, D[g] = zero, E[g] = zero;
  for (int j = 0; j < nch; ++j) {  // G^: every product counted
    const __m256d dcj = _mm256_set1_pd(dc[j]), mj = _mm256_set1_pd(j ? 33.0 : 32.0);
    for (int g = 0; g < NG; ++g) {
      const __m256d reg = j ? _mm256_add_pd(_mm256_add_pd(_mm256_and_pd(S[g], absmask), D[g]), E[g]) : zero;
      const __m256d Gh = _mm256_mul_pd(g1, _mm256_max_pd(mh[j][g], reg));  // NaN in reg propagates
      _mm_store_ps(thr[j][g], _mm256_cvtpd_ps(_mm256_fmadd_pd(Gh, c256, mabs)));  // see the portable loop
      const __m256d Th = _mm256_mul_pd(Gh, mj);
      const __m256d Sn = _mm256_add_pd(S[g], dot[j][g]), Dn = _mm256_mul_pd(dcj, bm[g]);
      const __m256d inner = _mm256_add_pd(_mm256_add_pd(_mm256_and_pd(Sn, absmask), Dn), _mm256_add_pd(E[g], Th));
      E[g] = _mm256_add_pd(_mm256_add_pd(E[g], Th), _mm256_mul_pd(r1, inner));
      S[g] = Sn, D[g] = Dn;
    }
  }
  for (int j = 0; j < nch; ++j) {
    const int64_t k = k0 + 32 * j;
    __m256 l[4];
    for (int i = 0; i < 4; ++i) l[i] = _mm256_loadu_ps(lr + k + 8 * i);
    for (int g = 0; g < NG; ++g) {
      __m256i cnt[4];
      for (int q = 0; q < 4; ++q) {
        const __m256 t = _mm256_set1_ps(thr[j][g][q]);
        const float* v = wc[4 * g + q] + k;
        __m256i cq = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i)
          cq = _mm256_sub_epi32(cq, _mm256_castps_si256(_mm256_cmp_ps(_mm256_mul_ps(l[i], _mm256_loadu_ps(v + 8 * i)), t,
                                                                      _CMP_LT_OQ)));  // a true lane is -1
        cnt[q] = cq;
      }
      nlow[j][g] = _mm256_cvtepi32_pd(hsum4i(cnt[0], cnt[1], cnt[2], cnt[3]));
    }
  }
  for (int g = 0; g < NG; ++g) S[g] = zero, D[g] = zero, E[g] = zero;
  for (int j = 0; j < nch; ++j) {
    const __m256d dcj = _mm256_set1_pd(dc[j]);
    for (int g = 0; g < NG; ++g) {
      const __m256d reg = j ? _mm256_add_pd(_mm256_add_pd(_mm256_and_pd(S[g], absmask), D[g]), E[g]) : zero;
      const __m256d G = _mm256_mul_pd(g1, _mm256_max_pd(mh[j][g], reg));
      const __m256d T = _mm256_fmadd_pd(G, nlow[j][g], j ? G : zero);
      const __m256d Sn = _mm256_add_pd(S[g], dot[j][g]), Dn = _mm256_mul_pd(dcj, bm[g]);
      const __m256d inner = _mm256_add_pd(_mm256_add_pd(_mm256_and_pd(Sn, absmask), Dn), _mm256_add_pd(E[g], T));
      E[g] = _mm256_add_pd(_mm256_add_pd(E[g], T), _mm256_mul_pd(r1, inner));
      S[g] = Sn, D[g] = Dn;
    }
  }
  for (int g = 0; g < NG; ++g) out[g] = E[g];
}
}  // namespace
#endif

bool truncation_bound_panel_f32(const ChunkLayout& L, const AccumulatorModel& acc, const double* a, const float* hf,
                                const float* lf, int64_t lda, const double* dcum, int64_t n, const double* w,
                                const float* wu, const float* wc, int64_t ldw, int64_t nr, double* err,
                                int64_t lderr) {
  const int64_t C = L.chunks();
  const double g1 = std::ldexp(1.0, 1 - acc.kept_bits);
  const double r1 = g1 + kU32;
  bool finite = true;
  // The blocks: first chunk of each (and C at the end).
  std::vector<int64_t> bfirst;
  for (int64_t c = 0; c < C; ++c)
    if (L.first_in_block[c]) bfirst.push_back(c);
  const int64_t nb = int64_t(bfirst.size());
  bfirst.push_back(C);
  // Largest |w| of each block per weight row, rounded up (for the drift D): bm[o * nb + b].
  std::vector<double> bm(static_cast<size_t>(nr * nb));
  for (int64_t o = 0; o < nr; ++o)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = L.start[bfirst[b]];
      bm[size_t(o * nb + b)] = max_of(wu + o * ldw + k0, std::min(L.K, k0 + L.block) - k0);
    }
  int64_t o_done = 0;  // weight rows handled by the four-lane kernel
#ifdef MOECHECK_TRUNC_AVX2
  bool all32 = true;
  for (int64_t c = 0; c < C; ++c) all32 &= L.start[c + 1] - L.start[c] == 32;
  for (int64_t b = 0; b < nb; ++b) all32 &= bfirst[b + 1] - bfirst[b] <= kMaxBlockChunks;
  if (all32) {
    const __m256d vg1 = _mm256_set1_pd(g1), vr1 = _mm256_set1_pd(r1);
    std::vector<double> bm4(static_cast<size_t>(nb * 8));
    std::vector<double> tot(static_cast<size_t>(n * 8));  // E_b summed over the blocks, per row
    // Block-major: one block of four weight rows (8 KiB at 128 columns) stays in L1 while every
    // input row passes over it.
    // Eight weight rows at a time where there are eight, then four.
    auto run_group = [&]<int NG>(std::integral_constant<int, NG>) {
      const double* wq[4 * NG];
      const float* uq[4 * NG];
      const float* cq[4 * NG];
      for (int q = 0; q < 4 * NG; ++q) {
        wq[q] = w + (o_done + q) * ldw, uq[q] = wu + (o_done + q) * ldw, cq[q] = wc + (o_done + q) * ldw;
        for (int64_t b = 0; b < nb; ++b) bm4[size_t(4 * NG * b + q)] = bm[size_t((o_done + q) * nb + b)];
      }
      std::fill(tot.begin(), tot.end(), 0.0);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = bfirst[b], k0 = L.start[c0];
        const int nch = int(bfirst[b + 1] - c0);
        __m256d bmv[NG], e[NG];
        for (int g = 0; g < NG; ++g) bmv[g] = _mm256_loadu_pd(bm4.data() + 4 * NG * b + 4 * g);
        for (int64_t r = 0; r < n; ++r) {
          block_rows<NG>(nch, k0, vg1, vr1, a + r * lda, hf + r * lda, lf + r * lda, dcum + r * C + c0, wq, uq, cq, bmv, e);
          for (int g = 0; g < NG; ++g) {
            double* t = &tot[size_t(8 * r + 4 * g)];
            _mm256_storeu_pd(t, _mm256_add_pd(_mm256_loadu_pd(t), e[g]));
          }
        }
      }
      for (int64_t r = 0; r < n; ++r)
        for (int g = 0; g < NG; ++g) {
          const __m256d res = _mm256_loadu_pd(&tot[size_t(8 * r + 4 * g)]);
          _mm256_storeu_pd(err + r * lderr + o_done + 4 * g, res);
          // finite iff x - x == 0
          finite &= _mm256_movemask_pd(_mm256_cmp_pd(_mm256_sub_pd(res, res), _mm256_setzero_pd(), _CMP_EQ_OQ)) == 0xF;
        }
      o_done += 4 * NG;
    };
    while (o_done + 8 <= nr) run_group(std::integral_constant<int, 2>{});
    while (o_done + 4 <= nr) run_group(std::integral_constant<int, 1>{});
  }
#endif
  std::vector<double> mhs(static_cast<size_t>(C)), dots(static_cast<size_t>(C));
  std::vector<float> thr(static_cast<size_t>(C));
  for (int64_t o = o_done; o < nr; ++o) {
    const double* wr = w + o * ldw;
    const float* wur = wu + o * ldw;
    const float* wcr = wc + o * ldw;
    const double* bmo = bm.data() + o * nb;
    for (int64_t r = 0; r < n; ++r) {
      const double* ar = a + r * lda;
      const float* hr = hf + r * lda;
      const float* lr = lf + r * lda;
      const double* dc = dcum + r * C;
      double Eh = 0, S = 0, D = 0;  // pass 1: chunk maxima and sums, G^ (every product counted)
      for (int64_t c = 0; c < C; ++c) {
        const bool first = L.first_in_block[c];
        const int64_t k0 = L.start[c], m = L.start[c + 1] - k0;
        if (first) Eh = 0, S = 0, D = 0;
        const ChunkSums cs = chunk_sums(ar + k0, hr + k0, wr + k0, wur + k0, m);
        mhs[c] = double(cs.mx) * (1 + 0x1p-22) + 0x1p-148, dots[c] = cs.dot;
        const double Gh = g1 * std::max(mhs[c], first ? 0.0 : std::fabs(S) + D + Eh);
        // Rounded to nearest, y = 256 G^ (1 + 2^-22) + 2^-148 becomes >= 256 G^ (1 + 2^-24) + 2^-150,
        // what the float products' own rounding needs (truncation_bound.hpp).
        thr[c] = static_cast<float>(256 * Gh * (1 + 0x1p-22) + 0x1p-148);
        const double Th = Gh * double((first ? 0 : 1) + m);
        const double Sn = S + cs.dot, Dn = dc[c] * bmo[L.block_of[c]];
        Eh += Th + r1 * (std::fabs(Sn) + Dn + Eh + Th);
        S = Sn, D = Dn;
      }
      double total = 0, E = 0;  // pass 2: the bound
      S = 0, D = 0;
      for (int64_t c = 0; c < C; ++c) {
        const bool first = L.first_in_block[c];
        const int64_t k0 = L.start[c], m = L.start[c + 1] - k0;
        if (first) total += E, E = 0, S = 0, D = 0;
        const double G = g1 * std::max(mhs[c], first ? 0.0 : std::fabs(S) + D + E);
        const double T = (first ? 0.0 : G) + G * chunk_count(lr + k0, wcr + k0, thr[c], m);
        const double Sn = S + dots[c], Dn = dc[c] * bmo[L.block_of[c]];
        E += T + r1 * (std::fabs(Sn) + Dn + E + T);
        S = Sn, D = Dn;
      }
      const double e = total + E;
      finite &= std::isfinite(e);
      err[r * lderr + o] = e;
    }
  }
  return finite;
}

}  // namespace moecheck
