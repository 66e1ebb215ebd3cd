// The float64 MoE forward (see moe_forward.hpp for the tiers and their rounding steps).
//
// How this file is organised:
//   plan       group the (token, slot) pairs of each chunk of tokens by local expert
//   panels     dequantize a few rows of an FP8 weight at a time through per-block tables
//   expert     the two GEMMs of one expert, with the tier's roundings in between
//   driver     chunks of tokens, worker threads over experts, combine in slot order
#include "reference/moe_forward.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <mutex>
#include <thread>
#include <tuple>

#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_combine.hpp"
#include "reference/noise_model.hpp"
#include "reference/parallel_jobs.hpp"
#include "reference/requant_projection.hpp"
#include "reference/tail_bound.hpp"
#include "reference/truncation_bound.hpp"
#include "reference/weight_panel.hpp"

namespace moecheck {

std::string_view to_string(Tier t) { return t == Tier::ideal ? "ideal" : "quantized"; }
std::optional<Tier> parse_tier(std::string_view s) {
  if (s == "ideal") return Tier::ideal;
  if (s == "quantized") return Tier::quantized;
  return std::nullopt;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double silu_slope(double g) {
  const double sg = 1.0 / (1.0 + std::exp(-g));
  return sg * (1.0 + g * (1.0 - sg));
}
double round_to(double x, Precision p) { return p == Precision::bf16 ? double(bf16_round(x)) : double(fl32(x)); }

namespace {

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMap = Eigen::Map<RowMat>;
using ConstRowMap = Eigen::Map<const RowMat>;

// ---- plan ----------------------------------------------------------------------------
struct ExpertJob {
  int64_t expert = 0;              // global id
  std::vector<int64_t> slots;      // t_local * k + j, ascending (token order)
};

// Slot outputs are held for a chunk of tokens at a time; this bounds that buffer.
constexpr int64_t kSlotBufferBytes = int64_t(512) << 20;

// ---- panels --------------------------------------------------------------------------
// Rows of a weight dequantized per GEMM call: 32 rows x H doubles (1.8 MiB at H = 7168) stay in
// L2/L3 while the GEMM reads them.
constexpr int64_t kPanelRows = 32;

// The float operands of the truncation bound's fast path (truncation_bound.hpp): the panel's
// e4m3 values dec and mag = |dec| (NaN where zero), [kPanelRows, K] each.
// maga: their alignment magnitudes max(|dec|, 2^-6) (NaN where zero; truncation_bound.hpp).
struct Float32Panel {
  float* dec;
  float* mag;
  float* maga;
};

// A float buffer of n values that starts on a 64-byte boundary, inside v (resized for the
// room): the truncation pass reads its float operands (the rows' and the weight panel's) with
// 32-byte loads at multiples of 8 floats along K, and from a 16-byte aligned start (what the
// allocator gives) every other load would span two cache lines. Aligned, the panel's
// dequantization and truncation pass at K = 7168 (rows of a multiple of 16 floats stay aligned)
// took 5-8 % less time on a 2-core EPYC (Zen 2) for 2 to 5 input rows; the values read are the
// same.
float* aligned_floats(std::vector<float>& v, size_t n) {
  v.resize(n + 16);
  const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
}

// The weights' alignment magnitude A(w) (truncation_bound.hpp): an e4m3 subnormal code aligns as
// 2^-6 of its block's scale.
constexpr double kSubnormalAlign = 0x1p-6;

// Products computed from the same dequantized panels as the main one (the budgets' extras):
// abs: out = in * |W|^T, the sums of magnitudes; back: back = out * W [n, K], the main product's
// output multiplied back through W (the flip projections <W2[:, i], y> of BUDGETS.md §7 for
// every i at once, contiguous, instead of a strided walk down W2's columns per flip).
struct AbsProduct {
  const RowMat* in;
  RowMat* out;
};
// The chunked truncation bound of a truncating accumulator (truncation_bound.hpp): per row of
// the input its chunk maxima and deviation sums, out err [n, N] = sum over blocks of E_b. The
// float32 path is used when the rows' float inputs exist (rows_f32) and it answers; else the
// double one.
struct TruncationProduct {
  const ChunkLayout* layout;
  const AccumulatorModel* acc;
  const RowMat* hi;
  const RowMat* lo;
  const RowMat* dcum;
  RowMat* err;
  std::vector<double>* scratch;
  RowMat* var = nullptr;  // [n, N] the noise model's variance proxy of the same error (BUDGETS.md §10.1)
  const float* af = nullptr;  // [n, K] float inputs of the rows
  const float* hf = nullptr;
  const float* lf = nullptr;
  // The first magnitude product's input rounded up ([n, K]; null: not fused): the float path
  // then computes that product too, from the same pass (truncation_bound.hpp).
  const float* abs_in = nullptr;
  bool rows_f32 = false;
  Float32Panel panel{};  // buffers for the weights' float operands ([kPanelRows, K] each)
  std::vector<double>* walign = nullptr;  // buffer for the double path's A(w) panel
  const RowCodes* codes = nullptr;        // the rows' codes for the variance's per-term losses (float path)
};
// The float32 products (the squares of the noise model, the re-quantization direction: each needs
// a few digits; float halves the GEMM's cost): the input converted once per call into `in`, the
// panel's (squared) weights into `panel`, the product into `out` before it is widened.
struct Float32Buffers {
  std::vector<float> panel, in, out;
};
// out [n, ceil(K/group)]: per row and group g of K, the projection of the group's own part of the
// product, (in_g W_g^T)[r, :], on the whole product row (in W^T)[r, :], in float32 (a variance
// needs a few digits): how a common factor on group g moves the row along itself (BUDGETS.md §7).
struct GroupProjection {
  const RowMat* in = nullptr;
  RowMat* out = nullptr;
  int64_t group = 0;
  std::vector<float> panel, a, part, whole;
};
struct PanelExtras {
  AbsProduct abs[2];
  int n_abs = 0;
  RowMat* back = nullptr;
  // When given, back is needed only at these (row, column) pairs (the flip-able intermediates of
  // each row): computed as dot products when they are few, else as the whole product.
  const std::vector<std::vector<std::pair<int64_t, double>>>* back_only = nullptr;
  // With back: col_sq [K] = the squared norms of W's columns, sum over the N rows of W[:, k]^2
  // (how far a flip of input k moves the whole output: the energy test's crossings, §10.8), at
  // the back_only columns when the back product is sparse (0 elsewhere), else at every column.
  std::vector<double>* col_sq = nullptr;
  const TruncationProduct* trunc = nullptr;  // needs n_abs > 0 (it reads the |W| panel)
  // sq: out = in * (W o W)^T, the sums of squares of the noise model (BUDGETS.md §10.2), through
  // the float32 buffers sq_buf.
  AbsProduct sq{};
  Float32Buffers* sq_buf = nullptr;
  // lin: out = in * W^T in float32 through lin_buf (the re-quantization direction, §10.7: a test
  // direction needs a few digits, as a variance does).
  AbsProduct lin{};
  Float32Buffers* lin_buf = nullptr;
  GroupProjection* grp = nullptr;
  void add_abs(const RowMat* in, RowMat* out) { abs[n_abs++] = {in, out}; }
  void add_sq(const RowMat* in, RowMat* out, Float32Buffers* buf) { sq = {in, out}, sq_buf = buf; }
  void add_lin(const RowMat* in, RowMat* out, Float32Buffers* buf) { lin = {in, out}, lin_buf = buf; }
};

// out [n, N] = a [n, K] * W^T, W the [N, K] FP8 weight, dequantized panel by panel (and |W|
// from the same codes through a table of magnitudes, when extras ask for it).
void gemm_fp8_weight(const RowMat& a, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
                     RowMat& out, std::vector<double>& panel, std::vector<double>& lut, const PanelExtras& ex = {},
                     std::vector<double>* abs_panel = nullptr) {
  out.resize(a.rows(), N);
  panel.resize(static_cast<size_t>(kPanelRows) * K);
  for (int i = 0; i < ex.n_abs; ++i) ex.abs[i].out->resize(ex.abs[i].in->rows(), N);
  if (ex.n_abs) abs_panel->resize(panel.size());
  if (ex.back) ex.back->setZero(a.rows(), K);
  bool sparse_back = false;
  if (ex.back && ex.back_only) {
    size_t pairs = 0;
    for (const auto& f : *ex.back_only) pairs += f.size();
    sparse_back = pairs * 16 <= size_t(a.rows() * K);
  }
  std::vector<int64_t> sq_cols;  // the columns col_sq is needed at (sparse back product)
  if (ex.col_sq) {
    ex.col_sq->assign(size_t(K), 0.0);
    if (sparse_back) {
      std::vector<char> seen(size_t(K), 0);
      for (const auto& f : *ex.back_only)
        for (const auto& [col, dh] : f)
          if (!seen[size_t(col)]) seen[size_t(col)] = 1, sq_cols.push_back(col);
    }
  }
  if (ex.trunc) ex.trunc->err->resize(a.rows(), N);
  if (ex.trunc && ex.trunc->var) ex.trunc->var->resize(a.rows(), N);
  using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  // The float32 products: the input converted once, the panel per panel, the output widened.
  auto prepare_f32 = [&](const AbsProduct& x, Float32Buffers* b) {
    if (!x.in) return;
    x.out->resize(x.in->rows(), N);
    b->panel.resize(panel.size());
    b->in.resize(size_t(x.in->size()));
    b->out.resize(size_t(x.in->rows() * kPanelRows));
    Eigen::Map<RowMatF>(b->in.data(), x.in->rows(), K) = x.in->cast<float>();
  };
  auto product_f32 = [&](const AbsProduct& x, Float32Buffers* b, int64_t r0, int64_t nr) {
    Eigen::Map<RowMatF> o(b->out.data(), x.in->rows(), nr);
    o.noalias() = Eigen::Map<const RowMatF>(b->in.data(), x.in->rows(), K) *
                  Eigen::Map<const RowMatF>(b->panel.data(), nr, K).transpose();
    x.out->middleCols(r0, nr) = o.cast<double>();
  };
  prepare_f32(ex.sq, ex.sq_buf);
  prepare_f32(ex.lin, ex.lin_buf);
  // <in_g W_g^T, in W^T> = sum over k in g of in[:, k] (out W)[:, k]: when the whole back product
  // out W is computed anyway, the group projections are its reduction (after the panels).
  const bool grp_from_back = ex.grp && ex.back && !sparse_back;
  if (ex.grp) ex.grp->out->setZero(a.rows(), ceil_div(K, ex.grp->group));
  if (ex.grp && !grp_from_back) {
    GroupProjection& g = *ex.grp;
    g.panel.resize(panel.size());
    g.a.resize(size_t(a.size()));
    g.part.resize(size_t(a.rows() * kPanelRows));
    g.whole.resize(g.part.size());
    Eigen::Map<RowMatF>(g.a.data(), a.rows(), K) = g.in->cast<float>();
  }
  const Float32Panel* f32 = ex.trunc && ex.trunc->rows_f32 ? &ex.trunc->panel : nullptr;
  // The float truncation pass also computes the (only) magnitude product: no |W| panel then,
  // unless the pass declines.
  const bool fuse_abs = f32 && ex.n_abs == 1 && ex.trunc->abs_in;
  for (int64_t r0 = 0; r0 < N;) {
    // A panel never crosses a block row, so it shares one row of scales.
    const int64_t block_end = std::min(N, (r0 / B + 1) * B);
    const int64_t nr = std::min(kPanelRows, block_end - r0);
    WeightPanelOut dst{panel.data(), ex.n_abs && !fuse_abs ? abs_panel->data() : nullptr};
    if (f32) dst.dec = f32->dec, dst.mag = f32->mag, dst.maga = f32->maga;
    dequant_panel(codes, scales, K, B, r0, nr, dst, lut);
    ConstRowMap w(panel.data(), nr, K);
    out.middleCols(r0, nr).noalias() = a * w.transpose();
    if (ex.sq.in) {
      Eigen::Map<RowMatF>(ex.sq_buf->panel.data(), nr, K) = w.array().square().cast<float>().matrix();
      product_f32(ex.sq, ex.sq_buf, r0, nr);
    }
    if (ex.lin.in) {
      Eigen::Map<RowMatF>(ex.lin_buf->panel.data(), nr, K) = w.cast<float>();
      product_f32(ex.lin, ex.lin_buf, r0, nr);
    }
    if (ex.grp && !grp_from_back) {
      GroupProjection& g = *ex.grp;
      // The panel in float32: the re-quantization direction's product has just converted it.
      if (!ex.lin.in) Eigen::Map<RowMatF>(g.panel.data(), nr, K) = w.cast<float>();
      const Eigen::Map<const RowMatF> wf(ex.lin.in ? ex.lin_buf->panel.data() : g.panel.data(), nr, K);
      Eigen::Map<RowMatF> part(g.part.data(), a.rows(), nr), whole(g.whole.data(), a.rows(), nr);
      whole = out.middleCols(r0, nr).cast<float>();
      const Eigen::Map<const RowMatF> af(g.a.data(), a.rows(), K);
      for (int64_t k0 = 0; k0 < K; k0 += g.group) {
        const int64_t kn = std::min(g.group, K - k0);
        part.noalias() = af.middleCols(k0, kn) * wf.middleCols(k0, kn).transpose();
        g.out->col(k0 / g.group) += (part.array() * whole.array()).rowwise().sum().cast<double>().matrix();
      }
    }
    if (ex.back && !sparse_back) ex.back->noalias() += out.middleCols(r0, nr) * w;
    // Row by row, so that every column sums in row order whatever the buffers' alignment (an
    // Eigen colwise reduction gave run-to-run differences in the last bit).
    if (ex.col_sq && !sparse_back)
      for (int64_t o = 0; o < nr; ++o) {
        const double* row = panel.data() + o * K;
        double* cs = ex.col_sq->data();
        for (int64_t c = 0; c < K; ++c) cs[c] += row[c] * row[c];
      }
    for (const int64_t col : sq_cols) {
      double acc = 0;
      for (int64_t o = 0; o < nr; ++o) acc += panel[size_t(o * K + col)] * panel[size_t(o * K + col)];
      (*ex.col_sq)[size_t(col)] += acc;
    }
    if (sparse_back)
      for (int64_t r = 0; r < a.rows(); ++r)
        for (const auto& flip : (*ex.back_only)[size_t(r)]) {
          const int64_t col = flip.first;
          double acc = 0;
          for (int64_t o = 0; o < nr; ++o) acc += out(r, r0 + o) * panel[size_t(o * K + col)];
          (*ex.back)(r, col) += acc;
        }
    if (ex.n_abs) {
      bool fast = false;  // the float truncation pass answered
      const TruncationProduct* t = ex.trunc;
      if (t && f32) {
        // The panel's rows share one block row of scales: w = dec * scale[k / B].
        const float* srow = scales + (r0 / B) * ceil_div(K, B);
        fast = truncation_bound_panel_f32(*t->layout, *t->acc, t->af, t->hf, t->lf, K,
                                          t->dcum->data(), a.rows(), f32->dec, f32->mag, K, srow, nr,
                                          t->err->data() + r0, N, fuse_abs ? t->abs_in : nullptr,
                                          fuse_abs ? ex.abs[0].out->data() + r0 : nullptr, f32->maga,
                                          t->var ? t->var->data() + r0 : nullptr, t->codes);
      }
      if (fuse_abs && !fast) dequant_panel(codes, scales, K, B, r0, nr, {panel.data(), abs_panel->data()}, lut);
      ConstRowMap wa(abs_panel->data(), nr, K);
      for (int i = fuse_abs && fast ? 1 : 0; i < ex.n_abs; ++i)
        ex.abs[i].out->middleCols(r0, nr).noalias() = *ex.abs[i].in * wa.transpose();
      if (t && !fast) {
        std::vector<double>& wal = *t->walign;
        wal.resize(size_t(nr * K));
        const float* srow = scales + (r0 / B) * ceil_div(K, B);
        for (int64_t o = 0; o < nr; ++o)
          for (int64_t kk = 0; kk < K; ++kk) {
            const double m = (*abs_panel)[size_t(o * K + kk)];
            wal[size_t(o * K + kk)] = m > 0 ? std::max(m, kSubnormalAlign * std::fabs(double(srow[kk / B]))) : 0.0;
          }
        truncation_bound_panel(*t->layout, *t->acc, a.data(), t->hi->data(), t->lo->data(), K, t->dcum->data(),
                               a.rows(), panel.data(), abs_panel->data(), K, nr, t->err->data() + r0, N, *t->scratch,
                               wal.data(), t->var ? t->var->data() + r0 : nullptr);
      }
    }
    r0 += nr;
  }
  if (grp_from_back)
    for (int64_t k0 = 0; k0 < K; k0 += ex.grp->group) {
      const int64_t kn = std::min(ex.grp->group, K - k0);
      ex.grp->out->col(k0 / ex.grp->group) =
          (ex.grp->in->middleCols(k0, kn).array() * ex.back->middleCols(k0, kn).array()).rowwise().sum().matrix();
    }
}


// ---- expert --------------------------------------------------------------------------
struct Scratch {
  RowMat a, x, h, y;
  RowMat da, dx, dh, dy;  // budget: magnitude inputs and their sums through |W|
  RowMat qa, qx, qh, qy;  // ideal bound: quantization errors and their sums through |W|
  RowMat yw;              // budget: y W2 [n, I], the flip projections
  std::vector<double> w2_col_sq;  // budget: W2's squared column norms [I] (at the flips' columns)
  RowMat hdev;            // budget: deviation of the device's re-quantized h [n, I]
  RowMat thi, tlo, tdcum, terr;  // budget, truncating model: chunk inputs and the E_b sums
  RowMat da2, vx, hvar, vy, tvar;  // noise model (BUDGETS.md §10): squared inputs; GEMM1, h, slot, truncation variances
  std::vector<double> panel, lut, abs_panel, tscratch;
  Float32Buffers sq_buf;  // noise model: the squares products in float32
  // Re-quantization test (§10.7): the weighted h_deq - h [n, I] and its GEMM2 [n, H], h_deq - h
  // itself, RequantMoments.
  RowMat hq, rq, hdelta, hmean, hmb, hfv, hcell;
  Float32Buffers lin_buf;
  // Noise model: the relative variance of each group's float32 scale [n, I/G] and the projection of
  // each group's part of GEMM2 on the slot output [n, I/G] (BUDGETS.md §7).
  RowMat gsv, gproj;
  // Noise model: the groups' scale jumps (ScaleJumps): the moved codes' parts [n, I], the
  // probabilities and the scales' relative moves [n, I/G].
  RowMat jcup, jcdn, jp, jrup, jrdn;
  RowMat fp, fstep;  // noise model: each code's crossing probability and step (CodeFlips) [n, I]
  std::vector<char> listed;  // [I] the columns already in a row's flip list
  GroupProjection grp;
  std::vector<float> taf, thf, tlf, tin, tdec, tmag, tmaga;  // truncation bound, float path: rows, panel
  RowMat tfloor, hfloor;         // truncation bound: the rows' alignment floors (BUDGETS.md §2.1)
  std::vector<double> twalign;   // truncation bound, double path: the panel's A(w)
  std::vector<double> ilo, ihi, iref, idev;
  std::vector<std::vector<std::pair<int64_t, double>>> flips;  // per row: (i, dh_i) of flip-able h
  std::vector<float> hrow;
  std::vector<uint8_t> hcodes;
  std::vector<float> hscales;
  std::vector<uint8_t> qcodes;                  // noise model: h's codes [n, I] and scales [n, I/G] for GEMM2
  std::vector<float> qscales;
  std::vector<float> tcode, tfield;             // noise model: the rows' RowCodes [n, K]
  std::vector<double> tcs;
  std::vector<uint8_t> tknown;
  RowCodes trc{};
};

// Activations of the quantized tier, quantized once per token: codes [T, H], scales [T, H/G].
struct QuantizedHidden {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  std::vector<uint8_t> own_codes;
  std::vector<float> own_scales;
};

// Budget of one row's intermediate (BUDGETS.md §3-4): from the GEMM1 outputs x and their bounds
// dx, the interval of gate and up after rounding to intermediate_dtype, of h = silu(gate) * up
// after its rounding, then the deviation of the re-quantized h; writes the GEMM2 budget input
// c2 |h_ref| + (1 + c2) dh into row r of s.dh.
void intermediate_budget(const MoeConfig& c, const BudgetModel& m, double c2, const double* x, const double* dx,
                         int64_t gate0, int64_t up0, const double* h_deq, Scratch& s, int64_t r) {
  const int64_t I = c.intermediate_size, G = c.group_size;
  const Precision ip = c.intermediate_dtype;
  s.ilo.resize(I), s.ihi.resize(I), s.idev.resize(I);
  for (int64_t i = 0; i < I; ++i) {
    const double g = x[gate0 + i], u = x[up0 + i], dg = dx[gate0 + i], du = dx[up0 + i];
    const Interval gi = round_interval({g - dg, g + dg}, ip), ui = round_interval({u - du, u + du}, ip);
    // silu_dtype = bf16 (BUDGETS.md §9.5): the SiLU interval is rounded before the product.
    Interval si = silu_interval(gi, m.silu_ulps);
    if (c.recipe.silu_dtype == Precision::bf16) si = round_interval(si, Precision::bf16);
    const Interval hi = round_interval(product_interval_f32(si, ui), ip);
    s.ilo[i] = hi.lo, s.ihi[i] = hi.hi;
  }
  for (int64_t g0 = 0; g0 < I; g0 += G) {
    const int64_t n = std::min(G, I - g0);
    requant_deviation(s.ilo.data() + g0, s.ihi.data() + g0, h_deq + g0, n, act_quant_rule(c), m, s.idev.data() + g0);
  }
  for (int64_t i = 0; i < I; ++i) s.dh(r, i) = c2 * std::fabs(h_deq[i]) + (1 + c2) * s.idev[i];
  std::copy_n(s.idev.data(), I, s.hdev.row(r).data());
  // Re-quantization flips of this row (deviations beyond the float32 scale/division slack), kept
  // for the systematic allowance of the bias test (BUDGETS.md §7).
  s.flips[r].clear();
  for (int64_t i = 0; i < I; ++i)
    if (s.idev[i] > 1e-4 * std::fabs(h_deq[i]) + 1e-300) s.flips[r].push_back({i, s.idev[i]});
}

// Budget state shared by the experts: the model and the two dot-product constants.
struct BudgetCtx {
  const BudgetModel* model = nullptr;
  // Coefficients of sum |a||w| for GEMM1 (K = H) and GEMM2 (K = I): dot_product_bound, or with
  // the chunked truncation bound (BUDGETS.md §2.1) promotion_bound, the block accumulation then
  // bounded chunk by chunk along the layouts L1 (K = H) and L2 (K = I).
  double c1 = 0, c2 = 0;
  bool chunked = false;
  ChunkLayout L1, L2;
  const std::vector<double>* act_dev = nullptr;  // [T, H] deviation of the device's activations
  bool ideal = false;                             // also the ideal-tier bound (BUDGETS.md §8)
  double* slot_sys = nullptr;                     // [chunk T * k] flip projections per slot
  double* slot_tail = nullptr;                    // [chunk T * k, kFlipTailWidth] their flips' tails
  double* slot_energy_tail = nullptr;             // [chunk T * k, kEnergyTailWidth] the same crossings' norms
  double* slot_var = nullptr;                     // [chunk T * k * H] noise model per slot (BUDGETS.md §10.2)
  RequantSlots requant;                           // re-quantization test's per-slot terms (§10.7)
};

// Chunk inputs of the truncation bound for every row of a (deviation rows from dev_of(r)).
// abs_in: the input of the GEMM's first magnitude product, fused into the float pass.
template <class DevOf>
TruncationProduct prepare_truncation(const ChunkLayout& L, const AccumulatorModel& acc, const RowMat& a, DevOf dev_of,
                                     const RowMat& abs_in, Scratch& s) {
  const int64_t n = a.rows(), K = a.cols();
  s.thi.resize(n, K);
  s.tlo.resize(n, K);
  s.tdcum.resize(n, L.chunks());
  float* const af = aligned_floats(s.taf, size_t(n * K));
  float* const hf = aligned_floats(s.thf, size_t(n * K));
  float* const lf = aligned_floats(s.tlf, size_t(n * K));
  bool f32 = true;
  for (int64_t r = 0; r < n; ++r) {
    truncation_row_inputs(L, a.row(r).data(), dev_of(r), s.thi.row(r).data(), s.tlo.row(r).data(),
                          s.tdcum.row(r).data(), s.tfloor.row(r).data());
    f32 &= truncation_row_inputs_f32(K, a.row(r).data(), s.thi.row(r).data(), s.tlo.row(r).data(),
                                     af + r * K, hf + r * K, lf + r * K);
  }
  TruncationProduct tp{&L, &acc, &s.thi, &s.tlo, &s.tdcum, &s.terr, &s.tscratch};
  tp.af = af, tp.hf = hf, tp.lf = lf, tp.rows_f32 = f32;
  tp.panel = {aligned_floats(s.tdec, size_t(kPanelRows * K)), aligned_floats(s.tmag, size_t(kPanelRows * K)),
              aligned_floats(s.tmaga, size_t(kPanelRows * K))};
  tp.walign = &s.twalign;
  // Only the float pass can fuse the magnitude product (null: not fused).
  if (f32) {
    float* const in = aligned_floats(s.tin, size_t(n * K));
    for (int64_t i = 0; i < n * K; ++i) in[i] = f32_up(abs_in.data()[i]);
    tp.abs_in = in;
  }
  return tp;
}

// The rows' FP8 codes for the variance's per-term losses (truncation_bound.hpp RowCodes), where
// the activation group is the K block (the device promotes per block); else the whole-step model.
template <class CodesOf, class ScalesOf, class DevOf>
void prepare_row_codes(TruncationProduct& tp, int64_t group, CodesOf codes_of, ScalesOf scales_of, DevOf dev_of,
                       Scratch& s) {
  const ChunkLayout& L = *tp.layout;
  if (group != L.block || !tp.rows_f32) return;
  const int64_t n = tp.hi->rows(), K = L.K, nb = ceil_div(K, L.block);
  float* const code = aligned_floats(s.tcode, size_t(n * K));
  float* const field = aligned_floats(s.tfield, size_t(n * K));
  s.tcs.resize(size_t(n * nb));
  s.tknown.resize(size_t(n * nb));
  for (int64_t r = 0; r < n; ++r)
    truncation_row_codes(L, codes_of(r), scales_of(r), dev_of(r), tp.hi->row(r).data(), code + r * K,
                         field + r * K, s.tcs.data() + r * nb, s.tknown.data() + r * nb);
  s.trc = {code, field, s.tcs.data(), nb, s.tknown.data()};
  tp.codes = &s.trc;
}

// One expert's run over its slots (rows r of the job), in named steps that share this context;
// the Scratch holds every intermediate from one step to the next.
struct ExpertRun {
  const MoeProblem& p;
  Tier tier;
  const ExpertView& w;
  const ExpertJob& job;
  int64_t t0, k;
  const QuantizedHidden& qh;
  const BudgetCtx& bc;
  WeightProducts* products;
  Scratch& s;
  bool budget() const { return bc.model != nullptr; }
  bool requant() const { return bc.model != nullptr && bc.requant.r != nullptr; }
  int64_t rows() const { return static_cast<int64_t>(job.slots.size()); }
};

// Activations: exact bf16/float values (ideal) or their group quantization, dequantized (s.a);
// with a budget their GEMM1 input s.da, with the ideal bound their distance s.qa.
void expert_activations(const ExpertRun& e) {
  const MoeProblem& p = e.p;
  const Tier tier = e.tier;
  const ExpertJob& job = e.job;
  const QuantizedHidden& qh = e.qh;
  const BudgetCtx& bc = e.bc;
  Scratch& s = e.s;
  const int64_t t0 = e.t0, k = e.k, n = e.rows();
  const int64_t H = p.config.hidden_size, G = p.config.group_size, hg = ceil_div(H, G);
  const float* table = fp8_table(Fp8Format::e4m3fn);
  s.a.resize(n, H);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = t0 + job.slots[r] / k;
    double* row = s.a.row(r).data();
    if (tier == Tier::ideal) {
      const float* x = p.hidden + t * H;
      for (int64_t i = 0; i < H; ++i) row[i] = x[i];
    } else {
      const uint8_t* q = qh.codes + t * H;
      const float* sc = qh.scales + t * hg;
      for (int64_t i = 0; i < H; ++i) row[i] = double(table[q[i]]) * double(sc[i / G]);
    }
  }
  if (e.budget()) {
    // GEMM1 budget input: c1 |a| + (1 + c1) da, so that da |W|^T (activation flips) and the
    // accumulation term c1 |a_device| |W|^T come out of one GEMM (BUDGETS.md §2).
    s.da.resize(n, H);
    for (int64_t r = 0; r < n; ++r) {
      const double* dev = bc.act_dev->data() + (t0 + job.slots[r] / k) * H;
      for (int64_t i = 0; i < H; ++i) s.da(r, i) = bc.c1 * std::fabs(s.a(r, i)) + (1 + bc.c1) * dev[i];
    }
  }
  if (bc.ideal) {
    // |a - a^| <= (2^-4 + 2^-22)|a| + 2^-10 s: e4m3's half ulp (normal range, relative; subnormal
    // range, absolute in units of the group scale) plus the float32 rounding of a / s. The actual
    // difference is taken when larger (an engine's own FP8 activations need not obey the rule).
    s.qa.resize(n, H);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = t0 + job.slots[r] / k;
      const float* x = p.hidden + t * H;
      for (int64_t i = 0; i < H; ++i) {
        const double bound = (0x1p-4 + 0x1p-22) * std::fabs(x[i]) + 0x1p-10 * double(qh.scales[t * hg + i / G]);
        s.qa(r, i) = std::max(bound, std::fabs(double(x[i]) - s.a(r, i)));
      }
    }
  }
}

// GEMM1: x [n, 2I] = a W13^T, with the budget's and the noise model's products beside it.
void expert_gemm1(const ExpertRun& e) {
  const ExpertJob& job = e.job;
  const QuantizedHidden& qh = e.qh;
  const BudgetCtx& bc = e.bc;
  Scratch& s = e.s;
  const MoeConfig& c = e.p.config;
  const int64_t t0 = e.t0, k = e.k, n = e.rows();
  const int64_t H = c.hidden_size, I = c.intermediate_size, B = c.weight_block, G = c.group_size, hg = ceil_div(H, G);
  const bool budget = e.budget();
  PanelExtras ex;
  if (budget) ex.add_abs(&s.da, &s.dx);
  // §10.1: GEMM1's input deviations (the activations' and the per-term accumulation constant
  // c1 |a|), one term each, sum_k w_k^2 da_k^2, for the float32 models. Under a chunked model
  // (hopper) c1 is the promotion's 2^-23 and the activations' deviation is 0 outside the rare
  // groups whose scale the float32 slack may move: there they enter at their worst case
  // (sum_k da_k |w_k|)^2 instead, saving a pass over W13 that at T = 64 on DeepSeek-V3 costs as
  // much as GEMM1 itself.
  if (budget && !bc.chunked) {
    s.da2 = s.da.array().square().matrix();
    ex.add_sq(&s.da2, &s.vx, &s.sq_buf);
  }
  if (bc.ideal) ex.add_abs(&s.qa, &s.qx);
  TruncationProduct tp{};
  if (budget && bc.chunked) {
    // Alignment floors of the activations: 2^-6 of the group scale, doubled for a device scale
    // one power of two above ours (UE8M0) or a few ulps off (float32).
    s.tfloor.resize(n, H);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = t0 + job.slots[r] / k;
      for (int64_t i = 0; i < H; ++i) s.tfloor(r, i) = 2 * kSubnormalAlign * double(qh.scales[t * hg + i / G]);
    }
    auto act_dev = [&](int64_t r) { return bc.act_dev->data() + (t0 + job.slots[r] / k) * H; };
    tp = prepare_truncation(bc.L1, bc.model->acc, s.a, act_dev, s.da, s);
    tp.var = &s.tvar;
    prepare_row_codes(
        tp, G, [&](int64_t r) { return qh.codes + (t0 + job.slots[r] / k) * H; },
        [&](int64_t r) { return qh.scales + (t0 + job.slots[r] / k) * hg; }, act_dev, s);
    ex.trunc = &tp;
  }
  if (e.products) {
    s.x.resize(n, 2 * I);
    e.products->multiply(s.a.data(), n, e.w.w13, e.w.w13_scale, 2 * I, H, B, s.x.data());
  } else {
    gemm_fp8_weight(s.a, e.w.w13, e.w.w13_scale, 2 * I, H, B, s.x, s.panel, s.lut, ex, &s.abs_panel);
  }
  if (budget && bc.chunked) s.vx = s.dx.array().square().matrix();  // before the truncation term
  if (budget && bc.chunked) s.dx += (1 + bc.c1) * s.terr, s.vx += (1 + bc.c1) * (1 + bc.c1) * s.tvar;  // §2.1, §10.1
  // Gradual underflow (BUDGETS.md §2): each of the ceil(H/B) promotion FFMAs may err by half a
  // float32 subnormal step beyond its relative bound.
  if (budget) s.dx.array() += double(ceil_div(H, B)) * 0x1p-149;
}

