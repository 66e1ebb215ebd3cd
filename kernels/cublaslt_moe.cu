// Backend "cublaslt" (contract: cublaslt_moe.hpp): the cuda backend's stages around one
// cuBLASLt block-scaled FP8 GEMM per local expert, plus the three small kernels the library's
// layouts need.
//
//   routing -> [bf16 entry: quantize] -> permute -> gather -> (sync: row offsets to host)
//   -> VEC128 scales -> GEMM1 x E_local -> round to intermediate_dtype -> SiLU*up + requant
//   -> VEC128 scales -> GEMM2 x E_local -> finalize
//
// Sources for the layouts and rules: cuBLAS docs §3.1.4.5 "128-element 1D and 128x128 2D
// Block Scaling For FP8 Data Types" and §3.1.4.5.1 "Scaling factors layouts"
// (scale start addresses 16-byte aligned; M and N multiples of 4; VEC128_32F: "M-major for A
// with shape M x L", "N-major for B with shape N x L"; BLK128x128_32F: K-major, column stride
// a multiple of 4, L4 x ceil(M/128) for A); cublasLt.h of CUDA 13 for the enum names.
#include "kernels/cublaslt_moe.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cublaslt_util.cuh"
#include "kernels/cuda_check.hpp"
#include "kernels/fp8_quant_device.cuh"
#include "kernels/launch_checks.hpp"
#include "kernels/moe_stages.hpp"

#if !defined(CUBLAS_VERSION) || CUBLAS_VERSION < 120900
#error "the cublaslt backend needs cuBLAS >= 12.9 (VEC128_32F / BLK128x128_32F block scaling)"
#endif

namespace moecheck::kernels {

namespace {

using namespace lt;

int64_t round_up4(int64_t v) { return (v + 3) / 4 * 4; }

// ---- Layout kernels -----------------------------------------------------------------------------
constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return grid_x(std::min<int64_t>((n + kThreads - 1) / kThreads, 8192), "cublaslt_moe"); }

// Row-major scales [rows, L] -> VEC128 layout by expert block: expert e's block (rows
// [base, base + P)) becomes [L][P] at base * L, contiguous along its rows. Rows < total only.
__global__ void vec128_scales_kernel(const float* __restrict__ row_major, int64_t L,
                                     const int32_t* __restrict__ tile_expert, const int32_t* __restrict__ row_offset,
                                     int64_t total, float* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total * L;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t kb = i / total, r = i % total;
    const int32_t e = tile_expert[r / kGemmTileM];
    const int64_t base = row_offset[e], rows = row_offset[e + 1] - base;
    out[base * L + kb * rows + (r - base)] = row_major[r * L + kb];
  }
}

// GEMM output rows < total into row-major [rows, n]: read in place, or (activations_as_a) from
// the scratch where expert e's block is column-major [P x n] at base * n; then rounded to bf16
// (RNE, DEVICE-ALGORITHM.md §3) when asked.
__global__ void finish_rows_kernel(const float* __restrict__ scratch, const int32_t* __restrict__ tile_expert,
                                   const int32_t* __restrict__ row_offset, int64_t total, int64_t n, bool transposed,
                                   bool to_bf16, float* __restrict__ out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total * n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, col = i % n;
    float v;
    if (transposed) {
      const int32_t e = tile_expert[r / kGemmTileM];
      const int64_t base = row_offset[e], rows = row_offset[e + 1] - base;
      v = scratch[base * n + col * rows + (r - base)];
    } else {
      v = out[i];
    }
    out[i] = to_bf16 ? device::round_bf16(v) : v;
  }
}

// ---- Workspace layout ---------------------------------------------------------------------------
struct Extra {
  float* a1_vec = nullptr;     // [max_rows * H/128]  VEC128 scales of GEMM1's B (or A)
  float* a2_vec = nullptr;     // [max_rows * I/128]  VEC128 scales of GEMM2's
  float* w13_blk = nullptr;    // [E_local][2I/128][L4(H/128)]  BLK128x128 scales, K-major
  float* w2_blk = nullptr;     // [E_local][H/128][L4(I/128)]
  float* d_scratch = nullptr;  // activations_as_a: [max_rows * max(2I, H)] transposed D
  void* lt_ws = nullptr;       // cuBLASLt workspace
};

