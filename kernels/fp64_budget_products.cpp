// The budget's extra products on the GPU (fp64_budget_products.hpp).
//
// One product with its extras: the inputs packed into one page-locked buffer and sent in one copy
// (the codes through the context's staged upload), the weight dequantized exactly into float64
// and its other forms made from it (|W|; W^2 and W rounded to float), then cuBLAS in pedantic
// math mode: DGEMM for the main, magnitude and back products, SGEMM for the float32 ones (their
// inputs rounded to float on the device); the truncation pass and the column norms are kernels
// of fp64_budget_extras.cu. Every output goes into one poisoned (NaN) buffer, comes back in one
// copy and is spread to the caller's arrays (float32 products widened).
#include "kernels/fp64_budget_products.hpp"

#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/fp64_budget_extras.hpp"
#include "kernels/fp64_dequantize.hpp"
#include "reference/errors.hpp"
#include "reference/truncation_pair.hpp"

namespace moecheck::kernels::fp64 {

namespace {

// Arrays laid out one after another in a pack, each at a 256-byte boundary.
struct Pack {
  struct Item {
    const void* host;  // upload: the source; download: nullptr (spread by the caller)
    size_t offset, bytes;
    size_t elem;  // bytes per element: 8 (double) or 4 (float, int)
  };
  std::vector<Item> items;
  size_t bytes = 0;
  size_t add(const void* host, size_t n, size_t elem = 8) {
    const size_t off = bytes;
    items.push_back({host, off, n, elem});
    bytes = (off + n + 255) / 256 * 256;
    return off;
  }
};

template <class T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

bool supported(const ProductExtras& ex, int64_t n, int64_t N, int64_t K, int64_t B) {
  if (n > INT_MAX || N > INT_MAX || K > INT_MAX) return false;
  if (ex.trunc && !truncation_pass_fits(n, N)) return false;
  if (const ProductExtras::Truncation* t = ex.trunc) {
    const ChunkLayout& L = *t->layout;
    if (L.K != K || L.block != B || L.m < 1 || (B + L.m - 1) / L.m > kGpuMaxBlockChunks) return false;
  }
  return true;
}

}  // namespace

bool run_with_extras(Context& c, const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N,
                     int64_t K, int64_t B, double* out, const ProductExtras& ex, ProductTiming* tm) {
  if (!supported(ex, n, N, K, B)) return false;
  const ProductExtras::Truncation* t = ex.trunc;
  const size_t nK = size_t(n * K), nN = size_t(n * N), kb = size_t((K + B - 1) / B);
  const size_t nscale = size_t((N + B - 1) / B) * kb;
  const bool var = t && t->var, codes_var = var && t->codes;
  const int64_t C = t ? t->layout->chunks() : 0;

  // Inputs.
  Pack in;
  const size_t o_a = in.add(a, nK * 8);
  size_t o_abs[2], o_sq = 0, o_lin = 0, o_af = 0, o_hf = 0, o_lf = 0, o_tin = 0, o_code = 0, o_field = 0, o_dcum = 0,
                   o_cs = 0;
  for (int i = 0; i < ex.n_abs; ++i) o_abs[i] = in.add(ex.abs_in[i], nK * 8);
  if (ex.sq_in) o_sq = in.add(ex.sq_in, nK * 8);
  if (ex.lin_in) o_lin = in.add(ex.lin_in, nK * 8);
  if (t) {
    o_af = in.add(t->af, nK * 4), o_hf = in.add(t->hf, nK * 4), o_lf = in.add(t->lf, nK * 4);
    o_dcum = in.add(t->dcum, size_t(n * C) * 8);
    if (t->abs_in) o_tin = in.add(t->abs_in, nK * 4);
    if (codes_var) {
      o_code = in.add(t->codes->code, nK * 4), o_field = in.add(t->codes->field, nK * 4);
      o_cs = in.add(t->codes->scale, size_t(n) * kb * 8);
    }
  }
  // Outputs, and the float32 inputs made on the device.
  Pack outp;
  const size_t p_out = outp.add(nullptr, nN * 8);
  size_t p_abs[2], p_sq = 0, p_lin = 0, p_err = 0, p_var = 0, p_tabs = 0, p_back = 0, p_col = 0;
  for (int i = 0; i < ex.n_abs; ++i) p_abs[i] = outp.add(nullptr, nN * 8);
  if (ex.sq_in) p_sq = outp.add(nullptr, nN * 4, 4);
  if (ex.lin_in) p_lin = outp.add(nullptr, nN * 4, 4);
  if (t) p_err = outp.add(nullptr, nN * 8);
  if (var) p_var = outp.add(nullptr, nN * 8);
  if (t && t->abs_in) p_tabs = outp.add(nullptr, nN * 8);
  if (ex.back) p_back = outp.add(nullptr, nK * 8);
  if (ex.col_sq) p_col = outp.add(nullptr, size_t(K) * 8);
  const size_t p_finite = outp.add(nullptr, 4, 4);
  const size_t out_bytes = outp.bytes;
  const size_t f_sq = ex.sq_in ? outp.add(nullptr, nK * 4, 4) : 0;  // device only, beyond what comes back
  const size_t f_lin = ex.lin_in ? outp.add(nullptr, nK * 4, 4) : 0;

  uint8_t* dc = c.codes.at_least<uint8_t>(size_t(N * K));
  float* ds = c.scales.at_least<float>(nscale);
  double* dw = c.w.at_least<double>(size_t(N * K));
  double* dwabs = ex.n_abs ? c.wabs.at_least<double>(size_t(N * K)) : nullptr;
  float* dwsq = ex.sq_in ? c.wsq.at_least<float>(size_t(N * K)) : nullptr;
  float* dwf = ex.lin_in ? c.wf.at_least<float>(size_t(N * K)) : nullptr;
  char* din = c.in_pack.at_least<char>(in.bytes);
  char* dout = c.out_pack.at_least<char>(outp.bytes);
  char* pin = c.pin_in_pack.at_least<char>(in.bytes);
  char* pout = c.pin_out_pack.at_least<char>(out_bytes);

  MOECHECK_CUDA_CHECK(cudaEventRecord(c.upload_start, c.stream));
  upload_staged(dc, codes, size_t(N * K), c.pin_codes, c.stream);
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(ds, scales, nscale * sizeof(float), cudaMemcpyHostToDevice, c.stream));
  for (const Pack::Item& it : in.items) std::memcpy(pin + it.offset, it.host, it.bytes);
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(din, pin, in.bytes, cudaMemcpyHostToDevice, c.stream));
  MOECHECK_CUDA_CHECK(cudaMemsetAsync(dout, 0xFF, outp.bytes, c.stream));  // NaN: an unwritten value shows
  MOECHECK_CUDA_CHECK(cudaMemsetAsync(dout + p_finite, 1, 4, c.stream));   // nonzero: finite until cleared
  MOECHECK_CUDA_CHECK(cudaEventRecord(c.compute_start, c.stream));

  launch_dequantize_fp64(dc, ds, N, K, B, dw, c.stream);
  launch_weight_forms(dw, N * K, dwabs, dwsq, dwf, c.stream);
  const double one = 1.0, zero = 0.0;
  const float onef = 1.0f, zerof = 0.0f;
  // Row-major out [n, N] = x [n, K] W^T is column-major out^T [N, n] = W^T' x^T (W's row-major
  // [N, K] storage is column-major [K, N]).
  auto dgemm_nt = [&](const double* w, const double* x, double* o) {
    FP64_CUBLAS_CHECK(cublasDgemm(c.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(n), int(K), &one, w, int(K), x,
                                  int(K), &zero, o, int(N)));
  };
  auto sgemm_nt = [&](const float* w, const float* x, float* o) {
    FP64_CUBLAS_CHECK(cublasSgemm(c.handle, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(n), int(K), &onef, w, int(K), x,
                                  int(K), &zerof, o, int(N)));
  };
  double* d_out = at<double>(dout, p_out);
  dgemm_nt(dw, at<double>(din, o_a), d_out);
  for (int i = 0; i < ex.n_abs; ++i) dgemm_nt(dwabs, at<double>(din, o_abs[i]), at<double>(dout, p_abs[i]));
  if (ex.sq_in) {
    launch_to_float(at<double>(din, o_sq), int64_t(nK), at<float>(dout, f_sq), c.stream);
    sgemm_nt(dwsq, at<float>(dout, f_sq), at<float>(dout, p_sq));
  }
  if (ex.lin_in) {
    launch_to_float(at<double>(din, o_lin), int64_t(nK), at<float>(dout, f_lin), c.stream);
    sgemm_nt(dwf, at<float>(dout, f_lin), at<float>(dout, p_lin));
  }
  // back [n, K] = out [n, N] W [N, K]: column-major back^T [K, n] = W^T [K, N] out^T [N, n].
  if (ex.back)
    FP64_CUBLAS_CHECK(cublasDgemm(c.handle, CUBLAS_OP_N, CUBLAS_OP_N, int(K), int(n), int(N), &one, dw, int(K), d_out,
                                  int(N), &zero, at<double>(dout, p_back), int(K)));
  if (ex.col_sq) launch_column_squares(dw, N, K, at<double>(dout, p_col), c.stream);
  if (t) {
    TruncationPassArgs ta{};
    ta.codes = dc, ta.scales = ds;
    ta.n = n, ta.N = N, ta.K = K, ta.B = B, ta.m = t->layout->m, ta.C = C;
    ta.g1 = std::ldexp(1.0, 1 - t->acc->kept_bits);
    ta.r1 = ta.g1 + truncation_pair::kU32;
    ta.af = at<float>(din, o_af), ta.hf = at<float>(din, o_hf), ta.lf = at<float>(din, o_lf);
    ta.in = t->abs_in ? at<float>(din, o_tin) : nullptr;
    ta.code = codes_var ? at<float>(din, o_code) : nullptr;
    ta.field = codes_var ? at<float>(din, o_field) : nullptr;
    ta.dcum = at<double>(din, o_dcum);
    ta.cscale = codes_var ? at<double>(din, o_cs) : nullptr;
    ta.err = at<double>(dout, p_err);
    ta.var = var ? at<double>(dout, p_var) : nullptr;
    ta.abs_out = t->abs_in ? at<double>(dout, p_tabs) : nullptr;
    ta.finite = at<int>(dout, p_finite);
    MOECHECK_CUDA_CHECK(cudaEventRecord(c.trunc_start, c.stream));
    launch_truncation_pass(ta, c.stream);
    MOECHECK_CUDA_CHECK(cudaEventRecord(c.trunc_end, c.stream));
  }
  MOECHECK_CUDA_CHECK(cudaEventRecord(c.compute_end, c.stream));
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(pout, dout, out_bytes, cudaMemcpyDeviceToHost, c.stream));
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  float up_ms = 0, ms = 0;
  MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&up_ms, c.upload_start, c.compute_start));
  MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, c.compute_start, c.compute_end));
  float tr_ms = 0;
  if (t) MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&tr_ms, c.trunc_start, c.trunc_end));
  if (tm) tm->upload = 1e-3 * up_ms, tm->compute = 1e-3 * ms, tm->truncation = 1e-3 * tr_ms;

  if (t && *at<int>(pout, p_finite) == 0) return false;  // the CPU's double path takes this product
  // Every output was poisoned with NaN and every input is finite (the case reader's rules), so a
  // NaN that came back is an output no kernel or GEMM wrote.
  for (const Pack::Item& it : outp.items) {
    if (it.offset == p_finite || it.offset >= out_bytes) continue;
    // All-ones is a NaN, never a value: as a double (8 bytes) or a float (4).
    bool unwritten = false;
    if (it.elem == 8)
      for (size_t i = 0; i < it.bytes / 8; ++i) unwritten |= at<uint64_t>(pout, it.offset)[i] == ~uint64_t(0);
    else
      for (size_t i = 0; i < it.bytes / 4; ++i) unwritten |= at<uint32_t>(pout, it.offset)[i] == ~uint32_t(0);
    if (unwritten)
      throw CudaError("the budget's products on the GPU left an output unwritten (the array at byte " +
                          std::to_string(it.offset) + " of the output pack)",
                      cudaErrorUnknown);
  }
  std::memcpy(out, pout + p_out, nN * 8);
  for (int i = 0; i < ex.n_abs; ++i) std::memcpy(ex.abs_out[i], pout + p_abs[i], nN * 8);
  auto widen = [&](size_t off, double* to) {
    const float* f = at<float>(pout, off);
    for (size_t i = 0; i < nN; ++i) to[i] = f[i];
  };
  if (ex.sq_in) widen(p_sq, ex.sq_out);
  if (ex.lin_in) widen(p_lin, ex.lin_out);
  if (t) std::memcpy(t->err, pout + p_err, nN * 8);
  if (var) std::memcpy(t->var, pout + p_var, nN * 8);
  if (t && t->abs_in) std::memcpy(t->abs_out, pout + p_tabs, nN * 8);
  if (ex.back) std::memcpy(ex.back, pout + p_back, nK * 8);
  if (ex.col_sq) std::memcpy(ex.col_sq, pout + p_col, size_t(K) * 8);
  return true;
}

}  // namespace moecheck::kernels::fp64
