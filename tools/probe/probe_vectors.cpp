// Test-vector families of `moecheck probe` (probe_vectors.hpp).
#include "tools/probe/probe_vectors.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck::probe {

namespace {

using kernels::kProbeTileM;
using kernels::kProbeTileN;

// A deterministic stream of draws for one tile.
class Draw {
 public:
  Draw(uint64_t seed, uint64_t stream) : rng_{seed, stream}, normals_{seed, stream ^ (uint64_t(1) << 63)} {}
  uint32_t u32() { return uint32_t(rng_.bits(i_++)); }
  int uniform_int(int lo, int hi) { return lo + int(u32() % uint32_t(hi - lo + 1)); }  // [lo, hi]
  double uniform() { return rng_.uniform(i_++); }
  bool coin(double p) { return uniform() < p; }
  double normal() { return normals_.normal(j_++); }  // bit-identical on every machine

 private:
  CounterRng rng_, normals_;  // normals from their own stream (counter_rng.hpp)
  uint64_t i_ = 0, j_ = 0;
};

// An e4m3fn code with unbiased field exponent e (-6..8; -7 requests a subnormal), random
// significand bits (or the given ones) and random sign.
uint8_t code_with_exponent(Draw& d, int e, int mant = -1) {
  const uint8_t sign = d.coin(0.5) ? 0x80 : 0;
  const int m = mant >= 0 ? mant : d.uniform_int(0, 7);
  if (e < -6) return uint8_t(sign | std::max(1, m));  // subnormal 1..7 x 2^-9
  e = std::min(e, 8);
  const int E = e + 7;
  if (E == 15 && m == 7) return uint8_t(sign | (E << 3) | 6);  // 0x7F is NaN: take 448's neighbour
  return uint8_t(sign | (E << 3) | m);
}

uint8_t random_finite_code(Draw& d) {
  for (;;) {
    const uint8_t c = uint8_t(d.u32() & 0xFF);
    if ((c & 0x7F) != 0x7F) return c;
  }
}

float random_float(Draw& d, int e) {  // +-(1 + f) 2^e with a random 23-bit fraction
  const double f = double(d.u32() & 0x7FFFFF) * 0x1p-23;
  const float v = float(std::ldexp(1.0 + f, e));
  return d.coin(0.5) ? -v : v;
}

void fill_gaussian(kernels::ProbeTiles& t, int64_t tile, Draw& d) {
  const int64_t K = t.k();
  int ra[kProbeTileM], cb[kProbeTileN];
  for (int& r : ra) r = d.uniform_int(-3, 3);
  for (int& c : cb) c = d.uniform_int(-3, 3);
  for (int m = 0; m < kProbeTileM; ++m)
    for (int64_t k = 0; k < K; ++k)
      t.a[(tile * kProbeTileM + m) * K + k] = fp8_encode(std::ldexp(d.normal(), ra[m]), Fp8Format::e4m3fn);
  for (int n = 0; n < kProbeTileN; ++n)
    for (int64_t k = 0; k < K; ++k)
      t.b[(tile * kProbeTileN + n) * K + k] = fp8_encode(std::ldexp(d.normal(), cb[n]), Fp8Format::e4m3fn);
  for (int m = 0; m < kProbeTileM; ++m)
    for (int n = 0; n < kProbeTileN; ++n)
      t.c[(tile * kProbeTileM + m) * kProbeTileN + n] =
          d.coin(0.5) ? 0.0f : float(std::ldexp(d.normal() * std::sqrt(double(K)), ra[m] + cb[n]));
}

void fill_codes(kernels::ProbeTiles& t, int64_t tile, Draw& d) {
  const int64_t K = t.k();
  for (int64_t i = 0; i < kProbeTileM * K; ++i) t.a[tile * kProbeTileM * K + i] = random_finite_code(d);
  for (int64_t i = 0; i < kProbeTileN * K; ++i) t.b[tile * kProbeTileN * K + i] = random_finite_code(d);
  for (int i = 0; i < kProbeTileM * kProbeTileN; ++i)
    t.c[tile * kProbeTileM * kProbeTileN + i] = d.coin(0.5) ? 0.0f : random_float(d, d.uniform_int(-18, 17));
}

// Operands "big" (exponent hi) or "small" (hi - gap), per row / column parameters.
void fill_two_scale(kernels::ProbeTiles& t, int64_t tile, Draw& d) {
  const int64_t K = t.k();
  auto fill_row = [&](uint8_t* row) {
    const int hi = d.uniform_int(-2, 8), gap = d.uniform_int(0, 14);
    const double p_big = d.coin(0.5) ? 1.0 / 32 : d.uniform();
    for (int64_t k = 0; k < K; ++k) {
      const bool big = d.coin(p_big);
      row[k] = d.coin(0.05) ? 0 : code_with_exponent(d, big ? hi : hi - gap - d.uniform_int(0, 2));
    }
  };
  for (int m = 0; m < kProbeTileM; ++m) fill_row(&t.a[(tile * kProbeTileM + m) * K]);
  for (int n = 0; n < kProbeTileN; ++n) fill_row(&t.b[(tile * kProbeTileN + n) * K]);
  for (int i = 0; i < kProbeTileM * kProbeTileN; ++i)
    t.c[tile * kProbeTileM * kProbeTileN + i] = d.coin(0.4) ? 0.0f : random_float(d, d.uniform_int(-16, 18));
}

// Big pairs a_k b_k = -a_{k+1} b_{k+1} (same codes, one sign flipped) and small terms.
void fill_cancel(kernels::ProbeTiles& t, int64_t tile, Draw& d) {
  const int64_t K = t.k();
  for (int n = 0; n < kProbeTileN; ++n) {
    uint8_t* row = &t.b[(tile * kProbeTileN + n) * K];
    for (int64_t k = 0; k < K; ++k) row[k] = code_with_exponent(d, d.uniform_int(-1, 1)) & 0x7F;  // positive
  }
  for (int m = 0; m < kProbeTileM; ++m) {
    uint8_t* row = &t.a[(tile * kProbeTileM + m) * K];
    const int hi = d.uniform_int(0, 8), gap = d.uniform_int(4, 20);
    for (int64_t k = 0; k + 1 < K; k += 2) {
      if (d.coin(0.5)) {
        row[k] = code_with_exponent(d, hi);
        row[k + 1] = uint8_t(row[k] ^ 0x80);
      } else {
        row[k] = code_with_exponent(d, hi - gap);
        row[k + 1] = d.coin(0.5) ? 0 : code_with_exponent(d, hi - gap - d.uniform_int(0, 3));
      }
    }
  }
  // Pairs cancel only where b_k = b_{k+1}: make the B rows pairwise equal.
  for (int n = 0; n < kProbeTileN; ++n) {
    uint8_t* row = &t.b[(tile * kProbeTileN + n) * K];
    for (int64_t k = 0; k + 1 < K; k += 2) row[k + 1] = row[k];
  }
  for (int i = 0; i < kProbeTileM * kProbeTileN; ++i)
    t.c[tile * kProbeTileM * kProbeTileN + i] = d.coin(0.5) ? 0.0f : random_float(d, d.uniform_int(-10, 10));
}

void fill_carry(kernels::ProbeTiles& t, int64_t tile, Draw& d) {
  const int64_t K = t.k();
  const int e = d.uniform_int(-4, 6);
  for (int64_t i = 0; i < kProbeTileM * K; ++i) {
    uint8_t& a = t.a[tile * kProbeTileM * K + i];
    a = d.coin(0.1) ? code_with_exponent(d, e - d.uniform_int(1, 12)) : code_with_exponent(d, e, d.uniform_int(5, 7));
    if (d.coin(0.7)) a &= 0x7F;  // mostly positive: carries out of the top
  }
  for (int64_t i = 0; i < kProbeTileN * K; ++i)
    t.b[tile * kProbeTileN * K + i] = uint8_t(code_with_exponent(d, 0, d.uniform_int(5, 7)) & 0x7F);
  for (int i = 0; i < kProbeTileM * kProbeTileN; ++i)
    t.c[tile * kProbeTileM * kProbeTileN + i] = d.coin(0.5) ? 0.0f : random_float(d, e + d.uniform_int(-3, 7));
}

void fill_accumulator(kernels::ProbeTiles& t, int64_t tile, Draw& d) {
  const int64_t K = t.k();
  const bool none = d.coin(0.5);
  for (int64_t i = 0; i < kProbeTileM * K; ++i)
    t.a[tile * kProbeTileM * K + i] = none || d.coin(0.7) ? 0 : code_with_exponent(d, d.uniform_int(-7, 2));
  for (int64_t i = 0; i < kProbeTileN * K; ++i)
    t.b[tile * kProbeTileN * K + i] = none ? 0 : code_with_exponent(d, d.uniform_int(-7, 2));
  for (int i = 0; i < kProbeTileM * kProbeTileN; ++i)
    t.c[tile * kProbeTileM * kProbeTileN + i] = random_float(d, d.uniform_int(-40, 40));
}

}  // namespace