Extra carve_extra(const MoeConfig& c, int64_t max_tokens, CublasLtOperandOrder order, char* base, size_t* total) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    off = (off + 255) / 256 * 256;
    char* p = base == nullptr ? nullptr : base + off;
    off += bytes;
    return p;
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.local_experts();
  const auto rows = static_cast<size_t>(permute_capacity(max_tokens, c.top_k, E).max_rows);
  Extra x;
  x.a1_vec = reinterpret_cast<float*>(take(rows * static_cast<size_t>(H / 128) * 4));
  x.a2_vec = reinterpret_cast<float*>(take(rows * static_cast<size_t>(I / 128) * 4));
  x.w13_blk = reinterpret_cast<float*>(take(static_cast<size_t>(E * (2 * I / 128) * round_up4(H / 128)) * 4));
  x.w2_blk = reinterpret_cast<float*>(take(static_cast<size_t>(E * (H / 128) * round_up4(I / 128)) * 4));
  if (order == CublasLtOperandOrder::activations_as_a)
    x.d_scratch = reinterpret_cast<float*>(take(rows * static_cast<size_t>(std::max(2 * I, H)) * 4));
  x.lt_ws = take(CublasLtMoeWorkspace::kCublasWorkspaceBytes);
  *total = (off + 255) / 256 * 256;
  return x;
}

}  // namespace

const char* to_string(CublasLtOperandOrder o) {
  return o == CublasLtOperandOrder::weights_as_a ? "weights_as_a" : "activations_as_a";
}

// ---- Workspace ----------------------------------------------------------------------------------
struct CublasLtMoeWorkspace::Impl {
  MoeWorkspace stages;
  CublasLtOperandOrder order = CublasLtOperandOrder::weights_as_a;
  int64_t local_experts = 0;
  void* extra_base = nullptr;
  size_t extra_bytes = 0;
  Extra x;
  int32_t* host_offsets = nullptr;  // pinned [E_local + 1]
  cublasLtHandle_t handle = nullptr;
  // Heuristic per (gemm, rows, alignment of A, B, D): the choice depends on nothing else.
  std::map<std::tuple<int, int64_t, uint32_t, uint32_t, uint32_t>, cublasLtMatmulHeuristicResult_t> heuristics;
  std::vector<CublasLtGemmChoice> last;

  ~Impl() {
    if (handle != nullptr) cublasLtDestroy(handle);
    if (host_offsets != nullptr) cudaFreeHost(host_offsets);
    if (extra_base != nullptr) cudaFree(extra_base);
  }
};

size_t CublasLtMoeWorkspace::required_bytes(const MoeConfig& c, int64_t max_tokens, CublasLtOperandOrder order) {
  const size_t stage = MoeWorkspace::required_bytes(c, max_tokens);  // the cuda backend's rules
  size_t extra = 0;
  carve_extra(c, max_tokens, order, nullptr, &extra);
  return stage + extra;
}

std::string CublasLtMoeWorkspace::library_version() {
  return "cuBLASLt " + std::to_string(cublasLtGetVersion()) + " (cudart " + std::to_string(cublasLtGetCudartVersion()) +
         ")";
}

CublasLtMoeWorkspace::CublasLtMoeWorkspace() = default;
CublasLtMoeWorkspace::~CublasLtMoeWorkspace() = default;
CublasLtMoeWorkspace::CublasLtMoeWorkspace(CublasLtMoeWorkspace&&) noexcept = default;
CublasLtMoeWorkspace& CublasLtMoeWorkspace::operator=(CublasLtMoeWorkspace&&) noexcept = default;

