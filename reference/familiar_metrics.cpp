// The familiar metrics (moe_compare.hpp, docs/BUG-CLASSES.md §2): what engines' own tests compute,
// on the same data as the budgeted judgement, so a report can show which of them a fault passes.
#include <algorithm>
#include <cmath>
#include <limits>

#include "reference/moe_compare.hpp"

namespace moecheck {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

FamiliarMetrics familiar_metrics(const std::vector<double>& ref, const std::vector<float>& obs) {
  FamiliarMetrics m;
  double sxx = 0, syy = 0, sxy = 0, sdd = 0, sad = 0, sar = 0, rmax = 0;
  int64_t close = 0;
  for (double r : ref) rmax = std::max(rmax, std::fabs(r));
  for (size_t i = 0; i < ref.size(); ++i) {
    const double x = ref[i], y = obs[i];
    if (!std::isfinite(y)) {
      ++m.nonfinite;
      continue;
    }
    const double d = y - x;
    sxx += x * x, syy += y * y, sxy += x * y, sdd += d * d, sad += std::fabs(d), sar += std::fabs(x);
    m.max_abs = std::max(m.max_abs, std::fabs(d));
    if (std::fabs(x) >= 1e-3 * rmax && x != 0) m.max_rel = std::max(m.max_rel, std::fabs(d) / std::fabs(x));
    close += std::fabs(d) <= 0.035 + 0.035 * std::fabs(x);
  }
  m.rel_l2 = sxx > 0 ? std::sqrt(sdd / sxx) : (sdd > 0 ? kInf : 0.0);
  m.nmse = sxx > 0 ? sdd / sxx : (sdd > 0 ? kInf : 0.0);
  m.sqnr_db = sdd > 0 ? 10 * std::log10(sxx / sdd) : kInf;
  m.cos_diff = (sxx + syy) > 0 ? 1 - 2 * sxy / (sxx + syy) : 0.0;
  m.mean_rel = sar > 0 ? sad / sar : (sad > 0 ? kInf : 0.0);
  m.allclose_fraction = ref.empty() ? 1.0 : double(close) / double(ref.size());
  // Thresholds of docs/BUG-CLASSES.md §2: DeepGEMM calc_diff < 1e-3, SGLang fused-MoE mean-relative
  // < 0.02, vLLM assert_close(atol = rtol = 0.035) on every element, NMSE < 5e-3 (llama.cpp MoE).
  const bool finite = m.nonfinite == 0;
  m.deepgemm_pass = finite && m.cos_diff < 1e-3;
  m.sglang_pass = finite && m.mean_rel < 0.02;
  m.vllm_pass = finite && close == static_cast<int64_t>(ref.size());
  m.nmse_pass = finite && m.nmse < 5e-3;
  return m;
}

}  // namespace moecheck
