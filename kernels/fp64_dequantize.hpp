// The exact float64 dequantization of an FP8 weight on the device (fp64_dequantize.cu), for the
// GPU's weight products (fp64_weight_products.cpp). Internal to kernels/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moecheck::kernels {

// W [N, K] = decode(codes) * scales (the [ceil(N/B), ceil(K/B)] block scales) in float64 on `stream`.
void launch_dequantize_fp64(const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B, double* w,
                            cudaStream_t stream);

}  // namespace moecheck::kernels
