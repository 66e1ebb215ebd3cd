// Support for the GPU kernel tests (gpu_kernels_test, gpu_moe_test): the no-GPU skip, device
// buffers poisoned with NaN bytes, seeded test data, and the float64 CPU models the GPU results
// are judged against, each with its derived error bound (the bounds are documented where they
// are computed, in gpu_test_support.cpp).
//
// Every check returns a CheckReport instead of asserting, so the same code serves GoogleTest
// (EXPECT_TRUE(r.ok) << r) and RapidCheck (RC_ASSERT(r.ok)).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/fp8_block_scale_moe.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::gputest {

// ---- No GPU: skip, never pass ---------------------------------------------------------------
// Why no CUDA device can be used (cudaGetDeviceCount failed or found none); nullopt when one
// can. Asked once per process.
const std::optional<std::string>& gpu_unavailable();

#define MOECHECK_REQUIRE_GPU()                                                   \
  do {                                                                           \
    if (const auto& why_no_gpu = ::moecheck::gputest::gpu_unavailable())         \
      GTEST_SKIP() << "no CUDA device: " << *why_no_gpu;                         \
  } while (0)

// ---- Device memory ----------------------------------------------------------------------------
// A device array; every new one (and poison()) is filled with 0xFF bytes: NaN as float, bf16
// and e4m3, -1 as int32, so an element a kernel forgot to write is visible.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) MOECHECK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
    poison();
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { upload(v); }
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  size_t size() const { return n_; }
  void poison() {
    if (n_ > 0) MOECHECK_CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T)));
  }
  void upload(const std::vector<T>& v) {
    if (v.size() != n_) throw std::logic_error("DeviceBuffer::upload: size mismatch");
    if (n_ > 0) MOECHECK_CUDA_CHECK(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const { return download_from(p_, n_); }
  // Any device array (a workspace view, say).
  static std::vector<T> download_from(const T* p, size_t n) {
    std::vector<T> v(n);
    if (n > 0) MOECHECK_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// ---- Check reports ------------------------------------------------------------------------------
// One check: pass/fail, the first few failures spelled out, and the worst error-to-bound ratio
// (LAPACK style: O(1e-2..1) when correct, printed so a shrinking margin is visible).
struct CheckReport {
  std::string what;
  bool ok = true;
  int64_t checked = 0, failures = 0;
  double max_ratio = 0;
  std::string details;  // first failures
  std::string summary;  // "stage: max ratio" of every merged stage

  void fail(const std::string& msg);          // records a failure (keeps the first 8 messages)
  void ratio(double err, double bound, const std::string& where);  // err <= bound or a failure
  void merge(const CheckReport& o);
};
std::ostream& operator<<(std::ostream& os, const CheckReport& r);

// Runs fn(i, report) for i in [0, n) on all cores, one report per worker, merged into one.
CheckReport parallel_check(const std::string& what, int64_t n, const std::function<void(int64_t, CheckReport&)>& fn);

// ---- Seeded data (reference/counter_rng.hpp: identical on every machine) ------------------------
std::vector<float> normal_floats(uint64_t seed, uint64_t stream, size_t n, double sigma);
std::vector<float> uniform_floats(uint64_t seed, uint64_t stream, size_t n, double lo, double hi);
// e4m3fn codes of N(0, sigma^2) values (RNE, saturating); sigma ~ 100 spans the whole format.
std::vector<uint8_t> normal_codes(uint64_t seed, uint64_t stream, size_t n, double sigma);
// Uniformly random finite e4m3fn codes (NaN codes 0x7F / 0xFF excluded); fast, for big weights.
std::vector<uint8_t> random_codes(uint64_t seed, uint64_t stream, size_t n);
// Scales 2^u, u uniform in [lo_exp, hi_exp): distinct per block, so a scale read from the wrong
// block is a visible error (docs/BUG-CLASSES.md #4 lesson 2).
std::vector<float> log_uniform_scales(uint64_t seed, uint64_t stream, size_t n, double lo_exp, double hi_exp);

// ---- CPU model of one block-scaled GEMM row ---------------------------------------------------
// The exact value of DEVICE-ALGORITHM.md §3 for one output row, and the bound on what a correct
// GPU may differ from it (definition in gpu_test_support.cpp, "GEMM error bound").
struct GemmRowModel {
  std::vector<double> exact;  // [N] sum_b fl32(sa_b * sw_b) * p_b, p_b exact
  std::vector<double> bound;  // [N]
};
// a [K] codes + sa [K/128]; w [N, K] codes + sw [N/128, K/128]; out = GEMM output rounding.
GemmRowModel gemm_row_model(const uint8_t* a, const float* sa, const uint8_t* w, const float* sw, int64_t n,
                            int64_t k, Precision out);
// |gpu - exact| <= bound for every column; bf16 outputs must also be bf16 values.
void check_gemm_row(const GemmRowModel& m, const float* gpu, Precision out, const std::string& where,
                    CheckReport& r);

// ---- A whole MoE problem ----------------------------------------------------------------------
struct MoeCase {
  std::string name;
  MoeConfig c;
  int64_t tokens = 1;
  uint64_t seed = 1;
  bool bias = false;              // routing bias (deepseek_v3 / sigmoid_renormalize)
  bool bf16_entry = false;        // fp8_block_scale_moe_from_bf16
  bool fast_weights = false;      // random_codes() weights (DeepSeek-size cases)
  double logit_sigma = 1.0;
  int32_t force_expert = -1;      // >= 0: every token's logit of this expert +20 (all-to-one)
  int32_t favour_first = -1;      // >= 0: experts [offset, offset + local) get +favour_first
  int64_t zero_group_tokens = 1;  // the first n tokens get an all-zero 128-group (eps scale)
  int64_t check_stride = 1;       // CPU GEMM/SiLU checks on every n-th token only (huge T)
  bool block_tiles = false;       // weights packed once (WeightLayout::block_tiles), as the cuda
                                  // backend loads them; large batches then take the large_batch
                                  // GEMM schedule (cuda only: cuBLASLt reads row-major weights)
};
std::ostream& operator<<(std::ostream& os, const MoeCase& m);  // self-describing: name(k=v,...)
// A case of this shape, everything else at its default.
MoeCase make_case(std::string name, RoutingMethod method, int64_t E, int64_t k, int64_t H, int64_t I, int64_t T);
// The whole-layer cases of the GPU backends (gpu_moe_test.cpp, gpu_cublaslt_test.cpp), one
// registry: T = 1, ragged T, experts spanning several M tiles, experts with zero tokens, all
// tokens on one expert, EP (offset > 0, tokens with no local expert), every routing method,
// UE8M0 scales, up_gate, bf16 intermediates and weights, the bf16 entry, DeepSeek-V3 sizes,
// T = 16384. Seeds unset: each test numbers its own selection.
std::vector<MoeCase> layer_cases();

struct MoeHostData {
  std::vector<float> logits, bias;             // [T, E], [E] or empty
  std::vector<uint16_t> hidden_bf16;           // [T, H] (bf16 entry)
  std::vector<uint8_t> hidden_codes;           // [T, H] (fp8 entry)
  std::vector<float> hidden_scales;            // [H/128, T]
  std::vector<uint8_t> w13, w2;                // [E_local, 2I, H], [E_local, H, I]
  std::vector<float> w13_scale, w2_scale;      // [E_local, 2I/128, H/128], [E_local, H/128, I/128]
};
MoeHostData make_moe_data(const MoeCase& m);

// What one GPU run produced: the outputs and every intermediate of the workspace.
struct MoeGpuRun {
  std::vector<uint16_t> out;            // [T, H]
  std::vector<float> expert_outputs;    // [T, k, H]
  std::vector<int32_t> topk_ids;        // [T, k]
  std::vector<float> topk_weights;      // [T, k]
  std::vector<uint8_t> hidden_codes;    // bf16 entry: [T, H]
  std::vector<float> hidden_scales;     // bf16 entry: [H/128, T]
  std::vector<int32_t> expert_count, row_offset, tile_expert, slot_to_row, row_to_slot, totals;
  std::vector<float> gemm1_out;         // [rows, 2I]
  std::vector<uint8_t> a2_codes;        // [rows, I]
  std::vector<float> a2_scales;         // [rows, I/128]
  std::vector<float> gemm2_out;         // [rows, H]
  int64_t rows = 0;                     // capacity rows downloaded
};
// A case on the device, for the runners of both GPU backends: its inputs uploaded, its outputs
// allocated (poisoned), and the layer's arguments pointing at them (the entry m.bf16_entry names).
struct DeviceLayer {
  DeviceLayer(const MoeCase& m, const MoeHostData& d);
  DeviceBuffer<float> logits, bias;
  DeviceBuffer<uint16_t> hidden_bf16;
  DeviceBuffer<uint8_t> hidden_codes;
  DeviceBuffer<float> hidden_scales;
  DeviceBuffer<uint8_t> w13, w2, w13_tiles, w2_tiles;  // tiles: MoeCase::block_tiles
  DeviceBuffer<float> w13s, w2s;
  DeviceBuffer<uint16_t> out;  // [T, H]
  DeviceBuffer<float> eo;      // [T, k, H]
  DeviceBuffer<int32_t> ids;   // [T, k]
  DeviceBuffer<float> wts;     // [T, k]
  kernels::Fp8BlockScaleMoeInputs in;
  kernels::Fp8BlockScaleMoeOutputs o;
};
// The outputs and every intermediate of a finished run; b: the workspace's stage buffers.
MoeGpuRun download_run(const MoeCase& m, const kernels::MoeBuffers& b, const DeviceLayer& dl);
// Poisons outputs and the workspace with 0xFF bytes, runs the MoE, downloads everything.
// via_graph: capture the call on a stream into a CUDA graph and launch the graph instead.
MoeGpuRun run_moe_on_gpu(const MoeCase& m, const MoeHostData& d, bool via_graph = false);

// All stage checks of a run (routing, permutation, GEMM1, SiLU re-quantization, GEMM2, finalize,
// end to end), merged. Rows of no slot must keep the workspace's poison in every buffer
// (GemmPadding::untouched, the cuda backend) or in the SiLU stage's only (computed: cuBLASLt's
// GEMMs write whole row blocks).
enum class GemmPadding { untouched, computed };
CheckReport check_moe(const MoeCase& m, const MoeHostData& d, const MoeGpuRun& g,
                      GemmPadding gemm_padding = GemmPadding::untouched);

// Individual stage checks (also used by the stage tests).
CheckReport check_routing(const MoeConfig& c, const float* logits, const float* bias, int64_t tokens,
                          const std::vector<int32_t>& ids, const std::vector<float>& weights);

}  // namespace moecheck::gputest