CublasLtMoeWorkspace::CublasLtMoeWorkspace(const MoeConfig& c, int64_t max_tokens, CublasLtOperandOrder order)
    : impl_(std::make_unique<Impl>()) {
  required_bytes(c, max_tokens, order);  // validates before anything is allocated
  if (cublasLtGetVersion() < 120900)
    throw std::runtime_error("cublaslt backend: the loaded " + library_version() +
                             " predates 12.9, which introduced VEC128_32F / BLK128x128_32F scaling");
  int dev = 0, major = 0, minor = 0;
  MOECHECK_CUDA_CHECK(cudaGetDevice(&dev));
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  MOECHECK_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    throw std::runtime_error("cublaslt backend: cuBLASLt's 128-element / 128x128 FP8 block scaling exists on sm_90 "
                             "only; device " + std::to_string(dev) + " is sm_" + std::to_string(major * 10 + minor));
  Impl& im = *impl_;
  im.stages = MoeWorkspace(c, max_tokens);
  im.order = order;
  im.local_experts = c.local_experts();
  carve_extra(c, max_tokens, order, nullptr, &im.extra_bytes);
  MOECHECK_CUDA_CHECK(cudaMalloc(&im.extra_base, im.extra_bytes));
  size_t total = 0;
  im.x = carve_extra(c, max_tokens, order, static_cast<char*>(im.extra_base), &total);
  MOECHECK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&im.host_offsets),
                                     static_cast<size_t>(im.local_experts + 1) * sizeof(int32_t)));
  MOECHECK_CUBLAS_CHECK(cublasLtCreate(&im.handle));
}

const MoeBuffers& CublasLtMoeWorkspace::buffers() const { return impl_->stages.buffers(); }
CublasLtOperandOrder CublasLtMoeWorkspace::order() const { return impl_->order; }
bool CublasLtMoeWorkspace::fits(const MoeConfig& c, int64_t tokens) const {
  return impl_ != nullptr && impl_->stages.fits(c, tokens);
}
void* CublasLtMoeWorkspace::stage_data() const { return impl_->stages.data(); }
size_t CublasLtMoeWorkspace::stage_bytes() const { return impl_->stages.bytes(); }
void* CublasLtMoeWorkspace::extra_data() const { return impl_->extra_base; }
size_t CublasLtMoeWorkspace::extra_bytes() const { return impl_->extra_bytes; }
const std::vector<CublasLtGemmChoice>& CublasLtMoeWorkspace::last_algorithms() const { return impl_->last; }
void CublasLtMoeWorkspace::set_stage_hook(StageHook hook) { impl_->stages.set_stage_hook(std::move(hook)); }

