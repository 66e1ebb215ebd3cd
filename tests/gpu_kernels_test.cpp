// Stage tests of the GPU MoE path (kernels/): argument checks (run everywhere, no GPU needed),
// activation quantization bit-exact with the reference, routing against the float64
// reference, and the grouped FP8 GEMM (bit-exact on exact-arithmetic inputs, within the derived
// bound on realistic ones). Whole-layer tests: gpu_moe_test.cpp.
//
// Without a usable CUDA device every GPU test reports SKIPPED ("no CUDA device: <reason>").
// Every device output is poisoned with 0xFF bytes before the run, and every element checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/fp8_block_scale_moe.hpp"
#include "kernels/moe_stages.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_routing.hpp"
#include "reference/tensor_core_model.hpp"
#include "tests/gpu_test_support.hpp"

namespace moecheck::gputest {
namespace {

MoeConfig small_config(RoutingMethod method, int64_t E, int64_t k, int64_t H, int64_t I) {
  MoeConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.hidden_size = H;
  c.intermediate_size = I;
  c.routing = method;
  return c;
}

template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no std::invalid_argument thrown>";
}

// ---- Argument checks and host-side contracts (no GPU needed) -----------------------------------

TEST(GpuApi, RejectsSizesThatAreNotMultiplesOf128) {
  MoeConfig c = small_config(RoutingMethod::renormalize, 8, 2, 256, 100);
  ASSERT_TRUE(config_problems(c).empty());
  EXPECT_NE(invalid_argument_message([&] { kernels::MoeWorkspace::required_bytes(c, 4); })
                .find("intermediate_size must be a multiple of 128"),
            std::string::npos);
  c.intermediate_size = 128;
  c.hidden_size = 200;
  EXPECT_NE(invalid_argument_message([&] { kernels::MoeWorkspace::required_bytes(c, 4); })
                .find("hidden_size must be a multiple of 128"),
            std::string::npos);
  c.hidden_size = 256;
  EXPECT_GT(kernels::MoeWorkspace::required_bytes(c, 4), 0u);
}

TEST(GpuApi, RejectsInvalidConfigAndBiasForMethodsWithoutOne) {
  MoeConfig c = small_config(RoutingMethod::renormalize, 8, 9, 128, 128);  // top_k > E
  EXPECT_NE(invalid_argument_message([&] { kernels::MoeWorkspace::required_bytes(c, 4); }).find("top_k"),
            std::string::npos);
  c.top_k = 2;
  const float dummy[8] = {};
  int32_t ids[2];
  float w[2];
  // Checked before anything touches the (host) pointers or the device.
  EXPECT_NE(invalid_argument_message([&] { kernels::launch_moe_routing(c, dummy, dummy, 1, ids, w, nullptr); })
                .find("bias"),
            std::string::npos);
}

TEST(GpuApi, CudaErrorNamesCallMessageAndLocation) {
  const CudaError e("cudaMalloc(&p, 16)", cudaErrorMemoryAllocation, "x.cu", 7);
  EXPECT_STREQ(e.what(), "cudaMalloc(&p, 16) failed: out of memory (x.cu:7)");
  EXPECT_EQ(e.code(), cudaErrorMemoryAllocation);
}

TEST(GpuApi, FlashInferConfigMapping) {
  const MoeConfig c = kernels::flashinfer_moe_config(256, 8, 8, 4, 7168, 2048, 32, 32, 2.5, 2);
  EXPECT_EQ(c.routing, RoutingMethod::deepseek_v3);
  EXPECT_EQ(c.gate_up_layout, GateUpLayout::up_gate);
  EXPECT_EQ(c.routing_weight_dtype, Precision::bf16);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.local_experts(), 32);
  EXPECT_TRUE(config_problems(c).empty());
  const MoeConfig r = kernels::flashinfer_moe_config(128, 8, 0, 0, 4096, 1536, 0, 128, 1.0, 4);
  EXPECT_EQ(r.routing, RoutingMethod::renormalize);
  EXPECT_EQ(r.n_group, 1);
  EXPECT_EQ(kernels::flashinfer_moe_config(128, 8, 0, 0, 4096, 1536, 0, 128, 1.0, 0).routing,
            RoutingMethod::softmax_topk);
  EXPECT_THROW(kernels::flashinfer_moe_config(128, 8, 0, 0, 4096, 1536, 0, 128, 1.0, 7), std::invalid_argument);
}

// The capacity bound holds for every split of T*k slots over the experts (checked exhaustively on
// small sizes: the worst case puts one slot on as many experts as possible, the rest on one).
TEST(GpuApi, PermuteCapacityBoundsEveryRouting) {
  for (int64_t E = 1; E <= 6; ++E)
    for (int64_t slots = 1; slots <= 200; ++slots) {
      const auto cap = kernels::permute_capacity(slots, 1, E);
      // worst split: n experts with one slot each... and the remainder on the last one
      for (int64_t n = 1; n <= std::min(E, slots); ++n) {
        const int64_t rest = slots - (n - 1);
        const int64_t tiles = (n - 1) + (rest + kernels::kGemmTileM - 1) / kernels::kGemmTileM;
        EXPECT_LE(tiles, cap.max_tiles) << "E=" << E << " slots=" << slots << " n=" << n;
      }
      // and the balanced split
      int64_t tiles = 0;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t c = slots / E + (e < slots % E ? 1 : 0);
        tiles += (c + kernels::kGemmTileM - 1) / kernels::kGemmTileM;
      }
      EXPECT_LE(tiles, cap.max_tiles);
      EXPECT_EQ(cap.max_rows, cap.max_tiles * kernels::kGemmTileM);
    }
}

// ---- Activation quantization: bit-exact ---------------------------------------------------------

struct QuantCase {
  kernels::ActivationDtype dtype;
  ScaleFormat fmt;
  ScaleLayout layout;
  double eps;
};

