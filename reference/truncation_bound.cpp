// The chunked accumulation bound of a truncating accumulator (contract: truncation_bound.hpp,
// derivation: BUDGETS.md §2.1).
#include "reference/truncation_bound.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>

#include "reference/fp8_formats.hpp"
#if defined(__AVX2__) && defined(__FMA__)
#define MOECHECK_TRUNC_AVX2 1
#include <immintrin.h>
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define MOECHECK_TRUNC_AVX512 1
#endif
#endif

namespace moecheck {

namespace {
constexpr double kU32 = 0x1p-24;  // float32 register rounding

// The variance proxy of one chunk (BUDGETS.md §10.1). The grid is a power of two no larger than
// G (the alignment exponent is an exponent-field sum, whose power of two is at most the largest
// term): Gp = 2^floor(log2 G). Each of the T / G terms that may lose bits loses its bits below Gp,
// with the sign of its product; under the model's assumptions (signs independent and symmetric,
// the lost bits uniform) each is uniform on (-Gp, Gp): mean 0, variance Gp^2 / 3, and strictly
// sub-Gaussian with that proxy. The result's cut to p bits (below the power of two of rq) likewise.
inline double pow2_floor(double x) {
  if (!(x > 0) || !std::isfinite(x)) return x;
  int e;
  std::frexp(x, &e);
  return std::ldexp(1.0, e - 1);
}
inline double chunk_variance(double G, double T, double rq) {
  const double gp = pow2_floor(G), rp = pow2_floor(rq);
  return (G > 0 ? T / G * gp * gp : 0.0) / 3 + rp * rp / 3;
}
// With the rows' codes (RowCodes, truncation_bound.hpp): the chunk's per-term losses in code
// units (chunk_loss) times the block's scale product cs squared, and the two cuts of the running
// sum, each uniform over the bits it may lose (BUDGETS.md §10.1): the register, whose lowest bit
// is at least up = 2^(1-p) pow2_floor(|S_prev|) (it holds p bits), loses those below the chunk's
// grid gd; the aligned sum (a multiple of gd) cut to p bits loses those below uc = 2^(1-p)
// pow2_floor(|S|). gd = max(2^(1-p) mf cs, up): the chunk's largest alignment power or the
// register's, as the device aligns (S the reference's partial sums: A5, the device's are in the
// same binade).
inline double chunk_variance_codes(double losses, double cs, double gd, double up, double uc, bool reg) {
  const double lead = reg ? std::max(gd * gd - up * up, 0.0) : 0.0, cut = std::max(uc * uc - gd * gd, 0.0);
  return losses * cs * cs + (lead + cut) / 3;
}
// The variance grid in code units: 2^(1-p) times the larger of the chunk's largest alignment
// power mf (code units, a power of two) and the register bound reg_code's power of two. The
// 2^-40 keeps a register bound that is a power of two in exact arithmetic from rounding below it.
inline float variance_grid(double g1, double mf, double reg_code) {
  return static_cast<float>(g1 * std::max(mf, pow2_floor(reg_code * (1 + 0x1p-40))));
}
}  // namespace

void truncation_row_codes(const ChunkLayout& L, const uint8_t* codes, const float* scales, const double* dev,
                          const double* hi, float* code, float* field, double* block_scale, uint8_t* block_known) {
  const float* table = fp8_table(Fp8Format::e4m3fn);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t b = 0, k0 = 0; k0 < L.K; ++b, k0 += L.block) {
    const double s = scales[b];
    const bool ok = s > 0 && std::isfinite(s);
    block_scale[b] = ok ? s : 0.0;
    block_known[b] = 1;
    for (int64_t k = k0; k < std::min(L.K, k0 + L.block); ++k) {
      const double v = table[codes[k]], a = v * s, d = dev ? dev[k] : 0.0;
      if (!ok || !std::isfinite(v)) {
        code[k] = field[k] = nan, block_known[b] = 0;
      } else if (a == 0 ? d == 0 : d < std::fabs(a) / 32) {  // an e4m3 step is >= |a| / 16: the same code
        code[k] = static_cast<float>(v);
        field[k] = v == 0 ? nan : static_cast<float>(pow2_floor(std::max(std::fabs(v), 0x1p-6)));
      } else {
        code[k] = nan, block_known[b] = 0;
        field[k] = hi[k] > 0 ? f32_up(hi[k] / s * (1 + 0x1p-50)) : nan;
      }
    }
  }
}