// Row r's intermediate in the quantized tier: gate and up rounded to intermediate_dtype, silu,
// the product rounded, re-quantized per group (s.hrow, s.hcodes, s.hscales) and dequantized
// (s.h); the ideal tier's exact silu(gate) up.
void intermediate_row(const ExpertRun& e, int64_t r, int64_t gate0, int64_t up0) {
  const BudgetCtx& bc = e.bc;
  Scratch& s = e.s;
  const MoeConfig& c = e.p.config;
  const int64_t n = e.rows(), I = c.intermediate_size, G = c.group_size, ig = ceil_div(I, G);
  const float* table = fp8_table(Fp8Format::e4m3fn);
  const double* xr = s.x.row(r).data();
  double* hr = s.h.row(r).data();
  if (e.tier == Tier::ideal) {
    for (int64_t i = 0; i < I; ++i) hr[i] = silu(xr[gate0 + i]) * xr[up0 + i];
    return;
  }
  const Precision ip = c.intermediate_dtype;
  for (int64_t i = 0; i < I; ++i) {
    const double g = round_to(xr[gate0 + i], ip), u = round_to(xr[up0 + i], ip);
    // h is held in intermediate_dtype (float32 at least) before re-quantization; silu(g) in
    // silu_dtype before the product (float32 at least).
    const double sg = c.recipe.silu_dtype == Precision::bf16 ? round_to(silu(g), Precision::bf16) : silu(g);
    s.hrow[i] = static_cast<float>(round_to(sg * u, ip));
  }
  group_quantize_row(s.hrow.data(), I, G, act_quant_rule(c), s.hcodes.data(), s.hscales.data());
  if (e.budget() && bc.chunked) {
    s.qcodes.resize(size_t(n * I)), s.qscales.resize(size_t(n * ig));
    std::copy_n(s.hcodes.data(), I, s.qcodes.data() + r * I);
    std::copy_n(s.hscales.data(), ig, s.qscales.data() + r * ig);
  }
  for (int64_t i = 0; i < I; ++i) hr[i] = double(table[s.hcodes[i]]) * double(s.hscales[i / G]);
}

