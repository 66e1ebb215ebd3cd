// The float64 weight products on the GPU, with the budget's extras or without (fp64_product.hpp).
//
// One product: the inputs packed into one page-locked buffer and sent in pieces (the codes
// through the context's staged upload), the weight dequantized exactly into float64 and, for the
// extras, its other forms made from it (|W|; W^2 and W rounded to float), then cuBLAS in pedantic
// math mode: DGEMM for the main, magnitude and back products, SGEMM for the float32 ones (their
// inputs rounded to float on the device); the truncation pass and the column norms are kernels
// of fp64_budget_extras.cu. Every output goes into one poisoned (NaN) buffer, comes back in one
// copy, is checked for values nothing wrote, and is spread to the caller's arrays (float32
// products widened).
#include "kernels/fp64_product.hpp"

#include <algorithm>
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
T* at(char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}
template <class T>
const T* at(const char* base, size_t offset) {
  return reinterpret_cast<const T*>(base + offset);
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

// Where every array of one product sits: the inputs' pack (sent in pieces as it fills) and the outputs'
// pack (poisoned, computed into, downloaded in one copy up to out_bytes; beyond it the float32
// inputs made on the device). Offsets into the packs; 0 for an array the product does not have.
struct Layout {
  Pack in, out;
  size_t a = 0, abs[2] = {}, sq = 0, lin = 0, af = 0, hf = 0, lf = 0, tin = 0, code = 0, field = 0, dcum = 0, cs = 0;
  size_t o = 0, o_abs[2] = {}, o_sq = 0, o_lin = 0, err = 0, var = 0, tabs = 0, back = 0, col = 0, finite = 0;
  size_t out_bytes = 0, f_sq = 0, f_lin = 0;
  size_t nK = 0, nN = 0, kb = 0, nscale = 0;
  bool var_wanted = false, codes_var = false;
  int64_t C = 0;
};

Layout plan(const double* a, int64_t n, int64_t N, int64_t K, int64_t B, const ProductExtras& ex) {
  const ProductExtras::Truncation* t = ex.trunc;
  Layout L;
  L.nK = size_t(n * K), L.nN = size_t(n * N), L.kb = size_t((K + B - 1) / B);
  L.nscale = size_t((N + B - 1) / B) * L.kb;
  L.var_wanted = t && t->var, L.codes_var = L.var_wanted && t->codes;
  L.C = t ? t->layout->chunks() : 0;
  const size_t nK = L.nK, nN = L.nN;

  Pack& in = L.in;
  L.a = in.add(a, nK * 8);
  for (int i = 0; i < ex.n_abs; ++i) L.abs[i] = in.add(ex.abs_in[i], nK * 8);
  if (ex.sq_in) L.sq = in.add(ex.sq_in, nK * 8);
  if (ex.lin_in) L.lin = in.add(ex.lin_in, nK * 8);
  if (t) {
    L.af = in.add(t->af, nK * 4), L.hf = in.add(t->hf, nK * 4), L.lf = in.add(t->lf, nK * 4);
    L.dcum = in.add(t->dcum, size_t(n * L.C) * 8);
    if (t->abs_in) L.tin = in.add(t->abs_in, nK * 4);
    if (L.codes_var) {
      L.code = in.add(t->codes->code, nK * 4), L.field = in.add(t->codes->field, nK * 4);
      L.cs = in.add(t->codes->scale, size_t(n) * L.kb * 8);
    }
  }
  Pack& out = L.out;
  L.o = out.add(nullptr, nN * 8);
  for (int i = 0; i < ex.n_abs; ++i) L.o_abs[i] = out.add(nullptr, nN * 8);
  if (ex.sq_in) L.o_sq = out.add(nullptr, nN * 4, 4);
  if (ex.lin_in) L.o_lin = out.add(nullptr, nN * 4, 4);
  if (t) L.err = out.add(nullptr, nN * 8);
  if (L.var_wanted) L.var = out.add(nullptr, nN * 8);
  if (t && t->abs_in) L.tabs = out.add(nullptr, nN * 8);
  if (ex.back) L.back = out.add(nullptr, nK * 8);
  if (ex.col_sq) L.col = out.add(nullptr, size_t(K) * 8);
  L.finite = out.add(nullptr, 4, 4);
  L.out_bytes = out.bytes;
  L.f_sq = ex.sq_in ? out.add(nullptr, nK * 4, 4) : 0;  // device only, beyond what comes back
  L.f_lin = ex.lin_in ? out.add(nullptr, nK * 4, 4) : 0;
  return L;
}

// The device arrays of one product on c (grown to the largest request).
struct DeviceArrays {
  uint8_t* codes;
  float* scales;
  double *w, *wabs;
  float *wsq, *wf;
  char *in, *out, *pin, *pout;
};

DeviceArrays device_arrays(Context& c, const Layout& L, int64_t N, int64_t K, const ProductExtras& ex) {
  DeviceArrays d;
  d.codes = c.codes.at_least<uint8_t>(size_t(N * K));
  d.scales = c.scales.at_least<float>(L.nscale);
  d.w = c.w.at_least<double>(size_t(N * K));
  d.wabs = ex.n_abs ? c.wabs.at_least<double>(size_t(N * K)) : nullptr;
  d.wsq = ex.sq_in ? c.wsq.at_least<float>(size_t(N * K)) : nullptr;
  d.wf = ex.lin_in ? c.wf.at_least<float>(size_t(N * K)) : nullptr;
  d.in = c.in_pack.at_least<char>(L.in.bytes);
  d.out = c.out_pack.at_least<char>(L.out.bytes);
  d.pin = c.pin_in_pack.at_least<char>(L.in.bytes);
  d.pout = c.pin_out_pack.at_least<char>(L.out_bytes);
  return d;
}

// The input pack through its page-locked twin: each item copied in, and the pack sent in pieces of
// at least 4 MiB as they fill, so the CPU's copy of one piece overlaps the bus transfer of the one
// before (measured for the activations alone, fp64_weight_products.cpp).
void upload_pack(const Pack& in, char* pin, char* dev, cudaStream_t stream) {
  constexpr size_t kPiece = size_t(4) << 20;
  size_t sent = 0;
  auto send = [&](size_t upto) {
    if (upto <= sent) return;
    MOECHECK_CUDA_CHECK(cudaMemcpyAsync(dev + sent, pin + sent, upto - sent, cudaMemcpyHostToDevice, stream));
    sent = upto;
  };
  for (const Pack::Item& it : in.items)
    for (size_t off = 0; off < it.bytes; off += kPiece) {
      const size_t len = std::min(kPiece, it.bytes - off), end = it.offset + off + len;
      std::memcpy(pin + it.offset + off, static_cast<const char*>(it.host) + off, len);
      if (end - sent >= kPiece) send(end);
    }
  send(in.bytes);
}

// The codes, scales and input pack up; the output pack poisoned (NaN: an unwritten value shows)
// and its finite flag set (nonzero: finite until a pair clears it).
void upload(Context& c, const Layout& L, const DeviceArrays& d, const uint8_t* codes, const float* scales,
            int64_t N, int64_t K) {
  MOECHECK_CUDA_CHECK(cudaEventRecord(c.upload_start, c.stream));
  upload_staged(d.codes, codes, size_t(N * K), c.pin_codes, c.stream);
  upload_pack(L.in, d.pin, d.in, c.stream);
  // From pageable memory, so it may wait for the copies before it: after the pack is filled.
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(d.scales, scales, L.nscale * sizeof(float), cudaMemcpyHostToDevice, c.stream));
  MOECHECK_CUDA_CHECK(cudaMemsetAsync(d.out, 0xFF, L.out.bytes, c.stream));
  MOECHECK_CUDA_CHECK(cudaMemsetAsync(d.out + L.finite, 1, 4, c.stream));
}

