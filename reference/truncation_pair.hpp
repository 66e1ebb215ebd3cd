// The float path of the truncation bound (truncation_bound.hpp, "float32 fast path") for one pair
// of an input row and a weight row, one K block at a time: the portable form, written once for
// this CPU's portable loop (truncation_bound.cpp) and the GPU's (kernels/fp64_budget_extras.cu), so
// both evaluate the same operations in the same order.
//
// Bits: every operation here is a single IEEE operation rounded to nearest (float or double),
// with no contraction of a * b + c into a fused multiply-add: the CPU build has
// -ffp-contract=off, the GPU file --fmad=false; IEEE division and gradual underflow on both
// (--prec-div=true --ftz=false). The weights' e4m3 values are exact in float either way. So the
// two give the same results bit for bit (tests/gpu_budget_products_test.cpp checks it).
//
// Plain C++17 so that nvcc compiles it too; MOECHECK_HD marks the functions for both sides.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOECHECK_HD __host__ __device__ inline
#else
#define MOECHECK_HD inline
#endif

namespace moecheck::truncation_pair {

// Margins of the float path (truncation_bound.hpp): chunk maxima, thresholds, chunk sums.
constexpr double kMaxRel = 1 + 0x1p-22, kAbs = 0x1p-148;
constexpr double kSumRel = 0x1p-15, kSumAbs = 0x1p-134;
constexpr double kU32 = 0x1p-24;  // float32 register rounding
// The magnitude product's widening per chunk (gamma_7 and underflow, truncation_bound.hpp).
constexpr double kAbsRel = 1 + 0x1p-20, kAbsAbs = 0x1p-144;

// std::max's and std::min's own rule ((a < b) ? b : a): a NaN second operand is never taken.
template <class T>
MOECHECK_HD T max_of2(T a, T b) {
  return (a < b) ? b : a;
}
MOECHECK_HD bool finite(double x) { return x - x == 0; }  // false for +-inf and NaN

// The variance proxy of one chunk (BUDGETS.md §10.1). The grid is a power of two no larger than
// G (the alignment exponent is an exponent-field sum, whose power of two is at most the largest
// term): Gp = 2^floor(log2 G). Each of the T / G terms that may lose bits loses its bits below Gp,
// with the sign of its product; under the model's assumptions (signs independent and symmetric,
// the lost bits uniform) each is uniform on (-Gp, Gp): mean 0, variance Gp^2 / 3, and strictly
// sub-Gaussian with that proxy. The result's cut to p bits (below the power of two of rq) likewise.
MOECHECK_HD double pow2_floor(double x) {
  if (!(x > 0) || !finite(x)) return x;
  int e;
  ::frexp(x, &e);
  return ::ldexp(1.0, e - 1);
}
MOECHECK_HD double chunk_variance(double G, double T, double rq) {
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
MOECHECK_HD double chunk_variance_codes(double losses, double cs, double gd, double up, double uc, bool reg) {
  const double lead = reg ? max_of2(gd * gd - up * up, 0.0) : 0.0, cut = max_of2(uc * uc - gd * gd, 0.0);
  return losses * cs * cs + (lead + cut) / 3;
}
// The variance grid in code units: 2^(1-p) times the larger of the chunk's largest alignment
// power mf (code units, a power of two) and the register bound reg_code's power of two. The
// 2^-40 keeps a register bound that is a power of two in exact arithmetic from rounding below it.
MOECHECK_HD float variance_grid(double g1, double mf, double reg_code) {
  return static_cast<float>(g1 * max_of2(mf, pow2_floor(reg_code * (1 + 0x1p-40))));
}
// The alignment power of a weight's code, from its alignment magnitude max(|dec|, 2^-6) (0 where
// that is NaN: a zero weight aligns nothing): the sign and exponent bits.
MOECHECK_HD float field_of(float maga) {
  if (!(maga == maga)) return 0.0f;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(__float_as_uint(maga) & 0xFF800000u);
#else
  uint32_t u;
  std::memcpy(&u, &maga, sizeof u);
  u &= 0xFF800000u;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// The float operands of a weight's e4m3 value d (without its block scale): mag = |d|, NaN where
// d = 0 (a zero weight adds no error, and the NaN marks it for the passes that skip it); maga =
// max(|d|, 2^-6), the alignment magnitude (every e4m3 subnormal aligns as 2^-6), NaN where d = 0.
constexpr float kSubnormalAlign = 0x1p-6f;
MOECHECK_HD float weight_mag(float d) { return d != 0 ? std::fabs(d) : NAN; }
MOECHECK_HD float weight_maga(float d) {
  const float m = weight_mag(d);
  return m == m ? max_of2(m, kSubnormalAlign) : m;
}

// A weight row as the float path reads it (weight_panel.hpp): dec, the code's e4m3 value; mag =
// |dec|, NaN where dec = 0; maga = max(|dec|, 2^-6), NaN where dec = 0.
struct WeightRowArrays {
  const float* dec;
  const float* mag;
  const float* maga;
  MOECHECK_HD float d(int64_t k) const { return dec[k]; }
  MOECHECK_HD float m(int64_t k) const { return mag[k]; }
  MOECHECK_HD float ma(int64_t k) const { return maga[k]; }
};

// One input row as the float path reads it (truncation_bound.hpp), at absolute k: af, hf, lf;
// in (nullptr: no magnitude product); code and field (nullptr: no RowCodes). Another row type
// (the GPU's tile in shared memory) provides the same members.
struct InputRow {
  const float* af_;
  const float* hf_;
  const float* lf_;
  const float* in_;
  const float* code_;
  const float* field_;
  MOECHECK_HD float af(int64_t k) const { return af_[k]; }
  MOECHECK_HD float hf(int64_t k) const { return hf_[k]; }
  MOECHECK_HD float lf(int64_t k) const { return lf_[k]; }
  MOECHECK_HD float in(int64_t k) const { return in_[k]; }
  MOECHECK_HD float code(int64_t k) const { return code_[k]; }
  MOECHECK_HD float field(int64_t k) const { return field_[k]; }
  MOECHECK_HD bool has_in() const { return in_ != nullptr; }
};

// A chunk's values that the bound's second pass reads from its first.
struct ChunkValues {
  double mh, dot, dl, drift, mf;
  float thr, gv;
};

// What the pair carries from block to block; err = total + E at the end.
struct PairState {
  double total = 0, E = 0, V = 0, ab = 0;
  bool finite = true;
};

// One K block of one pair: the block's first element k0, its length len (chunks of m, the last
// shorter), its chunks' dcum values from dc (the row's dcum at the block's first chunk), the
// weight's block scale s, cs = |s| times the row's code scale of the block (0: the whole-step
// model, or no variance wanted), bmx the weight row's largest |dec| in the block. var: whether the
// variance is wanted. Reads input row x and weight row w at absolute k; cv: room for the block's
// ceil(len / m) chunks.
template <class Row, class WeightRow>
MOECHECK_HD void pair_block(double g1, double r1, int64_t k0, int64_t len, int64_t m, const double* dc, double s,
                            double cs, double bmx, bool var, const Row& x, const WeightRow& w, ChunkValues* cv,
                            PairState& st) {
  const int nc = int((len + m - 1) / m);
  const double as = ::fabs(s);
  // Pass 1: chunk maxima and sums, G^ (every product counted). |S| + Dl bounds the exact |S|.
  double Eh = 0, S = 0, Dl = 0, D = 0;
  for (int c = 0; c < nc; ++c) {
    const bool first = c == 0;
    const int64_t a0 = k0 + c * m, a1 = a0 + (m < len - c * m ? m : len - c * m);
    float mx = 0;
    double dot = 0, ab = 0;
    for (int64_t k = a0; k < a1; ++k) {
      const float p = x.hf(k) * w.ma(k);
      if (p > mx) mx = p;                          // NaN: skipped
      dot += double(x.af(k)) * double(w.d(k));     // exact: 24 + 4 significant bits
    }
    ChunkValues& v = cv[c];
    v.mh = as * (double(mx) * kMaxRel + kAbs), v.dot = s * dot, v.dl = kSumRel * v.mh + kSumAbs * as;
    const double reg = first ? 0.0 : ::fabs(S) + Dl + D + Eh;
    if (cs > 0) {
      float f = 0;
      for (int64_t k = a0; k < a1; ++k) {
        const float t = x.field(k) * field_of(w.ma(k));
        if (t > f) f = t;  // NaN: skipped
      }
      v.mf = f;
      v.gv = variance_grid(g1, v.mf, reg / cs);
    }
    const double Gh = g1 * max_of2(v.mh, reg);
    // Rounded to nearest, y = 256 G^ (1 + 2^-22) / |s| + 2^-148 becomes >= 256 G^ / |s|
    // (1 + 2^-24) + 2^-150, what the float products' own rounding needs (truncation_bound.hpp).
    v.thr = static_cast<float>(Gh * (256 * kMaxRel / as) + kAbs);
    const double Th = Gh * double((first ? 0 : 1) + (a1 - a0));
    v.drift = dc[c] * (as * bmx);
    const double Sn = S + v.dot, Dln = Dl + v.dl, Dn = v.drift;
    Eh += Th + r1 * (::fabs(Sn) + Dln + Dn + Eh + Th);
    S = Sn, Dl = Dln, D = Dn;
    if (x.has_in()) {  // the magnitude sum, exact products in |dec|, widened per chunk
      for (int64_t k = a0; k < a1; ++k) ab += double(x.in(k)) * ::fabs(double(w.d(k)));
      st.ab += as * (ab * kAbsRel + kAbsAbs);
    }
  }
  // Pass 2: the bound. A product that may be nonzero and lies below the threshold may lose bits.
  st.total += st.E;
  double E = 0;
  S = 0, Dl = 0, D = 0;
  for (int c = 0; c < nc; ++c) {
    const bool first = c == 0;
    const int64_t a0 = k0 + c * m, a1 = a0 + (m < len - c * m ? m : len - c * m);
    const ChunkValues& v = cv[c];
    const double G = g1 * max_of2(v.mh, first ? 0.0 : ::fabs(S) + Dl + D + E);
    int cnt = 0;
    for (int64_t k = a0; k < a1; ++k) cnt += x.lf(k) * w.m(k) < v.thr;
    const double T = (first ? 0.0 : G) + G * cnt;
    const double Sn = S + v.dot, Dln = Dl + v.dl, Dn = v.drift;
    E += T + r1 * (::fabs(Sn) + Dln + Dn + E + T);
    if (cs > 0) {
      // Per-term losses in code units on the grid gv (RowCodes): (|p| mod gv)^2 for a known code
      // (exact in float: p has at most 8 significant bits, p / gv and its floor are exact),
      // gv^2 / 3 for an unknown one that may lose bits, 0 for zero products.
      const float gv = v.gv, inv = gv > 0 ? 1 / gv : 0.0f;
      double loss = 0;
      for (int64_t k = a0; k < a1; ++k) {
        const float p = x.code(k) * w.d(k);
        if (p == p) {
          const float a = ::fabsf(p), l = a - gv * ::floorf(a * inv);
          loss += double(l) * double(l);
        } else if (x.lf(k) * w.m(k) < v.thr) {
          loss += double(gv) * double(gv) / 3;
        }
      }
      const double up = first ? 0.0 : pow2_floor(g1 * ::fabs(S)), uc = pow2_floor(g1 * ::fabs(Sn));
      st.V += chunk_variance_codes(loss, cs, max_of2(g1 * v.mf * cs, up), up, uc, !first);
    } else if (var) {
      st.V += chunk_variance(G, T, r1 * (::fabs(Sn) + Dln + Dn));
    }
    S = Sn, Dl = Dln, D = Dn;
  }
  st.E = E;
}

// The pair's results after its last block: err (total + E); finite is cleared where err or the
// magnitude sum is not finite.
MOECHECK_HD double pair_err(PairState& st, bool with_abs) {
  const double e = st.total + st.E;
  st.finite = st.finite && finite(e) && (!with_abs || finite(st.ab));
  return e;
}

}  // namespace moecheck::truncation_pair
