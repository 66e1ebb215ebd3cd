// Our encoders (reference/fp8_formats.hpp) against the CUDA Toolkit's own conversions, compiled
// for the host from cuda_fp8.h / cuda_bf16.h (their host branches are the software emulation of
// the device cvt instructions; no GPU is used).
//
//  1. EveryFloat32: all 2^32 float bit patterns, split across threads, checking
//       e4m3fn and e5m2, __NV_SATFINITE and __NV_NOSAT   vs __nv_cvt_float_to_fp8
//       bf16_encode                                        vs __float2bfloat16 (RNE; NaN -> 0x7FFF)
//       e4m3_encode_satfinite (the fast path)              vs fp8_encode(x, e4m3fn, finite)
//       ue8m0_encode_ceil                                  vs __nv_cvt_float_to_e8m0(SATFINITE, RoundPosInf)
//     UE8M0 contracts differ on purpose for negative inputs: cuda_fp8.hpp (host path) rounds |x|
//     up (bf16 round-up of |x|, then exponent + 1 if any mantissa bit is left), while ours maps
//     every x <= 0 to 0x00 (a scale comes from an amax >= 0; a negative one is a bug upstream).
//     They agree on +0, -0, NaN (0xFF; CUDA's satfinite keeps NaN), +inf and huge values (0xFE:
//     CUDA saturates 0xFF to 0xFE for non-NaN), and tiny positives (0x00 = 2^-127, ceil clamped).
//     Negative nonzero non-NaN inputs are counted as skipped, not compared.
//  2. DoubleBoundaries: doubles float cannot hold: every midpoint between consecutive codes (and
//     the overflow midpoint past the largest finite value), exactly and +-1 ulp of double, vs
//     __nv_cvt_double_to_fp8 / __double2bfloat16 and vs the nearer / even neighbour; plus random
//     doubles in the formats' ranges.
//  3. E4m3fnuz: CUDA has no fnuz conversion; checked against our independent bit-field reading
//     (encode(decode(c)) == c, midpoints to the even code, overflow past 240).
// Any mismatch prints the input bits and both outputs (first few per check) and fails.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck {
namespace {

enum Check { kE4Sat, kE4NoSat, kE5Sat, kE5NoSat, kBf16, kFast, kUe8m0, kNumChecks };
const char* const kCheckNames[kNumChecks] = {"e4m3fn satfinite", "e4m3fn nosat", "e5m2 satfinite", "e5m2 nosat",
                                             "bf16",             "e4m3 fast path", "ue8m0 ceil"};

struct Report {
  std::atomic<uint64_t> checked[kNumChecks] = {};
  std::atomic<uint64_t> mismatches[kNumChecks] = {};
  std::atomic<uint64_t> skipped_ue8m0{0};
  std::mutex print;

