// The float64 reference's weight dequantization on the GPU (fp64_weight_products.hpp): W [N, K] =
// decode(code) * scale in float64, exact (an e4m3 value has 4 significant bits, a float32 scale
// 24). NaN codes (S.1111.111) decode to NaN; the case reader refuses them in weights anyway.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_check.hpp"
#include "kernels/fp64_dequantize.hpp"

namespace moecheck::kernels {

namespace {

// e4m3fn: S.EEEE.MMM, bias 7; exponent field 0 is subnormal (M * 2^-9); S.1111.111 is NaN.
__device__ double decode_e4m3(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  double v;
  if (e == 0xF && m == 7) v = __longlong_as_double(0x7FF8000000000000LL);
  else if (e == 0) v = ldexp(double(m), -9);
  else v = ldexp(double(8 + m), e - 10);
  return (c & 0x80) ? -v : v;
}

__global__ void dequantize_fp64(const uint8_t* __restrict__ codes, const float* __restrict__ scales, int64_t N,
                                int64_t K, int64_t B, double* __restrict__ w) {
  const int64_t kb = (K + B - 1) / B;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * K; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / K, c = i % K;
    w[i] = decode_e4m3(codes[i]) * double(scales[(r / B) * kb + c / B]);
  }
}

}  // namespace

void launch_dequantize_fp64(const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B, double* w,
                            cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>((N * K + 255) / 256, 4096);
  if (blocks == 0) return;
  dequantize_fp64<<<unsigned(blocks), 256, 0, stream>>>(codes, scales, N, K, B, w);
  MOECHECK_CUDA_CHECK_LAUNCH("dequantize_fp64");
}

}  // namespace moecheck::kernels