// Row r's budget and noise terms (BUDGETS.md §3-4, §10.2, §10.7): the intermediate's worst-case
// deviation, its variance, the groups' shared scale terms and jumps, the re-quantization test's
// inputs.
void intermediate_noise_row(const ExpertRun& e, int64_t r, int64_t gate0, int64_t up0) {
  const BudgetCtx& bc = e.bc;
  Scratch& s = e.s;
  const MoeConfig& c = e.p.config;
  const int64_t I = c.intermediate_size;
  const bool requant = e.requant();
  const double* hr = s.h.row(r).data();
  intermediate_budget(c, *bc.model, bc.c2, s.x.row(r).data(), s.dx.row(r).data(), gate0, up0, hr, s, r);
  // §10.2: the dequantized intermediate's variance, plus the GEMM2 promotion's term c2 |h|.
  double* hv = s.hvar.row(r).data();
  RequantMoments moments;
  if (requant) moments = {s.hmean.row(r).data(), s.hmb.row(r).data(), s.hfv.row(r).data(), s.hcell.row(r).data()};
  const ScaleJumps jumps{s.jp.row(r).data(), s.jrup.row(r).data(), s.jrdn.row(r).data(), s.jcup.row(r).data(),
                         s.jcdn.row(r).data()};
  const CodeFlips code_flips{s.fp.row(r).data(), s.fstep.row(r).data()};
  intermediate_noise_var(c, *bc.model, s.x.row(r).data(), s.vx.row(r).data(), gate0, up0, s.hrow.data(),
                         s.hcodes.data(), s.hscales.data(), s.hdev.row(r).data(), hv, requant ? &moments : nullptr,
                         s.gsv.row(r).data(), &jumps, &code_flips);
  // GEMM2's back product y W2 is taken at the flips' columns only (when they are few): the codes a
  // jump moves join them, with no flip of their own (dh 0).
  s.listed.assign(size_t(I), 0);
  for (const auto& f : s.flips[r]) s.listed[size_t(f.first)] = 1;
  for (int64_t i = 0; i < I; ++i)
    if (!s.listed[size_t(i)] && (s.jcup(r, i) != 0 || s.jcdn(r, i) != 0)) s.flips[r].push_back({i, 0.0});
  for (int64_t i = 0; i < I; ++i) {
    const double promotion = (bc.c2 * hr[i]) * (bc.c2 * hr[i]);
    hv[i] += promotion;
    if (requant) s.hfv(r, i) += promotion;
  }
  // §10.7: what the re-quantization changed (a skipped one moves the output by its GEMM2),
  // and the test's direction: the same, each intermediate weighted by how unlikely a correct
  // device is to have changed its code.
  if (requant)
    for (int64_t i = 0; i < I; ++i) {
      s.hdelta(r, i) = hr[i] - double(s.hrow[i]);
      s.hq(r, i) = requant_weight(s.hfv(r, i), s.hcell(r, i)) * s.hdelta(r, i);
    }
}