  void mismatch(Check c, const char* input, unsigned ours, unsigned theirs) {
    if (mismatches[c].fetch_add(1) < 8) {
      std::lock_guard<std::mutex> lock(print);
      std::printf("MISMATCH %s: input %s: ours 0x%02x, reference 0x%02x\n", kCheckNames[c], input, ours, theirs);
    }
  }
};

unsigned bf16_bits(__nv_bfloat16 b) { return static_cast<__nv_bfloat16_raw>(b).x; }

void sweep(uint64_t begin, uint64_t end, Report& rep) {
  uint64_t n[kNumChecks] = {};
  uint64_t skipped = 0;
  char buf[64];
  auto fail = [&](Check c, uint32_t u, unsigned ours, unsigned theirs) {
    std::snprintf(buf, sizeof buf, "float bits 0x%08x (%a)", u, static_cast<double>(std::bit_cast<float>(u)));
    rep.mismatch(c, buf, ours, theirs);
  };
  for (uint64_t i = begin; i < end; ++i) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = std::bit_cast<float>(u);
    const double xd = x;
    const unsigned e4s = fp8_encode(xd, Fp8Format::e4m3fn, Saturation::finite);
    const unsigned e4n = fp8_encode(xd, Fp8Format::e4m3fn, Saturation::none);
    const unsigned e5s = fp8_encode(xd, Fp8Format::e5m2, Saturation::finite);
    const unsigned e5n = fp8_encode(xd, Fp8Format::e5m2, Saturation::none);
    unsigned t;
    if ((t = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) != e4s) fail(kE4Sat, u, e4s, t);
    if ((t = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3)) != e4n) fail(kE4NoSat, u, e4n, t);
    if ((t = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)) != e5s) fail(kE5Sat, u, e5s, t);
    if ((t = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2)) != e5n) fail(kE5NoSat, u, e5n, t);
    const unsigned ob = bf16_encode(xd);
    if ((t = bf16_bits(__float2bfloat16(x))) != ob) fail(kBf16, u, ob, t);
    const unsigned of = e4m3_encode_satfinite(x);
    if (of != e4s) fail(kFast, u, of, e4s);
    if ((u >> 31) && x != 0.0f && !std::isnan(x)) {
      ++skipped;  // negative: deliberate contract difference (file comment)
    } else {
      const unsigned oe = ue8m0_encode_ceil(xd);
      if ((t = __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf)) != oe) fail(kUe8m0, u, oe, t);
      ++n[kUe8m0];
    }
  }
  for (int c = 0; c < kNumChecks; ++c) rep.checked[c] += (c == kUe8m0) ? n[c] : end - begin;
  rep.skipped_ue8m0 += skipped;
}

TEST(Fp8ConversionExhaustive, EveryFloat32) {
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned threads = std::max(2u, std::thread::hardware_concurrency());
  Report rep;
  std::vector<std::thread> pool;
  const uint64_t total = uint64_t{1} << 32, chunk = total / threads;
  for (unsigned k = 0; k < threads; ++k) {
    const uint64_t b = k * chunk, e = (k + 1 == threads) ? total : b + chunk;
    pool.emplace_back([b, e, &rep] { sweep(b, e, rep); });
  }
  for (auto& th : pool) th.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("swept 2^32 float32 patterns on %u threads in %.1f s\n", threads, secs);
  for (int c = 0; c < kNumChecks; ++c) {
    std::printf("  %-16s checked %llu, mismatches %llu\n", kCheckNames[c],
                static_cast<unsigned long long>(rep.checked[c].load()),
                static_cast<unsigned long long>(rep.mismatches[c].load()));
    EXPECT_EQ(rep.mismatches[c].load(), 0u) << kCheckNames[c];
  }
  std::printf("  ue8m0 skipped (negative nonzero, contract differs): %llu\n",
              static_cast<unsigned long long>(rep.skipped_ue8m0.load()));
  EXPECT_EQ(rep.checked[kE4Sat].load(), total);
  EXPECT_EQ(rep.checked[kUe8m0].load() + rep.skipped_ue8m0.load(), total);
  RecordProperty("sweep_seconds", std::to_string(secs));
}

