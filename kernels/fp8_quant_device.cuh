// Device-side pieces of the FP8 quantization recipe shared by the activation quantization
// (fp8_group_quant.cu) and the SiLU*up re-quantization (silu_mul_quant.cu). The recipe and its
// rounding steps are docs/DEVICE-ALGORITHM.md §2 and reference/fp8_quant.hpp; every function
// here is bit-exact with the float64 reference's group_scale / e4m3_encode_satfinite.
//
// NOTES:
//  - Compiled without --use_fast_math (kernels/CMakeLists.txt): divisions are spelled __fdiv_rn
//    anyway, so they stay correctly rounded even if someone adds -prec-div=false, and no FTZ.
//  - One warp quantizes one group of 128 values, 4 consecutive values per lane.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace moecheck::kernels::device {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr int kGroup = 128;

// amax combine that propagates NaN (the reference lets a NaN anywhere poison its group's scale).
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }

__device__ __forceinline__ float warp_amax(float v) {
  for (int off = 16; off > 0; off >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Smallest power of two >= s, exponent clamped to [-127, 127] (UE8M0; reference
// ue8m0_encode_ceil). s >= 0 or NaN. Works on the bits, so exact for subnormal s too.
__device__ __forceinline__ float ue8m0_ceil(float s) {
  if (s != s) return s;
  const uint32_t b = __float_as_uint(s);
  const int ex = static_cast<int>((b >> 23) & 0xFFu);
  const uint32_t man = b & 0x7FFFFFu;
  int e;
  if (ex == 0) e = man > (1u << 22) ? -126 : -127;  // subnormal: (2^-127, 2^-126) -> -126, else clamp
  else e = ex - 127 + (man != 0 ? 1 : 0);           // inf (ex 255) lands above 127 and clamps
  e = max(-127, min(127, e));
  return e >= -126 ? __uint_as_float(static_cast<uint32_t>(e + 127) << 23) : __uint_as_float(1u << 22);
}

// Scale of one group: s = fl32(max(amax, eps) / 448), or its UE8M0 ceiling.
// eps_scale = fl32(eps / 448) is computed on the host in double (the quotient the reference
// takes when eps wins); the comparison is done in double because eps is a double.
__device__ __forceinline__ float group_scale(float amax, double eps, float eps_scale, bool ue8m0) {
  float s;
  if (amax != amax) s = amax;
  else if (static_cast<double>(amax) >= eps) s = __fdiv_rn(amax, kE4m3Max);  // correctly rounded
  else s = eps_scale;
  return ue8m0 ? ue8m0_ceil(s) : s;
}

// e4m3fn, round to nearest even, saturating to +-448 (cvt.rn.satfinite.e4m3x2.f32).
__device__ __forceinline__ uint8_t e4m3_satfinite(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Four values -> four codes packed little-endian (value i in byte i), q = e4m3(fl32(x / s)).
__device__ __forceinline__ uint32_t quantize4(float x0, float x1, float x2, float x3, float s) {
  return static_cast<uint32_t>(e4m3_satfinite(__fdiv_rn(x0, s))) |
         (static_cast<uint32_t>(e4m3_satfinite(__fdiv_rn(x1, s))) << 8) |
         (static_cast<uint32_t>(e4m3_satfinite(__fdiv_rn(x2, s))) << 16) |
         (static_cast<uint32_t>(e4m3_satfinite(__fdiv_rn(x3, s))) << 24);
}

__device__ __forceinline__ void load4(const float* x, float v[4]) {
  const float4 q = *reinterpret_cast<const float4*>(x);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* x, float v[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(x);
  v[0] = __uint_as_float(q.x << 16);  // bf16 -> float is exact: the bits move up
  v[1] = __uint_as_float(q.x & 0xFFFF0000u);
  v[2] = __uint_as_float(q.y << 16);
  v[3] = __uint_as_float(q.y & 0xFFFF0000u);
}

// One group of 128 values held by one warp, lane l's four values v being the group's 4l .. 4l + 3
// -> codes q [128] (one 32-bit store per lane); returns the group's scale to every lane.
__device__ __forceinline__ float quantize_lane_values(const float (&v)[4], double eps, float eps_scale, bool ue8m0,
                                                      uint8_t* q) {
  const int lane = threadIdx.x & 31;
  float amax = nan_max(nan_max(fabsf(v[0]), fabsf(v[1])), nan_max(fabsf(v[2]), fabsf(v[3])));
  amax = warp_amax(amax);
  const float s = group_scale(amax, eps, eps_scale, ue8m0);
  *reinterpret_cast<uint32_t*>(q + 4 * lane) = quantize4(v[0], v[1], v[2], v[3], s);
  return s;
}

// The same for a group read from memory: x [128] (16-byte aligned for float, 8 for bf16).
template <class T>
__device__ __forceinline__ float quantize_group(const T* x, double eps, float eps_scale, bool ue8m0, uint8_t* q) {
  float v[4];
  load4(x + 4 * (threadIdx.x & 31), v);
  return quantize_lane_values(v, eps, eps_scale, ue8m0, q);
}

// Rounding of an intermediate to its dtype (Precision::bf16: RNE; f32: none).
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

}  // namespace moecheck::kernels::device
