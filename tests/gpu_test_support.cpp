// GPU test support (see gpu_test_support.hpp): skip logic, seeded data, the MoE runner, and
// the float64 models with their error bounds.
//
// GEMM error bound (per output element y of one row; DEVICE-ALGORITHM.md §3, BUDGETS.md §2):
//   exact     y* = sum_b s_b p_b,  s_b = fl32(sa_b * sw_b) (the contract's one scale rounding),
//             p_b = sum of the block's 128 code products, exact in double (each product has <= 8
//             significant bits, the block's partial sums fit in 53 bits).
//   tensor core, per block: 4 MMAs of K = 32, each adds 32 products to the running accumulator.
//             Model: the terms of one MMA are aligned to the largest exponent and kept to 13
//             fraction bits, truncating (SageAttention2's FP22, DeepSeek-V3 §3.5.2), and the
//             result may be truncated to that width once more. Per MMA step s the error is
//             < 2 * 33 * 2^-13 * M_s, with M_s = (sum of |products| before s) + max |product in s|
//             bounding the largest term (accumulator or product). E_tc,b = 66 * 2^-13 * sum_s M_s.
//             (If the hardware accumulates more precisely, the bound only gets looser.)
//   promotion: one FFMA per block, acc = fl32(acc + s_b * p^_b): <= G * 2^-24 * sum_b |s_b| S_b
//             (1.02 covering the tensor-core error inside |acc|), S_b = sum of |products|;
//             double evaluation of y* itself: 2^-50 * sum_b |s_b| S_b.
//   output    bf16: <= 2^-8 * (|y*| + the terms above); f32: none.
//   B = sum_b |s_b| E_tc,b + 1.02 G 2^-24 sum_b |s_b| S_b + 2^-50 sum_b |s_b| S_b + u_out (...)
// The bound is deterministic and worst case: correct results sit at ratios ~1e-3..1e-1.
// Layout and indexing bugs are caught far more sharply by the exact-integer GEMM test, whose
// results must be bit-exact.
#include "tests/gpu_test_support.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "reference/counter_rng.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_forward.hpp"
#include "reference/moe_routing.hpp"

namespace moecheck::gputest {

namespace {

constexpr double kU32 = 0x1p-24;
constexpr double kTcStep = 66 * 0x1p-13;
constexpr double kBf16 = 0x1p-8;
constexpr int64_t kB = 128;

const float* e4m3() { return fp8_table(Fp8Format::e4m3fn); }

std::string fmtd(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

}  // namespace

CheckReport parallel_check(const std::string& what, int64_t n, const std::function<void(int64_t, CheckReport&)>& fn) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  std::vector<CheckReport> parts(static_cast<size_t>(workers));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int64_t i = next++; i < n; i = next++) fn(i, parts[static_cast<size_t>(w)]);
    });
  for (auto& th : pool) th.join();
  CheckReport r;
  r.what = what;
  for (const auto& p : parts) r.merge(p);
  return r;
}

// ---- No GPU -----------------------------------------------------------------------------------

const std::optional<std::string>& gpu_unavailable() {
  static const std::optional<std::string> why = []() -> std::optional<std::string> {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    if (n == 0) return std::string("cudaGetDeviceCount found 0 devices");
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return std::string("cudaGetDeviceProperties failed");
    if (p.major != 9 || p.minor != 0)
      return std::string("device 0 (") + p.name + ") is sm_" + std::to_string(p.major) + std::to_string(p.minor) +
             "; the kernels are built for sm_90a";
    return std::nullopt;
  }();
  return why;
}

// ---- Reports ------------------------------------------------------------------------------------

void CheckReport::fail(const std::string& msg) {
  ok = false;
  if (failures++ < 8) details += "\n    " + msg;
}

void CheckReport::ratio(double err, double bound, const std::string& where) {
  ++checked;
  const double q = bound > 0 ? err / bound : (err == 0 ? 0.0 : INFINITY);
  if (!(q <= 1.0)) {
    fail(where + ": |err| = " + fmtd(err) + " > bound " + fmtd(bound));
    if (std::isnan(q)) return;
  }
  max_ratio = std::max(max_ratio, q);
}