// Doubles around every rounding boundary of an FP8 format: for consecutive magnitudes lo < hi
// (hi may be the first value past the largest finite one), mid = (lo + hi) / 2 exactly, then mid
// and its two double neighbours, both signs. Ours must equal CUDA's double conversion and the
// neighbour rule (nearer one; even one at mid; past the max: the saturation rule).
TEST(Fp8ConversionExhaustive, DoubleBoundaries) {
  Report rep;
  char buf[64];
  struct F { Fp8Format f; __nv_fp8_interpretation_t cuda; Check sat, nosat; };
  for (const F& fm : {F{Fp8Format::e4m3fn, __NV_E4M3, kE4Sat, kE4NoSat}, F{Fp8Format::e5m2, __NV_E5M2, kE5Sat, kE5NoSat}}) {
    const unsigned max_code = fp8_encode(fp8_max(fm.f), fm.f);
    for (unsigned c = 0; c <= max_code; ++c) {
      const double lo = fp8_decode(static_cast<uint8_t>(c), fm.f);
      // Past the max: the next binade step (480 for e4m3fn, 65536 for e5m2), "code" max + 1.
      const double hi = c < max_code ? fp8_decode(static_cast<uint8_t>(c + 1), fm.f)
                                     : lo + (lo - fp8_decode(static_cast<uint8_t>(c - 1), fm.f));
      const double mid = (lo + hi) / 2;
      const unsigned even = (c & 1u) ? c + 1 : c;
      for (double x : {std::nextafter(mid, 0.0), mid, std::nextafter(mid, HUGE_VAL)}) {
        const unsigned near = x < mid ? c : x > mid ? c + 1 : even;
        for (double sx : {x, -x}) {
          const unsigned sign = sx < 0 ? 0x80u : 0u;
          for (bool saturate : {true, false}) {
            const Check chk = saturate ? fm.sat : fm.nosat;
            const unsigned ours = fp8_encode(sx, fm.f, saturate ? Saturation::finite : Saturation::none);
            const unsigned cuda = __nv_cvt_double_to_fp8(sx, saturate ? __NV_SATFINITE : __NV_NOSAT, fm.cuda);
            unsigned rule = near;
            if (near > max_code) rule = saturate ? max_code : (fm.f == Fp8Format::e5m2 ? 0x7Cu : 0x7Fu);
            std::snprintf(buf, sizeof buf, "double bits 0x%016llx (%a)",
                          static_cast<unsigned long long>(std::bit_cast<uint64_t>(sx)), sx);
            if (ours != cuda) rep.mismatch(chk, buf, ours, cuda);
            if (ours != (rule | sign)) rep.mismatch(chk, buf, ours, rule | sign);
            rep.checked[chk] += 1;
          }
        }
      }
    }
  }
  // bf16: midpoints between consecutive finite patterns and past the max, vs __double2bfloat16.
  for (uint32_t b = 0; b <= 0x7F7F; ++b) {
    const double lo = bf16_decode(static_cast<uint16_t>(b));
    const double hi = b < 0x7F7F ? static_cast<double>(bf16_decode(static_cast<uint16_t>(b + 1))) : 0x1p128;
    const double mid = (lo + hi) / 2;
    for (double x : {std::nextafter(mid, 0.0), mid, std::nextafter(mid, HUGE_VAL)})
      for (double sx : {x, -x}) {
        const unsigned ours = bf16_encode(sx), cuda = bf16_bits(__double2bfloat16(sx));
        std::snprintf(buf, sizeof buf, "double bits 0x%016llx (%a)",
                      static_cast<unsigned long long>(std::bit_cast<uint64_t>(sx)), sx);
        if (ours != cuda) rep.mismatch(kBf16, buf, ours, cuda);
        rep.checked[kBf16] += 1;
      }
  }
  // Random doubles (53-bit significands) with exponents spanning each format's range and beyond.
  const CounterRng rng{20240917, 1};
  for (uint64_t i = 0; i < 4'000'000; ++i) {
    const uint64_t r = rng.bits(i);
    const double m = 1.0 + static_cast<double>(r >> 12) * 0x1p-52;
    const double sgn = (r & 1) ? -1.0 : 1.0;
    const double x8 = sgn * std::ldexp(m, static_cast<int>(((r >> 1) & 0x7FF) % 44) - 24);     // 2^-24 .. 2^19
    const double x16 = sgn * std::ldexp(m, static_cast<int>(((r >> 1) & 0x7FF) % 280) - 145);  // 2^-145 .. 2^134
    std::snprintf(buf, sizeof buf, "double bits 0x%016llx (%a)",
                  static_cast<unsigned long long>(std::bit_cast<uint64_t>(x8)), x8);
    const unsigned pairs[4][2] = {
        {fp8_encode(x8, Fp8Format::e4m3fn), __nv_cvt_double_to_fp8(x8, __NV_SATFINITE, __NV_E4M3)},
        {fp8_encode(x8, Fp8Format::e4m3fn, Saturation::none), __nv_cvt_double_to_fp8(x8, __NV_NOSAT, __NV_E4M3)},
        {fp8_encode(x8, Fp8Format::e5m2), __nv_cvt_double_to_fp8(x8, __NV_SATFINITE, __NV_E5M2)},
        {fp8_encode(x8, Fp8Format::e5m2, Saturation::none), __nv_cvt_double_to_fp8(x8, __NV_NOSAT, __NV_E5M2)}};
    for (int c = 0; c < 4; ++c) {
      if (pairs[c][0] != pairs[c][1]) rep.mismatch(static_cast<Check>(c), buf, pairs[c][0], pairs[c][1]);
      rep.checked[c] += 1;
    }
    const unsigned ob = bf16_encode(x16), cb = bf16_bits(__double2bfloat16(x16));
    if (ob != cb) {
      std::snprintf(buf, sizeof buf, "double bits 0x%016llx (%a)",
                    static_cast<unsigned long long>(std::bit_cast<uint64_t>(x16)), x16);
      rep.mismatch(kBf16, buf, ob, cb);
    }
    rep.checked[kBf16] += 1;
  }
  for (int c = 0; c < kNumChecks; ++c) {
    if (rep.checked[c] == 0) continue;
    std::printf("  double inputs %-16s checked %llu, mismatches %llu\n", kCheckNames[c],
                static_cast<unsigned long long>(rep.checked[c].load()),
                static_cast<unsigned long long>(rep.mismatches[c].load()));
    EXPECT_EQ(rep.mismatches[c].load(), 0u) << kCheckNames[c];
  }
}

