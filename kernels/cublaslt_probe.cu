// cuBLASLt block-scaled FP8 GEMM on caller data (cublaslt_probe.hpp). Layouts as in
// cublaslt_moe.hpp: A = W (K x N column-major = row-major [N, K]), op T, scales BLK128x128 as
// [N/128][L4] (K-major, column stride L4 = L rounded up to 4); B = tokens (K x M column-major =
// row-major [M, K]), op N, scales VEC128 as [L][M]; D = N x M column-major = row-major [M, N].
#include "kernels/cublaslt_probe.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>

#include "kernels/cublaslt_util.cuh"
#include "kernels/cuda_check.hpp"

namespace moecheck::kernels {

namespace {

template <class T>
struct DeviceVector {
  T* p = nullptr;
  explicit DeviceVector(const std::vector<T>& h) {
    MOECHECK_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T) + 16));
    MOECHECK_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceVector() { cudaFree(p); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
};

struct LtHandle {
  cublasLtHandle_t h = nullptr;
  LtHandle() { MOECHECK_CUBLAS_CHECK(cublasLtCreate(&h)); }
  ~LtHandle() { if (h != nullptr) cublasLtDestroy(h); }
};

}  // namespace

std::vector<float> run_cublaslt_block_gemm(const std::vector<uint8_t>& a, const std::vector<float>& sa,
                                           const std::vector<uint8_t>& w, const std::vector<float>& sw, int64_t M,
                                           int64_t N, int64_t K, std::string* algo) {
  if (M % 4 != 0 || N % 128 != 0 || K % 128 != 0)
    throw std::invalid_argument("cublaslt probe: M must be a multiple of 4, N and K of 128");
  const int64_t L = K / 128, L4 = (L + 3) / 4 * 4;
  // Scales into cuBLASLt's layouts.
  std::vector<float> w_blk(size_t((N / 128) * L4), 1.0f), a_vec(size_t(L * M));
  for (int64_t nb = 0; nb < N / 128; ++nb)
    for (int64_t b = 0; b < L; ++b) w_blk[size_t(nb * L4 + b)] = sw[size_t(nb * L + b)];
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < L; ++b) a_vec[size_t(b * M + m)] = sa[size_t(m * L + b)];
  DeviceVector<uint8_t> dA(w), dB(a);
  DeviceVector<float> dAs(w_blk), dBs(a_vec);
  std::vector<float> out(size_t(M * N));
  std::memset(out.data(), 0xFF, out.size() * sizeof(float));  // poison: NaN
  DeviceVector<float> dD(out);
  constexpr size_t kWorkspace = size_t(32) << 20;
  void* ws = nullptr;
  MOECHECK_CUDA_CHECK(cudaMalloc(&ws, kWorkspace));
  try {
    LtHandle handle;
    lt::MatmulDesc desc;
    MOECHECK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F});
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F});
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const float*>(dAs.p));
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const float*>(dBs.p));
    lt::Layout la(CUDA_R_8F_E4M3, K, N, K), lb(CUDA_R_8F_E4M3, K, M, K), ld(CUDA_R_32F, N, M, N);
    lt::Preference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspace});
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    MOECHECK_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle.h, desc.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &r, &found));
    if (found == 0) throw std::runtime_error("cublaslt probe: the heuristic returned no algorithm");
    if (algo) *algo = lt::describe_algo(r);
    const float alpha = 1.0f, beta = 0.0f;
    MOECHECK_CUBLAS_CHECK(cublasLtMatmul(handle.h, desc.h, &alpha, dA.p, la.h, dB.p, lb.h, &beta, dD.p, ld.h, dD.p,
                                         ld.h, &r.algo, ws, kWorkspace, nullptr));
    MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
    MOECHECK_CUDA_CHECK(cudaMemcpy(out.data(), dD.p, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaFree(ws);
    throw;
  }
  cudaFree(ws);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &out[i], 4);
    if (bits == 0xFFFFFFFFu) throw std::runtime_error("cublaslt probe: output element " + std::to_string(i) + " was not written");
  }
  return out;
}

}  // namespace moecheck::kernels