void CheckReport::merge(const CheckReport& o) {
  ok = ok && o.ok;
  checked += o.checked;
  if (o.failures > 0 && failures < 8) details += (o.what.empty() ? "" : "\n  [" + o.what + "]") + o.details;
  failures += o.failures;
  max_ratio = std::max(max_ratio, o.max_ratio);
  if (!o.what.empty()) {
    std::ostringstream os;
    os.precision(3);
    os << (summary.empty() ? "" : "; ") << o.what << " " << o.max_ratio;
    summary += os.str();
  }
}

std::ostream& operator<<(std::ostream& os, const CheckReport& r) {
  os << r.what << ": " << (r.ok ? "ok" : "FAILED") << ", " << r.checked << " checked, " << r.failures
     << " failures, max err/bound = " << r.max_ratio;
  if (!r.summary.empty()) os << " [" << r.summary << "]";
  os << r.details;
  return os;
}

// ---- Data ---------------------------------------------------------------------------------------

std::vector<float> normal_floats(uint64_t seed, uint64_t stream, size_t n, double sigma) {
  const CounterRng rng{seed, stream};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(sigma * rng.normal(i));
  return v;
}

std::vector<float> uniform_floats(uint64_t seed, uint64_t stream, size_t n, double lo, double hi) {
  const CounterRng rng{seed, stream};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(lo + (hi - lo) * rng.uniform(i));
  return v;
}

std::vector<uint8_t> normal_codes(uint64_t seed, uint64_t stream, size_t n, double sigma) {
  const auto x = normal_floats(seed, stream, n, sigma);
  std::vector<uint8_t> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = e4m3_encode_satfinite(x[i]);
  return c;
}

std::vector<uint8_t> random_codes(uint64_t seed, uint64_t stream, size_t n) {
  const CounterRng rng{seed, stream};
  std::vector<uint8_t> c(n);
  for (size_t i = 0; i < n; i += 16) {
    const auto b = rng.block(i / 16);
    for (size_t j = 0; j < 16 && i + j < n; ++j) {
      uint8_t code = static_cast<uint8_t>(b[j / 4] >> (8 * (j % 4)));
      if ((code & 0x7F) == 0x7F) code ^= 0x01;  // NaN -> +-448
      c[i + j] = code;
    }
  }
  return c;
}

std::vector<float> log_uniform_scales(uint64_t seed, uint64_t stream, size_t n, double lo_exp, double hi_exp) {
  // 2^e * (1 + m 2^-23), e a uniform integer in [lo, hi), m 23 random bits: exact, portable.
  const CounterRng rng{seed, stream};
  const auto lo = static_cast<int64_t>(std::floor(lo_exp)), span = std::max<int64_t>(1, static_cast<int64_t>(hi_exp - lo_exp));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bits = rng.bits(i);
    const int e = static_cast<int>(lo + static_cast<int64_t>((bits >> 32) % static_cast<uint64_t>(span)));
    const float m = 1.0f + static_cast<float>(bits & 0x7FFFFF) * 0x1p-23f;
    v[i] = std::ldexp(m, e);
  }
  return v;
}

// ---- GEMM model ---------------------------------------------------------------------------------

