// The float64 reference's weight products on the GPU (`moecheck reference --device cuda`): each
// FP8 weight dequantized exactly into float64 on the device, then cuBLAS DGEMM (the FP64 tensor
// cores on Hopper) in pedantic math mode, so no reduced-precision or emulated path is taken.
// Plain C++ header; CUDA stays behind it.
#pragma once

#include <memory>

#include "reference/weight_products.hpp"

namespace moecheck::kernels {

// InputError (naming --device) when no usable GPU; CudaError on CUDA or cuBLAS failures, from
// any call. `streams`: how many products may run at once (each with its own stream, cuBLAS
// handle and buffers, grown on demand to the largest product seen).
std::unique_ptr<WeightProducts> make_cuda_weight_products(int streams = 4);

}  // namespace moecheck::kernels
