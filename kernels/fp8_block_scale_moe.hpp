// The GPU FP8 block-scale MoE layer (backend "cuda"): one call runs routing, permutation,
// GEMM1, SiLU*up + re-quantization, GEMM2 and the weighted combine, as
// docs/DEVICE-ALGORITHM.md specifies. Plain C++ header (only cuda_runtime_api.h types), so
// host code compiled by g++ calls it directly.
//
// Tensors mirror FlashInfer's trtllm_fp8_block_scale_moe (flashinfer-ai/flashinfer v0.2.9:
// flashinfer/fused_moe/core.py, csrc/trtllm_fused_moe_kernel_launcher.cu), all device
// pointers, row-major, FP8 as raw e4m3fn bytes, bf16 as raw uint16 bits, scales float32
// dequantization multipliers (value = decode(code) * scale):
//   routing_logits       float [T, E]
//   routing_bias         float [E] or nullptr (deepseek_v3 / sigmoid_renormalize only)
//   hidden_states        e4m3  [T, H]        hidden_states_scale  float [H/128, T] (transposed)
//   gemm1_weights        e4m3  [E_local, 2I, H]   gemm1_weights_scale float [E_local, 2I/128, H/128]
//   gemm2_weights        e4m3  [E_local, H, I]    gemm2_weights_scale float [E_local, H/128, I/128]
//   output               bf16  [T, H]
// The configuration is a MoeConfig (num_experts, top_k, n_group, topk_group,
// intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor, routing,
// and our extensions gate_up_layout, scale_format, intermediate_dtype, routing_weight_dtype,
// act_eps). flashinfer_moe_config() builds one from FlashInfer's scalar arguments.
//
// Requirements (std::invalid_argument otherwise, before any launch): config_problems() empty;
// H and I multiples of 128; group_size = weight_block = 128; E <= 4096; top_k <= 32; code
// pointers 16-byte aligned, float pointers 4-byte aligned; the workspace made for this shape.
// CUDA failures throw moecheck::CudaError. Everything runs on `stream`, no host
// synchronisation (CUDA-graph capturable); outputs are complete when the stream reaches them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/moe_stages.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::kernels {

struct Fp8BlockScaleMoeInputs {
  const float* routing_logits = nullptr;
  const float* routing_bias = nullptr;
  const uint8_t* hidden_states = nullptr;        // fp8 entry (fp8_block_scale_moe)
  const float* hidden_states_scale = nullptr;    // [H/128, T]
  const uint16_t* hidden_states_bf16 = nullptr;  // bf16 entry (fp8_block_scale_moe_from_bf16)
  const uint8_t* gemm1_weights = nullptr;
  const float* gemm1_weights_scale = nullptr;
  const uint8_t* gemm2_weights = nullptr;
  const float* gemm2_weights_scale = nullptr;
  // Both weights' code layout (moe_stages.hpp): row_major as above, or block_tiles made by
  // launch_pack_weight_tiles (the cuda backend's own, faster for decode; cublaslt takes row_major).
  WeightLayout weight_layout = WeightLayout::row_major;
  int64_t num_tokens = 0;
};

struct Fp8BlockScaleMoeOutputs {
  uint16_t* output = nullptr;          // required: bf16 [T, H]
  float* expert_outputs = nullptr;     // optional: float [T, k, H], GEMM2 row of each slot, 0 if not local
  int32_t* topk_ids = nullptr;         // optional: int32 [T, k], rank order
  float* topk_weights = nullptr;       // optional: float [T, k], rsf applied, rounded to routing_weight_dtype
};

// Where a run keeps its intermediates (device pointers into the workspace's allocation). After
// a run on a stream has completed they hold that run's values, for stage-by-stage tests:
// gemm1_out row r = GEMM1 output of permuted row r (plan.slot_to_row maps slots to rows), etc.
struct MoeBuffers {
  int64_t max_tokens = 0;
  PermuteCapacity cap;
  int32_t* topk_ids = nullptr;       // [T, k]
  float* topk_weights = nullptr;     // [T, k]
  uint8_t* hidden_codes = nullptr;   // [T, H]     bf16 entry: the quantized hidden states
  float* hidden_scales = nullptr;    // [H/128, T] and their scales
  PermutePlan plan;
  uint8_t* a1_codes = nullptr;       // [max_rows, H]      GEMM1 A (gathered hidden states)
  float* a1_scales = nullptr;        // [max_rows, H/128]
  float* gemm1_out = nullptr;        // [max_rows, 2I]     rounded to intermediate_dtype
  uint8_t* a2_codes = nullptr;       // [max_rows, I]      re-quantized SiLU(gate) * up
  float* a2_scales = nullptr;        // [max_rows, I/128]
  float* gemm2_out = nullptr;        // [max_rows, H]      float32 slot outputs
};

