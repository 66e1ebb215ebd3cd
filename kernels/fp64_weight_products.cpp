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
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <fmt/format.h>
#include <mutex>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/fp64_dequantize.hpp"
#include "kernels/gpu_backend.hpp"
#include "reference/errors.hpp"

namespace moecheck::kernels {

namespace {

void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw CudaError(fmt::format("{} failed: {} ({}) ({}:{})", call, cublasGetStatusName(s), cublasGetStatusString(s),
                                file, line),
                    cudaErrorUnknown);
}
#define FP64_CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)

// Where a Grown buffer lives: device memory, or page-locked host memory (copies from it run at
// the bus's rate and asynchronously, where copies from pageable memory go through the driver's
// own staging).
struct DeviceMemory {
  static void* allocate(size_t n) {
    void* p = nullptr;
    MOECHECK_CUDA_CHECK(cudaMalloc(&p, n));
    return p;
  }
  static cudaError_t release(void* p) { return cudaFree(p); }
};
struct PinnedMemory {
  static void* allocate(size_t n) {
    void* p = nullptr;
    MOECHECK_CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocDefault));
    return p;
  }
  static cudaError_t release(void* p) { return cudaFreeHost(p); }
};

// A buffer grown to the largest request (contents not kept across growth).
template <class Memory>
struct Grown {
  void* p = nullptr;
  size_t bytes = 0;
  ~Grown() {
    if (p) Memory::release(p);
  }
  template <class T>
  T* at_least(size_t count) {
    const size_t need = count * sizeof(T);
    if (need > bytes) {
      if (p) MOECHECK_CUDA_CHECK(Memory::release(p));
      p = nullptr, bytes = 0;
      p = Memory::allocate(need);
      bytes = need;
    }
    return static_cast<T*>(p);
  }
};
using GrownDevice = Grown<DeviceMemory>;
using GrownPinned = Grown<PinnedMemory>;

// Copies n bytes from pageable src to device dst through the pinned buffer stage, in pieces, so
// that the CPU's copy of one piece overlaps the bus transfer of the previous one.
void upload_staged(void* dst, const void* src, size_t n, GrownPinned& stage, cudaStream_t stream) {
  constexpr size_t kPiece = size_t(4) << 20;
  char* pin = stage.at_least<char>(n);
  for (size_t off = 0; off < n; off += kPiece) {
    const size_t len = std::min(kPiece, n - off);
    std::memcpy(pin + off, static_cast<const char*>(src) + off, len);
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, pin + off, len, cudaMemcpyHostToDevice, stream));
  }
}

struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  GrownDevice codes, scales, w, a, out;
  GrownPinned pin_codes, pin_a, pin_out;
  cudaEvent_t upload_start = nullptr;                           // before the first copy up
  cudaEvent_t compute_start = nullptr, compute_end = nullptr;  // around dequantize + DGEMM
  Context() {
    try {
      MOECHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&upload_start));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&compute_start));
      MOECHECK_CUDA_CHECK(cudaEventCreate(&compute_end));
      FP64_CUBLAS_CHECK(cublasCreate(&handle));
      FP64_CUBLAS_CHECK(cublasSetStream(handle, stream));
      // Pedantic: the prescribed precision in every phase (no TF32-like or emulated FP64 paths).
      FP64_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH));
    } catch (...) {
      release_handles();
      throw;
    }
  }
  ~Context() { release_handles(); }
  void release_handles() {
    if (upload_start) cudaEventDestroy(upload_start), upload_start = nullptr;
    if (compute_start) cudaEventDestroy(compute_start), compute_start = nullptr;
    if (compute_end) cudaEventDestroy(compute_end), compute_end = nullptr;
    if (handle) cublasDestroy(handle), handle = nullptr;
    if (stream) cudaStreamDestroy(stream), stream = nullptr;
  }
};

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

  std::string describe() const override { return device_ + ", cuBLAS DGEMM (pedantic math)"; }
  std::string activity() const override {
    std::lock_guard<std::mutex> lock(m_);
    return fmt::format("{} products on up to {} streams, {:.2f} GB moved over PCIe, {:.3f} s busy (summed over streams), "
                       "of which {:.3f} s uploading and {:.3f} s GPU compute (dequantize + DGEMM; CUDA events)",
                       calls_, max_, bytes_ * 1e-9, busy_s_, upload_s_, compute_s_);
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
  int64_t calls_ = 0;
  double busy_s_ = 0, bytes_ = 0, compute_s_ = 0, upload_s_ = 0;
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
