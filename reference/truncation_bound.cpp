// The chunked accumulation bound of a truncating accumulator (contract: truncation_bound.hpp,
// derivation: BUDGETS.md §2.1).
#include "reference/truncation_bound.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>

#include "reference/fp8_formats.hpp"
#include "reference/truncation_kernels.hpp"
#include "reference/truncation_pair.hpp"
#if defined(__AVX2__) && defined(__FMA__)
#define MOECHECK_TRUNC_AVX2 1
#include <immintrin.h>
#endif

namespace moecheck {

using truncation_pair::chunk_variance;
using truncation_pair::kU32;
using truncation_pair::pow2_floor;

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
  // Weight rows [0, o_done) go to the four-lane kernels where the build has them.
  int64_t o_done = truncation_detail::panel_f32_x86(L, g1, r1, af, hf, lf, lda, dcum, n, dec, mag, ldw, scale, nr, err,
                                                     lderr, in, abs_out, maga, var, codes, bfirst, bmx,
                                                     g_kernel.load(std::memory_order_relaxed), finite);
  // The remaining weight rows: the portable loop, block by block (truncation_pair.hpp).
  std::vector<truncation_pair::ChunkValues> cv(size_t((L.block + L.m - 1) / L.m));
  for (int64_t o = o_done; o < nr; ++o) {
    const truncation_pair::WeightRowArrays w{dec + o * ldw, mag + o * ldw, maga + o * ldw};
    for (int64_t r = 0; r < n; ++r) {
      const truncation_pair::InputRow x{af + r * lda, hf + r * lda, lf + r * lda, in ? in + r * lda : nullptr,
                                        var && codes ? codes->code + r * lda : nullptr,
                                        var && codes ? codes->field + r * lda : nullptr};
      // The row's codes (noise model, RowCodes): scale products per block, 0 where not used.
      const double* rcs = var && codes ? codes->scale + r * codes->nb : nullptr;
      truncation_pair::PairState st;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t c0 = bfirst[b], k0 = L.start[c0];
        const double cs = rcs ? std::fabs(scale[b]) * rcs[b] : 0.0;
        truncation_pair::pair_block(g1, r1, k0, std::min(L.K, k0 + L.block) - k0, L.m, dcum + r * C + c0, scale[b], cs,
                                    bmx[size_t(o * nb + b)], var != nullptr, x, w, cv.data(), st);
      }
      err[r * lderr + o] = truncation_pair::pair_err(st, in != nullptr);
      finite &= st.finite;
      if (in) abs_out[r * lderr + o] = st.ab;
      if (var) var[r * lderr + o] = st.V;
    }
  }
  return finite;
}

}  // namespace moecheck