// The weight in float64 (exact) and its other forms, then the GEMMs: DGEMM for the main,
// magnitude and back products, SGEMM for the float32 ones (inputs rounded to float here).
void products(Context& c, const Layout& L, const DeviceArrays& d, int64_t n, int64_t N, int64_t K, int64_t B,
              const ProductExtras& ex) {
  launch_dequantize_fp64(d.codes, d.scales, N, K, B, d.w, c.stream);
  launch_weight_forms(d.w, N * K, d.wabs, d.wsq, d.wf, c.stream);
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
  double* out = at<double>(d.out, L.o);
  dgemm_nt(d.w, at<double>(d.in, L.a), out);
  for (int i = 0; i < ex.n_abs; ++i) dgemm_nt(d.wabs, at<double>(d.in, L.abs[i]), at<double>(d.out, L.o_abs[i]));
  if (ex.sq_in) {
    launch_to_float(at<double>(d.in, L.sq), int64_t(L.nK), at<float>(d.out, L.f_sq), c.stream);
    sgemm_nt(d.wsq, at<float>(d.out, L.f_sq), at<float>(d.out, L.o_sq));
  }
  if (ex.lin_in) {
    launch_to_float(at<double>(d.in, L.lin), int64_t(L.nK), at<float>(d.out, L.f_lin), c.stream);
    sgemm_nt(d.wf, at<float>(d.out, L.f_lin), at<float>(d.out, L.o_lin));
  }
  // back [n, K] = out [n, N] W [N, K]: column-major back^T [K, n] = W^T [K, N] out^T [N, n].
  if (ex.back)
    FP64_CUBLAS_CHECK(cublasDgemm(c.handle, CUBLAS_OP_N, CUBLAS_OP_N, int(K), int(n), int(N), &one, d.w, int(K), out,
                                  int(N), &zero, at<double>(d.out, L.back), int(K)));
  if (ex.col_sq) launch_column_squares(d.w, N, K, at<double>(d.out, L.col), c.stream);
}

