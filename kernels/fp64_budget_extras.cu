// The budget's extra products on the GPU (fp64_budget_extras.hpp). Compiled with --fmad=false
// (kernels/CMakeLists.txt): the truncation pass is truncation_pair.hpp's portable form, and
// without contraction it gives this CPU's portable loop's bits; the column squares likewise.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda_check.hpp"
#include "kernels/fp64_budget_extras.hpp"
#include "reference/truncation_pair.hpp"

namespace moecheck::kernels {

namespace {

namespace tp = truncation_pair;

// e4m3fn: S.EEEE.MMM, bias 7. A normal code is 2^(E-7) (1 + M/8): as a float, exponent field
// E + 120 and the mantissa's top three bits M; a subnormal is M 2^-9; S.1111.111 is NaN. Exact.
__device__ float e4m3_value(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  float v = e == 0 ? float(m) * 0x1p-9f : __int_as_float(((e + 120) << 23) | (m << 20));
  if (e == 0xF && m == 7) v = __int_as_float(0x7FC00000);
  return (c & 0x80) ? -v : v;
}

// A weight row read from its codes, with the values of weight_panel.hpp: dec; mag = |dec|, NaN
// where dec = 0; maga = max(|dec|, 2^-6), NaN where dec = 0 (and for a NaN code).
struct CodeRow {
  const uint8_t* q;
  __device__ float d(int64_t k) const { return e4m3_value(q[k]); }
  __device__ float m(int64_t k) const { return tp::weight_mag(d(k)); }
  __device__ float ma(int64_t k) const { return tp::weight_maga(d(k)); }
};

// Block b (elements k0 .. k0 + len) of pair (r, weight row of srow): the weight row's largest |dec|
// in the block (NaN skipped, as std::max skips a second NaN), its scale, then pair_block.
template <class Row, class WeightRow>
__device__ void pass_block(const TruncationPassArgs& a, int64_t r, int64_t b, int64_t k0, int64_t len, const float* srow,
                           const Row& x, const WeightRow& w, tp::ChunkValues* cv, tp::PairState& st) {
  const int64_t kb = (a.K + a.B - 1) / a.B, per_block = (a.B + a.m - 1) / a.m;
  float bmx = 0;
  for (int64_t k = k0; k < k0 + len; ++k) {
    const float v = w.m(k);
    bmx = bmx < v ? v : bmx;
  }
  const double s = srow[b];
  const double cs = a.cscale ? fabs(s) * a.cscale[r * kb + b] : 0.0;
  tp::pair_block(a.g1, a.r1, k0, len, a.m, a.dcum + r * a.C + b * per_block, s, cs, double(bmx), a.var != nullptr, x, w,
                 cv, st);
}

// Pair (r, o)'s results, and the finite flag cleared where they are not finite.
__device__ void store_pair(const TruncationPassArgs& a, int64_t r, int64_t o, tp::PairState& st) {
  a.err[r * a.N + o] = tp::pair_err(st, a.in != nullptr);
  if (a.abs_out) a.abs_out[r * a.N + o] = st.ab;
  if (a.var) a.var[r * a.N + o] = st.V;
  if (!st.finite) atomicAnd(a.finite, 0);
}

// One thread per pair: 32 weight rows (x) by 4 input rows (y) per block, so a warp shares its
// input row (broadcast loads) and reads 32 weight rows from L1.
constexpr int kRowsO = 32, kRowsR = 4;

__global__ void __launch_bounds__(kRowsO* kRowsR) truncation_pass(TruncationPassArgs a) {
  const int64_t o = int64_t(blockIdx.x) * kRowsO + threadIdx.x, r = int64_t(blockIdx.y) * kRowsR + threadIdx.y;
  if (o >= a.N || r >= a.n) return;
  const int64_t K = a.K, kb = (K + a.B - 1) / a.B;
  const CodeRow w{a.codes + o * K};
  const tp::InputRow x{a.af + r * K,
                       a.hf + r * K,
                       a.lf + r * K,
                       a.in ? a.in + r * K : nullptr,
                       a.code ? a.code + r * K : nullptr,
                       a.field ? a.field + r * K : nullptr};
  const float* srow = a.scales + (o / a.B) * kb;
  tp::ChunkValues cv[kGpuMaxBlockChunks];
  tp::PairState st;
  for (int64_t b = 0; b < kb; ++b) {
    const int64_t k0 = b * a.B, len = (K < k0 + a.B ? K : k0 + a.B) - k0;
    pass_block(a, r, b, k0, len, srow, x, w, cv, st);
  }
  store_pair(a, r, o, st);
}

// The same pass with the block's operands staged in shared memory, K block by K block: the
// weight tile of 32 rows decoded once (rows padded to an odd length, B | 1 floats: a warp's 32
// weight rows fall in 32 banks), the input rows' tiles of 8 rows (read by a whole warp at once: broadcast). Every
// pair then reads its operands from shared memory instead of from L1 with 32 lines per load.
constexpr int kTileO = 32, kTileR = 8, kInputArrays = 6;

size_t tiled_smem_bytes(int64_t B) { return size_t(kTileO * (B | 1) + kInputArrays * kTileR * B) * sizeof(float); }

// An input row's tile: its values of the current K block, at absolute k.
struct TileRow {
  const float *af_, *hf_, *lf_, *in_, *code_, *field_;
  int64_t k0;
  __device__ float af(int64_t k) const { return af_[k - k0]; }
  __device__ float hf(int64_t k) const { return hf_[k - k0]; }
  __device__ float lf(int64_t k) const { return lf_[k - k0]; }
  __device__ float in(int64_t k) const { return in_[k - k0]; }
  __device__ float code(int64_t k) const { return code_[k - k0]; }
  __device__ float field(int64_t k) const { return field_[k - k0]; }
  __device__ bool has_in() const { return in_ != nullptr; }
};
// A weight row's tile: the decoded values of the current K block (mag and maga as CodeRow's).
struct TileWeight {
  const float* dec;
  int64_t k0;
  __device__ float d(int64_t k) const { return dec[k - k0]; }
  __device__ float m(int64_t k) const { return tp::weight_mag(d(k)); }
  __device__ float ma(int64_t k) const { return tp::weight_maga(d(k)); }
};

__global__ void __launch_bounds__(kTileO* kTileR) truncation_pass_tiled(TruncationPassArgs a) {
  extern __shared__ float smem[];
  const int64_t B = a.B, ld = B | 1, K = a.K;
  float* wt = smem;
  float* tile[kInputArrays];
  for (int i = 0; i < kInputArrays; ++i) tile[i] = wt + kTileO * ld + i * kTileR * B;
  const float* src[kInputArrays] = {a.af, a.hf, a.lf, a.in, a.code, a.field};
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kTileO + tx, nthreads = kTileO * kTileR;
  const int64_t o0 = int64_t(blockIdx.x) * kTileO, r0 = int64_t(blockIdx.y) * kTileR;
  const int64_t o = o0 + tx, r = r0 + ty;
  const bool active = o < a.N && r < a.n;
  const int64_t kb = (K + B - 1) / B;
  TileRow x{tile[0] + ty * B,
            tile[1] + ty * B,
            tile[2] + ty * B,
            a.in ? tile[3] + ty * B : nullptr,
            a.code ? tile[4] + ty * B : nullptr,
            a.field ? tile[5] + ty * B : nullptr,
            0};
  TileWeight w{wt + tx * ld, 0};
  const float* srow = a.scales + (o < a.N ? o / B : 0) * kb;
  tp::ChunkValues cv[kGpuMaxBlockChunks];
  tp::PairState st;
  for (int64_t b = 0; b < kb; ++b) {
    const int64_t k0 = b * B, len = (K < k0 + B ? K : k0 + B) - k0;
    __syncthreads();  // every pair is done with the last block's tiles
    for (int64_t i = tid; i < kTileO * len; i += nthreads) {
      const int64_t ro = i / len, j = i % len, og = o0 + ro;
      wt[ro * ld + j] = og < a.N ? e4m3_value(a.codes[og * K + k0 + j]) : 0.0f;
    }
    for (int t = 0; t < kInputArrays; ++t) {
      if (!src[t]) continue;
      for (int64_t i = tid; i < kTileR * len; i += nthreads) {
        const int64_t rr = i / len, j = i % len, rg = r0 + rr;
        tile[t][rr * B + j] = rg < a.n ? src[t][rg * K + k0 + j] : 0.0f;
      }
    }
    __syncthreads();
    if (!active) continue;
    x.k0 = k0, w.k0 = k0;
    pass_block(a, r, b, k0, len, srow, x, w, cv, st);
  }
  if (!active) return;
  store_pair(a, r, o, st);
}

__global__ void weight_forms(const double* __restrict__ w, int64_t count, double* __restrict__ wabs,
                             float* __restrict__ wsq, float* __restrict__ wf) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = w[i];
    if (wabs) wabs[i] = fabs(v);
    if (wsq) wsq[i] = float(v * v);
    if (wf) wf[i] = float(v);
  }
}