TEST(GpuQuant, BitExactWithReferenceGroupQuantize) {
  MOECHECK_REQUIRE_GPU();
  const int64_t rows = 37, cols = 640, groups = cols / 128;
  // Values of every magnitude class: N(0,1) rows scaled by 2^(-130..+100) in steps, an all-zero
  // group per row (eps scale), groups below eps, and one group of exact multiples of 448.
  std::vector<float> x = normal_floats(11, 1, static_cast<size_t>(rows * cols), 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int e = static_cast<int>(r * 230 / rows) - 130;
    for (int64_t c = 0; c < cols; ++c) x[r * cols + c] = std::ldexp(x[r * cols + c], e);
    std::fill_n(x.begin() + r * cols + (r % groups) * 128, 128, 0.0f);
    if (r == 3)
      for (int64_t c = 128; c < 256; ++c) x[r * cols + c] = 448.0f * static_cast<float>((c % 7) - 3);
  }
  std::vector<uint16_t> xb(x.size());
  std::vector<float> xbf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = bf16_encode(x[i]);
    xbf[i] = bf16_decode(xb[i]);
  }
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint16_t> dxb(xb);
  for (auto dtype : {kernels::ActivationDtype::f32, kernels::ActivationDtype::bf16})
    for (auto fmt : {ScaleFormat::f32, ScaleFormat::ue8m0})
      for (auto layout : {ScaleLayout::row_major, ScaleLayout::transposed})
        for (double eps : {1e-10, 1e-2}) {
          SCOPED_TRACE(std::string("dtype=") + (dtype == kernels::ActivationDtype::f32 ? "f32" : "bf16") +
                       " fmt=" + std::string(to_string(fmt)) +
                       " layout=" + (layout == ScaleLayout::row_major ? "row_major" : "transposed") +
                       " eps=" + std::to_string(eps));
          DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows * cols));
          DeviceBuffer<float> scales(static_cast<size_t>(rows * groups));
          const void* src = dtype == kernels::ActivationDtype::f32 ? static_cast<const void*>(dx.get()) : dxb.get();
          kernels::launch_fp8_group_quant(src, dtype, rows, cols, fmt, eps, layout, codes.get(), scales.get(), nullptr);
          MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
          const auto& in = dtype == kernels::ActivationDtype::f32 ? x : xbf;
          const GroupQuantized ref = group_quantize(in.data(), rows, cols, 128, fmt, eps, layout);
          const auto got_codes = codes.download();
          const auto got_scales = scales.download();
          int64_t bad_codes = 0, bad_scales = 0;
          for (size_t i = 0; i < got_codes.size(); ++i) bad_codes += got_codes[i] != ref.codes[i];
          for (size_t i = 0; i < got_scales.size(); ++i)
            bad_scales += std::memcmp(&got_scales[i], &ref.scales[i], sizeof(float)) != 0;
          EXPECT_EQ(bad_codes, 0) << "codes differing from reference group_quantize";
          EXPECT_EQ(bad_scales, 0) << "scales differing (bitwise) from reference group_quantize";
        }
}

// ---- Routing ---------------------------------------------------------------------------------------

struct RoutingCase {
  const char* name;
  RoutingMethod method;
  int64_t E, k, n_group, topk_group;
  double rsf;
  bool bias;
  Precision wdt;
};

std::vector<float> run_routing(const MoeConfig& c, const std::vector<float>& logits, const std::vector<float>& bias,
                               int64_t T, std::vector<int32_t>* ids_out) {
  DeviceBuffer<float> dl(logits), db(bias);
  DeviceBuffer<int32_t> ids(static_cast<size_t>(T * c.top_k));
  DeviceBuffer<float> w(static_cast<size_t>(T * c.top_k));
  kernels::launch_moe_routing(c, dl.get(), bias.empty() ? nullptr : db.get(), T, ids.get(), w.get(), nullptr);
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  *ids_out = ids.download();
  return w.download();
}

// n logits on the grid {0.1, 0.35, 0.6, 0.85, 1.1} (seeded): many exactly equal scores, and
// positive and irregular, so no two different pairs of sigmoids have an equal sum (sigmoid(x) +
// sigmoid(-x) = 1 would tie group scores in exact arithmetic and let float and double round the
// tie differently). Distinct grid values keep distinct float32 sigmoids.
std::vector<float> grid_logits(uint64_t seed, uint64_t stream, size_t n) {
  std::vector<float> logits = uniform_floats(seed, stream, n, 0, 5);
  for (auto& v : logits) v = std::floor(v) * 0.25f + 0.1f;
  return logits;
}

