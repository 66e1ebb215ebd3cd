// Runs raw FP8 tensor-core instructions on test vectors, for `moecheck probe`: the device half of
// measuring how the H100/H200 accumulates e4m3 x e4m3 -> float32 (reference/tensor_core_model.hpp
// is the CPU half, tools/probe/ the test vectors and the fit).
//
// This header is plain C++ (the tile data is built and fitted without CUDA); only
// run_probe_tiles and probe_device_usable need the CUDA build (kernels/sm90_mma_probe.cu).
//
// Data layout, shared by every instruction form (ProbeTiles): a tile is one 64 x 8 block of
// independent dot products of length K = 32 * nk:
//   D[t][m][n] = C[t][m][n] + sum_k A[t][m][k] * B[t][n][k]        (m < 64, n < 8, k < K)
// computed as nk chained instructions of K = 32 (instruction i reads k in [32 i, 32 i + 32) and
// takes the previous instruction's float32 D as its C), exactly as the kernels of an engine chain
// them inside one 128-wide scale block. A and B are e4m3fn codes, K contiguous (B is "K-major",
// the only B layout FP8 wgmma takes); C and D are float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moecheck::kernels {

inline constexpr int kProbeTileM = 64;
inline constexpr int kProbeTileN = 8;
inline constexpr int kProbeInstrK = 32;

enum class ProbeInstruction {
  wgmma,     // wgmma.mma_async m64n8k32 f32.e4m3.e4m3 (sm_90a, operands in shared memory): QGMMA
  mma_sync,  // mma.sync m16n8k32 f32.e4m3.e4m3 (four per tile): what sm_90 lowers it to
};
inline std::string probe_instruction_name(ProbeInstruction i) {
  return i == ProbeInstruction::wgmma ? "wgmma.m64n8k32.f32.e4m3.e4m3" : "mma.sync.m16n8k32.f32.e4m3.e4m3";
}

struct ProbeTiles {
  int64_t tiles = 0;
  int nk = 1;                // chained instructions per dot product (K = 32 nk)
  std::vector<uint8_t> a;    // [tiles][64][K]
  std::vector<uint8_t> b;    // [tiles][8][K]
  std::vector<float> c;      // [tiles][64][8]
  int64_t k() const { return int64_t(kProbeInstrK) * nk; }
  void resize(int64_t n, int k_instr) {
    tiles = n;
    nk = k_instr;
    a.assign(size_t(n) * kProbeTileM * k(), 0);
    b.assign(size_t(n) * kProbeTileN * k(), 0);
    c.assign(size_t(n) * kProbeTileM * kProbeTileN, 0.0f);
  }
};

// Runs every tile on the current CUDA device with the instruction `ins`; returns D [tiles][64][8].
// Throws CudaError on any CUDA failure and std::runtime_error when the device cannot run `ins`
// (wgmma needs compute capability 9.0 and a binary built for sm_90a). `d` is poisoned with NaN
// before the launch and checked afterwards: an element left unwritten is an error.
std::vector<float> run_probe_tiles(const ProbeTiles& t, ProbeInstruction ins);

// Whether a CUDA device is usable, with the reason when it is not.
bool probe_device_usable(std::string* why, std::string* name);

}  // namespace moecheck::kernels
