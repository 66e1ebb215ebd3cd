// gemm_fp8_weight (forward_stages.hpp): a product with an FP8 weight, dequantized panel by panel
// through per-block tables, with the budget's extra products computed from the same panels.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "reference/forward_stages.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/truncation_bound.hpp"
#include "reference/weight_panel.hpp"

namespace moecheck::forward {

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

namespace {

using RowMatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// What one call's panels share: the extras' sizes set up once, and which forms they take.
struct PanelPass {
  const RowMat& a;
  const uint8_t* codes;
  const float* scales;
  int64_t N, K, B;
  RowMat& out;
  std::vector<double>& panel;
  std::vector<double>& lut;
  const PanelExtras& ex;
  std::vector<double>* abs_panel;
  bool sparse_back = false;       // the back product at the flips' columns only (dot products)
  std::vector<int64_t> sq_cols{};  // the columns col_sq is needed at (sparse back product)
  bool grp_from_back = false;     // the group projections as a reduction of the whole back product
  const Float32Panel* f32 = nullptr;  // the float truncation pass's weight operands
  bool fuse_abs = false;          // that pass also computes the (only) magnitude product
};

// The float32 products: the input converted once, the panel per panel, the output widened.
void prepare_f32(const PanelPass& x, const AbsProduct& p, Float32Buffers* b) {
  if (!p.in) return;
  p.out->resize(p.in->rows(), x.N);
  b->panel.resize(x.panel.size());
  b->in.resize(size_t(p.in->size()));
  b->out.resize(size_t(p.in->rows() * kPanelRows));
  Eigen::Map<RowMatF>(b->in.data(), p.in->rows(), x.K) = p.in->cast<float>();
}
void product_f32(const PanelPass& x, const AbsProduct& p, Float32Buffers* b, int64_t r0, int64_t nr) {
  Eigen::Map<RowMatF> o(b->out.data(), p.in->rows(), nr);
  o.noalias() = Eigen::Map<const RowMatF>(b->in.data(), p.in->rows(), x.K) *
                Eigen::Map<const RowMatF>(b->panel.data(), nr, x.K).transpose();
  p.out->middleCols(r0, nr) = o.cast<double>();
}

// Sizes every output of the call and decides the forms the extras take.
void prepare_pass(PanelPass& x) {
  const PanelExtras& ex = x.ex;
  const RowMat& a = x.a;
  const int64_t N = x.N, K = x.K;
  x.out.resize(a.rows(), N);
  x.panel.resize(static_cast<size_t>(kPanelRows) * K);
  for (int i = 0; i < ex.n_abs; ++i) ex.abs[i].out->resize(ex.abs[i].in->rows(), N);
  if (ex.n_abs) x.abs_panel->resize(x.panel.size());
  if (ex.back) ex.back->setZero(a.rows(), K);
  if (ex.back && ex.back_only) {
    size_t pairs = 0;
    for (const auto& f : *ex.back_only) pairs += f.size();
    x.sparse_back = pairs * 16 <= size_t(a.rows() * K);
  }
  if (ex.col_sq) {
    ex.col_sq->assign(size_t(K), 0.0);
    if (x.sparse_back) {
      std::vector<char> seen(size_t(K), 0);
      for (const auto& f : *ex.back_only)
        for (const auto& [col, dh] : f)
          if (!seen[size_t(col)]) seen[size_t(col)] = 1, x.sq_cols.push_back(col);
    }
  }
  if (ex.trunc) ex.trunc->err->resize(a.rows(), N);
  if (ex.trunc && ex.trunc->var) ex.trunc->var->resize(a.rows(), N);
  prepare_f32(x, ex.sq, ex.sq_buf);
  prepare_f32(x, ex.lin, ex.lin_buf);
  // <in_g W_g^T, in W^T> = sum over k in g of in[:, k] (out W)[:, k]: when the whole back product
  // out W is computed anyway, the group projections are its reduction (after the panels).
  x.grp_from_back = ex.grp && ex.back && !x.sparse_back;
  if (ex.grp) ex.grp->out->setZero(a.rows(), ceil_div(K, ex.grp->group));
  if (ex.grp && !x.grp_from_back) {
    GroupProjection& g = *ex.grp;
    g.panel.resize(x.panel.size());
    g.a.resize(size_t(a.size()));
    g.part.resize(size_t(a.rows() * kPanelRows));
    g.whole.resize(g.part.size());
    Eigen::Map<RowMatF>(g.a.data(), a.rows(), K) = g.in->cast<float>();
  }
  x.f32 = ex.trunc && ex.trunc->rows_f32 ? &ex.trunc->panel : nullptr;
  // The float truncation pass also computes the (only) magnitude product: no |W| panel then,
  // unless the pass declines.
  x.fuse_abs = x.f32 && ex.n_abs == 1 && ex.trunc->abs_in;
}

// The float32 extras of one panel: the noise model's squares, the re-quantization direction and
// the group projections (where not taken from the back product).
void panel_f32_extras(const PanelPass& x, ConstRowMap w, int64_t r0, int64_t nr) {
  const PanelExtras& ex = x.ex;
  const int64_t K = x.K;
  if (ex.sq.in) {
    Eigen::Map<RowMatF>(ex.sq_buf->panel.data(), nr, K) = w.array().square().cast<float>().matrix();
    product_f32(x, ex.sq, ex.sq_buf, r0, nr);
  }
  if (ex.lin.in) {
    Eigen::Map<RowMatF>(ex.lin_buf->panel.data(), nr, K) = w.cast<float>();
    product_f32(x, ex.lin, ex.lin_buf, r0, nr);
  }
  if (ex.grp && !x.grp_from_back) {
    GroupProjection& g = *ex.grp;
    // The panel in float32: the re-quantization direction's product has just converted it.
    if (!ex.lin.in) Eigen::Map<RowMatF>(g.panel.data(), nr, K) = w.cast<float>();
    const Eigen::Map<const RowMatF> wf(ex.lin.in ? ex.lin_buf->panel.data() : g.panel.data(), nr, K);
    Eigen::Map<RowMatF> part(g.part.data(), x.a.rows(), nr), whole(g.whole.data(), x.a.rows(), nr);
    whole = x.out.middleCols(r0, nr).cast<float>();
    const Eigen::Map<const RowMatF> af(g.a.data(), x.a.rows(), K);
    for (int64_t k0 = 0; k0 < K; k0 += g.group) {
      const int64_t kn = std::min(g.group, K - k0);
      part.noalias() = af.middleCols(k0, kn) * wf.middleCols(k0, kn).transpose();
      g.out->col(k0 / g.group) += (part.array() * whole.array()).rowwise().sum().cast<double>().matrix();
    }
  }
}

// The back product's and the column norms' share of one panel, whole or at the flips' columns.
void panel_back_extras(const PanelPass& x, ConstRowMap w, int64_t r0, int64_t nr) {
  const PanelExtras& ex = x.ex;
  const int64_t K = x.K;
  const std::vector<double>& panel = x.panel;
  if (ex.back && !x.sparse_back) ex.back->noalias() += x.out.middleCols(r0, nr) * w;
  // Row by row, so that every column sums in row order whatever the buffers' alignment (an
  // Eigen colwise reduction gave run-to-run differences in the last bit).
  if (ex.col_sq && !x.sparse_back)
    for (int64_t o = 0; o < nr; ++o) {
      const double* row = panel.data() + o * K;
      double* cs = ex.col_sq->data();
      for (int64_t c = 0; c < K; ++c) cs[c] += row[c] * row[c];
    }
  for (const int64_t col : x.sq_cols) {
    double acc = 0;
    for (int64_t o = 0; o < nr; ++o) acc += panel[size_t(o * K + col)] * panel[size_t(o * K + col)];
    (*ex.col_sq)[size_t(col)] += acc;
  }
  if (x.sparse_back)
    for (int64_t r = 0; r < x.a.rows(); ++r)
      for (const auto& flip : (*ex.back_only)[size_t(r)]) {
        const int64_t col = flip.first;
        double acc = 0;
        for (int64_t o = 0; o < nr; ++o) acc += x.out(r, r0 + o) * panel[size_t(o * K + col)];
        (*ex.back)(r, col) += acc;
      }
}

// The magnitude products and the truncation bound of one panel: the float pass where it answers,
// else the |W| panel's products and the double pass.
void panel_magnitude_extras(const PanelPass& x, int64_t r0, int64_t nr) {
  const PanelExtras& ex = x.ex;
  const int64_t N = x.N, K = x.K, B = x.B;
  const float* scales = x.scales;
  std::vector<double>& panel = x.panel;
  std::vector<double>* abs_panel = x.abs_panel;
  bool fast = false;  // the float truncation pass answered
  const TruncationProduct* t = ex.trunc;
  if (t && x.f32) {
    // The panel's rows share one block row of scales: w = dec * scale[k / B].
    const float* srow = scales + (r0 / B) * ceil_div(K, B);
    fast = truncation_bound_panel_f32(*t->layout, *t->acc, t->af, t->hf, t->lf, K, t->dcum->data(), x.a.rows(),
                                      x.f32->dec, x.f32->mag, K, srow, nr, t->err->data() + r0, N,
                                      x.fuse_abs ? t->abs_in : nullptr,
                                      x.fuse_abs ? ex.abs[0].out->data() + r0 : nullptr,
                                      x.f32->maga, t->var ? t->var->data() + r0 : nullptr, t->codes);
  }
  if (x.fuse_abs && !fast) dequant_panel(x.codes, scales, K, B, r0, nr, {panel.data(), abs_panel->data()}, x.lut);
  ConstRowMap wa(abs_panel->data(), nr, K);
  for (int i = x.fuse_abs && fast ? 1 : 0; i < ex.n_abs; ++i)
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
    truncation_bound_panel(*t->layout, *t->acc, x.a.data(), t->hi->data(), t->lo->data(), K, t->dcum->data(),
                           x.a.rows(), panel.data(), abs_panel->data(), K, nr, t->err->data() + r0, N, *t->scratch,
                           wal.data(), t->var ? t->var->data() + r0 : nullptr);
  }
}

// The group projections as a reduction of the whole back product (after the panels or the
// engine): <in_g W_g^T, in W^T> = sum over k in g of in[:, k] (out W)[:, k].
void group_projection_from_back(const PanelExtras& ex, int64_t K) {
  for (int64_t k0 = 0; k0 < K; k0 += ex.grp->group) {
    const int64_t kn = std::min(ex.grp->group, K - k0);
    ex.grp->out->col(k0 / ex.grp->group) =
        (ex.grp->in->middleCols(k0, kn).array() * ex.back->middleCols(k0, kn).array()).rowwise().sum().matrix();
  }
}

// The engine's turn (weight_products.hpp): the main product and the extras as plain arrays, every
// output sized here. False where the extras need the double truncation pass (rows beyond float
// range) or the engine declines: the panels then compute everything.
bool engine_pass(const RowMat& a, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
                 RowMat& out, const PanelExtras& ex, WeightProducts& products) {
  const TruncationProduct* t = ex.trunc;
  if (t && !t->rows_f32) return false;
  if (ex.grp && !ex.back) return false;  // the group projections come from the whole back product
  const int64_t n = a.rows();
  out.resize(n, N);
  ProductExtras pe;
  ProductExtras::Truncation pt;
  // The truncation pass also computes the (only) magnitude product, as the panels do.
  const bool fuse_abs = t && ex.n_abs == 1 && t->abs_in;
  if (t) {
    t->err->resize(n, N);
    if (t->var) t->var->resize(n, N);
    pt = {t->layout, t->acc, t->af, t->hf, t->lf, t->dcum->data(), fuse_abs ? t->abs_in : nullptr, t->codes,
          t->err->data(), t->var ? t->var->data() : nullptr, nullptr};
    pe.trunc = &pt;
  }
  for (int i = 0; i < ex.n_abs; ++i) {
    ex.abs[i].out->resize(ex.abs[i].in->rows(), N);
    if (i == 0 && fuse_abs) {
      pt.abs_out = ex.abs[0].out->data();
    } else {
      pe.abs_in[pe.n_abs] = ex.abs[i].in->data(), pe.abs_out[pe.n_abs] = ex.abs[i].out->data();
      ++pe.n_abs;
    }
  }
  if (ex.sq.in) ex.sq.out->resize(n, N), pe.sq_in = ex.sq.in->data(), pe.sq_out = ex.sq.out->data();
  if (ex.lin.in) ex.lin.out->resize(n, N), pe.lin_in = ex.lin.in->data(), pe.lin_out = ex.lin.out->data();
  if (ex.back) ex.back->resize(n, K), pe.back = ex.back->data();
  if (ex.col_sq) ex.col_sq->assign(size_t(K), 0.0), pe.col_sq = ex.col_sq->data();
  if (!products.multiply_with_extras(a.data(), n, codes, scales, N, K, B, out.data(), pe)) return false;
  if (ex.grp) {
    ex.grp->out->setZero(n, ceil_div(K, ex.grp->group));
    group_projection_from_back(ex, K);
  }
  return true;
}

}  // namespace

