// Grouped FP8 x FP8 GEMM with DeepSeek block scales ("1d2d": 1x128 activation scales x 128x128
// weight scales), the GEMM1 and GEMM2 of the MoE (docs/DEVICE-ALGORITHM.md §3, §5).
//
//   D[r, n] = round_out( sum_b fl32(sa[r, b] * sb[e, n/128, b]) * p_b[r, n] ),  e = expert of r's tile
//   p_b     = tensor-core sum of the 128 products qa * qw of K block b, restarted from zero
//
// Tiling: one CTA computes a 64 x 128 tile of D (kGemmTileM x kGemmTileN): all 64 rows belong
// to one local expert (the permutation pads every expert to 64 rows) and the 128 columns to one
// weight-scale block, so each K block has one sb per CTA and one sa per row. 8 warps in a 2 x 4
// grid, 32 x 32 outputs per warp = 2 x 4 mma.sync.m16n8k32 e4m3 tiles.
//
// Two-level accumulation (DeepSeek-V3 report, arXiv 2412.19437 §3.3.2): `part` is the
// tensor-core accumulator of one 128-K block (4 chained MMAs of K = 32, the first one from
// zero); after each block it is promoted on the CUDA cores into `acc` with one FMUL for the
// scale product and one FFMA:
//   acc = __fmaf_rn(__fmul_rn(sa, sb), part, acc)
// written with the _rn intrinsics so the compiler can neither contract nor reorder them.
//
// NOTES:
//  - Shared-memory rows are padded from 128 to 144 bytes: the fragment loads (row g, byte 4t)
//    then hit 32 distinct banks (word 36g + t mod 32 = 4g + t).
//  - Fragment layouts of m16n8k32 with 8-bit A/B (PTX ISA, "Matrix Fragments for mma.m16n8k32"):
//    lane = 4g + t; A regs: {row g, k 4t..4t+3}, {row g+8, same k}, {row g, k 16+4t..}, {row g+8,
//    k 16+4t..}; B regs (col-major = W[n][k] rows): {n g, k 4t..4t+3}, {n g, k 16+4t..};
//    C/D: {row g, n 2t, 2t+1}, {row g+8, n 2t, 2t+1}. Bytes of a register are consecutive k.
//  - Padding rows hold zero codes and a finite scale: their outputs are exact zeros, and rows
//    never mix (each output element reads one A row), so nothing can leak between rows.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"

