// Judging a sharded layer (compare_sharded.hpp).
#include "reference/compare_sharded.hpp"

#include <cmath>
#include <fmt/format.h>

#include "reference/errors.hpp"

namespace moecheck {

namespace {

ForwardResult budgeted_reference(const MoeProblem& p, const CompareOptions& opt) {
  ForwardOptions fo;
  fo.tier = Tier::quantized;
  fo.budget = &opt.model;
  return moe_forward(p, fo);
}

// The rank whose partial best explains d (least squares on one partial at a time).
void blame_rank(const std::vector<double>& d, const ShardedObservation& obs, ShardedVerdict& v) {
  double dd = 0;
  for (double x : d) dd += x * x;
  if (dd == 0) return;
  for (size_t r = 0; r < obs.ranks.size(); ++r) {
    double dp = 0, pp = 0;
    for (size_t i = 0; i < d.size(); ++i) dp += d[i] * obs.ranks[r].output[i], pp += double(obs.ranks[r].output[i]) * obs.ranks[r].output[i];
    if (pp == 0) continue;
    const double share = dp * dp / (pp * dd);
    if (share > v.blamed_share) v.blamed_share = share, v.blamed_beta = dp / pp, v.blamed_rank = int64_t(r);
  }
  if (v.blamed_share < 0.5) v.blamed_rank = -1;
}

}  // namespace

ShardedVerdict compare_sharded(const MoeProblem& full, const ShardPlan& plan, const ShardedObservation& obs,
                               const CompareOptions& opt) {
  const size_t n = size_t(full.tokens * full.config.hidden_size);
  if (int64_t(obs.ranks.size()) != plan.ranks)
    throw InputError(full.source, "ranks", fmt::format("{} rank outputs for {} ranks", obs.ranks.size(), plan.ranks));
  if (obs.output.size() != n)
    throw InputError(full.source, "output", fmt::format("{} values where [T, H] has {}", obs.output.size(), n));
  for (size_t r = 0; r < obs.ranks.size(); ++r)
    if (obs.ranks[r].output.size() != n)
      throw InputError(full.source, fmt::format("ranks/{}", r),
                       fmt::format("{} values where [T, H] has {}", obs.ranks[r].output.size(), n));
  ShardedVerdict v;
  // Ranks: each partial against its shard's reference. A rank without tokens for its experts has
  // an all-zero partial: vacuous, and allowed to be.
  CompareOptions ropt = opt;
  ropt.allow_vacuous = true;
  std::vector<double> sum_ref(n, 0.0), sum_budget(n, 0.0);
  std::vector<std::vector<float>> partials;
  for (int64_t r = 0; r < plan.ranks; ++r) {
    const MoeProblem p = shard_problem(full, plan, r);
    const ForwardResult ref = budgeted_reference(p, ropt);
    v.ranks.push_back(compare_output(p, ref, obs.ranks[r], ropt));
    v.ranks.back().name = fmt::format("rank {}", r);
    v.pass &= v.ranks.back().pass;
    for (size_t i = 0; i < n; ++i) sum_ref[i] += ref.output[i], sum_budget[i] += ref.budget[i];
    partials.push_back(obs.ranks[r].output);
  }
  // Reduction: the output against the contract's sum of the recorded partials.
  std::vector<double> lo, hi;
  reduction_interval(partials, lo, hi);
  std::vector<double> resid(n, 0.0);
  const std::vector<float> contract = reduce_partials(partials);
  for (size_t i = 0; i < n; ++i) {
    const double o = obs.output[i];
    if (!(o >= lo[i] && o <= hi[i])) ++v.reduction_outside;
    resid[i] = std::isfinite(o) ? o - contract[i] : 0.0;
  }
  if (v.reduction_outside) blame_rank(resid, obs, v), v.pass = false;
  // Whole: the output against the unsharded reference.
  ForwardOptions wo;
  wo.tier = Tier::quantized;
  const ForwardResult whole = moe_forward(full, wo);
  const bool same_recipe = sharded_recipe_is_exact(full.config, plan.kind);
  for (size_t i = 0; i < n; ++i) {
    double m = 0;
    for (const auto& p : partials) m += std::fabs(p[i]);
    const double e = double(plan.ranks) * 0x1p-24 * m;  // the float32 sum, any order (gamma_{N-1} < N 2^-24)
    // Where the sharded recipe is the unsharded one in exact arithmetic, sum_r o_r and o differ
    // by their double evaluations only: K 2^-52 of the magnitudes, far under a 2^-10 share of
    // the ranks' budgets (>= 2^-24 of the same magnitudes). Elsewhere the recipe's own per-rank
    // roundings, as the references compute them.
    const double recipe = same_recipe ? 0x1p-10 * sum_budget[i] : std::fabs(sum_ref[i] - whole.output[i]);
    const double bound = sum_budget[i] + recipe + 0x1p-8 * (m + e) + e + 0x1p-133;
    const double dev = std::fabs(double(obs.output[i]) - whole.output[i]);
    const double ratio = std::isfinite(dev) ? dev / bound : INFINITY;
    v.whole_max_ratio = std::max(v.whole_max_ratio, ratio);
    if (!(ratio <= 1)) ++v.whole_outside;
  }
  if (v.whole_outside) v.pass = false;
  return v;
}

std::string ShardedVerdict::text() const {
  std::string s = fmt::format("{}: {} ranks\n", pass ? "PASS" : "FAIL", ranks.size());
  for (const CompareResult& r : ranks)
    s += fmt::format("  {}: {} (max ratio {:.3g}, {} of {} checks failed)\n", r.name, verdict_label(r), r.max_ratio,
                     r.checks_failed, r.checks);
  s += fmt::format("  reduction: {} element(s) outside the float32 all-reduce of the ranks' partials", reduction_outside);
  if (blamed_rank >= 0)
    s += fmt::format("; the residual is rank {}'s partial x {:.3f} ({:.0f}% of its energy)", blamed_rank, blamed_beta,
                     100 * blamed_share);
  s += fmt::format("\n  whole layer: {} element(s) over the bound against the unsharded reference (max ratio {:.3g})\n",
                   whole_outside, whole_max_ratio);
  return s;
}

}  // namespace moecheck
