// Host side of the GPU MoE (contract: fp8_block_scale_moe.hpp): argument checks, the
// workspace layout, and the chain of stages (moe_stages.hpp) on one stream.
//
//   routing -> [bf16 entry: quantize hidden states] -> permute -> gather -> GEMM1
//   -> SiLU*up + re-quantize -> GEMM2 -> finalize
// (the first three in one launch for small batches: launch_moe_prologue)
#include "kernels/fp8_block_scale_moe.hpp"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda_check.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/launch_checks.hpp"

namespace moecheck::kernels {

namespace {

struct Shape {
  int64_t tokens, top_k, local_experts, hidden, inter;
};

void validate_config(const MoeConfig& c) {
  const auto problems = config_problems(c);
  if (!problems.empty()) {
    std::string all = "fp8_block_scale_moe: invalid MoeConfig:";
    for (const auto& p : problems) all += " " + p + ";";
    throw std::invalid_argument(all);
  }
  const char* who = "fp8_block_scale_moe";
  require(c.hidden_size % kScaleBlock == 0, who,
          "hidden_size must be a multiple of 128 (the GEMM kernels have no ragged K or N blocks), got " +
              std::to_string(c.hidden_size));
  require(c.intermediate_size % kScaleBlock == 0, who,
          "intermediate_size must be a multiple of 128 (the GEMM kernels have no ragged K or N blocks), got " +
              std::to_string(c.intermediate_size));
  require(c.group_size == kScaleBlock && c.weight_block == kScaleBlock, who,
          "group_size and weight_block must be 128, got " + std::to_string(c.group_size) + " and " +
              std::to_string(c.weight_block));
  require(c.num_experts <= kMaxExperts, who, "num_experts must be <= " + std::to_string(kMaxExperts));
  require(c.top_k <= kMaxTopK, who, "top_k must be <= " + std::to_string(kMaxTopK));
  eps_scale_or_throw(c.act_eps, who);
}

Shape shape_of(const MoeConfig& c, int64_t tokens) {
  return {tokens, c.top_k, c.local_experts(), c.hidden_size, c.intermediate_size};
}

// Carves the buffers out of `base` (nullptr: only sizes), each 256-byte aligned.
MoeBuffers carve(const Shape& s, char* base, size_t* total) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    off = (off + 255) / 256 * 256;
    char* p = base == nullptr ? nullptr : base + off;
    off += bytes;
    return p;
  };
  MoeBuffers b;
  b.max_tokens = s.tokens;
  b.cap = permute_capacity(s.tokens, s.top_k, s.local_experts);
  const auto T = static_cast<size_t>(s.tokens), k = static_cast<size_t>(s.top_k);
  const auto H = static_cast<size_t>(s.hidden), I = static_cast<size_t>(s.inter);
  const auto rows = static_cast<size_t>(b.cap.max_rows), E = static_cast<size_t>(s.local_experts);
  b.topk_ids = reinterpret_cast<int32_t*>(take(T * k * 4));
  b.topk_weights = reinterpret_cast<float*>(take(T * k * 4));
  b.hidden_codes = reinterpret_cast<uint8_t*>(take(T * H));
  b.hidden_scales = reinterpret_cast<float*>(take(T * (H / 128) * 4));
  b.plan.expert_count = reinterpret_cast<int32_t*>(take(E * 4));
  b.plan.row_offset = reinterpret_cast<int32_t*>(take((E + 1) * 4));
  b.plan.tile_expert = reinterpret_cast<int32_t*>(take(static_cast<size_t>(b.cap.max_tiles) * 4));
  b.plan.slot_to_row = reinterpret_cast<int32_t*>(take(T * k * 4));
  b.plan.row_to_slot = reinterpret_cast<int32_t*>(take(rows * 4));
  b.plan.totals = reinterpret_cast<int32_t*>(take(2 * 4));
  b.a1_codes = reinterpret_cast<uint8_t*>(take(rows * H));
  b.a1_scales = reinterpret_cast<float*>(take(rows * (H / 128) * 4));
  b.gemm1_out = reinterpret_cast<float*>(take(rows * 2 * I * 4));
  b.a2_codes = reinterpret_cast<uint8_t*>(take(rows * I));
  b.a2_scales = reinterpret_cast<float*>(take(rows * (I / 128) * 4));
  b.gemm2_out = reinterpret_cast<float*>(take(rows * H * 4));
  *total = (off + 255) / 256 * 256;
  return b;
}

