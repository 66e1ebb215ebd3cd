// Float64 weight products on the GPU (fp64_weight_products.hpp): each product, plain or with the
// budget's extras, runs on one of a few contexts (stream, cuBLAS handle, buffers;
// fp64_context.hpp) by fp64_product.cpp, which uploads the codes and the activations through
// page-locked buffers in pieces (measured on an H100 host at T = 4096 for the plain products:
// 2.43 s against 3.02 s from pageable memory), dequantizes W exactly into float64, runs cuBLAS
// DGEMM, and checks that every output value was written (the buffers are poisoned with NaN).
#include "kernels/fp64_weight_products.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <fmt/format.h>
#include <iostream>
#include <mutex>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/fp64_context.hpp"
#include "kernels/fp64_product.hpp"
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
    const ProductExtras none;
    ProductTiming tm;
    bool ran = false;
    const double busy =
        on_context([&](Context& c) { ran = run_with_extras(c, a, n, codes, scales, N, K, B, out, none, &tm); });
    // The plain product has no CPU fallback here: a declined one is a failure, never an unwritten out.
    if (!ran) throw CudaError("the GPU declined a plain float64 product", cudaErrorUnknown);
    std::lock_guard<std::mutex> lock(m_);
    ++calls_, busy_s_ += busy, compute_s_ += tm.compute, upload_s_ += tm.upload;
    bytes_ += double(N * K) + 8.0 * double(n * (K + N));
  }

  bool multiply_with_extras(const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N, int64_t K,
                            int64_t B, double* out, const ProductExtras& ex) override {
    if (n == 0 || failed_.load()) return false;
    ProductTiming tm;
    bool ran = false;
    double busy = 0;
    try {
      busy = on_context([&](Context& c) { ran = run_with_extras(c, a, n, codes, scales, N, K, B, out, ex, &tm); });
    } catch (const CudaError& e) {
      // The budget's products fall back to this CPU for the rest of the run (the caller computes
      // this product there): a full or failing GPU, or a context that cannot be made, costs time,
      // not the judgement. Said once.
      if (!failed_.exchange(true))
        std::cerr << "moecheck: the budget's products on the GPU failed (" << e.what()
                  << "); they run on this CPU from here on\n";
      return false;
    }
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
  // Runs f on a free context and returns its wall seconds. On an exception nothing of the product
  // may still be running when the context goes back: its stream is drained first.
  template <class F>
  double on_context(F&& f) {
    Context& c = acquire();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f(c);
    } catch (...) {
      cudaStreamSynchronize(c.stream);
      release(c);
      throw;
    }
    const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    release(c);
    return busy;
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