std::vector<std::string> probe_family_names() {
  return {"gaussian", "codes", "two-scale", "cancel", "carry", "accumulator"};
}

std::vector<ProbeFamily> default_probe_families(int64_t dot_products) {
  const int64_t per_tile = kProbeTileM * kProbeTileN;
  const int64_t tiles = std::max<int64_t>(1, (dot_products + per_tile - 1) / per_tile);
  // Shares of the tiles: the common case and the hardest alignment cases get the most.
  auto part = [&](int64_t num, int64_t den) { return std::max<int64_t>(1, tiles * num / den); };
  return {
      {"gaussian", 1, part(3, 16)},  {"gaussian", 4, part(3, 16)}, {"two-scale", 1, part(3, 16)},
      {"two-scale", 4, part(2, 16)}, {"codes", 1, part(1, 16)},    {"cancel", 1, part(1, 16)},
      {"cancel", 4, part(1, 32)},    {"carry", 1, part(1, 16)},    {"carry", 4, part(1, 32)},
      {"accumulator", 1, part(1, 16)},
  };
}

kernels::ProbeTiles make_probe_tiles(const ProbeFamily& f, uint64_t seed) {
  using Fill = void (*)(kernels::ProbeTiles&, int64_t, Draw&);
  const std::vector<std::string> names = probe_family_names();
  const Fill fills[] = {fill_gaussian, fill_codes, fill_two_scale, fill_cancel, fill_carry, fill_accumulator};
  const auto it = std::find(names.begin(), names.end(), f.name);
  if (it == names.end()) throw std::invalid_argument("probe: unknown test-vector family '" + f.name + "'");
  const size_t which = size_t(it - names.begin());
  kernels::ProbeTiles t;
  t.resize(f.tiles, f.nk);
  for (int64_t tile = 0; tile < f.tiles; ++tile) {
    // One stream per (family, nk, tile): tiles are independent of how many were asked for.
    Draw d(seed, (uint64_t(which) << 56) ^ (uint64_t(f.nk) << 48) ^ uint64_t(tile));
    fills[which](t, tile, d);
  }
  return t;
}

}  // namespace moecheck::probe