// Row r's alignment floors of h for GEMM2's truncation bound.
void intermediate_floors_row(const ExpertRun& e, int64_t r) {
  Scratch& s = e.s;
  const MoeConfig& c = e.p.config;
  const int64_t n = e.rows(), I = c.intermediate_size, G = c.group_size;
  // Alignment floors of h (truncation_bound.hpp): 2^-6 of the largest scale the device may
  // use for the group, from the group's largest possible amax (the intervals of §4), doubled
  // for UE8M0's power-of-two step and float32's ulps.
  s.hfloor.resize(n, I);
  for (int64_t g0 = 0; g0 < I; g0 += G) {
    double amax = 0;
    for (int64_t i = g0; i < std::min(I, g0 + G); ++i) amax = std::max({amax, std::fabs(s.ilo[i]), std::fabs(s.ihi[i])});
    const double sc = std::max(double(s.hscales[g0 / G]), std::max(amax, double(c.act_eps)) / 448.0);
    for (int64_t i = g0; i < std::min(I, g0 + G); ++i) s.hfloor(r, i) = 2 * kSubnormalAlign * sc;
  }
}

// Row r's distance of the ideal h from this tier's re-quantized one (BUDGETS.md §8).
void ideal_intermediate_row(const ExpertRun& e, int64_t r, int64_t gate0, int64_t up0) {
  Scratch& s = e.s;
  const int64_t I = e.p.config.intermediate_size;
  const double* hr = s.h.row(r).data();
  // The ideal h = silu(g) u with g, u within qx of this tier's unrounded GEMM1 outputs;
  // its distance from the re-quantized h^ that GEMM2 uses here.
  const double* xr2 = s.x.row(r).data();
  const double* qx = s.qx.row(r).data();
  for (int64_t i = 0; i < I; ++i) {
    const double g = xr2[gate0 + i], u = xr2[up0 + i], dg = qx[gate0 + i], du = qx[up0 + i];
    const Interval hi = product_interval_f32(silu_interval({g - dg, g + dg}, 0), {u - du, u + du});
    s.qh(r, i) = std::max(hi.width_from(hr[i]), 0.0);
  }
}

