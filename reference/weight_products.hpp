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

#include "reference/truncation_bound.hpp"

namespace moecheck {

// The budget's extra products of one weight (BUDGETS.md §2-§10), as an engine may run them beside
// the main product out = a W^T (forward_stages.hpp's PanelExtras, in plain arrays). Every array
// is row-major; n rows of input, W [N, K].
struct ProductExtras {
  // The float path of the chunked truncation bound (truncation_bound.hpp, truncation_bound_panel_f32):
  // the rows' float inputs af, hf, lf [n, K] and dcum [n, layout->chunks()]; codes (may be null:
  // RowCodes, read only with var). Out: err, var (may be null) [n, N]. With abs_in [n, K] (may be
  // null) also abs_out [n, N] >= abs_in |W|^T, from the same pass.
  struct Truncation {
    const ChunkLayout* layout = nullptr;
    const AccumulatorModel* acc = nullptr;
    const float *af = nullptr, *hf = nullptr, *lf = nullptr;
    const double* dcum = nullptr;
    const float* abs_in = nullptr;
    const RowCodes* codes = nullptr;
    double *err = nullptr, *var = nullptr, *abs_out = nullptr;
  };
  const Truncation* trunc = nullptr;
  // Magnitude products in float64, abs_out[i] [n, N] = abs_in[i] [n, K] |W|^T (besides the
  // truncation pass's own).
  int n_abs = 0;
  const double* abs_in[2] = {nullptr, nullptr};
  double* abs_out[2] = {nullptr, nullptr};
  // float32 products, inputs rounded to float: sq_out = sq_in (W o W)^T, the squares rounded to
  // float after squaring in double; lin_out = lin_in W^T ([n, K] in, [n, N] out; null: none).
  const double* sq_in = nullptr;
  double* sq_out = nullptr;
  const double* lin_in = nullptr;
  double* lin_out = nullptr;
  // back [n, K] = out W in float64 (the whole back product), and col_sq [K] = the sum over W's N
  // rows of W[o, k]^2 (null: none).
  double* back = nullptr;
  double* col_sq = nullptr;
};

class WeightProducts {
 public:
  virtual ~WeightProducts() = default;
  // codes [N, K] e4m3fn row-major; scales [ceil(N/B), ceil(K/B)] row-major; a [n, K] and out
  // [n, N] row-major.
  virtual void multiply(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K,
                        int64_t B, double* out) = 0;
  // The main product and the extras of ex on the engine. False where the engine cannot run some
  // of them (or the truncation pass met a non-finite value, where the CPU takes its double path):
  // the caller then computes all of them itself, and the outputs are unspecified. Products from
  // the engine meet multiply's contract; the truncation pass gives the bits of this CPU's
  // portable loop of truncation_bound_panel_f32 (truncation_pair.hpp), the float32 products any
  // float32 summation order, as the CPU's do.
  virtual bool multiply_with_extras(const double* /*a*/, int64_t /*n*/, const uint8_t* /*codes*/,
                                    const float* /*scales*/, int64_t /*N*/, int64_t /*K*/, int64_t /*B*/,
                                    double* /*out*/, const ProductExtras& /*ex*/) {
    return false;
  }
  // What runs the products, in words ("NVIDIA H100 80GB HBM3 (sm_90, ...), cuBLAS DGEMM").
  virtual std::string describe() const = 0;
  // What the engine did so far, in words (products, bytes moved, time busy); may be empty.
  virtual std::string activity() const { return ""; }
};

}  // namespace moecheck