GemmRowModel gemm_row_model(const uint8_t* a, const float* sa, const uint8_t* w, const float* sw, int64_t n,
                            int64_t k, Precision out) {
  const float* dec = e4m3();
  const int64_t kb = k / kB;
  std::vector<double> av(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) av[static_cast<size_t>(i)] = dec[a[i]];
  GemmRowModel m;
  m.exact.resize(static_cast<size_t>(n));
  m.bound.resize(static_cast<size_t>(n));
  for (int64_t col = 0; col < n; ++col) {
    const uint8_t* wr = w + col * k;
    const float* swr = sw + (col / kB) * kb;
    double y = 0, tc = 0, mass = 0;
    for (int64_t b = 0; b < kb; ++b) {
      const double s = static_cast<double>(sa[b] * swr[b]);  // fl32 of the scale product
      double p = 0, before = 0, steps = 0;
      for (int64_t st = 0; st < 4; ++st) {
        double mx = 0, sum_abs = 0;
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t kk = b * kB + st * 32 + i;
          const double prod = av[static_cast<size_t>(kk)] * static_cast<double>(dec[wr[kk]]);
          p += prod;
          const double ab = std::fabs(prod);
          sum_abs += ab;
          mx = std::max(mx, ab);
        }
        steps += before + mx;
        before += sum_abs;
      }
      y += s * p;
      tc += std::fabs(s) * steps;
      mass += std::fabs(s) * before;
    }
    double bound = kTcStep * tc + (1.02 * static_cast<double>(kb) * kU32 + 0x1p-50) * mass +
                   static_cast<double>(kb) * 0x1p-149;
    if (out == Precision::bf16) bound += kBf16 * (std::fabs(y) + bound);
    m.exact[static_cast<size_t>(col)] = y;
    m.bound[static_cast<size_t>(col)] = bound;
  }
  return m;
}

void check_gemm_row(const GemmRowModel& m, const float* gpu, Precision out, const std::string& where, CheckReport& r) {
  for (size_t col = 0; col < m.exact.size(); ++col) {
    const float v = gpu[col];
    if (!std::isfinite(v)) {
      r.fail(where + " col " + std::to_string(col) + ": not finite (" + fmtd(v) + "), exact " + fmtd(m.exact[col]));
      continue;
    }
    if (out == Precision::bf16 && bf16_round(v) != v)
      r.fail(where + " col " + std::to_string(col) + ": " + fmtd(v) + " is not a bf16 value");
    r.ratio(std::fabs(static_cast<double>(v) - m.exact[col]), m.bound[col], where + " col " + std::to_string(col));
  }
}

// ---- MoE data -------------------------------------------------------------------------------------

std::ostream& operator<<(std::ostream& os, const MoeCase& m) {
  const MoeConfig& c = m.c;
  os << m.name << "(T=" << m.tokens << ",E=" << c.num_experts << ",k=" << c.top_k << ",H=" << c.hidden_size
     << ",I=" << c.intermediate_size << ",routing=" << to_string(c.routing) << ",groups=" << c.n_group << "/"
     << c.topk_group << ",ep=" << c.local_expert_offset << "+" << c.local_experts()
     << ",scale=" << to_string(c.scale_format) << ",layout=" << to_string(c.gate_up_layout)
     << ",inter=" << to_string(c.intermediate_dtype) << ",wdt=" << to_string(c.routing_weight_dtype)
     << ",rsf=" << c.routed_scaling_factor << ",bias=" << m.bias << ",bf16_entry=" << m.bf16_entry
     << ",block_tiles=" << m.block_tiles << ",seed=" << m.seed << ")";
  return os;
}

