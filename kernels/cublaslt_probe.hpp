// One cuBLASLt block-scaled FP8 GEMM on caller data, for `moecheck probe`: the library's
// accumulation (which wgmma chain, where the per-block scales are applied, split-K) is fitted
// against the measured instruction model (reference/tensor_core_model.hpp) by tools/probe/probe_gemm.
// Plain C++ header; the implementation (cublaslt_probe.cu) needs the CUDA build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecheck::kernels {

// D [M x N] (row-major, float32) = sum over K blocks b of sa[m][b] sw[n/128][b] * (A_b W_b^T),
// with A [M x K] e4m3 (row-major), sa [M][K/128] float32 (per token per 128 channels),
// W [N x K] e4m3 (row-major), sw [N/128][K/128] float32 (per 128 x 128 block), computed by
// cublasLtMatmul exactly as the cublaslt backend calls it (weights as A, BLK128x128_32F; tokens
// as B, VEC128_32F; compute 32F; no fast accumulation). `algo` receives the heuristic's choice.
// M, N multiples of 128 (N) and 4 (M); K a multiple of 128.
std::vector<float> run_cublaslt_block_gemm(const std::vector<uint8_t>& a, const std::vector<float>& sa,
                                           const std::vector<uint8_t>& w, const std::vector<float>& sw, int64_t M,
                                           int64_t N, int64_t K, std::string* algo);

}  // namespace moecheck::kernels
