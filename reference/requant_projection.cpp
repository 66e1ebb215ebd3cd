// The re-quantization test's reference terms (requant_projection.hpp; BUDGETS.md §10.7).
#include "reference/requant_projection.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <tuple>
#include <cmath>

#include "reference/noise_model.hpp"
#include "reference/parallel_jobs.hpp"
#include "reference/tail_bound.hpp"
#include "reference/weight_panel.hpp"

namespace moecheck {

double requant_weight(double var, double cell) {
  const double c2 = kRequantWeightCell * cell * cell;
  return c2 > 0 ? c2 / (c2 + var) : 0.0;
}

bool RequantTerms::complete(int64_t T, int64_t H, int64_t k) const {
  const size_t t = size_t(T);
  return direction.size() == t * size_t(H) && signal.size() == t && var.size() == t && mean.size() == t &&
         mean_bound.size() == t && tail.size() == t * size_t(k * kFlipTailWidth);
}

void RequantTerms::clear() { *this = {}; }

void RequantTerms::copy_token(const RequantTerms& from, int64_t i, int64_t t, int64_t H, int64_t k) {
  std::copy_n(&from.direction[size_t(i * H)], H, &direction[size_t(t * H)]);
  std::copy_n(&from.tail[size_t(i * k * kFlipTailWidth)], k * kFlipTailWidth, &tail[size_t(t * k * kFlipTailWidth)]);
  signal[size_t(t)] = from.signal[size_t(i)], var[size_t(t)] = from.var[size_t(i)];
  mean[size_t(t)] = from.mean[size_t(i)], mean_bound[size_t(t)] = from.mean_bound[size_t(i)];
}

namespace {

using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr int64_t kRows = 32;  // weight rows dequantized at a time (within one block row)

// q_t = sum over local slots of w_j r_j, in slot order.
void combine_directions(const MoeConfig& c, const Routing& rt, const float* r, int64_t T, std::vector<double>& out) {
  const int64_t H = c.hidden_size, k = c.top_k;
  out.assign(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      if (!c.is_local(rt.ids[t * k + j])) continue;
      const double w = rt.weights[t * k + j];
      const float* rj = r + (t * k + j) * H;
      double* o = out.data() + t * H;
      for (int64_t i = 0; i < H; ++i) o[i] += w * double(rj[i]);
    }
}

// For one expert: G [n, I] = R W2 with R the rows r_t of its slots' tokens (in double, straight
// from the dequantized panels: with a few rows per expert the product is bound by the panels'
// decoding, not by its arithmetic), then each slot's variance and mean terms.
struct Workspace {
  RowMatD R, G;
  std::vector<double> panel, lut;
};
void project_expert(const MoeConfig& c, const Routing& rt, const RequantSlots& in, const std::vector<double>& dir,
                    const ExpertView& w, const std::vector<int64_t>& slots, Workspace& ws, double* slot_signal,
                    double* slot_var, double* slot_mean, double* slot_bound, double* slot_tail) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, B = c.weight_block, k = c.top_k, G = c.group_size;
  const int64_t n = static_cast<int64_t>(slots.size()), ng = (I + G - 1) / G;
  ws.R.resize(n, H);
  for (int64_t r = 0; r < n; ++r)
    std::copy_n(dir.data() + (slots[size_t(r)] / k) * H, H, ws.R.row(r).data());
  ws.G.setZero(n, I);
  ws.panel.resize(size_t(kRows * I));
  for (int64_t r0 = 0; r0 < H;) {
    const int64_t nr = std::min({kRows, H - r0, (r0 / B + 1) * B - r0});
    dequant_panel(w.w2, w.w2_scale, I, B, r0, nr, {ws.panel.data()}, ws.lut);
    ws.G.noalias() += ws.R.middleCols(r0, nr) * Eigen::Map<const RowMatD>(ws.panel.data(), nr, I);
    r0 += nr;
  }
  for (int64_t r = 0; r < n; ++r) {
    const int64_t slot = slots[size_t(r)];
    const double wj = rt.weights[slot];
    const double* hv = in.hvar + slot * I;
    const double* hm = in.hmean + slot * I;
    const double* hb = in.hmean_bound + slot * I;
    const double* dl = in.delta + slot * I;
    const double* h = in.h + slot * I;
    const double* gsv = in.group_scale_var + slot * ng;
    const float* fp = in.flip_p + slot * I;
    const float* fs = in.flip_step + slot * I;
    double sig = 0, v = 0, m = 0, b = 0;
    for (int64_t i = 0; i < I; ++i) {
      const double g = ws.G(r, i);
      sig += dl[i] * g;
      v += hv[i] * g * g;
      m += hm[i] * g;
      b += hb[i] * std::fabs(g);
    }
    // The codes' crossings among v's terms (§10.8): code i moves <d_t, q_t> by its step |w_j g_i|
    // with probability p (at most its share hv / step^2 of the second moment), a rare term of its
    // own size that a Gaussian tail of the same variance would treat as impossible.
    auto crossing = [&](int64_t i) {
      const double a = double(fs[i]) * std::fabs(wj * ws.G(r, i));
      const double p = a > 0 ? std::min(double(fp[i]), hv[i] / (double(fs[i]) * double(fs[i]))) : 0.0;
      return std::pair{std::min(p, 1 - p) > 0 ? p : 0.0, a};
    };
    FlipTail::write_terms(
        [&](auto add) {
          for (int64_t i = 0; i < I; ++i) std::apply(add, crossing(i));
        },
        slot_tail + slot * kFlipTailWidth);
    const double* cup = in.jump_code_up + slot * I;
    const double* cdn = in.jump_code_dn + slot * I;
    const double* jp = in.jump_p + slot * ng;
    const double* rup = in.jump_rel_up + slot * ng;
    const double* rdn = in.jump_rel_dn + slot * ng;
    for (int64_t gi = 0; gi < ng; ++gi) {  // the groups' shared scale deviations and jumps
      double proj = 0, code_up = 0, code_dn = 0;  // proj = <h_g, g_j>: the scale's share of either
      for (int64_t i = gi * G; i < std::min(I, (gi + 1) * G); ++i) {
        const double g = ws.G(r, i);
        proj += h[i] * g, code_up += cup[i] * g, code_dn += cdn[i] * g;
      }
      v += gsv[gi] * proj * proj + jump_var(jp[gi], rup[gi] * proj + code_up, rdn[gi] * proj + code_dn);
    }
    slot_signal[slot] = wj * sig;
    slot_var[slot] = wj * wj * v;
    slot_mean[slot] = wj * m;
    slot_bound[slot] = std::fabs(wj) * b;
  }
}

}  // namespace

