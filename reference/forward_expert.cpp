// run_expert (forward_stages.hpp): one expert's two GEMMs with the tier's roundings in between
// (moe_forward.hpp), in named steps; with a budget model, the budget's and the noise model's
// terms of BUDGETS.md §2-§10 beside them.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "reference/forward_stages.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_combine.hpp"
#include "reference/noise_model.hpp"
#include "reference/requant_projection.hpp"
#include "reference/tail_bound.hpp"
#include "reference/truncation_bound.hpp"

namespace moecheck::forward {

namespace {

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
  gemm_fp8_weight(s.a, e.w.w13, e.w.w13_scale, 2 * I, H, B, s.x, s.panel, s.lut, ex, &s.abs_panel, e.products);
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
  gemm_fp8_weight(s.h, e.w.w2, e.w.w2_scale, H, I, B, s.y, s.panel, s.lut, ex, &s.abs_panel, e.products);
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

}  // namespace

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

}  // namespace moecheck::forward