// SiLU * up and the re-quantization of every row, with the budget's, the noise model's and the
// ideal bound's terms.
void expert_intermediates(const ExpertRun& e) {
  const BudgetCtx& bc = e.bc;
  Scratch& s = e.s;
  const MoeConfig& c = e.p.config;
  const int64_t n = e.rows(), I = c.intermediate_size, G = c.group_size, ig = ceil_div(I, G);
  const bool budget = e.budget();
  const int64_t gate0 = c.gate_up_layout == GateUpLayout::gate_up ? 0 : I;
  const int64_t up0 = I - gate0;
  s.h.resize(n, I);
  s.hrow.resize(I);
  s.hcodes.resize(I);
  s.hscales.resize(ig);
  if (budget) s.dh.resize(n, I), s.hdev.resize(n, I), s.hvar.resize(n, I), s.flips.resize(n), s.gsv.setZero(n, ig);
  if (budget) s.fp.resize(n, I), s.fstep.resize(n, I);
  if (budget) s.jcup.setZero(n, I), s.jcdn.setZero(n, I);
  if (budget) s.jp.setZero(n, ig), s.jrup.setZero(n, ig), s.jrdn.setZero(n, ig);
  if (e.requant()) {
    s.hq.resize(n, I), s.hdelta.resize(n, I), s.hmean.resize(n, I), s.hmb.resize(n, I), s.hfv.resize(n, I);
    s.hcell.resize(n, I);
  }
  if (bc.ideal) s.qh.resize(n, I);
  for (int64_t r = 0; r < n; ++r) {
    intermediate_row(e, r, gate0, up0);
    if (e.tier == Tier::ideal) continue;
    if (budget) intermediate_noise_row(e, r, gate0, up0);
    if (budget && bc.chunked) intermediate_floors_row(e, r);
    if (bc.ideal) ideal_intermediate_row(e, r, gate0, up0);
  }
}