TEST(GpuRouting, EveryMethodMatchesReferenceWithinFloat32Ties) {
  MOECHECK_REQUIRE_GPU();
  const RoutingCase cases[] = {
      {"deepseek_v3", RoutingMethod::deepseek_v3, 256, 8, 8, 4, 2.5, true, Precision::bf16},
      {"deepseek_v3_f32w", RoutingMethod::deepseek_v3, 256, 8, 8, 4, 2.5, true, Precision::f32},
      {"kimi_k2", RoutingMethod::deepseek_v3, 384, 8, 1, 1, 2.827, true, Precision::f32},
      {"dslite", RoutingMethod::deepseek_v3, 72, 6, 1, 1, 1.0, false, Precision::f32},
      {"one_expert_groups", RoutingMethod::deepseek_v3, 16, 3, 16, 5, 1.0, true, Precision::f32},
      {"renormalize", RoutingMethod::renormalize, 128, 8, 1, 1, 1.0, false, Precision::f32},
      {"softmax_topk", RoutingMethod::softmax_topk, 32, 2, 1, 1, 1.0, false, Precision::bf16},
      {"sigmoid_renormalize", RoutingMethod::sigmoid_renormalize, 64, 4, 1, 1, 1.0, true, Precision::f32},
      {"sigmoid_renormalize_nobias", RoutingMethod::sigmoid_renormalize, 60, 5, 1, 1, 1.5, false, Precision::f32},
      {"llama4", RoutingMethod::llama4, 16, 1, 1, 1, 1.0, false, Precision::f32},
      // One warp per token: 128 experts per lane, k = 32 picks (every lane keeps one), and 4096
      // one-expert groups (128 group bits per lane, the most shared memory a warp takes).
      {"wide_grouped", RoutingMethod::deepseek_v3, 4096, 32, 64, 8, 1.0, true, Precision::f32},
      {"wide_one_expert_groups", RoutingMethod::deepseek_v3, 4096, 8, 4096, 40, 1.0, true, Precision::f32},
      {"wide_renormalize", RoutingMethod::renormalize, 2048, 32, 1, 1, 1.0, false, Precision::bf16},
  };
  const int64_t T = 300;
  uint64_t seed = 100;
  for (const auto& rc : cases) {
    SCOPED_TRACE(rc.name);
    MoeConfig c = small_config(rc.method, rc.E, rc.k, 128, 128);
    c.n_group = rc.n_group;
    c.topk_group = rc.topk_group;
    c.routed_scaling_factor = rc.rsf;
    c.routing_weight_dtype = rc.wdt;
    ASSERT_TRUE(config_problems(c).empty());
    const auto logits = normal_floats(++seed, 1, static_cast<size_t>(T * rc.E), 2.0);
    const auto bias = rc.bias ? normal_floats(seed, 2, static_cast<size_t>(rc.E), 0.5) : std::vector<float>{};
    std::vector<int32_t> ids;
    const auto w = run_routing(c, logits, bias, T, &ids);
    const CheckReport r = check_routing(c, logits.data(), rc.bias ? bias.data() : nullptr, T, ids, w);
    EXPECT_TRUE(r.ok) << r;
    std::cout << "  [routing " << rc.name << "] " << r << "\n";
  }
}

// Logits on a coarse grid: many exactly equal scores. Equal inputs give bit-equal float32 scores,
// so the GPU must break every tie exactly as the reference does (lower index), ids and order. E
// on both sides of 256, where the warp's picks move from shared memory to registers, and not a
// multiple of 32 (lanes own different numbers of experts); k up to 32 (4 picks per lane).
TEST(GpuRouting, ExactTiesGoToTheLowerIndex) {
  MOECHECK_REQUIRE_GPU();
  const int64_t T = 200;
  struct Shape {
    int64_t E, k, n_group, topk_group;  // n_group and topk_group: deepseek_v3 only
  };
  const Shape shapes[] = {{32, 4, 4, 2}, {33, 32, 1, 1}, {255, 8, 1, 1}, {256, 8, 8, 4}, {256, 32, 8, 4}, {384, 32, 4, 2}};
  for (const Shape& sh : shapes)
    for (auto method : {RoutingMethod::deepseek_v3, RoutingMethod::renormalize, RoutingMethod::softmax_topk,
                        RoutingMethod::sigmoid_renormalize, RoutingMethod::llama4}) {
      SCOPED_TRACE(std::string(to_string(method)) + ", E " + std::to_string(sh.E) + ", k " + std::to_string(sh.k));
      MoeConfig c = small_config(method, sh.E, method == RoutingMethod::llama4 ? 1 : sh.k, 128, 128);
      if (method == RoutingMethod::deepseek_v3) {
        c.n_group = sh.n_group;
        c.topk_group = sh.topk_group;
      }
      ASSERT_TRUE(config_problems(c).empty());
      const std::vector<float> logits = grid_logits(7, 1, static_cast<size_t>(T * sh.E));
      std::vector<int32_t> ids;
      const auto w = run_routing(c, logits, {}, T, &ids);
      const Routing ref = route(c, logits.data(), nullptr, T);
      int64_t mismatches = 0;
      for (size_t i = 0; i < ids.size(); ++i) mismatches += ids[i] != ref.ids[i];
      EXPECT_EQ(mismatches, 0) << "ids differing from the reference's lower-index tie break";
      const CheckReport r = check_routing(c, logits.data(), nullptr, T, ids, w);
      EXPECT_TRUE(r.ok) << r;
    }
}

// NaN logits rank last (rank_key gives NaN the lowest order): with sigmoid scores and no bias an
// expert whose logit is NaN is picked only after every other, so with at most 40 NaN per token the
// picks are the reference's for the same logits with each NaN made -30 (below the grid; the
// reference takes finite logits only). Register picks (E = 256) and shared-memory picks (E = 320);
// k = 8 and 32.
TEST(GpuRouting, NanLogitsRankLast) {
  MOECHECK_REQUIRE_GPU();
  const int64_t T = 64;
  for (const int64_t E : {256, 320})
    for (const int64_t k : {8, 32}) {
      SCOPED_TRACE("E " + std::to_string(E) + ", k " + std::to_string(k));
      const MoeConfig c = small_config(RoutingMethod::sigmoid_renormalize, E, k, 128, 128);
      // On the grid the float and double picks can differ only through NaN.
      std::vector<float> logits = grid_logits(91, static_cast<uint64_t>(E + k), static_cast<size_t>(T * E));
      std::vector<float> as_low = logits;
      int64_t nan_count = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < 1 + t % 40; ++j) {  // 1 to 40 NaN per token, at spread indices
          const size_t i = static_cast<size_t>(t * E + (j * 37 + t * 11) % E);
          nan_count += !std::isnan(logits[i]);
          logits[i] = std::nanf("");
          as_low[i] = -30.0f;
        }
      std::vector<int32_t> ids;
      run_routing(c, logits, {}, T, &ids);
      const Routing ref = route(c, as_low.data(), nullptr, T);
      int64_t mismatches = 0, nan_picked = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        mismatches += ids[i] != ref.ids[i];
        nan_picked += std::isnan(logits[static_cast<size_t>(i / k) * E + ids[i]]);
      }
      EXPECT_GT(nan_count, 0);
      EXPECT_EQ(mismatches, 0) << "ids differing from the picks with NaN ranked last";
      EXPECT_EQ(nan_picked, 0) << "an expert with a NaN logit picked while finite ones were left";
    }
}

// ---- One-launch prologue ------------------------------------------------------------------------------

