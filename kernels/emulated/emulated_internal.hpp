// The stages of the emulated backend, one function each, shared by emulated_moe.cpp and the
// stage tests (tests/emulated_test.cpp). Numerics as emulated_moe.hpp states them.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/emulated/emulated_moe.hpp"
#include "reference/tensor_core_model.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::emulated {

// ---- routing (emulated_routing.cpp) -----------------------------------------------------
struct RoutingF32 {
  std::vector<int32_t> ids;    // [T, k] rank order
  std::vector<float> weights;  // [T, k] rsf applied, rounded to routing_weight_dtype
};
// logits [T, E], bias [E] or nullptr (only deepseek_v3 / sigmoid_renormalize accept one).
// Faults honoured: scaling_factor_missing, scaling_factor_twice, bias_ignored, bias_bf16,
// group_mask_zero, no_renormalize (others do not touch routing).
RoutingF32 route_f32(const MoeConfig& c, const float* logits, const float* bias, int64_t tokens, Fault fault);

// ---- formats and quantization (emulated_quant.cpp) --------------------------------------
// Exact e4m3fn -> float32 (NaN codes 0x7F / 0xFF -> NaN) without float subnormal operands.
void decode_e4m3(const uint8_t* codes, int64_t n, float* out);

struct QuantRule {
  ScaleFormat format = ScaleFormat::f32;
  double eps = 1e-10;
  bool no_eps = false;          // Fault::zero_group_nan
  bool ue8m0_mismatch = false;  // Fault::ue8m0_mismatch
  bool no_floor = false;        // recipe act_scale_floor = none: s = amax / 448, a zero group codes 0
  bool reciprocal = false;      // recipe quant_divide = reciprocal: q = e4m3(x * (1 / s))
};
// The dequantization scale of a group with max |x| = amax (and, under ue8m0_mismatch, the
// different scale used to quantize: *quant_scale; else *quant_scale = result).
float group_scale_f32(float amax, const QuantRule& r, float* quant_scale);
// One row x[n] per group of g: codes[n], scales[ceil(n/g)].
void quantize_row(const float* x, int64_t n, int64_t g, const QuantRule& r, uint8_t* codes, float* scales);

// ---- finalize (emulated_combine.cpp) ----------------------------------------------------
// out_bf16[T, H] from the slots' rows: row[t*k + j] is slot j's row of slot_out [rows, H]
// (-1: not local), weights [T, k], ids [T, k] global experts; the combine recipe decides the
// roundings and the order (emulated_moe.hpp). wrap > 0: Fault::int32_overflow, slot values
// read at flat index f = row * H + h taken mod wrap once f >= wrap.
void finalize(Combine how, int64_t T, int64_t k, int64_t H, const int32_t* ids, const float* weights,
              const int64_t* row, const float* slot_out, int64_t wrap, uint16_t* out_bf16);

// ---- block-scale GEMM (emulated_gemm.cpp) -----------------------------------------------
// C[M, N] (row-major, ldc = N) = sum over K blocks b (ascending) of fl32(sa[m, b] * sw[n/G, b]) *
// p_b(m, n), each promotion one fmaf, p_b the fixed-order float32 block sum of a[m, k] * w[n, k]
// (a: decoded activation codes, float [M, K]; w: e4m3 codes [N, K]).
// sa [M, ceil(K/G)], sw [ceil(N/G), ceil(K/G)], both row-major.
void block_scale_gemm(int64_t M, int64_t N, int64_t K, int64_t G, const float* a, const float* sa, const uint8_t* w,
                      const float* sw, float* C);
// The same GEMM with each block sum p_b computed by a tensor-core instruction model: the block's
// products in chained instructions of 32 (zero-padded), the first from zero, as DeepGEMM's and
// cuBLASLt's FP8 kernels run wgmma; the promotion as above. a holds e4m3 values (exact in float).
void block_scale_gemm_tc(const TensorCoreModel& tc, int64_t M, int64_t N, int64_t K, int64_t G, const float* a,
                         const float* sa, const uint8_t* w, const float* sw, float* C);
// The fixed-order float32 sum of a[i] * b[i], i < n: lane l sums the i = l mod 16 in
// ascending i, lanes then added pairwise (l + 8, l + 4, l + 2, l + 1).
float block_dot(const float* a, const float* b, int64_t n);

}  // namespace moecheck::emulated