// GEMM2: y [n, H] = h W2^T, with the budget's and the noise model's products beside it, rounded
// as the recipe's expert output.
void expert_gemm2(const ExpertRun& e) {
  const BudgetCtx& bc = e.bc;
  Scratch& s = e.s;
  const MoeConfig& c = e.p.config;
  const int64_t n = e.rows(), H = c.hidden_size, I = c.intermediate_size, B = c.weight_block, G = c.group_size;
  const int64_t ig = ceil_div(I, G);
  const bool budget = e.budget(), requant = e.requant();
  PanelExtras ex;
  if (budget) {
    ex.add_abs(&s.dh, &s.dy), ex.back = &s.yw, ex.back_only = &s.flips, ex.col_sq = &s.w2_col_sq;
    // Noise model (BUDGETS.md §10.2): each intermediate's deviation is one independent term,
    // reaching every output through W2: sum_i W2[o, i]^2 var_i.
    ex.add_sq(&s.hvar, &s.vy, &s.sq_buf);
    s.grp.in = &s.h, s.grp.out = &s.gproj, s.grp.group = G, ex.grp = &s.grp;
    if (requant) ex.add_lin(&s.hq, &s.rq, &s.lin_buf);
  }
  if (bc.ideal) ex.add_abs(&s.qh, &s.qy);
  TruncationProduct tp{};
  if (budget && bc.chunked) {
    s.tfloor = s.hfloor;
    auto h_dev = [&](int64_t r) { return s.hdev.row(r).data(); };
    tp = prepare_truncation(bc.L2, bc.model->acc, s.h, h_dev, s.dh, s);
    tp.var = &s.tvar;
    prepare_row_codes(
        tp, G, [&](int64_t r) { return s.qcodes.data() + r * I; },
        [&](int64_t r) { return s.qscales.data() + r * ig; }, h_dev, s);
    ex.trunc = &tp;
  }
  if (e.products) {
    s.y.resize(n, H);
    e.products->multiply(s.h.data(), n, e.w.w2, e.w.w2_scale, H, I, B, s.y.data());
  } else {
    gemm_fp8_weight(s.h, e.w.w2, e.w.w2_scale, H, I, B, s.y, s.panel, s.lut, ex, &s.abs_panel);
  }
  if (budget && bc.chunked) s.dy += (1 + bc.c2) * s.terr, s.vy += (1 + bc.c2) * (1 + bc.c2) * s.tvar;  // §2.1, §10.1
  if (budget) s.dy.array() += double(ceil_div(I, B)) * 0x1p-149;  // underflow, as for GEMM1
  if (budget) s.vy.array() += std::pow(double(ceil_div(I, B)) * 0x1p-149, 2);
  // expert_output_dtype = bf16 (BUDGETS.md §9.5): the device rounds its float32 slot output,
  // so both the value and its interval are rounded (bf16 of fl32, the device's composite).
  if (e.tier == Tier::quantized && c.recipe.expert_output_dtype == Precision::bf16)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < H; ++i) {
        const double y = s.y(r, i), yr = bf16_of_f32(y);
        if (budget) s.dy(r, i) = round_slot_interval(y, s.dy(r, i)).width_from(yr);
        if (budget) s.vy(r, i) = rounded_noise_var(y, yr, s.vy(r, i));
        s.y(r, i) = yr;
      }
}

// Root sum of squares of row r's terms that look like a scale error of its own slot output y:
// the flips, the groups' shared scale deviations and their jumps, each projected on y. The codes'
// crossings among the flips are also written to tail (FlipTail, kFlipTailWidth entries): each a
// rare term bounded by its own step, whose tail the aggregate tests bound as such (§10.8).
double slot_flip_projection(const Scratch& s, int64_t r, int64_t G, int64_t I, double* tail, double* energy_tail) {
  // A flip moves y along column i of W2 by at most dh_i; its projection on y itself is at most
  // dh_i |<W2[:, i], y>| = dh_i |(y W2)_i|: the part of the error that looks like a scale error
  // of this slot. Kept as the root sum of squares over the slot's flips (their signs are
  // independent).
  // The noise model's variance of each flip (§10.2) in place of its worst case dh^2.
  // Of that, a code's crossing (probability p, a move of one step) is the term B step g, B ~
  // Bernoulli(p): centred, a (B - p) with a = step |g| (TailBound), and its mean p step g, whose
  // sign follows g's, kept as variance like the rest of the flip.
  // The crossing's share of a flip's variance v is p (step g)^2, at most all of v.
  auto crossing = [&](int64_t i, double dh) {
    const double g = s.yw(r, i), a = s.fstep(r, i) * std::fabs(g), v = std::min(dh * dh, s.hvar(r, i)) * g * g;
    const double p = a > 0 ? std::min(s.fp(r, i), v / (a * a)) : 0.0;
    return std::pair{std::min(p, 1 - p) > 0 ? p : 0.0, a};
  };
  double sys = 0;
  for (const auto& [i, dh] : s.flips[r]) {
    const double g = s.yw(r, i);
    sys += std::min(dh * dh, s.hvar(r, i)) * g * g;
  }
  FlipTail::write_terms(
      [&](auto add) {
        for (const auto& [i, dh] : s.flips[r]) std::apply(add, crossing(i, dh));
      },
      tail);
  // The same crossings by the distance they move the whole slot output, a = step ||W2[:, i]||
  // (the energy test's, §10.8): one crossing moves every element at once, by at most its step and
  // at most the worst case's dh. Here p itself counts, not min(p, 1 - p): a crossing of p > 1/2
  // moves the slot by at most a, always (kept apart).
  auto energy_term = [&](int64_t i, double dh) {
    return std::pair{s.fp(r, i), std::min(s.fstep(r, i), dh) * std::sqrt(s.w2_col_sq[size_t(i)])};
  };
  FlipTail::write_terms(
      [&](auto add) {
        for (const auto& [i, dh] : s.flips[r])
          if (const auto [p, a] = energy_term(i, dh); p <= 0.5) add(p, a);
      },
      energy_tail);
  double certain = 0;
  for (const auto& [i, dh] : s.flips[r])
    if (const auto [p, a] = energy_term(i, dh); p > 0.5) certain += a;
  energy_tail[kFlipTailWidth] = certain;
  // A group's float32 scale that differs from the reference's by a factor 1 + e moves the
  // group's whole part of y by e: projected on y, e <y_g, y>, with the noise model's variance
  // of e's continuous part (§10.2 step 4). Groups are independent.
  for (int64_t g = 0; g < s.gsv.cols(); ++g) sys += s.gsv(r, g) * s.gproj(r, g) * s.gproj(r, g);
  // A jump of a group's scale (ScaleJumps): its whole change of h_deq projected on y through
  // W2, <W2 dh, y> = sum_i dh_i (y W2)_i: the scale's share rel <y_g, y> plus the moved codes'
  // (y W2 is taken at their columns: they are listed with the flips). Kept sub-Gaussian at
  // Hoeffding's p-free proxy (jump_var): the jump's modelled p is not trusted (§7).
  for (int64_t g = 0; g < s.jp.cols(); ++g) {
    if (!(s.jp(r, g) > 0)) continue;
    double a_up = s.jrup(r, g) * s.gproj(r, g), a_dn = s.jrdn(r, g) * s.gproj(r, g);
    for (int64_t i = g * G; i < std::min(I, (g + 1) * G); ++i)
      a_up += s.jcup(r, i) * s.yw(r, i), a_dn += s.jcdn(r, i) * s.yw(r, i);
    sys += jump_var(s.jp(r, g), a_up, a_dn);
  }
  return std::sqrt(sys);
}