// The prologue (routing + bf16 quantization + permutation in one block) against the three stage
// launches on the same inputs: every output bit for bit, the plan's arrays whole (padding and
// unused rows included). Both sides run the same device functions (route_token, quantize_group,
// permute_block), so this holds the fusion to the stages (shared memory reused across phases,
// the barriers, reads of what this launch wrote); the routing itself is held to the reference by
// the GpuRouting tests. Batches of 1 to 16 tokens; grouped sigmoid routing with a bias and the
// bf16 entry, softmax routing with the fp8 entry, an EP shard whose tokens partly miss it, and
// UE8M0 scales.
TEST(GpuPrologue, GivesTheBitsOfTheStagesItFuses) {
  MOECHECK_REQUIRE_GPU();
  // Every routing method, ties (logits on a grid of 1/4: many equal scores, broken by the index),
  // NaN logits, a grouping whose kept groups hold exactly k experts, E from 16 to 1024, T from 1
  // to 16.
  struct Case {
    const char* name;
    RoutingMethod method;
    int64_t E, k, n_group, topk_group, offset, local, T;
    bool bias, bf16, ue8m0;
    double tie_grid = 0;  // > 0: logits rounded to multiples of it
    int nan_logits = 0;   // logits set to NaN, spread over the batch
  };
  const Case cases[] = {
      {"deepseek_t1", RoutingMethod::deepseek_v3, 256, 8, 8, 4, 0, 256, 1, true, true, false},
      {"deepseek_t16_ue8m0", RoutingMethod::deepseek_v3, 256, 8, 8, 4, 0, 256, 16, true, true, true},
      {"renormalize_fp8_entry", RoutingMethod::renormalize, 64, 6, 1, 1, 0, 64, 5, false, false, false},
      {"ep_shard", RoutingMethod::sigmoid_renormalize, 128, 4, 1, 1, 96, 32, 9, true, true, false},
      {"deepseek_ties_t3", RoutingMethod::deepseek_v3, 256, 8, 8, 4, 0, 256, 3, false, true, false, 0.25},
      {"deepseek_kept_groups_exactly_k", RoutingMethod::deepseek_v3, 64, 8, 8, 1, 0, 64, 2, true, true, false},
      {"kimi_like_384_nan", RoutingMethod::deepseek_v3, 384, 8, 1, 1, 0, 384, 4, true, true, false, 0, 5},
      {"softmax_topk_ties_t7", RoutingMethod::softmax_topk, 128, 8, 1, 1, 0, 128, 7, false, true, false, 0.25},
      {"llama4_t2", RoutingMethod::llama4, 16, 1, 1, 1, 0, 16, 2, false, true, false},
      {"sigmoid_512", RoutingMethod::sigmoid_renormalize, 512, 8, 1, 1, 0, 512, 1, true, true, false},
      {"deepseek_1024", RoutingMethod::deepseek_v3, 1024, 8, 8, 4, 0, 1024, 1, true, true, false},
  };
  uint64_t seed = 700;
  for (const Case& x : cases) {
    SCOPED_TRACE(x.name);
    MoeConfig c = small_config(x.method, x.E, x.k, 512, 256);
    c.n_group = x.n_group, c.topk_group = x.topk_group;
    c.local_expert_offset = x.offset, c.local_num_experts = x.local;
    c.scale_format = x.ue8m0 ? ScaleFormat::ue8m0 : ScaleFormat::f32;
    c.routing_weight_dtype = Precision::bf16;
    ASSERT_TRUE(config_problems(c).empty());
    ASSERT_TRUE(kernels::moe_prologue_fits(c, x.T));
    const int64_t T = x.T, H = c.hidden_size;
    auto logits = normal_floats(++seed, 1, static_cast<size_t>(T * x.E), 2.0);
    if (x.tie_grid > 0)
      for (float& v : logits) v = static_cast<float>(std::round(v / x.tie_grid) * x.tie_grid);
    for (int i = 0; i < x.nan_logits; ++i) logits[(static_cast<size_t>(i) * 977) % logits.size()] = std::nanf("");
    const auto bias = normal_floats(seed, 2, static_cast<size_t>(x.E), 0.5);
    const auto xf = normal_floats(seed, 3, static_cast<size_t>(T * H), 3.0);
    std::vector<uint16_t> xb(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) xb[i] = bf16_encode(xf[i]);
    DeviceBuffer<float> d_logits(logits), d_bias(bias);
    DeviceBuffer<uint16_t> d_x(xb);
    const kernels::PermuteCapacity cap = kernels::permute_capacity(T, x.k, x.local);

    struct Out {  // one run's outputs, poisoned before it
      DeviceBuffer<int32_t> ids, count, offset, tiles, s2r, r2s, totals;
      DeviceBuffer<float> w, scales;
      DeviceBuffer<uint8_t> codes;
      kernels::PermutePlan plan;
      Out(int64_t T, int64_t k, int64_t H, int64_t local, const kernels::PermuteCapacity& cap)
          : ids(T * k), count(local), offset(local + 1), tiles(cap.max_tiles), s2r(T * k), r2s(cap.max_rows),
            totals(2), w(T * k), scales(T * H / 128), codes(T * H) {
        plan = {count.get(), offset.get(), tiles.get(), s2r.get(), r2s.get(), totals.get()};
      }
    };
    Out stages(T, x.k, H, x.local, cap), fused(T, x.k, H, x.local, cap);
    const float* b = x.bias ? d_bias.get() : nullptr;
    kernels::launch_moe_routing(c, d_logits.get(), b, T, stages.ids.get(), stages.w.get(), nullptr);
    if (x.bf16)
      kernels::launch_fp8_group_quant(d_x.get(), kernels::ActivationDtype::bf16, T, H, c.scale_format, c.act_eps,
                                      ScaleLayout::transposed, stages.codes.get(), stages.scales.get(), nullptr);
    kernels::launch_moe_permute(stages.ids.get(), T, x.k, x.offset, x.local, cap, stages.plan, nullptr);
    kernels::launch_moe_prologue(c, d_logits.get(), b, x.bf16 ? d_x.get() : nullptr, T, fused.ids.get(),
                                 fused.w.get(), fused.codes.get(), fused.scales.get(), cap, fused.plan, nullptr);
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
    auto same = [](const auto& a, const auto& b, const char* what) {
      const auto va = a.download(), vb = b.download();
      EXPECT_EQ(0, std::memcmp(va.data(), vb.data(), va.size() * sizeof(va[0]))) << what << " differ";
    };
    same(stages.ids, fused.ids, "topk_ids");
    same(stages.w, fused.w, "topk_weights");
    same(stages.codes, fused.codes, "hidden codes");
    same(stages.scales, fused.scales, "hidden scales");
    same(stages.count, fused.count, "expert_count");
    same(stages.offset, fused.offset, "row_offset");
    same(stages.tiles, fused.tiles, "tile_expert");
    same(stages.s2r, fused.s2r, "slot_to_row");
    same(stages.r2s, fused.r2s, "row_to_slot");
    same(stages.totals, fused.totals, "totals");
    // Not vacuous: the stages' ids are a valid routing (check_routing; it does not take NaN
    // logits, for which the two paths agreeing is the check).
    if (x.nan_logits == 0) {
      std::vector<int32_t> ids = stages.ids.download();
      const CheckReport r =
          check_routing(c, logits.data(), x.bias ? bias.data() : nullptr, T, ids, stages.w.download());
      EXPECT_TRUE(r.ok) << r;
    }
  }
}