void gemm_fp8_weight(const RowMat& a, const uint8_t* codes, const float* scales, int64_t N, int64_t K, int64_t B,
                     RowMat& out, std::vector<double>& panel, std::vector<double>& lut, const PanelExtras& ex,
                     std::vector<double>* abs_panel, WeightProducts* products) {
  if (products && !ex.any()) {
    out.resize(a.rows(), N);
    products->multiply(a.data(), a.rows(), codes, scales, N, K, B, out.data());
    return;
  }
  if (products && engine_pass(a, codes, scales, N, K, B, out, ex, *products)) return;
  PanelPass x{a, codes, scales, N, K, B, out, panel, lut, ex, abs_panel};
  prepare_pass(x);
  for (int64_t r0 = 0; r0 < N;) {
    // A panel never crosses a block row, so it shares one row of scales.
    const int64_t block_end = std::min(N, (r0 / B + 1) * B);
    const int64_t nr = std::min(kPanelRows, block_end - r0);
    WeightPanelOut dst{panel.data(), ex.n_abs && !x.fuse_abs ? abs_panel->data() : nullptr};
    if (x.f32) dst.dec = x.f32->dec, dst.mag = x.f32->mag, dst.maga = x.f32->maga;
    dequant_panel(codes, scales, K, B, r0, nr, dst, lut);
    ConstRowMap w(panel.data(), nr, K);
    out.middleCols(r0, nr).noalias() = a * w.transpose();
    panel_f32_extras(x, w, r0, nr);
    panel_back_extras(x, w, r0, nr);
    if (ex.n_abs) panel_magnitude_extras(x, r0, nr);
    r0 += nr;
  }
  if (x.grp_from_back) group_projection_from_back(ex, K);
}

}  // namespace moecheck::forward