// Each row's slot output and, with a budget, its budget, variance, flip projection and
// re-quantization test terms, into the chunk's per-slot arrays.
void expert_store(const ExpertRun& e, double* slot_out, double* slot_budget, double* slot_ideal) {
  const ExpertJob& job = e.job;
  const BudgetCtx& bc = e.bc;
  Scratch& s = e.s;
  const MoeConfig& c = e.p.config;
  const int64_t n = e.rows(), H = c.hidden_size, I = c.intermediate_size, G = c.group_size;
  const bool budget = e.budget(), requant = e.requant();
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(s.y.row(r).data(), H, slot_out + job.slots[r] * H);
    if (budget) {
      std::copy_n(s.dy.row(r).data(), H, slot_budget + job.slots[r] * H);
      std::copy_n(s.vy.row(r).data(), H, bc.slot_var + job.slots[r] * H);
      bc.slot_sys[job.slots[r]] = slot_flip_projection(s, r, G, I, bc.slot_tail + job.slots[r] * kFlipTailWidth,
                                                       bc.slot_energy_tail + job.slots[r] * kEnergyTailWidth);
      const int64_t slot = job.slots[r];
      if (requant) {
        for (int64_t i = 0; i < H; ++i) bc.requant.r[slot * H + i] = float(s.rq(r, i));
        std::copy_n(s.hfv.row(r).data(), I, bc.requant.hvar + slot * I);
        std::copy_n(s.hdelta.row(r).data(), I, bc.requant.delta + slot * I);
        std::copy_n(s.hmean.row(r).data(), I, bc.requant.hmean + slot * I);
        std::copy_n(s.hmb.row(r).data(), I, bc.requant.hmean_bound + slot * I);
        std::copy_n(s.h.row(r).data(), I, bc.requant.h + slot * I);
        std::copy_n(s.gsv.row(r).data(), s.gsv.cols(), bc.requant.group_scale_var + slot * s.gsv.cols());
        std::copy_n(s.jcup.row(r).data(), I, bc.requant.jump_code_up + slot * I);
        std::copy_n(s.jcdn.row(r).data(), I, bc.requant.jump_code_dn + slot * I);
        std::copy_n(s.jp.row(r).data(), s.jp.cols(), bc.requant.jump_p + slot * s.jp.cols());
        std::copy_n(s.jrup.row(r).data(), s.jp.cols(), bc.requant.jump_rel_up + slot * s.jp.cols());
        std::copy_n(s.jrdn.row(r).data(), s.jp.cols(), bc.requant.jump_rel_dn + slot * s.jp.cols());
        for (int64_t i = 0; i < I; ++i)
          bc.requant.flip_p[slot * I + i] = float(s.fp(r, i)), bc.requant.flip_step[slot * I + i] = float(s.fstep(r, i));
      }
    }
    if (bc.ideal) std::copy_n(s.qy.row(r).data(), H, slot_ideal + job.slots[r] * H);
  }
}

void run_expert(const MoeProblem& p, Tier tier, const ExpertView& w, const ExpertJob& job, int64_t t0, int64_t k,
                const QuantizedHidden& qh, double* slot_out, double* slot_budget, double* slot_ideal, const BudgetCtx& bc,
                WeightProducts* products, Scratch& s) {
  const ExpertRun e{p, tier, w, job, t0, k, qh, bc, products, s};
  expert_activations(e);
  expert_gemm1(e);
  expert_intermediates(e);
  expert_gemm2(e);
  expert_store(e, slot_out, slot_budget, slot_ideal);
}

}  // namespace