namespace {
std::atomic<TruncationKernel> g_kernel{TruncationKernel::widest};
}  // namespace
void set_truncation_kernel(TruncationKernel k) { g_kernel.store(k, std::memory_order_relaxed); }

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
                           double* dcum, const double* align_floor) {
  double run = 0;
  for (int64_t c = 0; c < L.chunks(); ++c) {
    if (L.first_in_block[c]) run = 0;
    for (int64_t k = L.start[c]; k < L.start[c + 1]; ++k) {
      const double d = da ? da[k] : 0.0, m = std::fabs(a[k]);
      hi[k] = m + d;
      if (align_floor && hi[k] > 0) hi[k] = std::max(hi[k], align_floor[k]);
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
                            std::vector<double>& scratch, const double* walign, double* var) {
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
    const double* wal = (walign ? walign : wabs) + o * ldw;  // the chunk maxima's A(w)
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
        for (int64_t k = k0; k < k1; ++k) mh = std::max(mh, hr[k] * wal[k]), dot += ar[k] * wr[k];
        mhs[c] = mh, dots[c] = dot;
        const double Gh = g1 * std::max(mh, first ? 0.0 : std::fabs(S) + D + Eh);
        const double Th = Gh * double((first ? 0 : 1) + (k1 - k0));
        const double Sn = S + dot, Dn = dc[c] * bmax[L.block_of[c]];
        Eh += Th + r1 * (std::fabs(Sn) + Dn + Eh + Th);
        ghat[c] = Gh, S = Sn, D = Dn;
      }
      // Pass 2: the bound. A product that may be nonzero and lies below 256 G^ (>= 256 G) may
      // lose bits: less than one grid step (truncation toward zero or toward -inf alike).
      double total = 0, E = 0, V = 0;
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
        V += chunk_variance(G, T, r1 * (std::fabs(Sn) + Dn));
        S = Sn, D = Dn;
      }
      err[r * lderr + o] = total + E;
      if (var) var[r * lderr + o] = V;
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

bool truncation_row_inputs_f32(int64_t K, const double* a, const double* hi, const double* lo, float* af, float* hf,
                               float* lf) {
  bool finite = true;
  for (int64_t k = 0; k < K; ++k) {
    af[k] = static_cast<float>(a[k]);
    hf[k] = f32_up(hi[k]);
    lf[k] = hi[k] > 0 ? f32_down(lo[k]) : std::numeric_limits<float>::quiet_NaN();
    finite &= std::isfinite(hf[k]);
  }
  return finite;
}

namespace {
// Margins of the float path (truncation_bound.hpp): chunk maxima, thresholds, chunk sums.
constexpr double kMaxRel = 1 + 0x1p-22, kAbs = 0x1p-148;
constexpr double kSumRel = 0x1p-15, kSumAbs = 0x1p-134;

// One chunk of one (row, weight row) pair, portable: the float maximum of hf mag (a NaN product
// is skipped), the double sum of the exact products af dec, and the count of lf mag below thr.
struct ChunkSums {
  float mx;
  double dot;
};
inline ChunkSums chunk_sums(const float* af, const float* hf, const float* dec, const float* mag, int64_t m) {
  float x = 0;
  double s = 0;
  for (int64_t j = 0; j < m; ++j) {
    const float p = hf[j] * mag[j];
    if (p > x) x = p;
    s += double(af[j]) * double(dec[j]);  // exact: 24 + 4 significant bits
  }
  return {x, s};
}
// The magnitude sum of one chunk, sum in |dec| (exact products; the double sum's 2^-53 per
// term is covered by the (1 + 2^-20) the caller applies, as in the AVX2 form).
inline double chunk_abs(const float* in, const float* dec, int64_t m) {
  double s = 0;
  for (int64_t j = 0; j < m; ++j) s += double(in[j]) * std::fabs(double(dec[j]));
  return s;
}
inline int chunk_count(const float* lf, const float* mag, float thr, int64_t m) {
  int t = 0;
  for (int64_t j = 0; j < m; ++j) t += lf[j] * mag[j] < thr;
  return t;
}
// The alignment power of a weight's code, from its alignment magnitude max(|dec|, 2^-6) (0 where
// that is NaN: a zero weight aligns nothing).
inline float field_of(float maga) { return maga == maga ? std::bit_cast<float>(std::bit_cast<uint32_t>(maga) & 0xFF800000u) : 0.0f; }
// The largest alignment power of one chunk's terms in code units (RowCodes: field of the rows).
inline double chunk_field_max(const float* field, const float* maga, int64_t m) {
  float x = 0;
  for (int64_t j = 0; j < m; ++j) {
    const float f = field[j] * field_of(maga[j]);
    if (f > x) x = f;  // NaN: skipped
  }
  return x;
}
// One chunk's per-term losses in code units on the grid gv (RowCodes): (|p| mod gv)^2 for a known
// code (exact in float: p has at most 8 significant bits, p / gv and its floor are exact), gv^2 / 3
// for an unknown one that may lose bits (the threshold test of the bound), 0 for zero products.
inline double chunk_loss(const float* code, const float* dec, const float* lf, const float* mag, float thr, float gv,
                         int64_t m) {
  const float inv = gv > 0 ? 1 / gv : 0.0f;
  double t = 0;
  for (int64_t j = 0; j < m; ++j) {
    const float p = code[j] * dec[j];
    if (p == p) {
      const float a = std::fabs(p), l = a - gv * std::floor(a * inv);
      t += double(l) * double(l);
    } else if (lf[j] * mag[j] < thr) {
      t += double(gv) * double(gv) / 3;
    }
  }
  return t;
}

// max(0, x_0, ..., x_{n-1}) of non-negative floats, NaN skipped (+inf stays +inf).
inline float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  float r = 0;
#ifdef MOECHECK_TRUNC_AVX2
  __m256 m = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);  // NaN: keep m
  alignas(32) float lane[8];
  _mm256_store_ps(lane, m);
  for (float v : lane) r = std::max(r, v);
#endif
  for (; i < n; ++i) r = std::max(r, x[i]);  // NaN: keep r
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
  __m256d bmax;      // |s| max |dec| over the block, per weight row (the drift D)
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
// hsum4 / hmax4 / hsum4i on both halves: per half its two 128-bit lanes combined, then two
// pairwise steps ([x0 + x1, x2 + x3, y0 + y1, y2 + y3] per 128-bit lane, as _mm_hadd_ps). Row 0's
// four results end in 128-bit lane 0, row 1's in lane 2.
inline __m512 fold(__m512 x) { return _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)); }
inline __m512 evens(__m512 x, __m512 y) { return _mm512_shuffle_ps(x, y, 0x88); }
inline __m512 odds(__m512 x, __m512 y) { return _mm512_shuffle_ps(x, y, 0xDD); }
inline __m512 hsum4_pair(const __m512* v) {
  __m512 a[4];
  for (int q = 0; q < 4; ++q) a[q] = _mm512_add_ps(v[q], fold(v[q]));
  const __m512 ab = _mm512_add_ps(evens(a[0], a[1]), odds(a[0], a[1]));
  const __m512 cd = _mm512_add_ps(evens(a[2], a[3]), odds(a[2], a[3]));
  return _mm512_add_ps(evens(ab, cd), odds(ab, cd));
}
inline __m512 hmax4_pair(const __m512* v) {
  __m512 a[4];
  for (int q = 0; q < 4; ++q) a[q] = _mm512_max_ps(v[q], fold(v[q]));
  const __m512 ab = _mm512_max_ps(evens(a[0], a[1]), odds(a[0], a[1]));
  const __m512 cd = _mm512_max_ps(evens(a[2], a[3]), odds(a[2], a[3]));
  return _mm512_max_ps(evens(ab, cd), odds(ab, cd));
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

// Step 1, two rows with codes (chunk_pass with exact rows).
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
      const __m512 h = pair_load(rows[0].hf + ki, rows[1].hf + ki), x = pair_load(rows[0].af + ki, rows[1].af + ki);
      const __m512 f = pair_load(rows[0].field + ki, rows[1].field + ki);
      const __m512 y = with_abs ? pair_load(rows[0].in + ki, rows[1].in + ki) : zero;
      for (int q = 0; q < 4; ++q) {
        const __m512 u = both_halves(maga[q] + ki), v = both_halves(dec[q] + ki);
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
      const __m512 l = pair_load(rows[0].lf + ki, rows[1].lf + ki), cd = pair_load(rows[0].code + ki, rows[1].code + ki);
      for (int q = 0; q < 4; ++q) {
        const __m512 u = both_halves(mag[q] + ki), v = both_halves(dec[q] + ki);
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
      const __m256d D = _mm256_mul_pd(_mm256_set1_pd(rows[r].dc[j]), bs.bmax);
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
    if (pair) chunk_pass_pair(st, nch, k0, rows, dec, maga, bs, with_abs);
#endif
  prefix_pass(st, nch, g1, rows, bs);
  grid_pass(st, nch, g1, r1, rows, bs);
  if (!pair) count_pass(st, nch, k0, rows, dec, mag, any_exact);
#ifdef MOECHECK_TRUNC_AVX512
  if constexpr (NR == 2)
    if (pair) count_pass_pair(st, nch, k0, rows, dec, mag);
#endif
  error_pass(st, nch, g1, r1, rows, bs, out, var_out);
  if (with_abs) {
    const __m256d rel = _mm256_set1_pd(1 + 0x1p-20), uf = _mm256_mul_pd(bs.abs_s, _mm256_set1_pd(nch * 0x1p-144));
    for (int r = 0; r < NR; ++r) abs_out[r] = _mm256_fmadd_pd(_mm256_mul_pd(bs.abs_s, st.absum[r]), rel, uf);
  }
}
}  // namespace
#endif

bool truncation_bound_panel_f32(const ChunkLayout& L, const AccumulatorModel& acc, const float* af, const float* hf,
                                const float* lf, int64_t lda, const double* dcum, int64_t n, const float* dec,
                                const float* mag, int64_t ldw, const float* scale, int64_t nr, double* err,
                                int64_t lderr, const float* in, double* abs_out, const float* maga, double* var,
                                const RowCodes* codes) {
  const int64_t C = L.chunks();
  if (!maga) maga = mag;
  const double g1 = std::ldexp(1.0, 1 - acc.kept_bits);
  const double r1 = g1 + kU32;
  bool finite = true;
  // The blocks: first chunk of each (and C at the end), and the largest |dec| of each block per
  // weight row: bmx[o * nb + b].
  std::vector<int64_t> bfirst;
  for (int64_t c = 0; c < C; ++c)
    if (L.first_in_block[c]) bfirst.push_back(c);
  const int64_t nb = int64_t(bfirst.size());
  bfirst.push_back(C);
  std::vector<double> bmx(static_cast<size_t>(nr * nb));
  for (int64_t o = 0; o < nr; ++o)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t k0 = L.start[bfirst[b]];
      bmx[size_t(o * nb + b)] = max_of(mag + o * ldw + k0, std::min(L.K, k0 + L.block) - k0);
    }
  int64_t o_done = 0;  // weight rows handled by the four-lane kernel
#ifdef MOECHECK_TRUNC_AVX2
  const TruncationKernel kernel = g_kernel.load(std::memory_order_relaxed);
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
    for (; o_done + 4 <= nr; o_done += 4) {
      const float* dq[4];
      const float* mq[4];
      const float* aq[4];
      for (int q = 0; q < 4; ++q)
        dq[q] = dec + (o_done + q) * ldw, mq[q] = mag + (o_done + q) * ldw, aq[q] = maga + (o_done + q) * ldw;
      std::fill(tot.begin(), tot.end(), 0.0);
      std::fill(tabs.begin(), tabs.end(), 0.0);
      std::fill(tvar.begin(), tvar.end(), 0.0);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = bfirst[b], k0 = L.start[c0];
        const int nch = int(bfirst[b + 1] - c0);
        const double s = scale[b], as = std::fabs(s);
        BlockScale bs{_mm256_set1_pd(s), _mm256_set1_pd(as), _mm256_set1_pd(256 * kMaxRel / as),
                      _mm256_set1_pd(kSumAbs * as),
                      _mm256_mul_pd(_mm256_set1_pd(as), _mm256_setr_pd(bmx[size_t(o_done * nb + b)],
                                                                        bmx[size_t((o_done + 1) * nb + b)],
                                                                        bmx[size_t((o_done + 2) * nb + b)],
                                                                        bmx[size_t((o_done + 3) * nb + b)]))};
        int64_t r = 0;
        for (; r + 2 <= n; r += 2) {  // two input rows share the weight loads and interleave their chains
          const RowPtrs rp[2] = {row(r, c0), row(r + 1, c0)};
          __m256d e[2], ab[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()}, v[2];
          block4<2>(nch, k0, vg1, vr1, rp, dq, mq, aq, bs, e, ab, var ? v : nullptr, wide);
          for (int i = 0; i < 2; ++i) {
            add4(&tot[size_t(4 * (r + i))], e[i]);
            if (in) add4(&tabs[size_t(4 * (r + i))], ab[i]);
            if (var) add4(&tvar[size_t(4 * (r + i))], v[i]);
          }
        }
        if (r < n) {
          const RowPtrs rp[1] = {row(r, c0)};
          __m256d e[1], ab[1] = {_mm256_setzero_pd()}, v[1];
          block4<1>(nch, k0, vg1, vr1, rp, dq, mq, aq, bs, e, ab, var ? v : nullptr, wide);
          add4(&tot[size_t(4 * r)], e[0]);
          if (in) add4(&tabs[size_t(4 * r)], ab[0]);
          if (var) add4(&tvar[size_t(4 * r)], v[0]);
        }
      }
      for (int64_t r = 0; r < n; ++r) {
        const __m256d res = _mm256_loadu_pd(&tot[size_t(4 * r)]);
        _mm256_storeu_pd(err + r * lderr + o_done, res);
        finite &= all_finite4(res);
        if (var) _mm256_storeu_pd(var + r * lderr + o_done, _mm256_loadu_pd(&tvar[size_t(4 * r)]));
        if (in) {
          const __m256d ab = _mm256_loadu_pd(&tabs[size_t(4 * r)]);
          _mm256_storeu_pd(abs_out + r * lderr + o_done, ab);
          finite &= all_finite4(ab);
        }
      }
    }
  }
