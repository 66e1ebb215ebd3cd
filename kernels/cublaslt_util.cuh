// Checked cuBLASLt calls and owners of its descriptors, shared by the cublaslt backend
// (cublaslt_moe.cu) and the probe of cuBLASLt's block-scaled GEMM (cublaslt_probe.cu).
// CUDA-only header (cublasLt.h): include it from .cu files.
#pragma once

#include <cublasLt.h>

#include <sstream>
#include <string>

#include "kernels/cuda_check.hpp"

namespace moecheck::kernels::lt {

// ---- Checked cuBLASLt calls -----------------------------------------------------------------
inline void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(std::string(call) + " failed: " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) +
                      ") (" + file + ":" + std::to_string(line) + ")",
                  cudaErrorUnknown);
}
#define MOECHECK_CUBLAS_CHECK(call) ::moecheck::kernels::lt::cublas_check((call), #call, __FILE__, __LINE__)

// Owners of cuBLASLt descriptors (destroy statuses are ignored: nothing useful to do with them).
struct MatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  ~MatmulDesc() { if (h != nullptr) cublasLtMatmulDescDestroy(h); }
  template <class V>
  void set(cublasLtMatmulDescAttributes_t a, const V& v) {
    MOECHECK_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(h, a, &v, sizeof(v)));
  }
};
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    MOECHECK_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&h, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  }
  ~Layout() { if (h != nullptr) cublasLtMatrixLayoutDestroy(h); }
};
struct Preference {
  cublasLtMatmulPreference_t h = nullptr;
  Preference() { MOECHECK_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&h)); }
  ~Preference() { if (h != nullptr) cublasLtMatmulPreferenceDestroy(h); }
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t a, const V& v) {
    MOECHECK_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(h, a, &v, sizeof(v)));
  }
};

// Largest power of two (<= 256, cuBLASLt's default assumption) dividing the address.
inline uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t r = 256;
  while (r > 1 && a % r != 0) r >>= 1;
  return r;
}

// "algo=66 tile=... splitk=2 ...": what the heuristic chose, for logs and reports.
inline std::string describe_algo(const cublasLtMatmulHeuristicResult_t& r) {
  int32_t id = 0, splitk = 0;
  uint32_t tile = 0, stages = 0, reduction = 0, swizzle = 0, custom = 0;
  uint16_t inner = 0, cluster = 0;
  size_t written = 0;
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t a, void* v, size_t n) {
    MOECHECK_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&r.algo, a, v, n, &written));
  };
  get(CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id));
  get(CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
  get(CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages));
  get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk));
  get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof(reduction));
  get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle));
  get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom));
  get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner, sizeof(inner));
  get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster));
  std::ostringstream os;
  os << "algo=" << id << " tile=" << tile << " stages=" << stages << " splitk=" << splitk << " reduction=" << reduction
     << " swizzle=" << swizzle << " custom=" << custom << " inner=" << inner << " cluster=" << cluster
     << " workspace=" << r.workspaceSize << " waves=" << r.wavesCount;
  return os.str();
}


}  // namespace moecheck::kernels::lt
