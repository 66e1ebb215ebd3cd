// Float64 weight products on the GPU (fp64_weight_products.hpp).
//
// Per product, on one of a few contexts (stream, cuBLAS handle, buffers): the weight's codes and
// scales and the activations a go up (the large ones through page-locked buffers of the context,
// in pieces, so the CPU's copy of one piece overlaps the bus transfer of the last; measured on an
// H100 host at T = 4096: 2.43 s against 3.02 s from pageable memory), fp64_dequantize.cu writes
// W [N, K] in float64 (exact),
// cublasDgemm computes out^T = W a^T (the column-major view of the row-major operands), and out
// comes back. Every call is checked; the output buffer is poisoned (NaN) before each product so
// an unwritten element cannot pass for a value.
#include "kernels/fp64_weight_products.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <fmt/format.h>
#include <iostream>
#include <mutex>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/fp64_context.hpp"
#include "kernels/fp64_dequantize.hpp"
#include "kernels/fp64_budget_products.hpp"
#include "kernels/gpu_backend.hpp"
#include "reference/errors.hpp"

namespace moecheck::kernels {

namespace {

using namespace fp64;

class CudaWeightProducts final : public WeightProducts {
 public:
  CudaWeightProducts(int streams, std::string device) : max_(std::max(1, streams)), device_(std::move(device)) {}

  void multiply(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
                double* out) override {
    if (n == 0) return;
    if (n > INT_MAX || N > INT_MAX || K > INT_MAX)
      throw InputError("", "--device", fmt::format("cuda: a [{} x {}] x [{} x {}]^T product exceeds cuBLAS's int "
                                                   "dimensions; use --device cpu",
                                                   n, K, N, K));
    Context& c = acquire();
    const auto t0 = std::chrono::steady_clock::now();
    Timing tm;
    try {
      tm = run(c, a, n, codes, scales, N, K, B, out);
    } catch (...) {
      cudaStreamSynchronize(c.stream);  // nothing of the failed product may still be running
      release(c);
      throw;
    }
    const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    release(c);
    std::lock_guard<std::mutex> lock(m_);
    ++calls_, busy_s_ += busy, compute_s_ += tm.compute, upload_s_ += tm.upload;
    bytes_ += double(N * K) + 8.0 * double(n * (K + N));
  }

  bool multiply_with_extras(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K,
                            int64_t B, double* out, const ProductExtras& ex) override {
    if (n == 0 || failed_.load()) return false;
    Context& c = acquire();
    const auto t0 = std::chrono::steady_clock::now();
    ProductTiming tm;
    bool ran = false;
    try {
      ran = run_with_extras(c, a, n, codes, scales, N, K, B, out, ex, &tm);
    } catch (const CudaError& e) {
      // The budget's products fall back to this CPU for the rest of the run (the caller computes
      // this product there): a full or failing GPU costs time, not the judgement. Said once.
      cudaStreamSynchronize(c.stream);  // nothing of the failed product may still be running
      release(c);
      if (!failed_.exchange(true))
        std::cerr << "moecheck: the budget's products on the GPU failed (" << e.what()
                  << "); they run on this CPU from here on\n";
      return false;
    } catch (...) {
      cudaStreamSynchronize(c.stream);
      release(c);
      throw;
    }
    const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    release(c);
    std::lock_guard<std::mutex> lock(m_);
    ++extras_calls_, busy_s_ += busy, compute_s_ += tm.compute, upload_s_ += tm.upload, trunc_s_ += tm.truncation;
    if (!ran) ++declined_;
    return ran;
  }

  std::string describe() const override {
    return device_ + ", cuBLAS DGEMM (pedantic math), the budget's products on the GPU";
  }
  std::string activity() const override {
    std::lock_guard<std::mutex> lock(m_);
    return fmt::format("{} products and {} with the budget's extras ({} left to the CPU) on up to {} streams, "
                       "{:.2f} GB of plain products moved over PCIe, {:.3f} s busy (summed over streams), of which "
                       "{:.3f} s uploading and {:.3f} s GPU compute (CUDA events; {:.3f} s of it the truncation pass)",
                       calls_, extras_calls_, declined_, max_, bytes_ * 1e-9, busy_s_, upload_s_, compute_s_, trunc_s_);
  }

