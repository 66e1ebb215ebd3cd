// The budget's extra products on the GPU beside the float64 reference's (fp64_product.cpp,
// ProductExtras in reference/weight_products.hpp): the kernels of fp64_budget_extras.cu. Every
// array is row-major in device memory. Internal to kernels/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecheck::kernels {

// The most chunks per K block the truncation pass takes (its chunk values stay in the thread's
// local memory): 16, a block of 512 at 32 products per instruction. Layouts with more stay on
// the CPU.
constexpr int64_t kGpuMaxBlockChunks = 16;

// The float path of the chunked truncation bound for every (row r < n, weight row o < N) pair:
// truncation_pair.hpp's portable form, block by block, on the rows' float inputs (af, hf, lf, and
// in, code, field where not null) [n, K], dcum [n, C] and cscale [n, ceil(K / B)] (RowCodes::
// scale; null: no per-term losses) against the weight's codes [N, K] and block scales
// [ceil(N / B), ceil(K / B)], chunks of m products in blocks of B. Writes err, and var and
// abs_out where not null, [n, N]; clears *finite (an int, set to 1 by the caller) where a result
// is not finite.
struct TruncationPassArgs {
  const uint8_t* codes;
  const float* scales;
  int64_t n, N, K, B, m, C;
  double g1, r1;
  const float *af, *hf, *lf, *in, *code, *field;
  const double *dcum, *cscale;
  double *err, *var, *abs_out;
  int* finite;
};
void launch_truncation_pass(const TruncationPassArgs& a, cudaStream_t stream);
// Whether the pass's grid holds n input rows and N weight rows (65,535 blocks of 4 input rows).
bool truncation_pass_fits(int64_t n, int64_t N);

// From the float64 weight w [N, K]: wabs = |w|, wsq = float(w * w) and wf = float(w) where not null.
void launch_weight_forms(const double* w, int64_t count, double* wabs, float* wsq, float* wf, cudaStream_t stream);

// to[i] = float(from[i]) (rounded to nearest).
void launch_to_float(const double* from, int64_t count, float* to, cudaStream_t stream);

// col_sq[k] = sum over o < N, in order, of w[o, k]^2 (each square rounded, then added: no FMA,
// as the CPU's loop).
void launch_column_squares(const double* w, int64_t N, int64_t K, double* col_sq, cudaStream_t stream);

}  // namespace moecheck::kernels