MoeHostData make_moe_data(const MoeCase& m) {
  const MoeConfig& c = m.c;
  const int64_t T = m.tokens, E = c.num_experts, H = c.hidden_size, I = c.intermediate_size, El = c.local_experts();
  MoeHostData d;
  d.logits = normal_floats(m.seed, 1, static_cast<size_t>(T * E), m.logit_sigma);
  for (int64_t t = 0; t < T; ++t) {
    if (m.force_expert >= 0) d.logits[static_cast<size_t>(t * E + m.force_expert)] += 20.0f;
    if (m.favour_first >= 0)
      for (int64_t e = c.local_expert_offset; e < c.local_expert_offset + El; ++e)
        d.logits[static_cast<size_t>(t * E + e)] += static_cast<float>(m.favour_first);
  }
  if (m.bias) d.bias = normal_floats(m.seed, 2, static_cast<size_t>(E), 0.25);

  // Hidden states: N(0, 1) times a per-token power of two; the first tokens get a zero group.
  std::vector<float> x = normal_floats(m.seed, 3, static_cast<size_t>(T * H), 1.0);
  for (int64_t t = 0; t < T; ++t) {
    const float f = std::ldexp(1.0f, static_cast<int>(t % 5) - 2);
    for (int64_t h = 0; h < H; ++h) x[static_cast<size_t>(t * H + h)] *= f;
    if (t < m.zero_group_tokens) {
      const int64_t g = t % (H / kB);
      std::fill_n(x.begin() + t * H + g * kB, kB, 0.0f);
    }
  }
  if (m.bf16_entry) {
    d.hidden_bf16.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) d.hidden_bf16[i] = bf16_encode(x[i]);
  } else {
    const GroupQuantized q = group_quantize(x.data(), T, H, kB, c.scale_format, c.act_eps, ScaleLayout::transposed);
    d.hidden_codes = q.codes;
    d.hidden_scales = q.scales;
  }

  // Weights: codes spanning the e4m3 range, distinct block scales (powers of two for ue8m0).
  const bool pow2 = c.scale_format == ScaleFormat::ue8m0;
  auto codes = [&](uint64_t stream, size_t n) {
    return m.fast_weights ? random_codes(m.seed, stream, n) : normal_codes(m.seed, stream, n, 64.0);
  };
  auto scales = [&](uint64_t stream, size_t n) {
    auto s = log_uniform_scales(m.seed, stream, n, -14, -8);
    if (pow2)
      for (auto& v : s) v = std::ldexp(1.0f, std::ilogb(v));
    return s;
  };
  d.w13 = codes(4, static_cast<size_t>(El * 2 * I * H));
  d.w13_scale = scales(5, static_cast<size_t>(El * (2 * I / kB) * (H / kB)));
  d.w2 = codes(6, static_cast<size_t>(El * H * I));
  d.w2_scale = scales(7, static_cast<size_t>(El * (H / kB) * (I / kB)));
  return d;
}

// ---- Whole-layer cases -------------------------------------------------------------------------

MoeCase make_case(std::string name, RoutingMethod method, int64_t E, int64_t k, int64_t H, int64_t I, int64_t T) {
  MoeCase m;
  m.name = std::move(name);
  m.c.num_experts = E;
  m.c.top_k = k;
  m.c.hidden_size = H;
  m.c.intermediate_size = I;
  m.c.routing = method;
  m.tokens = T;
  return m;
}

