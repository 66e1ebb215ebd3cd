// Weight codes from row_major [E, N, K] into block_tiles [E, N/128, K/128, 16 KiB]
// (moe_stages.hpp, WeightLayout): a copy that moves bytes, never changes one.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"
#include "kernels/sm90_wgmma.cuh"

namespace moecheck::kernels {

namespace {

constexpr int kBlock = static_cast<int>(kScaleBlock);
constexpr int kTileBytes = kBlock * kBlock;
constexpr int kThreads = 256;

// One CTA per 128 x 128 block: 1024 chunks of 16 bytes, chunk i = row i / 8, column 16 (i % 8),
// read row by row (coalesced) and written to its swizzled place in the tile.
__global__ void __launch_bounds__(kThreads) pack_weight_tiles_kernel(const uint8_t* __restrict__ w, int64_t n, int64_t k,
                                                                      uint8_t* __restrict__ tiles) {
  const int64_t blocks_k = k / kBlock, blocks_n = n / kBlock;
  const int64_t tile = blockIdx.x;  // (e, n block, k block), k block fastest
  const int64_t kb = tile % blocks_k, panel = tile / blocks_k;  // panel = e * blocks_n + n block
  const int64_t e = panel / blocks_n, nb = panel % blocks_n;
  const uint8_t* src = w + (e * n + nb * kBlock) * k + kb * kBlock;
  uint8_t* dst = tiles + tile * kTileBytes;
  for (int i = threadIdx.x; i < kTileBytes / 16; i += kThreads) {
    const int row = i >> 3, c16 = i & 7;
    const uint4 v = *reinterpret_cast<const uint4*>(src + row * k + 16 * c16);
    *reinterpret_cast<uint4*>(dst + sm90::swizzle_offset(row, c16)) = v;
  }
}

}  // namespace

void launch_pack_weight_tiles(const uint8_t* row_major, int64_t experts, int64_t n, int64_t k, uint8_t* tiles,
                              cudaStream_t stream) {
  const char* who = "pack_weight_tiles";
  require(experts >= 1, who, "need at least one expert");
  require(n > 0 && n % kBlock == 0 && k > 0 && k % kBlock == 0, who,
          "N and K must be positive multiples of 128, got " + std::to_string(n) + " x " + std::to_string(k));
  require_ptr(row_major, who, "row-major weights", 16);
  require_ptr(tiles, who, "block tiles", 16);
  const auto bytes = static_cast<uintptr_t>(experts * n * k);
  const auto a = reinterpret_cast<uintptr_t>(row_major), b = reinterpret_cast<uintptr_t>(tiles);
  require(a + bytes <= b || b + bytes <= a, who, "the row-major weights and the tiles overlap");
  pack_weight_tiles_kernel<<<grid_x(experts * (n / kBlock) * (k / kBlock), who), kThreads, 0, stream>>>(row_major, n, k,
                                                                                                     tiles);
  MOECHECK_CUDA_CHECK_LAUNCH("pack_weight_tiles_kernel");
}

void launch_pack_layer_weight_tiles(const MoeConfig& c, const uint8_t* w13, const uint8_t* w2, uint8_t* t13,
                                    uint8_t* t2, cudaStream_t stream) {
  const int64_t El = c.local_experts(), H = c.hidden_size, I = c.intermediate_size;
  launch_pack_weight_tiles(w13, El, 2 * I, H, t13, stream);
  launch_pack_weight_tiles(w2, El, H, I, t2, stream);
}

}  // namespace moecheck::kernels