// ---- Grouped GEMM ------------------------------------------------------------------------------------

struct GemmProblem {
  int64_t experts, n, k;
  std::vector<int32_t> tile_expert;  // per M tile, -1 = skipped
  std::vector<uint8_t> a, b;
  std::vector<float> sa, sb;
  std::vector<int32_t> row_offset, expert_count;  // optional: the permutation plan's rows per expert
  int64_t rows() const { return static_cast<int64_t>(tile_expert.size()) * kernels::kGemmTileM; }
};

// The GEMM on p, its weights as given (row_major) or packed on the device into block tiles first.
std::vector<float> run_gemm(const GemmProblem& p, Precision out,
                            kernels::WeightLayout layout = kernels::WeightLayout::row_major,
                            kernels::GemmSchedule schedule = kernels::GemmSchedule::small_batch,
                            int64_t max_expert_rows = 0, int decode_stages = 0) {
  DeviceBuffer<uint8_t> a(p.a), b(p.b), tiles(layout == kernels::WeightLayout::block_tiles ? p.b.size() : 0);
  DeviceBuffer<float> sa(p.sa), sb(p.sb);
  DeviceBuffer<int32_t> te(p.tile_expert), ro(p.row_offset), ec(p.expert_count);
  DeviceBuffer<float> d(static_cast<size_t>(p.rows() * p.n));
  kernels::GroupedGemmArgs g;
  g.a = a.get();
  g.a_scale = sa.get();
  g.b = b.get();
  if (layout == kernels::WeightLayout::block_tiles) {
    kernels::launch_pack_weight_tiles(b.get(), p.experts, p.n, p.k, tiles.get(), nullptr);
    g.b = tiles.get();
  }
  g.b_layout = layout;
  g.b_scale = sb.get();
  g.tile_expert = te.get();
  if (!p.row_offset.empty()) {
    g.row_offset = ro.get();
    g.expert_count = ec.get();
  }
  g.max_tiles = static_cast<int64_t>(p.tile_expert.size());
  g.n = p.n;
  g.k = p.k;
  g.experts = p.experts;
  g.out_precision = out;
  g.d = d.get();
  g.schedule = schedule;
  g.max_expert_rows = max_expert_rows;
  g.decode_stages = decode_stages;
  kernels::launch_sm90_fp8_grouped_gemm(g, nullptr);
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  return d.download();
}

// Whether `row` is a padding row of the problem's plan (none without one).
bool padding_row(const GemmProblem& p, int64_t row) {
  const int32_t e = p.tile_expert[row / kernels::kGemmTileM];
  return e >= 0 && !p.row_offset.empty() && row - p.row_offset[e] >= p.expert_count[e];
}

// Padding rows get NaN codes (0x7F) and NaN scales, as an untouched workspace may hold: the GEMM
// must neither store them nor let them reach a routed row.
void poison_padding_rows(GemmProblem& p) {
  const int64_t kb = p.k / 128;
  for (int64_t row = 0; row < p.rows(); ++row) {
    if (!padding_row(p, row)) continue;
    std::fill_n(p.a.begin() + row * p.k, p.k, uint8_t{0x7F});
    std::fill_n(p.sa.begin() + row * kb, kb, std::numeric_limits<float>::quiet_NaN());
  }
}

// Rows of skipped tiles and padding rows must keep their poison; the others must match the model.
void check_gemm(const GemmProblem& p, const std::vector<float>& d, Precision out, bool exact, CheckReport& r) {
  const int64_t kb = p.k / 128;
  for (int64_t row = 0; row < p.rows(); ++row) {
    const int32_t e = p.tile_expert[row / kernels::kGemmTileM];
    const float* got = d.data() + row * p.n;
    if (e < 0 || padding_row(p, row)) {
      for (int64_t col = 0; col < p.n; ++col, ++r.checked) {
        uint32_t bits;
        std::memcpy(&bits, got + col, 4);
        if (bits != 0xFFFFFFFFu)
          r.fail("row " + std::to_string(row) + (e < 0 ? " of a skipped tile" : " (padding)") + " was written");
      }
      continue;
    }
    const GemmRowModel m = gemm_row_model(p.a.data() + row * p.k, p.sa.data() + row * kb,
                                          p.b.data() + e * p.n * p.k, p.sb.data() + e * (p.n / 128) * kb, p.n, p.k, out);
    if (!exact) {
      check_gemm_row(m, got, out, "row " + std::to_string(row), r);
      continue;
    }
    for (int64_t col = 0; col < p.n; ++col, ++r.checked) {
      const float want = out == Precision::bf16 ? bf16_round(m.exact[col]) : static_cast<float>(m.exact[col]);
      if (static_cast<double>(want) != m.exact[col] && out == Precision::f32)
        r.fail("test setup: exact value not a float");
      if (!(got[col] == want))
        r.fail("row " + std::to_string(row) + " col " + std::to_string(col) + ": got " + std::to_string(got[col]) +
               ", exact " + std::to_string(want));
    }
  }
}