// Called by a run after it has enqueued each stage on the stream, with the stage's name
// ("routing", "act_quant", "permute", or "prologue" in their place for small batches, then
// "gather", "gemm1", "silu_quant", "gemm2", "finalize"; the cublaslt backend adds "scale_repack"
// before GEMM1, whose mark comes after its one host synchronisation). `moecheck bench` records a CUDA event there to time each stage; a hook must
// only enqueue work on `stream` (or nothing), never synchronise it. For T <= 16 the stages after the
// prologue are programmatic dependent launches (dependent_launch.cuh); an event between two of
// them serializes them, so stage times measured this way include no overlap.
using StageHook = std::function<void(const char* stage, cudaStream_t stream)>;

// Scratch memory of the MoE for up to max_tokens tokens of one shape (k, E_local, H, I). Owns
// one cudaMalloc allocation; move-only. Reusable across runs of that shape (one stream at a time).
class MoeWorkspace {
 public:
  static size_t required_bytes(const MoeConfig& c, int64_t max_tokens);
  MoeWorkspace() = default;
  MoeWorkspace(const MoeConfig& c, int64_t max_tokens);
  ~MoeWorkspace();
  MoeWorkspace(MoeWorkspace&& o) noexcept;
  MoeWorkspace& operator=(MoeWorkspace&& o) noexcept;
  MoeWorkspace(const MoeWorkspace&) = delete;
  MoeWorkspace& operator=(const MoeWorkspace&) = delete;

  void* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  const MoeBuffers& buffers() const { return buf_; }
  // True when a run of `tokens` tokens with config c fits this workspace.
  bool fits(const MoeConfig& c, int64_t tokens) const;
  // The stage hook of later runs (empty: none, the default).
  void set_stage_hook(StageHook hook) { hook_ = std::move(hook); }
  void mark(const char* stage, cudaStream_t stream) const {
    if (hook_) hook_(stage, stream);
  }

 private:
  void release() noexcept;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  MoeBuffers buf_{};
  int64_t top_k_ = 0, local_experts_ = 0, hidden_ = 0, inter_ = 0;
  StageHook hook_;
};

// The argument checks of one layer run, shared by both GPU backends (this one and
// cublaslt_moe.hpp): std::invalid_argument "<who>: <rule>" before anything is launched.
// workspace_fits: the backend's workspace was made for this shape and holds num_tokens tokens.
void check_layer_arguments(const char* who, const Fp8BlockScaleMoeInputs& in, const Fp8BlockScaleMoeOutputs& out,
                           bool workspace_fits, bool bf16_entry);

// The MoE on FP8 hidden states + transposed scales (FlashInfer's input contract).
void fp8_block_scale_moe(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in, const Fp8BlockScaleMoeOutputs& out,
                         MoeWorkspace& ws, cudaStream_t stream);

// The MoE on bf16 hidden states [T, H]: quantizes them first (DEVICE-ALGORITHM.md §2 with
// c.scale_format and c.act_eps) into ws.buffers().hidden_codes / hidden_scales, then as above.
void fp8_block_scale_moe_from_bf16(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in,
                                   const Fp8BlockScaleMoeOutputs& out, MoeWorkspace& ws, cudaStream_t stream);

// A MoeConfig from trtllm_fp8_block_scale_moe's scalar arguments. routing_method_type uses
// FlashInfer's RoutingMethodType: 0 Default -> softmax_topk, 1 Renormalize and 4
// RenormalizeNaive -> renormalize, 2 DeepSeekV3 -> deepseek_v3, 3 Llama4 -> llama4,
// 6 SigmoidRenorm -> sigmoid_renormalize; others std::invalid_argument. n_group or topk_group
// <= 0 means no grouping. FlashInfer's numerics where we have a choice: gate_up_layout up_gate
// (w31), routing weights bf16 for DeepSeekV3 (its expert-weight dtype), f32 otherwise.
MoeConfig flashinfer_moe_config(int64_t num_experts, int64_t top_k, int64_t n_group, int64_t topk_group,
                                int64_t hidden_size, int64_t intermediate_size, int64_t local_expert_offset,
                                int64_t local_num_experts, double routed_scaling_factor, int routing_method_type);

}  // namespace moecheck::kernels
