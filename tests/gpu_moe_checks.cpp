// Stage-by-stage checks of one GPU MoE run against float64 models (gpu_test_support.hpp).
//
// Each stage is judged on the GPU's own inputs to that stage (its routing, its GEMM1 output, its
// re-quantized intermediate), so a rounding flip upstream (a code one ulp apart after
// re-quantization, a near-tie routed the other way) cannot masquerade as an error downstream;
// an end-to-end check then ties the chain together. Bounds (each derived next to its check):
//   routing     ids: a valid top-k once every float32 score may be off by delta (judge_topk);
//               weights: float32 error of the weight formula + bf16 rounding
//   permutation exact (integers)
//   GEMM1/GEMM2 gemm_row_model's bound (gpu_test_support.cpp)
//   SiLU quant  |decode(q) s - h| <= u8 |h| + 2^-10 s + float32/bf16 error of h
//   finalize    k 2^-24 sum |w y| + bf16 rounding
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_forward.hpp"
#include "reference/moe_routing.hpp"
#include "tests/gpu_test_support.hpp"

namespace moecheck::gputest {

namespace {

constexpr double kU32 = 0x1p-24;
constexpr double kBf16 = 0x1p-8;
constexpr double kU8 = 0x1p-4;
constexpr int64_t kB = 128;

std::string at(const char* what, int64_t a, int64_t b = -1) {
  std::ostringstream os;  // (not operator+ chains: GCC 12 -Wrestrict false positive)
  os << what << "[" << a;
  if (b >= 0) os << "," << b;
  os << "]";
  return os.str();
}

bool softmax_method(RoutingMethod m) { return m == RoutingMethod::renormalize || m == RoutingMethod::softmax_topk; }

// One local slot of the run: token t, slot j, its permuted row and local expert.
struct LocalSlot {
  int64_t t, j, row, expert;
};

}  // namespace

// Routing: float32 scores err by a few roundoffs of the score's magnitude:
//   sigmoid methods  gate = 1/(1+expf(-x)) (expf 2 ulp, + and / 0.5 ulp each) then + bias:
//                    |err| <= 5 * 2^-24 * (|gate| + |bias|); delta = 8 * 2^-24 * max magnitude
//   softmax methods  expf(l - m): the float subtraction errs by <= 2^-24 |l - m| in the exponent,
//                    expf 2 ulp, the block sum <= E 2^-24, the division 0.5 ulp:
//                    delta = (max|l - m| + E + 8) * 2^-24 * max p
//   llama4           sel is the logit itself: delta = 0 (comparisons are exact)
// Weights (relative to the exact weight of the GPU's own id set): the float32 formula costs
// (2k + 16) roundoffs (softmax methods add the score error), bf16 rounding adds 2^-8.
CheckReport check_routing(const MoeConfig& c, const float* logits, const float* bias, int64_t tokens,
                          const std::vector<int32_t>& ids, const std::vector<float>& weights) {
  CheckReport r;
  r.what = "routing";
  const int64_t E = c.num_experts, k = c.top_k;
  int64_t differs = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * E;
    const TokenScores s = selection_scores(c, l, bias);
    std::vector<int32_t> row(ids.begin() + t * k, ids.begin() + (t + 1) * k);
    bool well_formed = true;
    for (int64_t j = 0; j < k; ++j)
      if (row[j] < 0 || row[j] >= E || std::count(row.begin(), row.end(), row[j]) != 1) well_formed = false;
    if (!well_formed) {
      std::ostringstream os;
      for (auto v : row) os << v << " ";
      r.fail(at("ids", t) + " not k distinct experts: " + os.str());
      continue;
    }
    double delta = 0, wrel = (2.0 * k + 16) * kU32;
    if (c.routing == RoutingMethod::deepseek_v3 || c.routing == RoutingMethod::sigmoid_renormalize) {
      delta = 8 * kU32 * *std::max_element(s.magnitude.begin(), s.magnitude.end());
    } else if (softmax_method(c.routing)) {
      const double m = *std::max_element(l, l + E);
      double spread = 0;
      for (int64_t e = 0; e < E; ++e) spread = std::max(spread, m - l[e]);
      const double score_rel = (spread + static_cast<double>(E) + 8) * kU32;
      delta = score_rel * *std::max_element(s.sel.begin(), s.sel.end());
      wrel += 2 * score_rel;
    }
    const TopkJudgement jd = judge_topk(c, s, row, delta);
    ++r.checked;
    if (!jd.valid) {
      r.fail(at("ids", t) + ": " + jd.why);
      continue;
    }
    for (int64_t j = 0; j + 1 < k; ++j) {  // rank order: descending sel, exact ties by lower id
      const double a = s.sel[row[j]], b = s.sel[row[j + 1]];
      if (a < b - 2 * delta || (a == b && row[j] > row[j + 1]))
        r.fail(at("ids", t, j) + ": not in rank order (" + std::to_string(row[j]) + " before " +
               std::to_string(row[j + 1]) + ")");
    }
    if (route_token(c, s).ids != row) ++differs;
    for (int64_t j = 0; j < k; ++j) {
      const double w = jd.weights[j], got = weights[t * k + j];
      double bound = wrel * std::fabs(w) + 0x1p-140;
      if (c.routing_weight_dtype == Precision::bf16) {
        bound += kBf16 * (std::fabs(w) + bound);
        if (bf16_round(got) != got) r.fail(at("weights", t, j) + " is not a bf16 value");
      }
      r.ratio(std::isfinite(got) ? std::fabs(got - w) : INFINITY, bound, at("weights", t, j));
    }
  }
  if (differs > 0) r.details += "\n    (" + std::to_string(differs) + " tokens route differently from the float64 "
                                "reference within the float32 tie tolerance)";
  return r;
}