// Integer codes in [-4, 4] and power-of-two scales in [2^-2, 2^2]: every block sum is an integer
// below 2^12, exact in a tensor-core accumulator of >= 13 bits; every promoted sum a multiple of
// 2^-4 below 3 * 2^15, exact in float32. So the GPU must reproduce the exact value bit for bit,
// and any fragment, scale or expert indexing error shows.
TEST(GpuGemm, ExactSmallIntegersBitExact) {
  MOECHECK_REQUIRE_GPU();
  GemmProblem p;
  p.experts = 3;
  p.n = 256;
  p.k = 384;
  p.tile_expert = {0, 2, 2, 1, -1, 0, -1};
  const auto ai = uniform_floats(21, 1, static_cast<size_t>(p.rows() * p.k), -4, 5);
  const auto bi = uniform_floats(21, 2, static_cast<size_t>(p.experts * p.n * p.k), -4, 5);
  p.a.resize(ai.size());
  p.b.resize(bi.size());
  for (size_t i = 0; i < ai.size(); ++i) p.a[i] = e4m3_encode_satfinite(std::floor(ai[i]));
  for (size_t i = 0; i < bi.size(); ++i) p.b[i] = e4m3_encode_satfinite(std::floor(bi[i]));
  auto pow2 = [](const std::vector<float>& u) {
    std::vector<float> s(u.size());
    for (size_t i = 0; i < u.size(); ++i) s[i] = std::ldexp(1.0f, static_cast<int>(std::floor(u[i])));
    return s;
  };
  p.sa = pow2(uniform_floats(21, 3, static_cast<size_t>(p.rows() * (p.k / 128)), -2, 3));
  p.sb = pow2(uniform_floats(21, 4, static_cast<size_t>(p.experts * (p.n / 128) * (p.k / 128)), -2, 3));
  for (auto out : {Precision::f32, Precision::bf16}) {
    CheckReport r;
    r.what = std::string("exact GEMM, out ") + std::string(to_string(out));
    check_gemm(p, run_gemm(p, out), out, true, r);
    EXPECT_TRUE(r.ok) << r;
  }
}

// Realistic codes (N(0, 64^2) rounded to e4m3: the whole range, subnormals included) and
// log-uniform block scales.
GemmProblem realistic_problem(uint64_t seed, int64_t experts, int64_t n, int64_t k, std::vector<int32_t> tiles) {
  GemmProblem p;
  p.experts = experts, p.n = n, p.k = k;
  p.tile_expert = std::move(tiles);
  p.a = normal_codes(seed, 1, static_cast<size_t>(p.rows() * p.k), 64.0);
  p.b = normal_codes(seed, 2, static_cast<size_t>(p.experts * p.n * p.k), 64.0);
  p.sa = log_uniform_scales(seed, 3, static_cast<size_t>(p.rows() * (p.k / 128)), -10, -2);
  p.sb = log_uniform_scales(seed, 4, static_cast<size_t>(p.experts * (p.n / 128) * (p.k / 128)), -14, -8);
  return p;
}

// On realistic data the GPU must stay within the derived bound (gpu_test_support.cpp).
TEST(GpuGemm, RealisticWithinDerivedBound) {
  MOECHECK_REQUIRE_GPU();
  const GemmProblem p = realistic_problem(31, 2, 384, 1024, {1, 0, 0, -1});
  for (auto out : {Precision::f32, Precision::bf16}) {
    CheckReport r;
    r.what = std::string("GEMM within bound, out ") + std::string(to_string(out));
    check_gemm(p, run_gemm(p, out), out, false, r);
    EXPECT_TRUE(r.ok) << r;
    std::cout << "  " << r << "\n";
  }
}

// Experts with 1, 9, 17 and 97 rows: the tiles run the tensor cores on 8, 16, 32 and 64 rows (the
// last tile of the 97 on 64: 33 rows), padding rows among them holding NaN codes and scales, and
// must store exact values to the routed rows and nothing to the padding rows.
TEST(GpuGemm, TilesStoreTheirExpertsRowsOnly) {
  MOECHECK_REQUIRE_GPU();
  GemmProblem p;
  p.experts = 4;
  p.n = 256;
  p.k = 256;
  p.tile_expert = {0, 1, 2, 3, 3, -1};
  p.row_offset = {0, 64, 128, 192, 320};
  p.expert_count = {1, 9, 17, 97};
  const auto ai = uniform_floats(23, 1, static_cast<size_t>(p.rows() * p.k), -4, 5);
  const auto bi = uniform_floats(23, 2, static_cast<size_t>(p.experts * p.n * p.k), -4, 5);
  p.a.resize(ai.size());
  p.b.resize(bi.size());
  for (size_t i = 0; i < ai.size(); ++i) p.a[i] = e4m3_encode_satfinite(std::floor(ai[i]));
  for (size_t i = 0; i < bi.size(); ++i) p.b[i] = e4m3_encode_satfinite(std::floor(bi[i]));
  p.sa.assign(static_cast<size_t>(p.rows() * (p.k / 128)), 0.5f);
  p.sb.assign(static_cast<size_t>(p.experts * (p.n / 128) * (p.k / 128)), 2.0f);
  poison_padding_rows(p);
  CheckReport r;
  r.what = "exact GEMM with per-expert row counts";
  check_gemm(p, run_gemm(p, Precision::f32), Precision::f32, true, r);
  EXPECT_TRUE(r.ok) << r;
}