__global__ void to_float(const double* __restrict__ from, int64_t count, float* __restrict__ to) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    to[i] = float(from[i]);
}

__global__ void column_squares(const double* __restrict__ w, int64_t N, int64_t K, double* __restrict__ col_sq) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < K; k += int64_t(gridDim.x) * blockDim.x) {
    double s = 0;
    for (int64_t o = 0; o < N; ++o) s += w[o * K + k] * w[o * K + k];
    col_sq[k] = s;
  }
}

unsigned grid_for(int64_t count) { return unsigned(std::max<int64_t>(1, std::min<int64_t>((count + 255) / 256, 4096))); }

}  // namespace

bool truncation_pass_fits(int64_t n, int64_t N) {
  return (n + kRowsR - 1) / kRowsR <= 65535 && (N + kRowsO - 1) / kRowsO <= int64_t(0x7FFFFFFF);
}

namespace {
// The tiled pass where its tiles fit the default 48 KiB of shared memory (blocks of up to 153),
// unless MOECHECK_TRUNCATION_KERNEL=simple asks for the other form (for tests and measurements:
// the two give the same bits; read once per process, any other value means tiled).
bool use_tiled(int64_t B) {
  static const bool simple = [] {
    const char* e = std::getenv("MOECHECK_TRUNCATION_KERNEL");
    return e && std::string(e) == "simple";
  }();
  return !simple && tiled_smem_bytes(B) <= 48 * 1024;
}
}  // namespace