void run(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in, const Fp8BlockScaleMoeOutputs& out, MoeWorkspace& ws,
         cudaStream_t stream, bool bf16_entry) {
  validate_config(c);
  check_layer_arguments("fp8_block_scale_moe", in, out, ws.fits(c, in.num_tokens), bf16_entry);
  const int64_t T = in.num_tokens;
  if (T == 0) return;
  const MoeBuffers& b = ws.buffers();
  const int64_t H = c.hidden_size, I = c.intermediate_size, k = c.top_k, E_local = c.local_experts();

  // Routing, activation quantization (bf16 entry, into FlashInfer's layout [H/128, T]) and
  // permutation: one launch for small batches, three otherwise.
  const uint8_t* codes = bf16_entry ? b.hidden_codes : in.hidden_states;
  const float* scales = bf16_entry ? b.hidden_scales : in.hidden_states_scale;
  const PermuteCapacity cap = permute_capacity(T, k, E_local);  // <= b.cap: grids sized for this T
  const bool small_batch = moe_prologue_fits(c, T);
  const DependentLaunchScope dependent(small_batch);  // the stages after the prologue (dependent_launch.cuh)
  if (small_batch) {
    launch_moe_prologue(c, in.routing_logits, in.routing_bias, bf16_entry ? in.hidden_states_bf16 : nullptr, T,
                        b.topk_ids, b.topk_weights, b.hidden_codes, b.hidden_scales, cap, b.plan, stream);
    ws.mark("prologue", stream);
  } else {
    launch_moe_routing(c, in.routing_logits, in.routing_bias, T, b.topk_ids, b.topk_weights, stream);
    ws.mark("routing", stream);
    if (bf16_entry) {
      launch_fp8_group_quant(in.hidden_states_bf16, ActivationDtype::bf16, T, H, c.scale_format, c.act_eps,
                             ScaleLayout::transposed, b.hidden_codes, b.hidden_scales, stream);
      ws.mark("act_quant", stream);
    }
    launch_moe_permute(b.topk_ids, T, k, c.local_expert_offset, E_local, cap, b.plan, stream);
    ws.mark("permute", stream);
  }

  // Gather
  launch_gather_rows(codes, scales, ScaleLayout::transposed, T, H, k, b.plan, b.a1_codes, b.a1_scales, stream);
  ws.mark("gather", stream);

  // GEMM1: [rows, H] x [2I, H]^T -> [rows, 2I], rounded to intermediate_dtype
  GroupedGemmArgs g1;
  g1.a = b.a1_codes;
  g1.a_scale = b.a1_scales;
  g1.b = in.gemm1_weights;
  g1.b_scale = in.gemm1_weights_scale;
  g1.b_layout = in.weight_layout;
  g1.tile_expert = b.plan.tile_expert;
  g1.row_offset = b.plan.row_offset;
  g1.expert_count = b.plan.expert_count;
  g1.max_tiles = cap.max_tiles;
  g1.max_expert_rows = T;  // top-k ids of a token are distinct (routing's contract)
  g1.n = 2 * I;
  g1.k = H;
  g1.experts = E_local;
  g1.out_precision = c.intermediate_dtype;
  g1.d = b.gemm1_out;
  launch_sm90_fp8_grouped_gemm(g1, stream);
  ws.mark("gemm1", stream);

  // SiLU * up, re-quantized per 128 along I
  launch_silu_mul_quant(b.gemm1_out, b.plan.slot_to_row, T * k, I, c.gate_up_layout, c.intermediate_dtype,
                        c.scale_format, c.act_eps, b.a2_codes, b.a2_scales, stream);
  ws.mark("silu_quant", stream);

  // GEMM2: [rows, I] x [H, I]^T -> [rows, H], float32
  GroupedGemmArgs g2 = g1;
  g2.a = b.a2_codes;
  g2.a_scale = b.a2_scales;
  g2.b = in.gemm2_weights;
  g2.b_scale = in.gemm2_weights_scale;
  g2.n = H;
  g2.k = I;
  g2.out_precision = Precision::f32;
  g2.d = b.gemm2_out;
  launch_sm90_fp8_grouped_gemm(g2, stream);
  ws.mark("gemm2", stream);

  // Finalize
  launch_moe_finalize(b.gemm2_out, b.plan.slot_to_row, b.topk_weights, T, k, H, out.output, out.expert_outputs,
                      stream);
  ws.mark("finalize", stream);
  if (out.topk_ids != nullptr)
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(out.topk_ids, b.topk_ids, sizeof(int32_t) * T * k, cudaMemcpyDeviceToDevice,
                                        stream));
  if (out.topk_weights != nullptr)
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(out.topk_weights, b.topk_weights, sizeof(float) * T * k,
                                        cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

void check_layer_arguments(const char* who, const Fp8BlockScaleMoeInputs& in, const Fp8BlockScaleMoeOutputs& out,
                           bool workspace_fits, bool bf16_entry) {
  require(in.num_tokens >= 0, who, "num_tokens must be >= 0");
  require(workspace_fits, who,
          "the workspace was not made for this shape (top_k, local experts, hidden, intermediate) or holds "
          "fewer than num_tokens = " + std::to_string(in.num_tokens) + " tokens");
  if (in.num_tokens == 0) return;
  require_ptr(in.routing_logits, who, "routing_logits", 4);
  if (in.routing_bias != nullptr) require_ptr(in.routing_bias, who, "routing_bias", 4);
  if (bf16_entry) {
    require_ptr(in.hidden_states_bf16, who, "hidden_states_bf16", 16);
    require(in.hidden_states == nullptr && in.hidden_states_scale == nullptr, who,
            "the bf16 entry takes hidden_states_bf16 only (hidden_states / hidden_states_scale must be null)");
  } else {
    require_ptr(in.hidden_states, who, "hidden_states", 16);
    require_ptr(in.hidden_states_scale, who, "hidden_states_scale", 4);
    require(in.hidden_states_bf16 == nullptr, who, "the fp8 entry does not take hidden_states_bf16");
  }
  require_ptr(in.gemm1_weights, who, "gemm1_weights", 16);
  require_ptr(in.gemm1_weights_scale, who, "gemm1_weights_scale", 4);
  require_ptr(in.gemm2_weights, who, "gemm2_weights", 16);
  require_ptr(in.gemm2_weights_scale, who, "gemm2_weights_scale", 4);
  require_ptr(out.output, who, "output", 8);
  if (out.expert_outputs != nullptr) require_ptr(out.expert_outputs, who, "expert_outputs", 16);
  if (out.topk_ids != nullptr) require_ptr(out.topk_ids, who, "topk_ids", 4);
  if (out.topk_weights != nullptr) require_ptr(out.topk_weights, who, "topk_weights", 4);
}

size_t MoeWorkspace::required_bytes(const MoeConfig& c, int64_t max_tokens) {
  validate_config(c);
  require(max_tokens >= 1, "MoeWorkspace", "max_tokens must be >= 1");
  size_t total = 0;
  carve(shape_of(c, max_tokens), nullptr, &total);
  return total;
}

MoeWorkspace::MoeWorkspace(const MoeConfig& c, int64_t max_tokens) {
  bytes_ = required_bytes(c, max_tokens);
  MOECHECK_CUDA_CHECK(cudaMalloc(&base_, bytes_));
  size_t total = 0;
  buf_ = carve(shape_of(c, max_tokens), static_cast<char*>(base_), &total);
  top_k_ = c.top_k;
  local_experts_ = c.local_experts();
  hidden_ = c.hidden_size;
  inter_ = c.intermediate_size;
}

void MoeWorkspace::release() noexcept {
  if (base_ != nullptr) cudaFree(base_);  // no throw from a destructor; an error here is sticky anyway
  base_ = nullptr;
  bytes_ = 0;
  buf_ = MoeBuffers{};
}

MoeWorkspace::~MoeWorkspace() { release(); }

MoeWorkspace::MoeWorkspace(MoeWorkspace&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), buf_(std::exchange(o.buf_, {})),
      top_k_(o.top_k_), local_experts_(o.local_experts_), hidden_(o.hidden_), inter_(o.inter_),
      hook_(std::move(o.hook_)) {}

MoeWorkspace& MoeWorkspace::operator=(MoeWorkspace&& o) noexcept {
  if (this != &o) {
    release();
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    buf_ = std::exchange(o.buf_, {});
    top_k_ = o.top_k_;
    local_experts_ = o.local_experts_;
    hidden_ = o.hidden_;
    inter_ = o.inter_;
    hook_ = std::move(o.hook_);
  }
  return *this;
}

bool MoeWorkspace::fits(const MoeConfig& c, int64_t tokens) const {
  return base_ != nullptr && tokens <= buf_.max_tokens && c.top_k == top_k_ && c.local_experts() == local_experts_ &&
         c.hidden_size == hidden_ && c.intermediate_size == inter_;
}

void fp8_block_scale_moe(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in, const Fp8BlockScaleMoeOutputs& out,
                         MoeWorkspace& ws, cudaStream_t stream) {
  run(c, in, out, ws, stream, false);
}

void fp8_block_scale_moe_from_bf16(const MoeConfig& c, const Fp8BlockScaleMoeInputs& in,
                                   const Fp8BlockScaleMoeOutputs& out, MoeWorkspace& ws, cudaStream_t stream) {
  run(c, in, out, ws, stream, true);
}

MoeConfig flashinfer_moe_config(int64_t num_experts, int64_t top_k, int64_t n_group, int64_t topk_group,
                                int64_t hidden_size, int64_t intermediate_size, int64_t local_expert_offset,
                                int64_t local_num_experts, double routed_scaling_factor, int routing_method_type) {
  MoeConfig c;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.hidden_size = hidden_size;
  c.intermediate_size = intermediate_size;
  const bool grouped = n_group > 0 && topk_group > 0;
  c.n_group = grouped ? n_group : 1;
  c.topk_group = grouped ? topk_group : 1;
  c.local_expert_offset = local_expert_offset;
  c.local_num_experts = local_num_experts;
  c.routed_scaling_factor = routed_scaling_factor;
  c.gate_up_layout = GateUpLayout::up_gate;  // FlashInfer's w31: rows [0, I) are up
  switch (routing_method_type) {
    case 0: c.routing = RoutingMethod::softmax_topk; break;
    case 1:
    case 4: c.routing = RoutingMethod::renormalize; break;
    case 2:
      c.routing = RoutingMethod::deepseek_v3;
      c.routing_weight_dtype = Precision::bf16;  // "for DeepSeek, the expW is currently always bfloat16"
      break;
    case 3: c.routing = RoutingMethod::llama4; break;
    case 6: c.routing = RoutingMethod::sigmoid_renormalize; break;
    default:
      throw std::invalid_argument("flashinfer_moe_config: routing_method_type " + std::to_string(routing_method_type) +
                                  " has no moecheck equivalent (supported: 0, 1, 2, 3, 4, 6)");
  }
  return c;
}

}  // namespace moecheck::kernels