CheckReport check_moe(const MoeCase& m, const MoeHostData& d, const MoeGpuRun& g, GemmPadding gemm_padding) {
  const MoeConfig& c = m.c;
  const int64_t T = m.tokens, E = c.num_experts, k = c.top_k, H = c.hidden_size, I = c.intermediate_size;
  const int64_t El = c.local_experts(), off = c.local_expert_offset;
  const float* dec = fp8_table(Fp8Format::e4m3fn);
  std::ostringstream name;
  name << m;
  CheckReport all;
  all.what = name.str();

  // Routing
  all.merge(check_routing(c, d.logits.data(), m.bias ? d.bias.data() : nullptr, T, g.topk_ids, g.topk_weights));
  if (!all.ok) return all;  // later stages assume well-formed ids

  // Activation quantization of the bf16 entry: bit-exact with the reference.
  const uint8_t* hcodes = d.hidden_codes.data();
  const float* hscales = d.hidden_scales.data();
  if (m.bf16_entry) {
    CheckReport q;
    q.what = "hidden-state quantization";
    std::vector<float> x(d.hidden_bf16.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_decode(d.hidden_bf16[i]);
    const GroupQuantized ref = group_quantize(x.data(), T, H, kB, c.scale_format, c.act_eps, ScaleLayout::transposed);
    for (size_t i = 0; i < ref.codes.size(); ++i, ++q.checked)
      if (ref.codes[i] != g.hidden_codes[i]) q.fail(at("code", static_cast<int64_t>(i)) + " differs");
    for (size_t i = 0; i < ref.scales.size(); ++i, ++q.checked)
      if (ref.scales[i] != g.hidden_scales[i]) q.fail(at("scale", static_cast<int64_t>(i)) + " differs");
    all.merge(q);
    hcodes = g.hidden_codes.data();
    hscales = g.hidden_scales.data();
  }

  // Permutation: exact
  CheckReport p;
  p.what = "permutation";
  const kernels::PermuteCapacity cap = kernels::permute_capacity(T, k, El);
  std::vector<int32_t> count(static_cast<size_t>(El), 0), rank(static_cast<size_t>(T * k), -1);
  for (int64_t s = 0; s < T * k; ++s) {
    const int64_t e = g.topk_ids[s] - off;
    if (e >= 0 && e < El) rank[s] = count[e]++;
  }
  std::vector<int64_t> start(static_cast<size_t>(El + 1), 0);
  for (int64_t e = 0; e < El; ++e) start[e + 1] = start[e] + (count[e] + 63) / 64 * 64;
  const int64_t total = start[El];
  for (int64_t e = 0; e < El; ++e, ++p.checked) {
    if (g.expert_count[e] != count[e]) p.fail(at("expert_count", e) + " = " + std::to_string(g.expert_count[e]));
    if (g.row_offset[e] != start[e]) p.fail(at("row_offset", e) + " = " + std::to_string(g.row_offset[e]));
  }
  if (g.row_offset[El] != total || g.totals[0] != total || g.totals[1] != total / 64)
    p.fail("totals " + std::to_string(g.totals[0]) + "/" + std::to_string(g.totals[1]) + ", expected " +
           std::to_string(total) + "/" + std::to_string(total / 64));
  std::vector<int64_t> want_slot(static_cast<size_t>(cap.max_rows), -1);
  std::vector<LocalSlot> local;
  for (int64_t s = 0; s < T * k; ++s, ++p.checked) {
    const int64_t e = g.topk_ids[s] - off;
    const int64_t row = rank[s] >= 0 ? start[e] + rank[s] : -1;
    if (g.slot_to_row[s] != row) p.fail(at("slot_to_row", s) + " = " + std::to_string(g.slot_to_row[s]) +
                                        ", expected " + std::to_string(row));
    if (row >= 0) {
      want_slot[row] = s;
      local.push_back({s / k, s % k, row, e});
    }
  }
  for (int64_t r = 0; r < cap.max_rows; ++r, ++p.checked)
    if (g.row_to_slot[r] != want_slot[r]) p.fail(at("row_to_slot", r) + " = " + std::to_string(g.row_to_slot[r]));
  for (int64_t t = 0; t < cap.max_tiles; ++t, ++p.checked) {
    int64_t want = -1;
    for (int64_t e = 0; e < El && t * 64 < total; ++e)
      if (t * 64 >= start[e] && t * 64 < start[e + 1]) want = e;
    if (g.tile_expert[t] != want) p.fail(at("tile_expert", t) + " = " + std::to_string(g.tile_expert[t]));
  }
  all.merge(p);
  if (!p.ok) return all;

  // Rows of no slot (padding rows, and the capacity's rows past the plan) keep the 0xFF poison the
  // runners fill the workspace with: no stage writes them (moe_stages.hpp). cuBLASLt's GEMMs
  // compute whole row blocks, so with GemmPadding::computed its GEMM outputs are not checked.
  CheckReport pad;
  pad.what = "rows of no slot untouched";
  auto poison = [](const void* p, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(p);
    return std::all_of(b, b + bytes, [](uint8_t v) { return v == 0xFF; });
  };
  const bool gemm_rows = gemm_padding == GemmPadding::untouched;
  for (int64_t r = 0; r < cap.max_rows; ++r) {
    if (want_slot[r] >= 0) continue;
    pad.checked += 2 + (gemm_rows ? 2 : 0);
    if (gemm_rows && !poison(g.gemm1_out.data() + r * 2 * I, 4 * 2 * I)) pad.fail(at("gemm1_out row", r) + " written");
    if (!poison(g.a2_codes.data() + r * I, I)) pad.fail(at("a2_codes row", r) + " written");
    if (!poison(g.a2_scales.data() + r * (I / kB), 4 * (I / kB))) pad.fail(at("a2_scales row", r) + " written");
    if (gemm_rows && !poison(g.gemm2_out.data() + r * H, 4 * H)) pad.fail(at("gemm2_out row", r) + " written");
  }
  all.merge(pad);

  // The rows the float64 models check (every check_stride-th token).
  std::vector<LocalSlot> checked;
  for (const auto& ls : local)
    if (ls.t % m.check_stride == 0) checked.push_back(ls);
  std::vector<GemmRowModel> y_model(checked.size());

  // GEMM1: the token's own hidden codes (so the gather is checked too) against w13 of its expert.
  all.merge(parallel_check("GEMM1", static_cast<int64_t>(checked.size()), [&](int64_t i, CheckReport& r) {
    const LocalSlot& ls = checked[i];
    std::vector<float> sa(static_cast<size_t>(H / kB));
    for (int64_t b = 0; b < H / kB; ++b) sa[b] = hscales[b * T + ls.t];
    const GemmRowModel mod = gemm_row_model(hcodes + ls.t * H, sa.data(), d.w13.data() + ls.expert * 2 * I * H,
                                            d.w13_scale.data() + ls.expert * (2 * I / kB) * (H / kB), 2 * I, H,
                                            c.intermediate_dtype);
    check_gemm_row(mod, g.gemm1_out.data() + ls.row * 2 * I, c.intermediate_dtype, at("gemm1 slot", ls.t, ls.j), r);
  }));

  // SiLU * up and its re-quantization, on the GPU's GEMM1 output. h = silu(gate) * up in double;
  // the GPU's float32 h errs by <= 8 * 2^-24 |h| (expf 2 ulp through 1 + e, then +, /, * at
  // 0.5 ulp each, with margin), plus 2^-8 |h| when rounded to bf16; e4m3 RNE of h / s errs by
  // <= u8 |h / s| in the normal range and by <= 2^-10 below it. The scale must be the
  // reference's group_scale of an amax within that same relative error.
  const double h_rel = 8 * kU32 + (c.intermediate_dtype == Precision::bf16 ? kBf16 : 0.0);
  const int64_t gate_col = c.gate_up_layout == GateUpLayout::gate_up ? 0 : I;
  const int64_t up_col = c.gate_up_layout == GateUpLayout::gate_up ? I : 0;
  all.merge(parallel_check("SiLU*up re-quantization", static_cast<int64_t>(checked.size()), [&](int64_t i, CheckReport& r) {
    const LocalSlot& ls = checked[i];
    const float* x = g.gemm1_out.data() + ls.row * 2 * I;
    for (int64_t b = 0; b < I / kB; ++b) {
      double h[kB], amax = 0;
      for (int64_t q = 0; q < kB; ++q) {
        h[q] = silu(x[gate_col + b * kB + q]) * static_cast<double>(x[up_col + b * kB + q]);
        amax = std::max(amax, std::fabs(h[q]));
      }
      const float s = g.a2_scales[ls.row * (I / kB) + b];
      const float s_lo = group_scale(static_cast<float>(amax * (1 - h_rel)), c.scale_format, c.act_eps);
      const float s_hi = group_scale(static_cast<float>(amax * (1 + h_rel)), c.scale_format, c.act_eps);
      ++r.checked;
      if (!(s >= s_lo * (1 - 2 * kU32) && s <= s_hi * (1 + 2 * kU32)))
        r.fail(at("a2_scale slot", ls.t, ls.j) + " block " + std::to_string(b) + ": " + std::to_string(s) +
               " outside [" + std::to_string(s_lo) + ", " + std::to_string(s_hi) + "]");
      for (int64_t q = 0; q < kB; ++q) {
        const double v = static_cast<double>(dec[g.a2_codes[ls.row * I + b * kB + q]]) * s;
        const double bound = (kU8 + (1 + kU8) * h_rel) * std::fabs(h[q]) + 0x1p-10 * s;
        r.ratio(std::isfinite(v) ? std::fabs(v - h[q]) : INFINITY, bound,
                at("h slot", ls.t, ls.j) + " col " + std::to_string(b * kB + q));
      }
    }
  }));

  // GEMM2 on the GPU's re-quantized intermediate.
  all.merge(parallel_check("GEMM2", static_cast<int64_t>(checked.size()), [&](int64_t i, CheckReport& r) {
    const LocalSlot& ls = checked[i];
    y_model[i] = gemm_row_model(g.a2_codes.data() + ls.row * I, g.a2_scales.data() + ls.row * (I / kB),
                                d.w2.data() + ls.expert * H * I, d.w2_scale.data() + ls.expert * (H / kB) * (I / kB),
                                H, I, Precision::f32);
    check_gemm_row(y_model[i], g.gemm2_out.data() + ls.row * H, Precision::f32, at("gemm2 slot", ls.t, ls.j), r);
  }));

  // expert_outputs: bit copies of the slot rows, 0 for non-local slots.
  CheckReport eo;
  eo.what = "expert_outputs";
  for (int64_t s = 0; s < T * k; ++s) {
    const int64_t row = g.slot_to_row[s];
    for (int64_t h = 0; h < H; ++h, ++eo.checked) {
      const float want = row >= 0 ? g.gemm2_out[row * H + h] : 0.0f;
      const float got = g.expert_outputs[s * H + h];
      if (!(got == want) || std::signbit(got) != std::signbit(want))
        eo.fail(at("expert_outputs", s, h) + " = " + std::to_string(got) + ", expected " + std::to_string(want));
    }
  }
  all.merge(eo);

  // Finalize on the GPU's slot outputs: k FFMAs (<= k 2^-24 sum |w y|), then bf16 RNE (2^-8).
  CheckReport fin;
  fin.what = "finalize";
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      double ref = 0, mass = 0;
      int64_t n_local = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = g.slot_to_row[t * k + j];
        if (row < 0) continue;
        const double wy = static_cast<double>(g.topk_weights[t * k + j]) * g.gemm2_out[row * H + h];
        ref += wy;
        mass += std::fabs(wy);
        ++n_local;
      }
      const uint16_t bits = g.out[t * H + h];
      if (n_local == 0) {
        ++fin.checked;
        if (bits != 0) fin.fail(at("out", t, h) + ": token without local slot must give +0");
        continue;
      }
      const double bound = static_cast<double>(n_local) * kU32 * mass * (1 + kBf16) + kBf16 * std::fabs(ref) + 0x1p-133;
      const double got = bf16_decode(bits);
      fin.ratio(std::isfinite(got) ? std::fabs(got - ref) : INFINITY, bound, at("out", t, h));
    }
  all.merge(fin);

  // End to end on the checked tokens: output vs sum_j w_j * y*_j (GEMM2's exact model).
  CheckReport e2e;
  e2e.what = "end to end (GEMM2 model + finalize)";
  std::vector<std::vector<size_t>> by_token(static_cast<size_t>(T));
  for (size_t i = 0; i < checked.size(); ++i) by_token[checked[i].t].push_back(i);
  for (int64_t t = 0; t < T; t += m.check_stride) {
    if (by_token[t].empty()) continue;
    for (int64_t h = 0; h < H; ++h) {
      double ref = 0, slack = 0, mass = 0;
      for (size_t i : by_token[t]) {
        const double w = g.topk_weights[t * k + checked[i].j];
        ref += w * y_model[i].exact[h];
        slack += std::fabs(w) * y_model[i].bound[h];
        mass += std::fabs(w) * (std::fabs(y_model[i].exact[h]) + y_model[i].bound[h]);
      }
      const double n = static_cast<double>(by_token[t].size());
      const double bound = slack + n * kU32 * mass * (1 + kBf16) + kBf16 * (std::fabs(ref) + slack) + 0x1p-133;
      const double got = bf16_decode(g.out[t * H + h]);
      e2e.ratio(std::isfinite(got) ? std::fabs(got - ref) : INFINITY, bound, at("out", t, h));
    }
  }
  all.merge(e2e);
  (void)E;
  return all;
}

}  // namespace moecheck::gputest
