// One float64 weight product on the GPU, with the budget's extra products beside it or none
// (ProductExtras, reference/weight_products.hpp), on one context of fp64_context.hpp. Internal to kernels/.
#pragma once

#include <cstdint>

#include "kernels/fp64_context.hpp"
#include "reference/weight_products.hpp"

namespace moecheck::kernels::fp64 {

struct ProductTiming {
  double upload = 0, compute = 0;  // seconds (CUDA events): copies up; the kernels and GEMMs
  double truncation = 0;           // of compute: the truncation pass
};

// out = a W^T and ex's extras on c (none: the plain product, WeightProducts::multiply), the
// layout of WeightProducts::multiply_with_extras. False where the GPU does not run them all (a
// truncation layout other than blocks of B with at most kGpuMaxBlockChunks chunks, or a
// truncation result that is not finite): the caller computes everything then; never for the
// plain product within cuBLAS's int dimensions. CudaError on CUDA or cuBLAS failures.
bool run_with_extras(Context& c, const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N,
                     int64_t K, int64_t B, double* out, const ProductExtras& ex, ProductTiming* tm);

}  // namespace moecheck::kernels::fp64
