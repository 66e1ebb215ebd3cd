// Device fills for `moecheck bench` (bench_fill.cu): random FP8 weights, positive block scales,
// normal-ish bf16 activations and float logits, all on the default stream. Plain C++ header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moecheck::kernels {

// Random e4m3 codes, never the NaN codes S.1111.111 (they become 0).
void fill_fp8(void* p, size_t n, uint64_t seed);
// positive: base * U[0.5, 1.5); else base * (sum of four uniforms, centred, unit variance).
void fill_float(void* p, size_t n, uint64_t seed, float base, bool positive);
// bf16 bits of unit-variance normal-ish values (|x| <= 2 sqrt 3).
void fill_bf16(void* p, size_t n, uint64_t seed);

}  // namespace moecheck::kernels
