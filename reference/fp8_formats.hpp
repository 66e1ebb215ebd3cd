// Narrow number formats: float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, UE8M0 scale bytes and
// bfloat16. Exact decoding and correctly rounded encoding, on the host, in plain C++.
//
// Numerics (e4m3fn, e5m2: OCP 8-bit Floating Point Specification; e4m3fnuz: LLVM APFloat.h;
// saturation modes: CUDA Math API FP8 conversions; UE8M0 ceil: DeepGEMM deep_gemm/utils/math.py):
//  - decode is exact: every code's value is representable in float and double.
//  - encode rounds the exact input value (float or double; no intermediate rounding) to the
//    nearest representable value, ties to even. Saturation::finite clamps magnitudes beyond the
//    largest finite value (inf included) to it; Saturation::none gives NaN (e4m3fn, e4m3fnuz) or
//    inf (e5m2). For e4m3fn |x| in (448, 464] rounds to 448 in both modes (464 is the midpoint to
//    the non-existent 480, and 448 has the even mantissa). NaN input always gives the NaN code.
//  - e4m3fn: no inf, NaN = S.1111.111 (0x7F/0xFF), max 448, min subnormal 2^-9.
//    e5m2: IEEE-like, inf = S.11111.00, NaN = S.11111.{01,10,11}, max 57344.
//    e4m3fnuz: bias 8, no inf, no -0, NaN = 0x80 only, max 240, min subnormal 2^-10;
//    a negative value rounding to zero encodes as +0 (0x00).
//  - UE8M0: value 2^(code-127), code 0xFF = NaN. Encoding rounds up (ceil) to a power of two.
//  - bfloat16: encode is RNE from the exact input, overflow to inf, NaN kept quiet.
#pragma once

#include <cstdint>
#include <string_view>
#include <optional>

namespace moecheck {

enum class Fp8Format { e4m3fn, e5m2, e4m3fnuz };
enum class Saturation { finite, none };

std::string_view to_string(Fp8Format f);
std::optional<Fp8Format> parse_fp8_format(std::string_view s);  // "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz"

// Exact value of a code (NaN codes -> quiet NaN; e5m2 inf codes -> +-inf).
double fp8_decode(uint8_t code, Fp8Format f);
// The 256 decoded values as float, for hot loops (table[code]).
const float* fp8_table(Fp8Format f);
// Round x (exact value) to the nearest code, ties to even, with the given saturation.
uint8_t fp8_encode(double x, Fp8Format f, Saturation s = Saturation::finite);

// Largest finite value of the format (448, 57344, 240).
double fp8_max(Fp8Format f);

// Shorthands for the format the MoE path uses; e4m3 quantization always saturates.
inline float e4m3_decode(uint8_t code) { return fp8_table(Fp8Format::e4m3fn)[code]; }
uint8_t e4m3_encode_satfinite(float x);  // fast path, same result as fp8_encode(x, e4m3fn, finite)

// UE8M0 scale bytes.
double ue8m0_decode(uint8_t code);          // 2^(code-127); 0xFF -> NaN
uint8_t ue8m0_encode_ceil(double x);        // smallest 2^e >= x, e clamped to [-127, 127]; NaN -> 0xFF
                                            // x <= 0 -> 0x00 (2^-127)

// bfloat16.
float bf16_decode(uint16_t bits);
uint16_t bf16_encode(double x);             // RNE from the exact value
inline float bf16_round(double x) { return bf16_decode(bf16_encode(x)); }

// float32 rounding of a double, named so that the reference says where fl32 happens.
inline float fl32(double x) { return static_cast<float>(x); }

}  // namespace moecheck
