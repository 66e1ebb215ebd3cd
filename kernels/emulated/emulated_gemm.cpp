// The FP8 block-scale GEMM of the emulated backend (DEVICE-ALGORITHM.md §3, §5) in float32.
//
// C[m, n] = sum over K blocks b, ascending, of fl32(sa[m, b] * sw[n / G, b]) * p_b(m, n), each
// step one fmaf (the device's FFMA promotion). p_b is the block's sum of a[m, k] * w[n, k]:
// every product of two e4m3 values is exact in float32 (4 x 4 significant bits, exponents far
// inside the range), so a mul-then-add and an FMA give the same sum; only the summation order
// matters, and it is fixed (block_dot): 16 lanes, element i in lane i mod 16 in ascending i,
// then a pairwise tree. A value therefore depends only on its row of A, its row of W and the
// scales: never on M, the other tokens of the expert, the thread count or the CPU.
//
// Speed: the lanes are GCC/Clang vector types (16 floats in one zmm with AVX-512, two halves
// of 8 otherwise: the same lane-wise operations, so AVX-512, AVX2 and plain SSE2 builds give
// the same bits). W is streamed once per tile of A rows (sized to stay in L2), four rows of W
// at a time, decoded one K block at a time into an L1 buffer that every A row of the tile
// takes its four dots with (four independent add chains). The decode never feeds a float
// subnormal to the FPU (Intel cores take a microcode assist per such operand: 5x slower).
// A ragged block (K not a multiple of G, or G not a multiple of 16) takes the scalar path,
// which is the definition itself.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels/emulated/emulated_internal.hpp"

namespace moecheck::emulated {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kAhead = 512;  // bytes of a W row prefetched ahead of the block being decoded
typedef float V16 __attribute__((vector_size(64)));
typedef uint32_t U16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));
typedef uint32_t U8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));
typedef uint32_t U4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef float V2 __attribute__((vector_size(8)));

// e4m3 codes (zero-extended to 32-bit lanes) -> floats, decode_e4m3's arithmetic
// (emulated_quant.cpp) lane-wise. VF / VU / VI: float / uint32 / int32 vectors of one width.
template <class VF, class VU, class VI>
inline VF decode_lanes(VU c) {
  const VU mag = c & 0x7Fu;
  const VU normal = (mag << 20) + (120u << 23);
  const VF sub = __builtin_convertvector(reinterpret_cast<VI>(mag), VF) * 0x1p-9f;
  // Selections as and/or with all-ones lane masks (a vector ?: is lowered to scalar code on SSE2).
  const VU is_normal = reinterpret_cast<VU>(reinterpret_cast<VI>(mag) > 7);
  const VU is_nan = reinterpret_cast<VU>(reinterpret_cast<VI>(mag) == 0x7F);
  VU bits = (normal & is_normal) | (reinterpret_cast<VU>(sub) & ~is_normal);
  bits = (bits & ~is_nan) | (is_nan & 0x7FC0'0000u);
  return reinterpret_cast<VF>(bits | ((c & 0x80u) << 24));
}

// 16 codes -> out[16]. The zero-extension of bytes is spelled with intrinsics (compilers lower
// the generic form badly, through the stack, for some -march): one 16-lane vector with
// AVX-512, two of 8 lanes with AVX2, four of 4 with SSE2 (every x86-64).
inline void decode16(const uint8_t* p, float* out) {
#if defined(__AVX512F__)
  const U16 c = reinterpret_cast<U16>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  const V16 v = decode_lanes<V16, U16, I16>(c);
  std::memcpy(out, &v, sizeof v);
#elif defined(__AVX2__)
  for (int half = 0; half < 2; ++half) {
    const U8 c = reinterpret_cast<U8>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half))));
    const V8 v = decode_lanes<V8, U8, I8>(c);
    std::memcpy(out + 8 * half, &v, sizeof v);
  }
#elif defined(__SSE2__)
  const __m128i z = _mm_setzero_si128(), b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i w[2] = {_mm_unpacklo_epi8(b, z), _mm_unpackhi_epi8(b, z)};
  for (int q = 0; q < 4; ++q) {
    const __m128i c = (q & 1) ? _mm_unpackhi_epi16(w[q / 2], z) : _mm_unpacklo_epi16(w[q / 2], z);
    const V4 v = decode_lanes<V4, U4, I4>(reinterpret_cast<U4>(c));
    std::memcpy(out + 4 * q, &v, sizeof v);
  }
#else
  for (int q = 0; q < 4; ++q) {
    U4 c;
    for (int l = 0; l < 4; ++l) c[l] = p[4 * q + l];
    const V4 v = decode_lanes<V4, U4, I4>(c);
    std::memcpy(out + 4 * q, &v, sizeof v);
  }
#endif
}

