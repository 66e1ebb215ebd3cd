// Device fills for `moecheck bench` (bench_fill.cu): random FP8 weights, positive block scales,
// normal-ish bf16 activations and float logits, all on the default stream; and the read that
// refills the L2 between timed runs, on the bench's stream. Plain C++ header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moecheck::kernels {

// Random e4m3 codes, never the NaN codes S.1111.111 (they become 0).
void fill_fp8(void* p, size_t n, uint64_t seed);
// positive: base * U[0.5, 1.5); else base * (sum of four uniforms, centred, unit variance).
void fill_float(void* p, size_t n, uint64_t seed, float base, bool positive);
// bf16 bits of unit-variance normal-ish values (|x| <= 2 sqrt 3).
void fill_bf16(void* p, size_t n, uint64_t seed);
// Reads `bytes` of p (a multiple of 16, 16-byte aligned) on `stream`, so that L2 then holds clean
// lines of p; sink: one device word it may write.
void read_through(const void* p, size_t bytes, uint32_t* sink, cudaStream_t stream);

}  // namespace moecheck::kernels
