// cuBLASLt block-scaled FP8 GEMM on caller data (cublaslt_probe.hpp). Layouts as in
// cublaslt_moe.hpp: A = W (K x N column-major = row-major [N, K]), op T, scales BLK128x128 as
// [N/128][L4] (K-major, column stride L4 = L rounded up to 4); B = tokens (K x M column-major =
// row-major [M, K]), op N, scales VEC128 as [L][M]; D = N x M column-major = row-major [M, N].
#include "kernels/cublaslt_probe.hpp"

#include <cuda_runtime.h>

#include <stdexcept>

#include "kernels/cublaslt_util.cuh"
#include "kernels/cuda_check.hpp"
#include "kernels/device_buffer.hpp"

namespace moecheck::kernels {

namespace {

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
  DeviceBuffer dA(w.size()), dB(a.size()), dAs(w_blk.size() * sizeof(float)), dBs(a_vec.size() * sizeof(float));
  upload_all(dA, w), upload_all(dB, a), upload_all(dAs, w_blk), upload_all(dBs, a_vec);
  DeviceBuffer dD(size_t(M * N) * sizeof(float));
  dD.poison();  // NaN
  constexpr size_t kWorkspace = size_t(32) << 20;
  DeviceBuffer ws(kWorkspace);
  LtHandle handle;
  lt::MatmulDesc desc;
  MOECHECK_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0});
  desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F});
  desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F});
  desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, dAs.as<const float>());
  desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, dBs.as<const float>());
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
                                       ld.h, &r.algo, ws.p, kWorkspace, nullptr));
  MOECHECK_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> out;
  download(out, dD, size_t(M * N));
  if (const long long i = first_poisoned(out); i >= 0)
    throw std::runtime_error("cublaslt probe: output element " + std::to_string(i) + " was not written");
  return out;
}

}  // namespace moecheck::kernels