// ---- The per-expert GEMMs -----------------------------------------------------------------------
namespace {

struct ExpertGemms {
  int gemm;                 // 1 or 2 (for messages and the algorithm log)
  int64_t n, k;             // output columns, reduction length
  const uint8_t* w;         // [E_local, n, k] e4m3
  const float* w_blk;       // [E_local][n/128][L4(k/128)]
  const uint8_t* a;         // [rows, k] e4m3, permuted
  const float* a_vec;       // VEC128 by expert block
  float* d;                 // row-major [rows, n] (weights_as_a) or the transposed scratch
};

void run_expert_gemms(CublasLtMoeWorkspace::Impl& im, const ExpertGemms& g, cudaStream_t stream) {
  const bool w_is_a = im.order == CublasLtOperandOrder::weights_as_a;
  const int64_t L = g.k / kScaleBlock, L4 = round_up4(L);
  MatmulDesc desc;
  MOECHECK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // TN: op(A) = A^T with A stored K x (its rows) column-major, i.e. row-major [rows, K].
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});  // promote every block (no fast accumulation)
  const int32_t weight_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t act_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, w_is_a ? weight_mode : act_mode);
  desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, w_is_a ? act_mode : weight_mode);
  const float alpha = 1.0f, beta = 0.0f;
  std::map<int64_t, size_t> logged;  // rows -> index in im.last

  for (int64_t e = 0; e < im.local_experts; ++e) {
    const int64_t base = im.host_offsets[e], rows = im.host_offsets[e + 1] - base;
    if (rows == 0) continue;
    const uint8_t* w = g.w + e * g.n * g.k;
    const float* w_blk = g.w_blk + e * (g.n / kScaleBlock) * L4;
    const uint8_t* a = g.a + base * g.k;
    const float* a_vec = g.a_vec + base * L;
    float* d = g.d + base * g.n;
    const void* A = w_is_a ? static_cast<const void*>(w) : a;
    const void* B = w_is_a ? static_cast<const void*>(a) : w;
    const float* A_scale = w_is_a ? w_blk : a_vec;
    const float* B_scale = w_is_a ? a_vec : w_blk;
    for (const void* p : {A, B, static_cast<const void*>(d), static_cast<const void*>(A_scale),
                          static_cast<const void*>(B_scale)})
      require(alignment_of(p) >= 16, "cublaslt_fp8_block_scale_moe", "a GEMM operand or scale is not 16-byte aligned");
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, A_scale);
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, B_scale);
    // cuBLASLt dims: m = rows of op(A) = rows of D, n = columns of D (column-major).
    const int64_t lt_m = w_is_a ? g.n : rows, lt_n = w_is_a ? rows : g.n;
    Layout la(CUDA_R_8F_E4M3, g.k, lt_m, g.k), lb(CUDA_R_8F_E4M3, g.k, lt_n, g.k), ld(CUDA_R_32F, lt_m, lt_n, lt_m);

    const auto key = std::make_tuple(g.gemm, rows, alignment_of(A), alignment_of(B), alignment_of(d));
    auto it = im.heuristics.find(key);
    if (it == im.heuristics.end()) {
      Preference pref;
      pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{CublasLtMoeWorkspace::kCublasWorkspaceBytes});
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(A));
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(B));
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(d));
      pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(d));
      cublasLtMatmulHeuristicResult_t r{};
      int found = 0;
      const cublasStatus_t s =
          cublasLtMatmulAlgoGetHeuristic(im.handle, desc.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &r, &found);
      if (s != CUBLAS_STATUS_SUCCESS || found == 0 || r.state != CUBLAS_STATUS_SUCCESS) {
        std::ostringstream os;
        os << "cublasLtMatmulAlgoGetHeuristic returned no algorithm for GEMM" << g.gemm << " of local expert " << e
           << " (status " << cublasLtGetStatusName(s) << ", " << found << " results"
           << (found > 0 ? std::string(", result state ") + cublasLtGetStatusName(r.state) : std::string())
           << "): TN, m=" << lt_m << " n=" << lt_n << " k=" << g.k << ", e4m3 x e4m3 -> f32, compute 32F, scales "
           << (w_is_a ? "A BLK128x128_32F / B VEC128_32F" : "A VEC128_32F / B BLK128x128_32F") << ", order "
           << to_string(im.order) << ", alignments A/B/D " << alignment_of(A) << "/" << alignment_of(B) << "/"
           << alignment_of(d) << ", workspace " << CublasLtMoeWorkspace::kCublasWorkspaceBytes << " bytes, "
           << CublasLtMoeWorkspace::library_version();
        throw CudaError(os.str(), cudaErrorNotSupported);
      }
      it = im.heuristics.emplace(key, r).first;
    }
    const cublasLtMatmulHeuristicResult_t& r = it->second;
    MOECHECK_CUBLAS_CHECK(cublasLtMatmul(im.handle, desc.h, &alpha, A, la.h, B, lb.h, &beta, d, ld.h, d, ld.h, &r.algo,
                                         im.x.lt_ws, CublasLtMoeWorkspace::kCublasWorkspaceBytes, stream));
    auto lg = logged.find(rows);
    if (lg == logged.end()) {
      logged.emplace(rows, im.last.size());
      im.last.push_back({g.gemm, rows, g.n, g.k, 1, describe_algo(r)});
    } else {
      ++im.last[lg->second].experts;
    }
  }
}