// Realistic codes and scales: every output element equal, bit for bit, to the measured model of
// the instruction (TensorCoreModel::hopper_wgmma: 4 chained k32 instructions per block from zero)
// promoted by fl32(sa * sb) and one FFMA per block, blocks ascending (DEVICE-ALGORITHM.md §3).
TEST(GpuGemm, MatchesTheMeasuredWgmmaModelBitForBit) {
  MOECHECK_REQUIRE_GPU();
  const GemmProblem p = realistic_problem(37, 2, 256, 1024, {1, 0, -1});
  using kernels::GemmSchedule;
  using kernels::WeightLayout;
  const std::pair<WeightLayout, GemmSchedule> versions[] = {{WeightLayout::row_major, GemmSchedule::small_batch},
                                                            {WeightLayout::block_tiles, GemmSchedule::small_batch},
                                                            {WeightLayout::block_tiles, GemmSchedule::large_batch}};
  for (const auto& [layout, schedule] : versions) {
  SCOPED_TRACE(std::string(layout == WeightLayout::row_major ? "row-major" : "block-tile") + " weights, " +
               (schedule == GemmSchedule::small_batch ? "small_batch" : "large_batch") + " schedule");
  const std::vector<float> d = run_gemm(p, Precision::f32, layout, schedule);
  const TensorCoreModel tc = TensorCoreModel::hopper_wgmma();
  const int64_t kb = p.k / 128;
  int64_t mismatches = 0, checked = 0;
  std::string first;
  for (int64_t row = 0; row < p.rows(); ++row) {
    const int32_t e = p.tile_expert[row / kernels::kGemmTileM];
    if (e < 0) continue;
    for (int64_t col = 0; col < p.n; ++col, ++checked) {
      float acc = 0.0f;
      for (int64_t b = 0; b < kb; ++b) {
        const float part = tc_chain(tc, p.a.data() + row * p.k + b * 128,
                                    p.b.data() + (e * p.n + col) * p.k + b * 128, 32, 4, 0.0f);
        const float s = p.sa[row * kb + b] * p.sb[(e * (p.n / 128) + col / 128) * kb + b];
        acc = std::fma(s, part, acc);
      }
      const float got = d[row * p.n + col];
      if (std::memcmp(&got, &acc, 4) != 0 && mismatches++ == 0)
        first = "row " + std::to_string(row) + " col " + std::to_string(col) + ": gpu " + std::to_string(got) +
                ", model " + std::to_string(acc);
    }
  }
  EXPECT_EQ(mismatches, 0) << mismatches << " of " << checked << " differ; first: " << first;
  std::cout << "  " << checked << " outputs, " << mismatches << " differ from the wgmma model\n";
  }
}

// The packed layout moves bytes only: tile (e, n block, k block) holds row r, 16-byte chunk c of
// that block at byte 128 r + 16 (c ^ (r mod 8)) (moe_stages.hpp), checked byte for byte on the
// host. And the GEMM gives the same bits on either layout: experts of 1, 2 and 3 M tiles whose
// last tiles hold 9, 1, 22 and 64 rows (token widths 16, 8, 32, 64), both output precisions.
TEST(GpuGemm, BlockTileWeightsGiveTheRowMajorBits) {
  MOECHECK_REQUIRE_GPU();
  GemmProblem p = realistic_problem(41, 4, 384, 640, {0, 1, 1, 2, 2, 2, 3, -1});
  p.row_offset = {0, 64, 192, 384, 448};
  p.expert_count = {9, 65, 150, 64};
  poison_padding_rows(p);

  DeviceBuffer<uint8_t> b(p.b), tiles(p.b.size());
  kernels::launch_pack_weight_tiles(b.get(), p.experts, p.n, p.k, tiles.get(), nullptr);
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> packed = tiles.download();
  int64_t misplaced = 0;
  const int64_t nb = p.n / 128, kb = p.k / 128;
  for (int64_t e = 0; e < p.experts; ++e)
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t k = 0; k < p.k; ++k) {
        const int64_t tile = (e * nb + n / 128) * kb + k / 128, r = n % 128, c = (k % 128) / 16;
        const int64_t at = tile * 16384 + 128 * r + 16 * (c ^ (r % 8)) + k % 16;
        misplaced += packed[static_cast<size_t>(at)] != p.b[static_cast<size_t>((e * p.n + n) * p.k + k)];
      }
  EXPECT_EQ(misplaced, 0) << "bytes of the packed tiles not where the layout puts them";

  for (auto out : {Precision::f32, Precision::bf16}) {
    const std::vector<float> base = run_gemm(p, out);  // row-major: the version the other tests pin
    CheckReport r;
    r.what = std::string("GEMM within bound, out ") + std::string(to_string(out));
    check_gemm(p, base, out, false, r);
    EXPECT_TRUE(r.ok) << r;
    for (auto schedule : {kernels::GemmSchedule::small_batch, kernels::GemmSchedule::large_batch}) {
      const std::vector<float> d = run_gemm(p, out, kernels::WeightLayout::block_tiles, schedule);
      ASSERT_EQ(d.size(), base.size());
      int64_t differ = 0;
      for (size_t i = 0; i < d.size(); ++i) differ += std::memcmp(&d[i], &base[i], 4) != 0;
      EXPECT_EQ(differ, 0) << "outputs (" << to_string(out) << ") of block-tile weights, "
                           << (schedule == kernels::GemmSchedule::small_batch ? "small" : "large")
                           << "_batch schedule, differing from row-major's (skipped tiles and padding rows keep "
                              "their poison)";
    }
  }
}

// Two runs' outputs (rows of n) compared bit for bit: how many differ, and the first, by row and column.
struct BitDifferences {
  int64_t count = 0;
  std::string first;
};
BitDifferences bit_differences(const std::vector<float>& a, const std::vector<float>& b, int64_t n,
                               const std::string& a_name, const std::string& b_name) {
  BitDifferences d;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && d.count++ == 0)
      d.first = "row " + std::to_string(static_cast<int64_t>(i) / n) + " col " +
                std::to_string(static_cast<int64_t>(i) % n) + ": " + a_name + " " + std::to_string(a[i]) + ", " +
                b_name + " " + std::to_string(b[i]);
  return d;
}

