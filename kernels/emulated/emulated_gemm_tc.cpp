// The block-scale GEMM of the emulated backend with tensor-core block sums (emulated_internal.hpp,
// block_scale_gemm_tc): what an FP8 wgmma kernel computes, bit for bit, given the instruction
// model (reference/tensor_core_model.hpp; `moecheck probe` measures it).
//
//   p_b(m, n) = tc_chain(model, a[m, block b], w[n, block b]) over ceil(|b| / 32) instructions,
//               the first from zero (DeepGEMM and cuBLASLt restart the accumulator per block)
//   C[m, n]   = fmaf(fl32(sa[m, b] sw[n/G, b]), p_b, C), blocks ascending
// A ragged block is zero-padded to a multiple of 32: zero products take no part in the alignment.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/emulated/emulated_internal.hpp"
#include "reference/fp8_formats.hpp"

namespace moecheck::emulated {

void block_scale_gemm_tc(const TensorCoreModel& tc, int64_t M, int64_t N, int64_t K, int64_t G, const float* a,
                         const float* sa, const uint8_t* w, const float* sw, float* C) {
  constexpr int kInstr = 32;
  const int64_t KB = (K + G - 1) / G, KP = KB * ((G + kInstr - 1) / kInstr) * kInstr;  // padded K
  const int64_t GP = KP / KB;
  // Operands as codes, each block padded with zero codes to GP.
  std::vector<uint8_t> ac(size_t(M * KP), 0), wc(size_t(N * KP), 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) ac[size_t(m * KP + (k / G) * GP + k % G)] = fp8_encode(a[m * K + k], Fp8Format::e4m3fn);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) wc[size_t(n * KP + (k / G) * GP + k % G)] = w[n * K + k];
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t b = 0; b < KB; ++b) {
        const float p = tc_chain(tc, &ac[size_t(m * KP + b * GP)], &wc[size_t(n * KP + b * GP)], kInstr,
                                 int(GP / kInstr), 0.0f);
        acc = std::fma(sa[m * KB + b] * sw[(n / G) * KB + b], p, acc);
      }
      C[m * N + n] = acc;
    }
}

}  // namespace moecheck::emulated