 private:
  struct Timing {
    double upload = 0, compute = 0;  // seconds: copies up; dequantize + DGEMM
  };
  Timing run(Context& c, const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K,
           int64_t B, double* out) {
    const size_t nscale = size_t((N + B - 1) / B * ((K + B - 1) / B));
    uint8_t* dc = c.codes.at_least<uint8_t>(size_t(N * K));
    float* ds = c.scales.at_least<float>(nscale);
    double* dw = c.w.at_least<double>(size_t(N * K));
    double* da = c.a.at_least<double>(size_t(n * K));
    double* dout = c.out.at_least<double>(size_t(n * N));
    MOECHECK_CUDA_CHECK(cudaEventRecord(c.upload_start, c.stream));
    upload_staged(dc, codes, size_t(N * K), c.pin_codes, c.stream);
    upload_staged(da, a, size_t(n * K) * sizeof(double), c.pin_a, c.stream);
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(ds, scales, nscale * sizeof(float), cudaMemcpyHostToDevice, c.stream));
    MOECHECK_CUDA_CHECK(cudaMemsetAsync(dout, 0xFF, size_t(n * N) * sizeof(double), c.stream));
    MOECHECK_CUDA_CHECK(cudaEventRecord(c.compute_start, c.stream));
    launch_dequantize_fp64(dc, ds, N, K, B, dw, c.stream);
    // Row-major out [n, N] = a [n, K] W^T is column-major out^T [N, n] = W^T' a^T, where W's
    // row-major [N, K] storage is column-major [K, N] (transposed by the op) and a's is [K, n].
    const double one = 1.0, zero = 0.0;
    FP64_CUBLAS_CHECK(cublasDgemm(c.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(n), int(K), &one, dw, int(K), da,
                                  int(K), &zero, dout, int(N)));
    MOECHECK_CUDA_CHECK(cudaEventRecord(c.compute_end, c.stream));
    const size_t out_bytes = size_t(n * N) * sizeof(double);
    double* pout = c.pin_out.at_least<double>(size_t(n * N));
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(pout, dout, out_bytes, cudaMemcpyDeviceToHost, c.stream));
    MOECHECK_CUDA_CHECK(cudaStreamSynchronize(c.stream));
    std::memcpy(out, pout, out_bytes);
    float up_ms = 0, ms = 0;
    MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&up_ms, c.upload_start, c.compute_start));
    MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, c.compute_start, c.compute_end));
    return {1e-3 * up_ms, 1e-3 * ms};
  }

  Context& acquire() {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return !free_.empty() || int(all_.size()) < max_; });
    if (free_.empty()) {
      all_.push_back(std::make_unique<Context>());
      return *all_.back();
    }
    Context* c = free_.back();
    free_.pop_back();
    return *c;
  }
  void release(Context& c) {
    {
      std::lock_guard<std::mutex> lock(m_);
      free_.push_back(&c);
    }
    cv_.notify_one();
  }

  const int max_;
  const std::string device_;
  mutable std::mutex m_;
  int64_t calls_ = 0, extras_calls_ = 0, declined_ = 0;
  std::atomic<bool> failed_{false};  // a CUDA or cuBLAS failure of the budget's products
  double busy_s_ = 0, bytes_ = 0, compute_s_ = 0, upload_s_ = 0, trunc_s_ = 0;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Context>> all_;
  std::vector<Context*> free_;
};

}  // namespace

std::unique_ptr<WeightProducts> make_cuda_weight_products(int streams) {
  const GpuInfo info = probe_gpu();
  if (!info.usable) throw InputError("", "--device", "cuda: " + info.why);
  return std::make_unique<CudaWeightProducts>(streams, info.device);
}

}  // namespace moecheck::kernels
