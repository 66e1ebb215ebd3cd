// The chunked accumulation bound of a truncating accumulator (contract: truncation_bound.hpp,
// derivation: BUDGETS.md §2.1).
#include "reference/truncation_bound.hpp"

#include <algorithm>
#include <cmath>

namespace moecheck {

namespace {
constexpr double kU32 = 0x1p-24;  // float32 register rounding

// Exact-in-double partial sums are not needed: the reference's own double rounding (~2^-53
// relative to sum |a||w|) is 9 orders under the truncation terms (BUDGETS.md §2).
inline double dot(const double* x, const double* y, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += x[i] * y[i];
    s1 += x[i + 1] * y[i + 1];
    s2 += x[i + 2] * y[i + 2];
    s3 += x[i + 3] * y[i + 3];
  }
  for (; i < n; ++i) s0 += x[i] * y[i];
  return (s0 + s1) + (s2 + s3);
}
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

void truncation_bound_panel(const ChunkLayout& L, const AccumulatorModel& acc, const double* a, const double* hi,
                            const double* lo, int64_t lda, const double* dcum, int64_t n, const double* w,
                            const double* wabs, int64_t ldw, int64_t nr, double* err, int64_t lderr,
                            std::vector<double>& scratch) {
  const int64_t C = L.chunks();
  const int64_t nb = L.block_of.empty() ? 0 : L.block_of.back() + 1;
  // Per weight row: the largest |w| of each block (for the drift D of the partial sums).
  scratch.resize(static_cast<size_t>(nr * nb));
  for (int64_t o = 0; o < nr; ++o) {
    const double* wa = wabs + o * ldw;
    double* mb = scratch.data() + o * nb;
    std::fill(mb, mb + nb, 0.0);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = L.start[c]; k < L.start[c + 1]; ++k) mb[L.block_of[c]] = std::max(mb[L.block_of[c]], wa[k]);
  }
  const double g1 = std::ldexp(1.0, 1 - acc.kept_bits);  // grid / largest term
  const double r1 = g1 + kU32;                            // result truncation + register rounding
  for (int64_t r = 0; r < n; ++r) {
    const double* ar = a + r * lda;
    const double* hr = hi + r * lda;
    const double* lr = lo + r * lda;
    const double* dc = dcum + r * C;
    for (int64_t o = 0; o < nr; ++o) {
      const double* wr = w + o * ldw;
      const double* wa = wabs + o * ldw;
      const double* mb = scratch.data() + o * nb;
      double total = 0, E = 0, S = 0, D = 0;
      for (int64_t c = 0; c < C; ++c) {
        const bool first = L.first_in_block[c];
        if (first) total += E, E = 0, S = 0, D = 0;
        const int64_t k0 = L.start[c], k1 = L.start[c + 1];
        double mh = 0;
        for (int64_t k = k0; k < k1; ++k) mh = std::max(mh, hr[k] * wa[k]);
        const double Sn = S + dot(ar + k0, wr + k0, k1 - k0);
        const double G = g1 * std::max(mh, first ? 0.0 : std::fabs(S) + D + E);
        const double thr = 256 * G;
        double T = first ? 0.0 : G;
        // A product that may be nonzero and lies below 256 G may lose bits: less than one grid step
        // (truncation toward zero or toward -inf alike).
        for (int64_t k = k0; k < k1; ++k) T += (hr[k] * wa[k] > 0 && lr[k] * wa[k] < thr) ? G : 0.0;
        const double Dn = dc[c] * mb[L.block_of[c]];
        E += T + r1 * (std::fabs(Sn) + Dn + E + T);
        S = Sn, D = Dn;
      }
      err[r * lderr + o] = total + E;
    }
  }
}

}  // namespace moecheck