namespace moecheck::kernels {

namespace {

constexpr int kTileM = static_cast<int>(kGemmTileM);
constexpr int kTileN = static_cast<int>(kGemmTileN);
constexpr int kTileK = static_cast<int>(kScaleBlock);
constexpr int kRowBytes = kTileK + 16;  // padded shared-memory row (see NOTES)
constexpr int kThreads = 256;
static_assert(kTileN == 128 && kTileK == 128, "one weight-scale block per CTA column tile and K block");
static_assert(kTileM == 64, "the 2 x 4 warp grid below covers 64 rows");

struct GemmParams {
  const uint8_t* a;
  const float* a_scale;
  const uint8_t* b;
  const float* b_scale;
  const int32_t* tile_expert;
  int64_t n, k;
  float* d;
  bool bf16_out;
};

// D (16x8 f32) += A (16x32 e4m3, row) * B (32x8 e4m3, col), accumulator as the tensor core keeps it.
__device__ __forceinline__ void mma_e4m3_16x8x32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // FP8 MMA needs sm_89+; the library is built for sm_90a only
#endif
}

__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__global__ void __launch_bounds__(kThreads) sm90_fp8_grouped_gemm_1d2d_kernel(GemmParams p) {
  // Block scheduler: x = M tile (one expert), y = N tile (one weight-scale block).
  const int32_t expert = p.tile_expert[blockIdx.x];
  if (expert < 0) return;  // past the last tile of this routing
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileM;
  const int64_t n_tile = blockIdx.y;
  const int64_t k_blocks = p.k / kTileK;

  // Shared memory
  __shared__ __align__(16) uint8_t s_a[kTileM * kRowBytes];
  __shared__ __align__(16) uint8_t s_b[kTileN * kRowBytes];
  __shared__ float s_sa[kTileM];

  const uint8_t* g_a = p.a + row0 * p.k;
  const uint8_t* g_b = p.b + (static_cast<int64_t>(expert) * p.n + n_tile * kTileN) * p.k;
  const float* g_sa = p.a_scale + row0 * k_blocks;
  const float* g_sb = p.b_scale + (static_cast<int64_t>(expert) * (p.n / kTileN) + n_tile) * k_blocks;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;  // 2 x 4 warps, 32 x 32 outputs each
  const int g = lane >> 2, t = lane & 3;

  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;

  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    // Load the K block: A 64 x 128 and B 128 x 128 bytes, 16 bytes per thread and step.
    for (int i = tid; i < kTileM * (kTileK / 16); i += kThreads) {
      const int r = i >> 3, c16 = i & 7;
      *reinterpret_cast<uint4*>(s_a + r * kRowBytes + c16 * 16) =
          *reinterpret_cast<const uint4*>(g_a + r * p.k + kb * kTileK + c16 * 16);
    }
    for (int i = tid; i < kTileN * (kTileK / 16); i += kThreads) {
      const int r = i >> 3, c16 = i & 7;
      *reinterpret_cast<uint4*>(s_b + r * kRowBytes + c16 * 16) =
          *reinterpret_cast<const uint4*>(g_b + r * p.k + kb * kTileK + c16 * 16);
    }
    if (tid < kTileM) s_sa[tid] = g_sa[tid * k_blocks + kb];
    const float sb = g_sb[kb];
    __syncthreads();

    // Tensor-core sum of this block, from zero.
    float part[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int c = 0; c < 4; ++c) part[mi][ni][c] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kTileK / 32; ++ks) {
      uint32_t af[2][4], bfr[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const uint8_t* base = s_a + (wm * 32 + mi * 16 + g) * kRowBytes + ks * 32 + t * 4;
        af[mi][0] = lds32(base);
        af[mi][1] = lds32(base + 8 * kRowBytes);
        af[mi][2] = lds32(base + 16);
        af[mi][3] = lds32(base + 8 * kRowBytes + 16);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const uint8_t* base = s_b + (wn * 32 + ni * 8 + g) * kRowBytes + ks * 32 + t * 4;
        bfr[ni][0] = lds32(base);
        bfr[ni][1] = lds32(base + 16);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_e4m3_16x8x32(part[mi][ni], af[mi], bfr[ni]);
    }

    // Promote with scales
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s = __fmul_rn(s_sa[wm * 32 + mi * 16 + g + 8 * h], sb);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            acc[mi][ni][2 * h + c] = __fmaf_rn(s, part[mi][ni][2 * h + c], acc[mi][ni][2 * h + c]);
      }
    __syncthreads();  // the next block overwrites s_a, s_b, s_sa
  }

  // Epilogue: round to the output precision, two consecutive columns per 8-byte store.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row0 + wm * 32 + mi * 16 + g + 8 * h;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int64_t col = n_tile * kTileN + wn * 32 + ni * 8 + t * 2;
        float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
        if (p.bf16_out) {
          v0 = __bfloat162float(__float2bfloat16_rn(v0));
          v1 = __bfloat162float(__float2bfloat16_rn(v1));
        }
        *reinterpret_cast<float2*>(p.d + r * p.n + col) = make_float2(v0, v1);
      }
    }
}

}  // namespace

void launch_sm90_fp8_grouped_gemm(const GroupedGemmArgs& g, cudaStream_t stream) {
  const char* who = "sm90_fp8_grouped_gemm";
  require(g.n > 0 && g.n % kTileN == 0, who, "N must be a positive multiple of 128, got " + std::to_string(g.n));
  require(g.k > 0 && g.k % kTileK == 0, who, "K must be a positive multiple of 128, got " + std::to_string(g.k));
  require(g.experts >= 1, who, "need at least one expert");
  require(g.n / kTileN <= 65535, who, "N / 128 must be <= 65535 (grid y)");
  require(g.max_tiles >= 1, who, "need max_tiles >= 1");
  require_ptr(g.a, who, "A codes", 16);
  require_ptr(g.a_scale, who, "A scales", 4);
  require_ptr(g.b, who, "B codes", 16);
  require_ptr(g.b_scale, who, "B scales", 4);
  require_ptr(g.tile_expert, who, "tile_expert", 4);
  require_ptr(g.d, who, "D", 8);
  GemmParams p{g.a, g.a_scale, g.b, g.b_scale, g.tile_expert, g.n, g.k, g.d, g.out_precision == Precision::bf16};
  const dim3 grid(grid_x(g.max_tiles, who), static_cast<unsigned>(g.n / kTileN));
  sm90_fp8_grouped_gemm_1d2d_kernel<<<grid, kThreads, 0, stream>>>(p);
  MOECHECK_CUDA_CHECK_LAUNCH("sm90_fp8_grouped_gemm_1d2d_kernel");
}

}  // namespace moecheck::kernels