// e4m3fnuz from its bit fields (bias 8, no inf, 0x80 = NaN, no -0): value of code c.
double fnuz_spec(unsigned c) {
  if (c == 0x80) return NAN;
  const unsigned e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? m * std::pow(2.0, -10) : (8 + m) * std::pow(2.0, static_cast<int>(e) - 11);
  return (c & 0x80) ? -mag : mag;
}

TEST(Fp8ConversionExhaustive, E4m3fnuzAgainstBitFields) {
  uint64_t checked = 0;
  for (unsigned c = 0; c < 256; ++c) {
    if (c == 0x80) continue;
    EXPECT_EQ(fp8_decode(static_cast<uint8_t>(c), Fp8Format::e4m3fnuz), fnuz_spec(c));
    EXPECT_EQ(fp8_encode(fnuz_spec(c), Fp8Format::e4m3fnuz), c) << "code 0x" << std::hex << c;
    ++checked;
  }
  for (unsigned c = 0; c <= 0x7F; ++c) {  // boundaries between c and c + 1 (0x80 stands for 256)
    const double lo = fnuz_spec(c), hi = c < 0x7F ? fnuz_spec(c + 1) : 256.0, mid = (lo + hi) / 2;
    const unsigned even = (c & 1u) ? c + 1 : c;
    for (double x : {std::nextafter(mid, 0.0), mid, std::nextafter(mid, HUGE_VAL)})
      for (double sx : {x, -x})
        for (Saturation s : {Saturation::finite, Saturation::none}) {
          unsigned want = x < mid ? c : x > mid ? c + 1 : even;
          if (want == 0x80) want = s == Saturation::finite ? 0x7F : 0x80;  // past 240
          if (sx < 0 && want != 0 && !(want == 0x80 && s == Saturation::none)) want |= 0x80;
          EXPECT_EQ(fp8_encode(sx, Fp8Format::e4m3fnuz, s), want) << "x = " << sx;
          ++checked;
        }
  }
  EXPECT_EQ(fp8_encode(NAN, Fp8Format::e4m3fnuz), 0x80);
  std::printf("e4m3fnuz: %llu checks against the bit-field definition\n", static_cast<unsigned long long>(checked));
}

}  // namespace
}  // namespace moecheck
