// Hopper (sm_90a) building blocks of the FP8 grouped GEMM: cp.async copies, shared-memory matrix
// descriptors and the wgmma e4m3 x e4m3 -> f32 instruction for the token widths the GEMM uses.
//
// NOTES:
//  - Operand layout in shared memory: K-major with the 128-byte swizzle. A 128-wide K block of
//    R rows is R rows of 128 contiguous bytes; in row r, 16-byte chunk c (k = 16c .. 16c + 15)
//    sits at chunk position c ^ (r mod 8) (swizzle_offset). Groups of 8 rows (1024 bytes, the
//    swizzle atom, 1024-byte aligned) are the descriptor's stride-dimension byte offset apart;
//    its leading-dimension offset is unused (one k32 instruction reads 32 bytes of each row,
//    inside the atom). Slice s of the block (k = 32s .. 32s + 31) is addressed by moving the
//    descriptor's start 32 s bytes: the hardware applies the XOR to the full address, which is
//    why the atoms must be 1024-byte aligned. With this layout a warp's 16-byte copies can
//    cover 4 whole 128-byte rows (full-line L2 requests) and still hit 32 distinct banks.
//  - cp.async writes through the generic proxy; wgmma reads through the async proxy. Each
//    writing thread waits for its copies, issues fence.proxy.async.shared::cta, then a barrier.
//  - The f32 D fragment of m64nNk32 (PTX ISA, "wgmma register fragments"): thread 32 w + 4 g + t
//    of the warpgroup holds, for j in [0, N/8): d[4j], d[4j+1] = row 16 w + g, columns 8j + 2t
//    and 8j + 2t + 1; d[4j+2], d[4j+3] = row 16 w + g + 8, the same columns.
#pragma once

#include <cstdint>

namespace moecheck::kernels::sm90 {

inline constexpr int kSwizzleRowBytes = 128;  // one row of a K block
inline constexpr int kSwizzleAtomBytes = 1024; // 8 rows: the descriptor's stride-dimension offset

// Byte offset of 16-byte chunk c16 of row `row` in a 128-wide K block.
__device__ __forceinline__ int swizzle_offset(int row, int c16) { return row * kSwizzleRowBytes + ((c16 ^ (row & 7)) << 4); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Descriptor of a K-major 128B-swizzled operand whose slice starts at shared address `addr`.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  uint64_t d = uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t(1) << 16;                                   // leading-dimension offset: unused
  d |= uint64_t((kSwizzleAtomBytes >> 4) & 0x3FFF) << 32;  // stride-dimension offset
  d |= uint64_t(1) << 62;                                   // layout: 128-byte swizzle
  return d;
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// The same, asking L2 to fetch the whole aligned 256 bytes around it: a weight row's next K block
// then comes from L2, and DRAM sees 256-byte runs instead of 128-byte ones.
__device__ __forceinline__ void cp_async_16_l2_256(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// D (64 x N, f32 fragment) = A (64 x 32 e4m3, descriptor da) * B (32 x N e4m3, descriptor db)
// + (accumulate ? D : 0). Both operands K-major.
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[N / 2], uint64_t da, uint64_t db, int accumulate);

template <>
__device__ __forceinline__ void wgmma_e4m3<8>(float (&d)[4], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_e4m3<16>(float (&d)[8], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_e4m3<32>(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_e4m3<128>(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

// The tensor-core sum of one 128-wide K block into `part`, from zero: 4 chained k32 instructions
// over descriptors stepped 32 bytes (the accumulation TensorCoreModel::hopper_wgmma models; the
// GEMM's contract, docs/DEVICE-ALGORITHM.md §3), committed as one group and waited for. A
// (64 rows) and B (N rows) at shared addresses a and b, both K-major in the 128-byte swizzle.
template <int N>
__device__ __forceinline__ void wgmma_block_sum(float (&part)[N / 2], uint32_t a, uint32_t b) {
  wgmma_fence();
#pragma unroll
  for (int q = 0; q < 4; ++q) wgmma_e4m3<N>(part, smem_desc(a + 32 * q), smem_desc(b + 32 * q), q > 0 ? 1 : 0);
  wgmma_commit();
  wgmma_wait_all();
}

// ---- mbarriers, bulk and tensor copies (PTX ISA: "mbarrier", "cp.async.bulk", "cp.async.bulk.tensor") ----
// The copies write through the async proxy and complete on an mbarrier's transaction count, so a
// thread that has seen the phase complete may hand the bytes to wgmma (also the async proxy)
// without a proxy fence.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialised mbarriers visible to the async proxy (the copies' complete_tx).
__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// This thread's arrival, announcing `bytes` of transactions that complete the phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the phase of the given parity has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once (how a producer finds every stage free the first time).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"  // labels are local to the braces
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory as one
// bulk transaction that completes on mbarrier `bar`.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// The box of a 2D tensor map (a CUtensorMap kernel parameter, __grid_constant__) at element
// coordinates (x innermost, y) into shared memory, completing on `bar`. Elements outside the
// tensor arrive as zeros and still count toward the transaction bytes.
__device__ __forceinline__ void tensor_copy_2d_g2s(uint32_t dst, const void* tensor_map, int32_t x, int32_t y,
                                                   uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

}  // namespace moecheck::kernels::sm90
