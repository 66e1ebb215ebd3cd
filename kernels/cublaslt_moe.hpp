// The FP8 block-scale MoE layer on cuBLASLt (backend "cublaslt"): the vendor library's
// block-scaled FP8 GEMM (cuBLAS >= 12.9, sm_90 only) in place of our grouped GEMM kernel, with
// the cuda backend's own stages around it (moe_stages.hpp: routing, activation quantization,
// permutation + gather, SiLU*up re-quantization, finalize). Same inputs, outputs and numerics
// contract as fp8_block_scale_moe.hpp (docs/DEVICE-ALGORITHM.md); plain C++ header (no
// cuBLASLt types), so host code compiled by g++ calls it directly.
//
// One cublasLtMatmul per local expert that has tokens, for GEMM1 and for GEMM2:
//   D_e [M_e x N] = A_e [M_e x K] * W_e [N x K]^T,  M_e = the expert's padded row block
// (a multiple of kGemmTileM = 64, so cuBLASLt's "M and N multiples of 4" holds; the padding
// rows hold whatever the workspace held, moe_stages.hpp, and cuBLASLt computes their D rows
// from it, which no later stage reads: rows never mix). In cuBLASLt's column-major
// terms (cuBLAS docs §3.1.4.5; NVIDIA/CUDALibrarySamples cuBLASLt/LtBlk128x128Fp8Matmul), with
// the default operand order weights_as_a:
//   A = W_e  e4m3, K x N, lda K, op T, scales BLK128x128_32F: K-major [N/128][L4], L4 = L
//       rounded up to a multiple of 4 (L = K/128); we repack the caller's [N/128][L] copy;
//   B = A_e  e4m3, K x M_e, ldb K, op N, scales VEC128_32F: [L][M_e], contiguous along the
//       tokens (the transpose of the gather's row-major scales; a small kernel writes it);
//   D = float32, N x M_e column-major, ldd N (= row-major [M_e, N], written in place);
// compute CUBLAS_COMPUTE_32F, scale type CUDA_R_32F, alpha = 1, beta = 0, fast accumulation
// off. GEMM1's float32 D is then rounded to intermediate_dtype by our kernel; GEMM2's stays
// float32 (the slot outputs). Order activations_as_a swaps the roles (A = tokens with
// VEC128, B = weights with BLK128x128, D = [N x M_e] row-major, transposed by our kernel
// into the row layout); it exists to compare two of cuBLASLt's kernel families.
//
// Host synchronisation: cuBLASLt takes each GEMM's M on the host, so a run copies the
// permutation's row offsets to pinned host memory and synchronises `stream` once, after the
// permutation. A run therefore cannot be captured into a CUDA graph (std::invalid_argument
// when `stream` is capturing). Work after that point is asynchronous on `stream`.
//
// Seen on an H200 (cuBLASLt 13.1.0, one run of tests/gpu_cublaslt_test.cpp): for every shape
// tested the heuristic's first choice was algo 66, tile 128x128, stages 128xAUTO, in both
// operand orders; split-K 2 with a separate float32 reduction (2 MiB workspace) for the
// DeepSeek-V3 GEMM1 (64 rows, N 4096, K 7168), no split-K elsewhere. Results run-to-run
// bit-identical; errors within the same bounds as our kernel's (GEMM ratios <= 0.09).
//
// Errors: the cuda backend's argument rules (std::invalid_argument, before any launch);
// cuBLASLt failures and "the heuristic returned no algorithm" are moecheck::CudaError naming
// the call, the cuBLAS status and the GEMM's shape.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/fp8_block_scale_moe.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::kernels {

enum class CublasLtOperandOrder {
  weights_as_a,      // A = weights (BLK128x128), B = activations (VEC128), D written in place
  activations_as_a,  // A = activations (VEC128), B = weights (BLK128x128), D transposed after
};
const char* to_string(CublasLtOperandOrder o);

// What cuBLASLt chose for one GEMM shape of the last run (cublasLtMatmulAlgoGetHeuristic's
// first result). m, n, k in our terms: m = expert rows, n = output columns, k = reduction.
struct CublasLtGemmChoice {
  int gemm = 0;  // 1 or 2
  int64_t m = 0, n = 0, k = 0;
  int experts = 0;       // GEMMs of the run with this shape
  std::string algo;      // "algo=<id> tile=<cublasLtMatmulTile_t> stages=... splitk=... ..."
};

// Device scratch of the cuBLASLt MoE for up to max_tokens tokens of one shape (k, E_local, H,
// I): the cuda backend's MoeWorkspace (every stage buffer; buffers() as there) plus the
// transposed activation scales, the repacked weight scales, cuBLASLt's workspace (32 MiB) and
// the cuBLASLt handle. Owns its memory; move-only; one stream at a time. Construction needs
// an sm_90 device and a cuBLASLt library >= 12.9 at run time (std::runtime_error otherwise).
class CublasLtMoeWorkspace {
 public:
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
  // Device bytes of both allocations (validates c as the cuda backend does; no GPU needed).
  static size_t required_bytes(const MoeConfig& c, int64_t max_tokens,
                               CublasLtOperandOrder order = CublasLtOperandOrder::weights_as_a);
  CublasLtMoeWorkspace();
  CublasLtMoeWorkspace(const MoeConfig& c, int64_t max_tokens,
                       CublasLtOperandOrder order = CublasLtOperandOrder::weights_as_a);
  ~CublasLtMoeWorkspace();
  CublasLtMoeWorkspace(CublasLtMoeWorkspace&&) noexcept;
  CublasLtMoeWorkspace& operator=(CublasLtMoeWorkspace&&) noexcept;
  CublasLtMoeWorkspace(const CublasLtMoeWorkspace&) = delete;
  CublasLtMoeWorkspace& operator=(const CublasLtMoeWorkspace&) = delete;

  // The stage buffers (routing, plan, a1/a2 codes and row-major scales, gemm1_out, gemm2_out).
  const MoeBuffers& buffers() const;
  CublasLtOperandOrder order() const;
  bool fits(const MoeConfig& c, int64_t tokens) const;
  // Both device allocations, for tests that poison everything before a run.
  void* stage_data() const;
  size_t stage_bytes() const;
  void* extra_data() const;
  size_t extra_bytes() const;
  // cuBLASLt's choices in the last run, one entry per distinct (gemm, m).
  const std::vector<CublasLtGemmChoice>& last_algorithms() const;
  // The stage hook of later runs (fp8_block_scale_moe.hpp's StageHook; stages as there plus
  // "scale_repack", marked after the host synchronisation).
  void set_stage_hook(StageHook hook);
  // "cuBLASLt <version> (cudart <version>)" of the library loaded at run time.
  static std::string library_version();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend void run_cublaslt_layer(const MoeConfig&, const Fp8BlockScaleMoeInputs&, const Fp8BlockScaleMoeOutputs&,
                               CublasLtMoeWorkspace&, cudaStream_t, bool);
};

// The MoE on FP8 hidden states + transposed scales [H/128, T] (FlashInfer's input contract).
void cublaslt_fp8_block_scale_moe(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in,
                                  const Fp8BlockScaleMoeOutputs& out, CublasLtMoeWorkspace& ws, cudaStream_t stream);

// The MoE on bf16 hidden states [T, H]: quantized first (DEVICE-ALGORITHM.md §2) into
// ws.buffers().hidden_codes / hidden_scales, then as above.
void cublaslt_fp8_block_scale_moe_from_bf16(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in,
                                            const Fp8BlockScaleMoeOutputs& out, CublasLtMoeWorkspace& ws,
                                            cudaStream_t stream);

}  // namespace moecheck::kernels