void launch_truncation_pass(const TruncationPassArgs& a, cudaStream_t stream) {
  if (a.n == 0 || a.N == 0) return;
  if (use_tiled(a.B)) {
    const dim3 grid(unsigned((a.N + kTileO - 1) / kTileO), unsigned((a.n + kTileR - 1) / kTileR));
    truncation_pass_tiled<<<grid, dim3(kTileO, kTileR), tiled_smem_bytes(a.B), stream>>>(a);
    MOECHECK_CUDA_CHECK_LAUNCH("truncation_pass_tiled");
    return;
  }
  const dim3 grid(unsigned((a.N + kRowsO - 1) / kRowsO), unsigned((a.n + kRowsR - 1) / kRowsR));
  truncation_pass<<<grid, dim3(kRowsO, kRowsR), 0, stream>>>(a);
  MOECHECK_CUDA_CHECK_LAUNCH("truncation_pass");
}

void launch_weight_forms(const double* w, int64_t count, double* wabs, float* wsq, float* wf, cudaStream_t stream) {
  if (count == 0 || (!wabs && !wsq && !wf)) return;
  weight_forms<<<grid_for(count), 256, 0, stream>>>(w, count, wabs, wsq, wf);
  MOECHECK_CUDA_CHECK_LAUNCH("weight_forms");
}

void launch_to_float(const double* from, int64_t count, float* to, cudaStream_t stream) {
  if (count == 0) return;
  to_float<<<grid_for(count), 256, 0, stream>>>(from, count, to);
  MOECHECK_CUDA_CHECK_LAUNCH("to_float");
}

void launch_column_squares(const double* w, int64_t N, int64_t K, double* col_sq, cudaStream_t stream) {
  if (K == 0) return;
  column_squares<<<grid_for(K), 256, 0, stream>>>(w, N, K, col_sq);
  MOECHECK_CUDA_CHECK_LAUNCH("column_squares");
}

}  // namespace moecheck::kernels