// [E * blocks][L] -> [E * blocks][L4], the pad columns zero (cuBLASLt's column stride rule).
void repack_blk_scales(const float* src, int64_t blocks, int64_t L, float* dst, cudaStream_t stream) {
  const int64_t L4 = round_up4(L);
  if (L4 != L) MOECHECK_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(blocks * L4) * sizeof(float), stream));
  MOECHECK_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(L4) * sizeof(float), src,
                                        static_cast<size_t>(L) * sizeof(float), static_cast<size_t>(L) * sizeof(float),
                                        static_cast<size_t>(blocks), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

void run_cublaslt_layer(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in, const Fp8BlockScaleMoeOutputs& out,
                      CublasLtMoeWorkspace& ws, cudaStream_t stream, bool bf16_entry) {
  const char* who = "cublaslt_fp8_block_scale_moe";
  MoeWorkspace::required_bytes(c, 1);  // the cuda backend's configuration rules
  // cuBLASLt also takes 16-byte aligned operands; the weight scales are repacked into our own buffer.
  check_layer_arguments(who, in, out, ws.fits(c, in.num_tokens), bf16_entry);
  require(in.weight_layout == WeightLayout::row_major, who,
          "cuBLASLt reads the weights row-major: weight_layout must be row_major, not block_tiles");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MOECHECK_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  require(capture == cudaStreamCaptureStatusNone, who,
          "the stream is being captured: this backend reads each expert's token count on the host (one "
          "synchronisation per run), so it cannot be captured into a CUDA graph");
  CublasLtMoeWorkspace::Impl& im = *ws.impl_;
  im.last.clear();
  const int64_t T = in.num_tokens;
  if (T == 0) return;
  const MoeBuffers& b = im.stages.buffers();
  const int64_t H = c.hidden_size, I = c.intermediate_size, k = c.top_k, E = c.local_experts();
  const bool w_is_a = im.order == CublasLtOperandOrder::weights_as_a;

  // Routing, quantization (bf16 entry), permutation and gather: the cuda backend's stages
  const MoeWorkspace& ms = im.stages;  // its stage hook (fp8_block_scale_moe.hpp) marks our stages too
  launch_moe_routing(c, in.routing_logits, in.routing_bias, T, b.topk_ids, b.topk_weights, stream);
  ms.mark("routing", stream);
  const uint8_t* codes = in.hidden_states;
  const float* scales = in.hidden_states_scale;
  if (bf16_entry) {
    launch_fp8_group_quant(in.hidden_states_bf16, ActivationDtype::bf16, T, H, c.scale_format, c.act_eps,
                           ScaleLayout::transposed, b.hidden_codes, b.hidden_scales, stream);
    codes = b.hidden_codes;
    scales = b.hidden_scales;
    ms.mark("act_quant", stream);
  }
  const PermuteCapacity cap = permute_capacity(T, k, E);
  launch_moe_permute(b.topk_ids, T, k, c.local_expert_offset, E, cap, b.plan, stream);
  ms.mark("permute", stream);
  launch_gather_rows(codes, scales, ScaleLayout::transposed, T, H, k, b.plan, b.a1_codes, b.a1_scales, stream);
  ms.mark("gather", stream);

  // Weight scales into BLK128x128's K-major layout with the column stride padded to 4
  repack_blk_scales(in.gemm1_weights_scale, E * (2 * I / kScaleBlock), H / kScaleBlock, im.x.w13_blk, stream);
  repack_blk_scales(in.gemm2_weights_scale, E * (H / kScaleBlock), I / kScaleBlock, im.x.w2_blk, stream);

  // The one host synchronisation: each expert's row block (M of its GEMMs)
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(im.host_offsets, b.plan.row_offset, static_cast<size_t>(E + 1) * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, stream));
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t total = im.host_offsets[E];
  for (int64_t e = 0; e < E; ++e)
    if (im.host_offsets[e + 1] < im.host_offsets[e] || im.host_offsets[e] % kGemmTileM != 0)
      throw std::logic_error("cublaslt_fp8_block_scale_moe: permutation row offsets are not ascending multiples of 64");
  if (total < 0 || total > cap.max_rows || im.host_offsets[0] != 0)
    throw std::logic_error("cublaslt_fp8_block_scale_moe: permutation row total outside [0, capacity]");
  ms.mark("scale_repack", stream);  // includes the host synchronisation's round trip

  // GEMM1: [rows, H] x [2I, H]^T -> [rows, 2I], float32, then rounded to intermediate_dtype
  if (total > 0) {
    vec128_scales_kernel<<<blocks_for(total * (H / kScaleBlock)), kThreads, 0, stream>>>(
        b.a1_scales, H / kScaleBlock, b.plan.tile_expert, b.plan.row_offset, total, im.x.a1_vec);
    MOECHECK_CUDA_CHECK_LAUNCH("vec128_scales_kernel (GEMM1)");
    run_expert_gemms(im, {1, 2 * I, H, in.gemm1_weights, im.x.w13_blk, b.a1_codes, im.x.a1_vec,
                          w_is_a ? b.gemm1_out : im.x.d_scratch}, stream);
    const bool to_bf16 = c.intermediate_dtype == Precision::bf16;
    if (!w_is_a || to_bf16) {
      finish_rows_kernel<<<blocks_for(total * 2 * I), kThreads, 0, stream>>>(
          im.x.d_scratch, b.plan.tile_expert, b.plan.row_offset, total, 2 * I, !w_is_a, to_bf16, b.gemm1_out);
      MOECHECK_CUDA_CHECK_LAUNCH("finish_rows_kernel (GEMM1)");
    }
  }
  ms.mark("gemm1", stream);

  // SiLU * up, re-quantized per 128 along I (the routed rows only)
  launch_silu_mul_quant(b.gemm1_out, b.plan.slot_to_row, T * k, I, c.gate_up_layout, c.intermediate_dtype,
                        c.scale_format, c.act_eps, b.a2_codes, b.a2_scales, stream);
  ms.mark("silu_quant", stream);

  // GEMM2: [rows, I] x [H, I]^T -> [rows, H], float32
  if (total > 0) {
    vec128_scales_kernel<<<blocks_for(total * (I / kScaleBlock)), kThreads, 0, stream>>>(
        b.a2_scales, I / kScaleBlock, b.plan.tile_expert, b.plan.row_offset, total, im.x.a2_vec);
    MOECHECK_CUDA_CHECK_LAUNCH("vec128_scales_kernel (GEMM2)");
    run_expert_gemms(im, {2, H, I, in.gemm2_weights, im.x.w2_blk, b.a2_codes, im.x.a2_vec,
                          w_is_a ? b.gemm2_out : im.x.d_scratch}, stream);
    if (!w_is_a) {
      finish_rows_kernel<<<blocks_for(total * H), kThreads, 0, stream>>>(
          im.x.d_scratch, b.plan.tile_expert, b.plan.row_offset, total, H, true, false, b.gemm2_out);
      MOECHECK_CUDA_CHECK_LAUNCH("finish_rows_kernel (GEMM2)");
    }
  }
  ms.mark("gemm2", stream);

  // Finalize
  launch_moe_finalize(b.gemm2_out, b.plan.slot_to_row, b.topk_weights, T, k, H, out.output, out.expert_outputs,
                      stream);
  ms.mark("finalize", stream);
  if (out.topk_ids != nullptr)
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(out.topk_ids, b.topk_ids, sizeof(int32_t) * T * k, cudaMemcpyDeviceToDevice,
                                        stream));
  if (out.topk_weights != nullptr)
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(out.topk_weights, b.topk_weights, sizeof(float) * T * k,
                                        cudaMemcpyDeviceToDevice, stream));
}

void cublaslt_fp8_block_scale_moe(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in,
                                  const Fp8BlockScaleMoeOutputs& out, CublasLtMoeWorkspace& ws, cudaStream_t stream) {
  run_cublaslt_layer(c, in, out, ws, stream, false);
}

void cublaslt_fp8_block_scale_moe_from_bf16(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in,
                                            const Fp8BlockScaleMoeOutputs& out, CublasLtMoeWorkspace& ws,
                                            cudaStream_t stream) {
  run_cublaslt_layer(c, in, out, ws, stream, true);
}

}  // namespace moecheck::kernels