std::vector<MoeCase> layer_cases() {
  std::vector<MoeCase> v;
  {
    auto m = make_case("t1_deepseek_grouped", RoutingMethod::deepseek_v3, 16, 4, 256, 128, 1);
    m.c.n_group = 4, m.c.topk_group = 2, m.c.routed_scaling_factor = 2.5, m.bias = true;
    v.push_back(m);
  }
  // H = 384, I = 256: L = 3 and 2, so both BLK128x128 scale tensors need cuBLASLt's L4 padding.
  v.push_back(make_case("ragged_t_renormalize", RoutingMethod::renormalize, 8, 3, 384, 256, 37));
  v.push_back(make_case("multi_tile_softmax_topk", RoutingMethod::softmax_topk, 4, 2, 256, 128, 300));
  {
    auto m = make_case("zero_token_experts_sigmoid", RoutingMethod::sigmoid_renormalize, 32, 2, 128, 256, 5);
    m.bias = true;
    v.push_back(m);
  }
  {
    auto m = make_case("all_tokens_one_expert", RoutingMethod::softmax_topk, 8, 1, 256, 128, 130);
    m.force_expert = 5;
    v.push_back(m);
  }
  {
    auto m = make_case("ep_offset_deepseek", RoutingMethod::deepseek_v3, 16, 4, 256, 128, 40);
    m.c.local_expert_offset = 4, m.c.local_num_experts = 8, m.bias = true;
    v.push_back(m);
  }
  {
    auto m = make_case("ep_tokens_without_local_expert", RoutingMethod::renormalize, 16, 2, 128, 128, 20);
    m.c.local_expert_offset = 8, m.c.local_num_experts = 4;
    v.push_back(m);
  }
  v.push_back(make_case("llama4", RoutingMethod::llama4, 16, 1, 256, 256, 50));
  {
    auto m = make_case("ue8m0_up_gate_bf16", RoutingMethod::deepseek_v3, 32, 4, 256, 256, 17);
    m.c.n_group = 4, m.c.topk_group = 2, m.c.routed_scaling_factor = 2.5, m.bias = true;
    m.c.scale_format = ScaleFormat::ue8m0;
    m.c.gate_up_layout = GateUpLayout::up_gate;
    m.c.intermediate_dtype = Precision::bf16;
    m.c.routing_weight_dtype = Precision::bf16;
    v.push_back(m);
  }
  {
    auto m = make_case("bf16_entry_ue8m0", RoutingMethod::renormalize, 8, 2, 384, 128, 33);
    m.bf16_entry = true;
    m.c.scale_format = ScaleFormat::ue8m0;
    m.zero_group_tokens = 3;
    v.push_back(m);
  }
  {
    auto m = make_case("bf16_entry_sigmoid_eps", RoutingMethod::sigmoid_renormalize, 16, 3, 256, 128, 9);
    m.bf16_entry = true;
    m.c.act_eps = 1e-3;
    m.c.gate_up_layout = GateUpLayout::up_gate;
    v.push_back(m);
  }
  {
    // DeepSeek-V3 layer shapes (HF deepseek-ai/DeepSeek-V3 config.json) on an EP shard of 4
    // experts in group 1.
    auto m = make_case("deepseek_v3_shapes", RoutingMethod::deepseek_v3, 256, 8, 7168, 2048, 3);
    m.c.n_group = 8, m.c.topk_group = 4, m.c.routed_scaling_factor = 2.5, m.bias = true;
    m.c.local_expert_offset = 32, m.c.local_num_experts = 4;
    m.c.routing_weight_dtype = Precision::bf16;
    m.c.gate_up_layout = GateUpLayout::up_gate;
    m.favour_first = 3;
    m.fast_weights = true;
    v.push_back(m);
  }
  {
    auto m = make_case("t16384", RoutingMethod::renormalize, 16, 4, 256, 128, 16384);
    m.check_stride = 97;
    m.zero_group_tokens = 5;
    v.push_back(m);
  }
  {
    // Block-tile weights and >= 128 rows per expert: the large_batch GEMM schedule in the whole
    // layer (EP shard, odd K-block and N-tile counts, bias and bf16 intermediates included).
    // Last, so that the cases above keep their seeds.
    auto m = make_case("large_batch_block_tiles", RoutingMethod::deepseek_v3, 16, 4, 384, 256, 300);
    m.c.n_group = 4, m.c.topk_group = 2, m.c.routed_scaling_factor = 2.5, m.bias = true;
    m.c.local_expert_offset = 4, m.c.local_num_experts = 8;
    m.c.intermediate_dtype = Precision::bf16;
    m.block_tiles = true;
    v.push_back(m);
  }
  return v;
}

// ---- GPU run ------------------------------------------------------------------------------------

DeviceLayer::DeviceLayer(const MoeCase& m, const MoeHostData& d)
    : logits(d.logits),
      bias(d.bias),
      hidden_bf16(d.hidden_bf16),
      hidden_codes(d.hidden_codes),
      hidden_scales(d.hidden_scales),
      w13(d.w13),
      w2(d.w2),
      w13_tiles(m.block_tiles ? d.w13.size() : 0),
      w2_tiles(m.block_tiles ? d.w2.size() : 0),
      w13s(d.w13_scale),
      w2s(d.w2_scale),
      out(static_cast<size_t>(m.tokens * m.c.hidden_size)),
      eo(static_cast<size_t>(m.tokens * m.c.top_k * m.c.hidden_size)),
      ids(static_cast<size_t>(m.tokens * m.c.top_k)),
      wts(static_cast<size_t>(m.tokens * m.c.top_k)),
      o{out.get(), eo.get(), ids.get(), wts.get()} {
  in.routing_logits = logits.get();
  in.routing_bias = m.bias ? bias.get() : nullptr;
  in.gemm1_weights = w13.get();
  in.gemm1_weights_scale = w13s.get();
  in.gemm2_weights = w2.get();
  in.gemm2_weights_scale = w2s.get();
  in.num_tokens = m.tokens;
  if (m.block_tiles) {
    kernels::launch_pack_layer_weight_tiles(m.c, w13.get(), w2.get(), w13_tiles.get(), w2_tiles.get(), nullptr);
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
    in.gemm1_weights = w13_tiles.get();
    in.gemm2_weights = w2_tiles.get();
    in.weight_layout = kernels::WeightLayout::block_tiles;
  }
  if (m.bf16_entry) in.hidden_states_bf16 = hidden_bf16.get();
  else in.hidden_states = hidden_codes.get(), in.hidden_states_scale = hidden_scales.get();
}