// The tree on lanes 0..15 held as h = lanes 0..7 + lanes 8..15 (the first level done): then
// lane l += lane l + 4, + 2, + 1.
inline float reduce8(V8 h) {
  const V4 q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  const V2 d = __builtin_shufflevector(q, q, 0, 1) + __builtin_shufflevector(q, q, 2, 3);
  return d[0] + d[1];
}

template <class V>
inline V loadv(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// out[r] = block_dot(a, w + r * ldw, n) for r < R, n a multiple of 16. With AVX-512 the 16
// lanes are one register; otherwise two halves of 8 (lanes 0..7 and 8..15), so that GCC keeps
// the accumulators in registers on AVX2 and SSE too.
template <int R>
inline void block_dots16(const float* a, const float* w, int64_t ldw, int64_t n, float* out) {
#if defined(__AVX512F__)
  V16 lane[R];
  for (int r = 0; r < R; ++r) lane[r] = V16{};
  for (int64_t i = 0; i < n; i += kLanes) {
    const V16 av = loadv<V16>(a + i);
    for (int r = 0; r < R; ++r) lane[r] += av * loadv<V16>(w + r * ldw + i);
  }
  for (int r = 0; r < R; ++r)
    out[r] = reduce8(__builtin_shufflevector(lane[r], lane[r], 0, 1, 2, 3, 4, 5, 6, 7) +
                     __builtin_shufflevector(lane[r], lane[r], 8, 9, 10, 11, 12, 13, 14, 15));
#else
  V8 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = V8{};
  for (int64_t i = 0; i < n; i += kLanes) {
    const V8 al = loadv<V8>(a + i), ah = loadv<V8>(a + i + 8);
    for (int r = 0; r < R; ++r) {
      lo[r] += al * loadv<V8>(w + r * ldw + i);
      hi[r] += ah * loadv<V8>(w + r * ldw + i + 8);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = reduce8(lo[r] + hi[r]);
#endif
}

// The rows [n0, n0 + R) of C for the A rows [m0, m1), promotions in block order.
template <int R>
void row_group(int64_t m0, int64_t m1, int64_t n0, int64_t N, int64_t K, int64_t G, const float* a, const float* sa,
               const uint8_t* w, const float* sw, float* C, std::vector<float>& wb, std::vector<float>& acc) {
  const int64_t KB = (K + G - 1) / G;
  std::fill(acc.begin(), acc.begin() + (m1 - m0) * R, 0.0f);
  const float* swr[R];
  for (int r = 0; r < R; ++r) swr[r] = sw + ((n0 + r) / G) * KB;
  for (int64_t b = 0; b < KB; ++b) {
    const int64_t k0 = b * G, len = std::min(G, K - k0);
    const bool vector = len % kLanes == 0;
    for (int r = 0; r < R; ++r) {
      const uint8_t* src = w + (n0 + r) * K + k0;
      float* dst = wb.data() + r * G;
      // R interleaved streams through W defeat the hardware prefetcher: ask a few blocks ahead.
      if (k0 + kAhead < K) __builtin_prefetch(src + kAhead), __builtin_prefetch(src + kAhead + 64);
      if (vector) {
        for (int64_t i = 0; i < len; i += kLanes) decode16(src + i, dst + i);
      } else {
        decode_e4m3(src, len, dst);
      }
    }
    for (int64_t m = m0; m < m1; ++m) {
      float p[R];
      if (vector) {
        block_dots16<R>(a + m * K + k0, wb.data(), G, len, p);
      } else {
        for (int r = 0; r < R; ++r) p[r] = block_dot(a + m * K + k0, wb.data() + r * G, len);
      }
      const float s_a = sa[m * KB + b];
      float* am = acc.data() + (m - m0) * R;
      for (int r = 0; r < R; ++r) am[r] = std::fma(s_a * swr[r][b], p[r], am[r]);
    }
  }
  for (int64_t m = m0; m < m1; ++m)
    for (int r = 0; r < R; ++r) C[m * N + n0 + r] = acc[(m - m0) * R + r];
}

}  // namespace

float block_dot(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % kLanes] += a[i] * b[i];
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

void block_scale_gemm(int64_t M, int64_t N, int64_t K, int64_t G, const float* a, const float* sa, const uint8_t* w,
                      const float* sw, float* C) {
  constexpr int kRows = 4;
  const int64_t tile = std::max<int64_t>(1, (int64_t(1) << 17) / K);  // ~512 KiB of A rows
  std::vector<float> wb(kRows * G), acc(tile * kRows);
  for (int64_t m0 = 0; m0 < M; m0 += tile) {
    const int64_t m1 = std::min(M, m0 + tile);
    int64_t n0 = 0;
    for (; n0 + kRows <= N; n0 += kRows) row_group<kRows>(m0, m1, n0, N, K, G, a, sa, w, sw, C, wb, acc);
    for (; n0 < N; ++n0) row_group<1>(m0, m1, n0, N, K, G, a, sa, w, sw, C, wb, acc);
  }
}

}  // namespace moecheck::emulated