// The large_batch schedule against the small_batch one, bit for bit, where its own machinery is
// exercised: more work items than SMs (each persistent CTA walks several, so the producer runs
// ahead into the next item), more K blocks than pipeline stages (the mbarrier phases wrap), an
// odd N tile count (the second warpgroup idles on the last pair), experts of 1 to 5 tiles with
// partly filled last tiles, and both output precisions. Unused tiles past the plan and padding
// rows (NaN inputs) keep their poison in both.
TEST(GpuGemm, LargeBatchScheduleGivesTheSmallBatchBits) {
  MOECHECK_REQUIRE_GPU();
  const std::vector<int32_t> counts = {64, 1, 300, 0, 129, 77, 256, 190, 5, 233, 64, 70,
                                       128, 33, 192, 250, 1, 0, 65, 191, 300, 12, 64, 140};
  GemmProblem shape;
  shape.experts = static_cast<int64_t>(counts.size());
  shape.row_offset.push_back(0);
  for (int64_t e = 0; e < shape.experts; ++e) {
    const int64_t tiles = (counts[e] + 63) / 64;
    for (int64_t t = 0; t < tiles; ++t) shape.tile_expert.push_back(static_cast<int32_t>(e));
    shape.row_offset.push_back(static_cast<int32_t>(shape.row_offset.back() + 64 * tiles));
  }
  shape.tile_expert.insert(shape.tile_expert.end(), 3, -1);  // the capacity bound past the plan
  shape.expert_count = counts;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{640, 896}, {1024, 256}}) {
    GemmProblem p = realistic_problem(43 + n, shape.experts, n, k, shape.tile_expert);
    p.row_offset = shape.row_offset;
    p.expert_count = shape.expert_count;
    poison_padding_rows(p);
    const int64_t items = (p.row_offset.back() / 64) * ((n / 128 + 1) / 2);
    for (auto out : {Precision::f32, Precision::bf16}) {
      SCOPED_TRACE("N " + std::to_string(n) + ", K " + std::to_string(k) + ", " + std::to_string(items) +
                   " work items, out " + std::string(to_string(out)));
      const auto small = run_gemm(p, out, kernels::WeightLayout::block_tiles, kernels::GemmSchedule::small_batch);
      const auto large = run_gemm(p, out, kernels::WeightLayout::block_tiles, kernels::GemmSchedule::large_batch);
      ASSERT_EQ(small.size(), large.size());
      const BitDifferences d = bit_differences(small, large, n, "small", "large");
      EXPECT_EQ(d.count, 0) << d.count << " of " << small.size() << " outputs differ; first: " << d.first;
      if (out == Precision::f32 && n == 640) {  // the bound once (small_batch's bits are pinned elsewhere)
        CheckReport r;
        r.what = "large_batch GEMM within bound";
        check_gemm(p, large, out, false, r);
        EXPECT_TRUE(r.ok) << r;
      }
    }
  }
}

// The decode variants (tiles of at most 16 routed rows; 2, 3 or 5 stages, all in flight from the
// start) against the general one, bit for bit, and the general one within the derived bound on
// the same problems: experts of 0 to 16 rows, one tile each, with one K block (fewer than every
// variant's stages), 2 and 13 (the ring wraps), both output precisions, and the variant chosen
// per launch (MOECHECK_DECODE_STAGES, if set, forces that one). Padding rows (NaN inputs) and
// the unused tiles keep their poison.
TEST(GpuGemm, DecodeVariantsGiveTheGeneralBits) {
  MOECHECK_REQUIRE_GPU();
  const std::vector<int32_t> counts = {1, 16, 0, 9, 8, 2, 13, 16, 1, 5};
  GemmProblem shape;
  shape.experts = static_cast<int64_t>(counts.size());
  shape.row_offset.push_back(0);
  for (int64_t e = 0; e < shape.experts; ++e) {
    if (counts[e] > 0) shape.tile_expert.push_back(static_cast<int32_t>(e));
    shape.row_offset.push_back(shape.row_offset.back() + (counts[e] > 0 ? 64 : 0));
  }
  shape.tile_expert.insert(shape.tile_expert.end(), 2, -1);  // the capacity bound past the plan
  shape.expert_count = counts;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{128, 128}, {384, 256}, {256, 1664}}) {
    GemmProblem p = realistic_problem(47 + k, shape.experts, n, k, shape.tile_expert);
    p.row_offset = shape.row_offset;
    p.expert_count = shape.expert_count;
    poison_padding_rows(p);
    for (auto out : {Precision::f32, Precision::bf16}) {
      const auto general = run_gemm(p, out, kernels::WeightLayout::block_tiles);
      CheckReport r;  // the reference the decode variants are held to: within the bound, routed rows stored
      r.what = "general variant within bound, N " + std::to_string(n) + ", K " + std::to_string(k) + ", out " +
               std::string(to_string(out));
      check_gemm(p, general, out, false, r);
      EXPECT_TRUE(r.ok) << r;
      for (int stages : {2, 3, 5, 0}) {
        SCOPED_TRACE("N " + std::to_string(n) + ", K " + std::to_string(k) + ", out " + std::string(to_string(out)) +
                     ", decode stages " + (stages == 0 ? std::string("chosen per launch") : std::to_string(stages)));
        const auto decode = run_gemm(p, out, kernels::WeightLayout::block_tiles, kernels::GemmSchedule::small_batch,
                                     16, stages);
        ASSERT_EQ(decode.size(), general.size());
        const BitDifferences d = bit_differences(general, decode, n, "general", "decode");
        EXPECT_EQ(d.count, 0) << d.count << " of " << decode.size() << " outputs differ; first: " << d.first;
      }
    }
  }
}

}  // namespace
}  // namespace moecheck::gputest