MoeGpuRun download_run(const MoeCase& m, const kernels::MoeBuffers& b, const DeviceLayer& dl) {
  const MoeConfig& c = m.c;
  const int64_t T = m.tokens, k = c.top_k, H = c.hidden_size, I = c.intermediate_size, El = c.local_experts();
  MoeGpuRun g;
  g.out = dl.out.download();
  g.expert_outputs = dl.eo.download();
  g.topk_ids = dl.ids.download();
  g.topk_weights = dl.wts.download();
  const kernels::PermuteCapacity cap = kernels::permute_capacity(T, k, El);
  g.rows = cap.max_rows;
  const auto rows = static_cast<size_t>(cap.max_rows);
  using I32 = DeviceBuffer<int32_t>;
  using F32 = DeviceBuffer<float>;
  if (m.bf16_entry) {
    g.hidden_codes = DeviceBuffer<uint8_t>::download_from(b.hidden_codes, static_cast<size_t>(T * H));
    g.hidden_scales = F32::download_from(b.hidden_scales, static_cast<size_t>(T * H / kB));
  }
  g.expert_count = I32::download_from(b.plan.expert_count, static_cast<size_t>(El));
  g.row_offset = I32::download_from(b.plan.row_offset, static_cast<size_t>(El + 1));
  g.tile_expert = I32::download_from(b.plan.tile_expert, static_cast<size_t>(cap.max_tiles));
  g.slot_to_row = I32::download_from(b.plan.slot_to_row, static_cast<size_t>(T * k));
  g.row_to_slot = I32::download_from(b.plan.row_to_slot, rows);
  g.totals = I32::download_from(b.plan.totals, 2);
  g.gemm1_out = F32::download_from(b.gemm1_out, rows * static_cast<size_t>(2 * I));
  g.a2_codes = DeviceBuffer<uint8_t>::download_from(b.a2_codes, rows * static_cast<size_t>(I));
  g.a2_scales = F32::download_from(b.a2_scales, rows * static_cast<size_t>(I / kB));
  g.gemm2_out = F32::download_from(b.gemm2_out, rows * static_cast<size_t>(H));
  return g;
}

MoeGpuRun run_moe_on_gpu(const MoeCase& m, const MoeHostData& d, bool via_graph) {
  const MoeConfig& c = m.c;
  const int64_t T = m.tokens;
  DeviceLayer dl(m, d);

  kernels::MoeWorkspace ws(c, T);
  MOECHECK_CUDA_CHECK(cudaMemset(ws.data(), 0xFF, ws.bytes()));

  auto layer = [&](cudaStream_t s) {
    if (m.bf16_entry) kernels::fp8_block_scale_moe_from_bf16(c, dl.in, dl.o, ws, s);
    else kernels::fp8_block_scale_moe(c, dl.in, dl.o, ws, s);
  };
  if (!via_graph) {
    layer(nullptr);
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    cudaStream_t s = nullptr;
    MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    MOECHECK_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      layer(s);
    } catch (...) {
      cudaStreamEndCapture(s, &graph);  // leave the stream usable; the error is the one thrown
      throw;
    }
    MOECHECK_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    MOECHECK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MOECHECK_CUDA_CHECK(cudaGraphLaunch(exec, s));
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(s));
    MOECHECK_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MOECHECK_CUDA_CHECK(cudaGraphDestroy(graph));
    MOECHECK_CUDA_CHECK(cudaStreamDestroy(s));
  }

  return download_run(m, ws.buffers(), dl);
}

}  // namespace moecheck::gputest
