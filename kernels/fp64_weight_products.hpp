// The float64 reference's weight products on the GPU (`moecheck reference --device cuda`): each
// FP8 weight dequantized exactly into float64 on the device, then cuBLAS DGEMM (the FP64 tensor
// cores on Hopper) in pedantic math mode, so no reduced-precision or emulated path is taken.
// Plain C++ header; CUDA stays behind it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "reference/weight_products.hpp"

namespace moecheck::kernels {

// InputError (naming --device) when no usable GPU; CudaError on CUDA or cuBLAS failures, from
// any call. `streams`: how many products may run at once (each with its own stream, cuBLAS
// handle and buffers, grown on demand to the largest product seen).
std::unique_ptr<WeightProducts> make_cuda_weight_products(int streams = 4);

// W [N, K] = decode(codes) * scales (the [ceil(N/B), ceil(K/B)] block scales) in float64 on
// `stream` (fp64_dequantize.cu).
void launch_dequantize_fp64(const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B, double* w,
                            cudaStream_t stream);

}  // namespace moecheck::kernels