void requant_projections(const MoeProblem& p, const Routing& rt, const RequantSlots& in,
                         const std::vector<ExpertSlots>& experts, int threads, std::mutex& load_mutex,
                         ForwardResult& res) {
  const MoeConfig& c = p.config;
  const int64_t T = p.tokens, k = c.top_k;
  combine_directions(c, rt, in.r, T, res.requant.direction);
  res.requant.tail.assign(static_cast<size_t>(T * k * kFlipTailWidth), 0.0);
  std::vector<double> slot_var(static_cast<size_t>(T * k), 0.0), slot_mean(slot_var.size(), 0.0);
  std::vector<double> slot_bound(slot_var.size(), 0.0), slot_signal(slot_var.size(), 0.0);
  parallel_jobs<Workspace>(experts.size(), threads, [&](size_t i, Workspace& ws) {
    ExpertView w;
    {
      std::lock_guard<std::mutex> lock(load_mutex);
      w = p.load_expert(experts[i].expert);
    }
    project_expert(c, rt, in, res.requant.direction, w, *experts[i].slots, ws, slot_signal.data(), slot_var.data(),
                   slot_mean.data(), slot_bound.data(), res.requant.tail.data());
  });
  res.requant.signal.assign(static_cast<size_t>(T), 0.0);
  res.requant.var.assign(static_cast<size_t>(T), 0.0);
  res.requant.mean.assign(static_cast<size_t>(T), 0.0);
  res.requant.mean_bound.assign(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t s = t * k + j;
      res.requant.signal[t] += slot_signal[s], res.requant.var[t] += slot_var[s];
      res.requant.mean[t] += slot_mean[s], res.requant.mean_bound[t] += slot_bound[s];
    }
}

}  // namespace moecheck
