// Host side of the GPU backends (gpu_backend.hpp): uploads, one run, downloads.
#include "kernels/gpu_backend.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <fmt/format.h>

#include "kernels/cuda_check.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/fp8_block_scale_moe.hpp"
#include "kernels/moe_stages.hpp"
#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "kernels/cublaslt_moe.hpp"

namespace moecheck::kernels {

GpuInfo probe_gpu() {
  GpuInfo g;
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    g.why = fmt::format("no usable CUDA device ({})", cudaGetErrorString(e));
    return g;
  }
  if (n == 0) {
    g.why = "no CUDA device on this machine";
    return g;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    g.why = "cudaGetDeviceProperties failed";
    return g;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  g.device = fmt::format("{} (sm_{}{}, driver CUDA {}.{}, runtime {}.{})", prop.name, prop.major, prop.minor,
                         driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
  if (prop.major != 9) {
    g.why = fmt::format("{}: the FP8 kernels are built for Hopper (sm_90a); this device is sm_{}{}", prop.name,
                        prop.major, prop.minor);
    return g;
  }
  g.usable = true;
  return g;
}

BackendOutput run_gpu_backend(const MoeProblem& p, bool hidden_is_bf16, GpuBackend backend, bool expert_outputs) {
  const GpuInfo info = probe_gpu();
  if (!info.usable) throw InputError("", "--backend", info.why);
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, k = c.top_k;
  const int64_t El = c.local_experts(), hg = H / 128;
  const size_t w13_bytes = size_t(2 * I * H), w2_bytes = size_t(H * I);
  const size_t s13_n = size_t(2 * I / 128 * hg), s2_n = size_t(hg * (I / 128));

  // ---- inputs ----
  DeviceBuffer logits(sizeof(float) * T * E), bias(p.bias ? sizeof(float) * E : 0);
  logits.upload(p.logits, logits.bytes);
  if (p.bias) bias.upload(p.bias, bias.bytes);
  DeviceBuffer codes(size_t(T * H)), scales(sizeof(float) * T * hg), bf16(hidden_is_bf16 ? 2 * size_t(T * H) : 0);
  Fp8BlockScaleMoeInputs in;
  in.routing_logits = logits.as<float>();
  in.routing_bias = p.bias ? bias.as<float>() : nullptr;
  in.num_tokens = T;
  bool from_bf16 = false;
  if (p.hidden_fp8 && p.hidden_scale) {
    codes.upload(p.hidden_fp8, codes.bytes);
    // The case stores scales [T, H/128]; the kernels take FlashInfer's transposed [H/128, T].
    std::vector<float> st(size_t(T * hg));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < hg; ++g) st[g * T + t] = p.hidden_scale[t * hg + g];
    scales.upload(st.data(), scales.bytes);
  } else if (hidden_is_bf16) {
    std::vector<uint16_t> bits(size_t(T * H));
    for (int64_t i = 0; i < T * H; ++i) bits[i] = bf16_encode(p.hidden[i]);
    bf16.upload(bits.data(), bf16.bytes);
    in.hidden_states_bf16 = bf16.as<uint16_t>();
    from_bf16 = true;
  } else {
    DeviceBuffer x(sizeof(float) * T * H);
    x.upload(p.hidden, x.bytes);
    launch_fp8_group_quant(x.as<float>(), ActivationDtype::f32, T, H, c.scale_format, c.act_eps,
                           ScaleLayout::transposed, codes.as<uint8_t>(), scales.as<float>(), nullptr);
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  if (!from_bf16) in.hidden_states = codes.as<uint8_t>(), in.hidden_states_scale = scales.as<float>();

  // ---- weights: every local expert, FlashInfer layout [E_local, ...] ----
  DeviceBuffer w13(w13_bytes * El), w2(w2_bytes * El), s13(sizeof(float) * s13_n * El), s2(sizeof(float) * s2_n * El);
  MOECHECK_CUDA_CHECK(cudaMemset(w13.p, 0, w13.bytes));
  MOECHECK_CUDA_CHECK(cudaMemset(w2.p, 0, w2.bytes));
  {
    const std::vector<float> ones(std::max(s13_n, s2_n), 1.0f);
    for (int64_t l = 0; l < El; ++l) {
      s13.upload(ones.data(), sizeof(float) * s13_n, sizeof(float) * s13_n * l);
      s2.upload(ones.data(), sizeof(float) * s2_n, sizeof(float) * s2_n * l);
    }
  }
  for (int64_t e : p.stored_experts) {
    if (!c.is_local(e)) continue;
    const int64_t l = e - c.local_expert_offset;
    const ExpertView v = p.load_expert(e);
    w13.upload(v.w13, w13_bytes, w13_bytes * l);
    w2.upload(v.w2, w2_bytes, w2_bytes * l);
    s13.upload(v.w13_scale, sizeof(float) * s13_n, sizeof(float) * s13_n * l);
    s2.upload(v.w2_scale, sizeof(float) * s2_n, sizeof(float) * s2_n * l);
  }
  in.gemm1_weights = w13.as<uint8_t>(), in.gemm1_weights_scale = s13.as<float>();
  in.gemm2_weights = w2.as<uint8_t>(), in.gemm2_weights_scale = s2.as<float>();

  // ---- outputs, poisoned so that an unwritten element shows as NaN ----
  DeviceBuffer out(2 * size_t(T * H)), ids(sizeof(int32_t) * T * k), wts(sizeof(float) * T * k),
      eo(expert_outputs ? sizeof(float) * T * k * H : 0);
  out.poison(), ids.poison(), wts.poison(), eo.poison();
  Fp8BlockScaleMoeOutputs o;
  o.output = out.as<uint16_t>();
  o.topk_ids = ids.as<int32_t>();
  o.topk_weights = wts.as<float>();
  o.expert_outputs = expert_outputs ? eo.as<float>() : nullptr;

  BackendOutput r;
  r.tokens = T, r.hidden = H, r.top_k = k;
  r.device = info.device;
  if (backend == GpuBackend::cuda) {
    // The weights in the GEMM's own layout, as the bench times it (made once, like an engine's
    // weight preparation at load time).
    DeviceBuffer t13(w13.bytes), t2(w2.bytes);
    launch_pack_layer_weight_tiles(c, w13.as<uint8_t>(), w2.as<uint8_t>(), t13.as<uint8_t>(), t2.as<uint8_t>(),
                                   nullptr);
    in.gemm1_weights = t13.as<uint8_t>(), in.gemm2_weights = t2.as<uint8_t>();
    in.weight_layout = WeightLayout::block_tiles;
    MoeWorkspace ws(c, T);
    if (from_bf16)
      fp8_block_scale_moe_from_bf16(c, in, o, ws, nullptr);
    else
      fp8_block_scale_moe(c, in, o, ws, nullptr);
    r.backend = "cuda";
    r.accumulator_bits = 14;  // wgmma e4m3 as measured: 14 bits, truncating (BUDGETS.md §2.1)
  } else {
    CublasLtMoeWorkspace ws(c, T);
    if (from_bf16)
      cublaslt_fp8_block_scale_moe_from_bf16(c, in, o, ws, nullptr);
    else
      cublaslt_fp8_block_scale_moe(c, in, o, ws, nullptr);
    r.backend = "cublaslt";
    r.device += ", " + CublasLtMoeWorkspace::library_version();
    r.accumulator_bits = 14;  // Hopper FP8 wgmma as measured: 14 bits, truncating (BUDGETS.md §2.1)
  }
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  download(r.output_bf16, out, size_t(T * H));
  download(r.topk_ids, ids, size_t(T * k));
  download(r.topk_weights, wts, size_t(T * k));
  if (expert_outputs) download(r.expert_outputs, eo, size_t(T * k * H));
  return r;
}

}  // namespace moecheck::kernels