// The truncation pass (fp64_budget_extras.cu) over every pair, between its own events.
void truncation(Context& c, const Layout& L, const DeviceArrays& d, int64_t n, int64_t N, int64_t K, int64_t B,
                const ProductExtras::Truncation& t) {
  TruncationPassArgs ta{};
  ta.codes = d.codes, ta.scales = d.scales;
  ta.n = n, ta.N = N, ta.K = K, ta.B = B, ta.m = t.layout->m, ta.C = L.C;
  ta.g1 = std::ldexp(1.0, 1 - t.acc->kept_bits);
  ta.r1 = ta.g1 + truncation_pair::kU32;
  ta.af = at<float>(d.in, L.af), ta.hf = at<float>(d.in, L.hf), ta.lf = at<float>(d.in, L.lf);
  ta.in = t.abs_in ? at<float>(d.in, L.tin) : nullptr;
  ta.code = L.codes_var ? at<float>(d.in, L.code) : nullptr;
  ta.field = L.codes_var ? at<float>(d.in, L.field) : nullptr;
  ta.dcum = at<double>(d.in, L.dcum);
  ta.cscale = L.codes_var ? at<double>(d.in, L.cs) : nullptr;
  ta.err = at<double>(d.out, L.err);
  ta.var = L.var_wanted ? at<double>(d.out, L.var) : nullptr;
  ta.abs_out = t.abs_in ? at<double>(d.out, L.tabs) : nullptr;
  ta.finite = at<int>(d.out, L.finite);
  MOECHECK_CUDA_CHECK(cudaEventRecord(c.trunc_start, c.stream));
  launch_truncation_pass(ta, c.stream);
  MOECHECK_CUDA_CHECK(cudaEventRecord(c.trunc_end, c.stream));
}

ProductTiming timing(Context& c, bool with_truncation) {
  float up_ms = 0, ms = 0, tr_ms = 0;
  MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&up_ms, c.upload_start, c.compute_start));
  MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, c.compute_start, c.compute_end));
  if (with_truncation) MOECHECK_CUDA_CHECK(cudaEventElapsedTime(&tr_ms, c.trunc_start, c.trunc_end));
  return {1e-3 * up_ms, 1e-3 * ms, 1e-3 * tr_ms};
}

