// Where the float64 forward's weight products run when not on this CPU (moe_forward.hpp,
// ForwardOptions::products): a GPU's float64 GEMM (kernels/fp64_weight_products.hpp) behind a
// plain C++ interface, so the reference depends on no device code.
//
// Contract: out [n, N] = a [n, K] W^T in float64, W [N, K] the FP8 weight dequantized exactly
// (decode(code) * scale of its [B x B] block: exact in double). Any summation order, with or
// without fused multiply-adds: each element must lie within gamma_K sum_k |a_k| |W_k| of the
// exact product (gamma_K = K u / (1 - K u), u = 2^-53), which the CPU's Eigen GEMM also does. Two
// such engines therefore agree within 2 gamma_K sum |a||W| on every product; how that carries
// through the recipe's roundings to the output is BUDGETS.md §11.
// Called from the forward's worker threads, several at once.
#pragma once

#include <cstdint>
#include <string>

namespace moecheck {

class WeightProducts {
 public:
  virtual ~WeightProducts() = default;
  // codes [N, K] e4m3fn row-major; scales [ceil(N/B), ceil(K/B)] row-major; a [n, K] and out
  // [n, N] row-major.
  virtual void multiply(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K,
                        int64_t B, double* out) = 0;
  // What runs the products, in words ("NVIDIA H100 80GB HBM3 (sm_90, ...), cuBLAS DGEMM").
  virtual std::string describe() const = 0;
  // What the engine did so far, in words (products, bytes moved, time busy); may be empty.
  virtual std::string activity() const { return ""; }
};

}  // namespace moecheck