#endif
  std::vector<double> mhs(static_cast<size_t>(C)), dots(static_cast<size_t>(C)), dls(static_cast<size_t>(C)),
      drift(static_cast<size_t>(C));
  std::vector<float> thr(static_cast<size_t>(C)), gvc(static_cast<size_t>(C));
  std::vector<double> mfc(static_cast<size_t>(C));
  for (int64_t o = o_done; o < nr; ++o) {
    const float* dr = dec + o * ldw;
    const float* mr = mag + o * ldw;
    const float* mar = maga + o * ldw;
    for (int64_t r = 0; r < n; ++r) {
      const float* ar = af + r * lda;
      const float* hr = hf + r * lda;
      const float* lr = lf + r * lda;
      const double* dc = dcum + r * C;
      // The row's codes (noise model, RowCodes): scale products per block, 0 where not used.
      const double* rcs = var && codes ? codes->scale + r * codes->nb : nullptr;
      auto code_scale = [&](int64_t b) { return rcs ? std::fabs(scale[b]) * rcs[b] : 0.0; };
      // Pass 1: chunk maxima and sums, G^ (every product counted). |S| + Dl bounds the exact |S|.
      double Eh = 0, S = 0, Dl = 0, D = 0;
      for (int64_t c = 0; c < C; ++c) {
        const bool first = L.first_in_block[c];
        const int64_t k0 = L.start[c], m = L.start[c + 1] - k0, b = L.block_of[c];
        const double s = scale[b], as = std::fabs(s);
        if (first) Eh = 0, S = 0, Dl = 0, D = 0;
        const ChunkSums cs = chunk_sums(ar + k0, hr + k0, dr + k0, mar + k0, m);
        mhs[c] = as * (double(cs.mx) * kMaxRel + kAbs), dots[c] = s * cs.dot, dls[c] = kSumRel * mhs[c] + kSumAbs * as;
        if (const double csb = code_scale(b); csb > 0) {
          mfc[c] = chunk_field_max(codes->field + r * lda + k0, mar + k0, m);
          gvc[c] = variance_grid(g1, mfc[c], first ? 0.0 : (std::fabs(S) + Dl + D + Eh) / csb);
        }
        const double Gh = g1 * std::max(mhs[c], first ? 0.0 : std::fabs(S) + Dl + D + Eh);
        // Rounded to nearest, y = 256 G^ (1 + 2^-22) / |s| + 2^-148 becomes >= 256 G^ / |s|
        // (1 + 2^-24) + 2^-150, what the float products' own rounding needs (truncation_bound.hpp).
        thr[c] = static_cast<float>(Gh * (256 * kMaxRel / as) + kAbs);
        const double Th = Gh * double((first ? 0 : 1) + m);
        drift[c] = dc[c] * (as * bmx[size_t(o * nb + b)]);
        const double Sn = S + dots[c], Dln = Dl + dls[c], Dn = drift[c];
        Eh += Th + r1 * (std::fabs(Sn) + Dln + Dn + Eh + Th);
        S = Sn, Dl = Dln, D = Dn;
      }
      if (in) {  // the magnitude sum, widened as the AVX2 form widens its float one
        double ab = 0;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t k0 = L.start[c];
          ab += std::fabs(scale[L.block_of[c]]) *
                (chunk_abs(in + r * lda + k0, dr + k0, L.start[c + 1] - k0) * (1 + 0x1p-20) + 0x1p-144);
        }
        abs_out[r * lderr + o] = ab;
        finite &= std::isfinite(ab);
      }
      double total = 0, E = 0, V = 0;  // pass 2: the bound
      S = 0, Dl = 0, D = 0;
      for (int64_t c = 0; c < C; ++c) {
        const bool first = L.first_in_block[c];
        const int64_t k0 = L.start[c], m = L.start[c + 1] - k0;
        if (first) total += E, E = 0, S = 0, Dl = 0, D = 0;
        const double G = g1 * std::max(mhs[c], first ? 0.0 : std::fabs(S) + Dl + D + E);
        const double T = (first ? 0.0 : G) + G * chunk_count(lr + k0, mr + k0, thr[c], m);
        const double Sn = S + dots[c], Dln = Dl + dls[c], Dn = drift[c];
        E += T + r1 * (std::fabs(Sn) + Dln + Dn + E + T);
        if (const double cs = code_scale(L.block_of[c]); cs > 0) {
          const double up = first ? 0.0 : pow2_floor(g1 * std::fabs(S)), uc = pow2_floor(g1 * std::fabs(Sn));
          V += chunk_variance_codes(chunk_loss(codes->code + r * lda + k0, dr + k0, lr + k0, mr + k0, thr[c], gvc[c], m),
                                    cs, std::max(g1 * mfc[c] * cs, up), up, uc, !first);
        } else if (var)
          V += chunk_variance(G, T, r1 * (std::fabs(Sn) + Dln + Dn));
        S = Sn, Dl = Dln, D = Dn;
      }
      const double e = total + E;
      finite &= std::isfinite(e);
      err[r * lderr + o] = e;
      if (var) var[r * lderr + o] = V;
    }
  }
  return finite;
}

}  // namespace moecheck
