// A bit-level model of one FP8 tensor-core instruction's inner product, e4m3 x e4m3 -> float32:
//   d = Acc( c, a_0 b_0, ..., a_{n-1} b_{n-1} )      (n = 32 for Hopper's k32 FP8 instructions)
// and of a chain of such instructions (each takes the previous float32 d as its c), which is how
// a kernel sums one 128-wide scale block before promoting it to float32 on the CUDA cores.
//
// The model follows the structure that Fasi, Higham, Mikaitis and Pranesh (PeerJ CS 2021) and
// Khattak and Mikaitis (arXiv 2512.07004, 2025) use for tensor cores: products exact; the terms of
// one alignment group (the products of `group` consecutive k, and the incoming accumulator when
// `c_aligned`) shifted to the largest exponent among them and cut to `frac_bits` bits below it
// (toward zero or toward -inf); the cut terms summed exactly (enough carry bits); the sum
// normalized and written to float32 after cutting it to `out_bits` significant bits. Each
// parameter is one property the probe's test vectors isolate (tools/probe/); `moecheck probe`
// reports the values it measured and checks the whole model against >= 10^6 hardware outputs.
#pragma once

#include <cstdint>
#include <string>

namespace moecheck {

struct TensorCoreModel {
  enum class Cut { toward_zero, toward_minus_inf };
  enum class Exponent {
    field_sum,  // a product's exponent for the alignment is e(a) + e(b) from the exponent fields
                // (the significand product in [1, 4) is not normalised first; subnormals count as
                // e = -6)
    exact,      // floor(log2 |a b|)
  };
  int group = 32;            // products aligned together (an instruction may align in several groups)
  int frac_bits = 13;        // bits kept below the alignment exponent
  Cut cut = Cut::toward_zero;
  Exponent exponent = Exponent::field_sum;
  bool c_aligned = true;     // the incoming accumulator is aligned with the products (else added after)
  int out_bits = 24;         // significant bits of the normalised result, cut per `out_cut`
  Cut out_cut = Cut::toward_zero;
  bool out_nearest = false;  // round the result to out_bits to nearest even instead of cutting

  std::string describe() const;
  bool operator==(const TensorCoreModel&) const = default;

  // wgmma.mma_async m64nNk32 f32.e4m3.e4m3 on an H200 (sm_90a, driver 580, CUDA 13), measured by
  // `moecheck probe` (2026-12-03): the 32 products and the incoming accumulator aligned to the
  // largest exponent-field sum e(a) + e(b) (or the accumulator's exponent), each term cut toward
  // zero 13 bits below it, the exact sum cut toward zero to 14 significant bits (an e8m13 result,
  // "FP22"). Reproduced bit for bit on 2^20 outputs it was fitted to (seed 1) and on 2^21 fresh
  // ones (seed 2), over all six test-vector families, K = 32 and chained K = 128; no other model
  // of the 28,704 searched reproduced them. cuBLASLt's block-scaled GEMM (algo 66) is this
  // instruction chained 4 times per 128-wide block from zero, then promoted by one FFMA per block
  // (golden/probe/README.md).
  static TensorCoreModel hopper_wgmma() {
    TensorCoreModel m;
    m.group = 32;
    m.frac_bits = 13;
    m.cut = Cut::toward_zero;
    m.exponent = Exponent::field_sum;
    m.c_aligned = true;
    m.out_bits = 14;
    m.out_cut = Cut::toward_zero;
    return m;
  }
};

// One instruction: n products of the e4m3 codes a[i] b[i], plus c (float32). Returns float32.
float tc_instruction(const TensorCoreModel& m, const uint8_t* a, const uint8_t* b, int n, float c);

// nk chained instructions of `n` products each (a and b hold nk n codes): c -> d_0 -> ... -> d_{nk-1}.
float tc_chain(const TensorCoreModel& m, const uint8_t* a, const uint8_t* b, int n, int nk, float c);

}  // namespace moecheck