// ---- driver --------------------------------------------------------------------------
ForwardResult moe_forward(const MoeProblem& p, const ForwardOptions& opt) {
  const MoeConfig& c = p.config;
  require_valid_config(c);
  const int64_t T = p.tokens, H = c.hidden_size, k = c.top_k, G = c.group_size;
  if (T < 0 || !p.hidden || !p.logits || !p.load_expert)
    throw std::invalid_argument("moe_forward: hidden, logits and load_expert are required");

  ForwardResult res;
  res.tier = opt.tier;
  if (opt.routing_override) {
    res.routing = *opt.routing_override;
    if (res.routing.tokens != T || res.routing.top_k != k)
      throw std::invalid_argument("moe_forward: routing_override has the wrong shape");
  } else {
    res.routing = route(c, p.logits, p.bias, T);
  }
  const std::vector<double> exact_weights = res.routing.weights;  // before the quantized tier's rounding
  if (opt.tier == Tier::quantized) round_weights(res.routing, c.routing_weight_dtype);
  const BudgetModel* model = opt.tier == Tier::quantized ? opt.budget : nullptr;
  const bool ideal_bound = opt.tier == Tier::quantized && opt.ideal_bound;
  const bool keep_slots = opt.expert_outputs || model || ideal_bound;
  if (opt.products && (model || ideal_bound))
    throw std::invalid_argument("moe_forward: budgets and the ideal bound are computed with the CPU's products only");
  const Routing& rt = res.routing;

  // Every local expert a token routes to must be stored.
  std::vector<char> stored(static_cast<size_t>(c.num_experts), 0);
  for (int64_t e : p.stored_experts)
    if (e >= 0 && e < c.num_experts) stored[e] = 1;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = rt.ids[t * k + j];
      if (c.is_local(e) && !stored[e])
        throw InputError(p.source, "/weights/expert_ids",
                         fmt::format("token {} routes to local expert {}, which the case does not store", t, e));
    }

  // Quantized-tier activations, once per token.
  QuantizedHidden qh;
  if (opt.tier == Tier::quantized) {
    if (p.hidden_fp8 && p.hidden_scale) {
      qh.codes = p.hidden_fp8;
      qh.scales = p.hidden_scale;
    } else {
      GroupQuantized g = group_quantize(p.hidden, T, H, G, act_quant_rule(c));
      qh.own_codes = std::move(g.codes);
      qh.own_scales = std::move(g.scales);
      qh.codes = qh.own_codes.data();
      qh.scales = qh.own_scales.data();
    }
  }

  // Budget: deviation of the device's activations (scale and division slack; zero when the case
  // carries the engine's own FP8 activations) and the two dot-product constants.
  BudgetCtx bc;
  std::vector<double> act_dev;
  std::vector<float> requant_r;                  // §10.7 per slot (requant_projection.hpp)
  std::vector<double> requant_hvar, requant_hmean, requant_hmb, requant_delta, requant_h, requant_gsv;
  std::vector<double> requant_jcup, requant_jcdn, requant_jp, requant_jrup, requant_jrdn;
  std::vector<float> requant_fp, requant_fstep;
  if (model) {
    bc.model = model;
    bc.chunked = uses_chunked_truncation(model->acc);
    if (bc.chunked) {
      bc.c1 = promotion_bound(H, c.weight_block, false);
      bc.c2 = promotion_bound(c.intermediate_size, c.weight_block, false);
      bc.L1 = ChunkLayout(H, c.weight_block, model->acc.instr_k);
      bc.L2 = ChunkLayout(c.intermediate_size, c.weight_block, model->acc.instr_k);
    } else {
      bc.c1 = dot_product_bound(model->acc, H, c.weight_block, false);
      bc.c2 = dot_product_bound(model->acc, c.intermediate_size, c.weight_block, false);
    }
    act_dev.assign(static_cast<size_t>(T * H), 0.0);
    if (!(p.hidden_fp8 && p.hidden_scale)) {
      const float* table = fp8_table(Fp8Format::e4m3fn);
      std::vector<double> x(G), deq(G);
      const int64_t hg = ceil_div(H, G);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t g0 = 0; g0 < H; g0 += G) {
          const int64_t n = std::min(G, H - g0);
          for (int64_t i = 0; i < n; ++i) {
            x[i] = p.hidden[t * H + g0 + i];
            deq[i] = double(table[qh.codes[t * H + g0 + i]]) * double(qh.scales[t * hg + g0 / G]);
          }
          requant_deviation(x.data(), x.data(), deq.data(), n, act_quant_rule(c), *model, act_dev.data() + t * H + g0);
        }
    }
    bc.act_dev = &act_dev;
    res.budget.assign(static_cast<size_t>(T * H), 0.0);
    res.noise_var.assign(static_cast<size_t>(T * H), 0.0);
    res.slot_budget.assign(static_cast<size_t>(T * k * H), 0.0);
    res.slot_noise_var.assign(static_cast<size_t>(T * k * H), 0.0);
    res.slot_flip_projection.assign(static_cast<size_t>(T * k), 0.0);
    res.slot_flip_tail.assign(static_cast<size_t>(T * k * kFlipTailWidth), 0.0);
    res.slot_energy_tail.assign(static_cast<size_t>(T * k * kEnergyTailWidth), 0.0);
  }
  if (model && opt.requant_terms) {
    requant_r.assign(static_cast<size_t>(T * k * H), 0.0f);
    requant_hvar.assign(static_cast<size_t>(T * k * c.intermediate_size), 0.0);
    requant_hmean.assign(requant_hvar.size(), 0.0);
    requant_hmb.assign(requant_hvar.size(), 0.0);
    requant_delta.assign(requant_hvar.size(), 0.0);
    requant_h.assign(requant_hvar.size(), 0.0);
    requant_gsv.assign(static_cast<size_t>(T * k * ceil_div(c.intermediate_size, c.group_size)), 0.0);
    requant_jcup.assign(requant_hvar.size(), 0.0), requant_jcdn.assign(requant_hvar.size(), 0.0);
    requant_jp.assign(requant_gsv.size(), 0.0), requant_jrup.assign(requant_gsv.size(), 0.0);
    requant_jrdn.assign(requant_gsv.size(), 0.0);
    requant_fp.assign(requant_hvar.size(), 0.0f), requant_fstep.assign(requant_hvar.size(), 0.0f);
  }

  bc.ideal = ideal_bound;
  std::vector<double> slot_ideal_all;
  if (ideal_bound) {
    res.ideal_bound.assign(static_cast<size_t>(T * H), 0.0);
    slot_ideal_all.assign(static_cast<size_t>(T * k * H), 0.0);
  }
  res.output.assign(static_cast<size_t>(T * H), 0.0);
  if (keep_slots) res.expert_outputs.assign(static_cast<size_t>(T * k * H), 0.0);
  // With another engine's products a chunk may hold 8x more slot outputs (4 GiB: every token of
  // a DeepSeek-V3 layer at T = 4096), since each chunk sends every expert's weights to it again.
  const int64_t slot_bytes = opt.products ? 8 * kSlotBufferBytes : kSlotBufferBytes;
  const int64_t chunk = keep_slots ? std::max<int64_t>(T, 1)
                                   : std::max<int64_t>(1, slot_bytes / (8 * k * std::max<int64_t>(H, 1)));
  const int threads = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  std::mutex load_mutex;
  std::vector<double> chunk_slots;
  // Experts run in any chunk (int32_t: GCC 12 warns falsely, -Wfree-nonheap-object, on a char vector here).
  std::vector<int32_t> ran(static_cast<size_t>(c.num_experts), 0);

  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t nt = std::min(chunk, T - t0);
    // Plan: (token, slot) pairs of each local expert, in token order.
    std::vector<ExpertJob> jobs;
    {
      std::vector<int64_t> job_of(static_cast<size_t>(c.num_experts), -1);
      for (int64_t tl = 0; tl < nt; ++tl)
        for (int64_t j = 0; j < k; ++j) {
          const int32_t e = rt.ids[(t0 + tl) * k + j];
          if (!c.is_local(e)) continue;
          if (job_of[e] < 0) {
            job_of[e] = static_cast<int64_t>(jobs.size());
            jobs.push_back({e, {}});
          }
          jobs[job_of[e]].slots.push_back(tl * k + j);
        }
    }
    // Largest experts first, for load balance.
    std::stable_sort(jobs.begin(), jobs.end(), [](const ExpertJob& a, const ExpertJob& b) {
      return a.slots.size() > b.slots.size();
    });

    double* slots;
    double* slot_budget = model ? res.slot_budget.data() + t0 * k * H : nullptr;
    double* slot_ideal = ideal_bound ? slot_ideal_all.data() + t0 * k * H : nullptr;
    if (model) {
      bc.slot_sys = res.slot_flip_projection.data() + t0 * k, bc.slot_var = res.slot_noise_var.data() + t0 * k * H;
      bc.slot_tail = res.slot_flip_tail.data() + t0 * k * kFlipTailWidth;
      bc.slot_energy_tail = res.slot_energy_tail.data() + t0 * k * kEnergyTailWidth;
    }
    // With a model the chunk is every token (keep_slots), so slot indices are global.
    if (model && opt.requant_terms)
      bc.requant = {requant_r.data(), requant_hvar.data(), requant_hmean.data(), requant_hmb.data(),
                    requant_delta.data(), requant_h.data(), requant_gsv.data(), requant_jp.data(),
                    requant_jrup.data(),  requant_jrdn.data(), requant_jcup.data(), requant_jcdn.data(),
                    requant_fp.data(),    requant_fstep.data()};
    if (keep_slots) {
      slots = res.expert_outputs.data() + t0 * k * H;
    } else {
      chunk_slots.assign(static_cast<size_t>(nt * k * H), 0.0);
      slots = chunk_slots.data();
    }

    std::atomic<int64_t> done{0};
    parallel_jobs<Scratch>(jobs.size(), threads, [&](size_t i, Scratch& s) {
      ExpertView w;
      {
        std::lock_guard<std::mutex> lock(load_mutex);
        w = p.load_expert(jobs[i].expert);
      }
      run_expert(p, opt.tier, w, jobs[i], t0, k, qh, slots, slot_budget, slot_ideal, bc, opt.products, s);
      const int64_t d = ++done;
      if (opt.progress) {
        std::lock_guard<std::mutex> lock(load_mutex);
        opt.progress(d, static_cast<int64_t>(jobs.size()));
      }
    });

    // Combine under the case's combine recipe (moe_combine.hpp; BUDGETS.md §5, §9.1-9.2).
    // Non-local slots hold 0 and are left out. Tokens are independent: blocks of them per thread.
    auto combine_one = [&](int64_t tl, std::vector<SlotTerm>& terms) {
      const int64_t t = t0 + tl;
      terms.clear();
      for (int64_t j = 0; j < k; ++j) {
        if (!c.is_local(rt.ids[t * k + j])) continue;
        const double wj = rt.weights[t * k + j];
        const double* y = slots + (tl * k + j) * H;
        if (ideal_bound) {  // |w y - w_q y_q| <= |w_q| dy + |w - w_q| (|y_q| + dy)
          const double dw = std::fabs(exact_weights[t * k + j] - wj);
          const double* qy = slot_ideal + (tl * k + j) * H;
          double* ib = res.ideal_bound.data() + t * H;
          for (int64_t i = 0; i < H; ++i) ib[i] += std::fabs(wj) * qy[i] + dw * (std::fabs(y[i]) + qy[i]);
        }
        SlotTerm term{rt.ids[t * k + j], wj, 0.0, y, nullptr};
        if (model) {
          term.dw = weight_deviation(exact_weights[t * k + j], wj, c.routing_weight_dtype, c.num_experts + k, *model);
          term.dy = slot_budget + (tl * k + j) * H;
          term.vy = res.slot_noise_var.data() + (t0 + tl) * k * H + j * H;
        }
        terms.push_back(term);
      }
      CombineOut co{res.output.data() + t * H};
      if (model) co.budget = res.budget.data() + t * H, co.noise_var = res.noise_var.data() + t * H;
      combine_token(c.recipe.combine, terms, H, k, co);
    };
    constexpr int64_t kCombineTokens = 64;
    parallel_jobs<std::vector<SlotTerm>>(size_t(ceil_div(nt, kCombineTokens)), threads,
                                         [&](size_t b, std::vector<SlotTerm>& terms) {
                                           const int64_t end = std::min(nt, int64_t(b + 1) * kCombineTokens);
                                           for (int64_t tl = int64_t(b) * kCombineTokens; tl < end; ++tl)
                                             combine_one(tl, terms);
                                         });
    if (model && opt.requant_terms) {
      std::vector<ExpertSlots> ex;
      for (const ExpertJob& j : jobs) ex.push_back({j.expert, &j.slots});
      requant_projections(p, rt, bc.requant, ex, threads, load_mutex, res);
    }
    for (const ExpertJob& j : jobs) {
      const double n = static_cast<double>(j.slots.size());
      res.gemm_flops += 2.0 * n * double(H) * double(3 * c.intermediate_size);
    }
    for (const ExpertJob& j : jobs) ran[j.expert] = 1;
  }
  res.experts_run = std::count(ran.begin(), ran.end(), 1);
  return res;
}

}  // namespace moecheck