// Every output was poisoned with all-ones bytes: a NaN (as a double or a float) that no
// arithmetic here produces from finite inputs (the case reader rejects non-finite data, and the
// forward's intermediates are finite sums of it), so an all-ones value that came back is an
// output no kernel or GEMM wrote.
void check_written(const Layout& L, const char* pout) {
  for (const Pack::Item& it : L.out.items) {
    if (it.offset == L.finite || it.offset >= L.out_bytes) continue;
    bool unwritten = false;
    if (it.elem == 8)
      for (size_t i = 0; i < it.bytes / 8; ++i) unwritten |= at<const uint64_t>(pout, it.offset)[i] == ~uint64_t(0);
    else
      for (size_t i = 0; i < it.bytes / 4; ++i) unwritten |= at<const uint32_t>(pout, it.offset)[i] == ~uint32_t(0);
    if (unwritten)
      throw CudaError("a float64 product on the GPU left an output unwritten (the array at byte " +
                          std::to_string(it.offset) + " of the output pack)",
                      cudaErrorUnknown);
  }
}

// The downloaded outputs to the caller's arrays, float32 products widened to double.
void spread(const Layout& L, const char* pout, int64_t K, double* out, const ProductExtras& ex) {
  const size_t nN = L.nN;
  const ProductExtras::Truncation* t = ex.trunc;
  std::memcpy(out, pout + L.o, nN * 8);
  for (int i = 0; i < ex.n_abs; ++i) std::memcpy(ex.abs_out[i], pout + L.o_abs[i], nN * 8);
  auto widen = [&](size_t off, double* to) {
    const float* f = at<const float>(pout, off);
    for (size_t i = 0; i < nN; ++i) to[i] = f[i];
  };
  if (ex.sq_in) widen(L.o_sq, ex.sq_out);
  if (ex.lin_in) widen(L.o_lin, ex.lin_out);
  if (t) std::memcpy(t->err, pout + L.err, nN * 8);
  if (L.var_wanted) std::memcpy(t->var, pout + L.var, nN * 8);
  if (t && t->abs_in) std::memcpy(t->abs_out, pout + L.tabs, nN * 8);
  if (ex.back) std::memcpy(ex.back, pout + L.back, L.nK * 8);
  if (ex.col_sq) std::memcpy(ex.col_sq, pout + L.col, size_t(K) * 8);
}

}  // namespace

bool run_with_extras(Context& c, const double* a, int64_t n, const uint8_t* codes, const float* scales, int64_t N,
                     int64_t K, int64_t B, double* out, const ProductExtras& ex, ProductTiming* tm) {
  if (!supported(ex, n, N, K, B)) return false;
  const Layout L = plan(a, n, N, K, B, ex);
  const DeviceArrays d = device_arrays(c, L, N, K, ex);
  upload(c, L, d, codes, scales, N, K);
  MOECHECK_CUDA_CHECK(cudaEventRecord(c.compute_start, c.stream));
  products(c, L, d, n, N, K, B, ex);
  if (ex.trunc) truncation(c, L, d, n, N, K, B, *ex.trunc);
  MOECHECK_CUDA_CHECK(cudaEventRecord(c.compute_end, c.stream));
  MOECHECK_CUDA_CHECK(cudaMemcpyAsync(d.pout, d.out, L.out_bytes, cudaMemcpyDeviceToHost, c.stream));
  MOECHECK_CUDA_CHECK(cudaStreamSynchronize(c.stream));
  if (tm) *tm = timing(c, ex.trunc != nullptr);
  if (ex.trunc && *at<int>(d.pout, L.finite) == 0) return false;  // the CPU's double path takes this product
  check_written(L, d.pout);
  spread(L, d.pout, K, out, ex);
  return true;
}

}  // namespace moecheck::kernels::fp64
