// Judging a sharded layer (compare_sharded.hpp).
#include "reference/compare_sharded.hpp"

#include <cctype>
#include <cmath>
#include <fmt/format.h>
#include <memory>

#include "reference/errors.hpp"
#include "reference/sharded_reference.hpp"

namespace moecheck {

namespace {

void check_sizes(const MoeProblem& full, const ShardPlan& plan, const ShardedObservation& obs) {
  const size_t n = size_t(full.tokens * full.config.hidden_size);
  if (int64_t(obs.ranks.size()) != plan.ranks)
    throw InputError(full.source, "ranks", fmt::format("{} rank outputs for {} ranks", obs.ranks.size(), plan.ranks));
  if (obs.layer.output.size() != n)
    throw InputError(full.source, "output", fmt::format("{} values where [T, H] has {}", obs.layer.output.size(), n));
  for (size_t r = 0; r < obs.ranks.size(); ++r)
    if (obs.ranks[r].output.size() != n)
      throw InputError(full.source, fmt::format("ranks/{}", r),
                       fmt::format("{} values where [T, H] has {}", obs.ranks[r].output.size(), n));
}

// The rank whose partial best explains d (least squares on one partial at a time).
void blame_rank(const std::vector<double>& d, const ShardedObservation& obs, ShardedVerdict& v) {
  double dd = 0;
  for (double x : d) dd += x * x;
  if (dd == 0) return;
  for (size_t r = 0; r < obs.ranks.size(); ++r) {
    const std::vector<float>& p = obs.ranks[r].output;
    double dp = 0, pp = 0;
    for (size_t i = 0; i < d.size(); ++i)
      if (std::isfinite(p[i])) dp += d[i] * p[i], pp += double(p[i]) * p[i];
    if (pp == 0) continue;
    const double share = dp * dp / (pp * dd);
    if (share > v.blamed_share) v.blamed_share = share, v.blamed_beta = dp / pp, v.blamed_rank = int64_t(r);
  }
  if (v.blamed_share < 0.5) v.blamed_rank = -1;
}

// The output against the contract's reduction of the recorded partials.
void judge_reduction(const ShardedObservation& obs, ShardedVerdict& v) {
  std::vector<std::vector<float>> partials;
  for (const Observation& r : obs.ranks) partials.push_back(r.output);
  std::vector<double> lo, hi;
  reduction_interval(partials, lo, hi);
  const std::vector<float> contract = reduce_partials(partials);
  std::vector<double> resid(lo.size(), 0.0);
  for (size_t i = 0; i < lo.size(); ++i) {
    const double o = obs.layer.output[i];
    if (!(o >= lo[i] && o <= hi[i])) ++v.reduction_outside;
    resid[i] = std::isfinite(o) && std::isfinite(contract[i]) ? o - contract[i] : 0.0;
  }
  if (v.reduction_outside) blame_rank(resid, obs, v);
}

// Ids of the experts that fail in r, "3, 5" ("" when none), the first eight.
std::string failing_experts(const CompareResult& r) {
  const std::vector<int64_t> ids = failing_expert_ids(r);
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  if (ids.size() > 8) s += fmt::format(", ... ({} in all)", ids.size());
  return s;
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::vector<int64_t> ShardedVerdict::failing_ranks() const {
  std::vector<int64_t> f;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (!ranks[r].pass) f.push_back(int64_t(r));
  return f;
}

CompareResult compare_sharded(const MoeProblem& full, const ShardPlan& plan, ForwardResult whole,
                              const ShardedObservation& obs, const CompareOptions& opt) {
  check_sizes(full, plan, obs);
  ForwardOptions fo;
  fo.tier = Tier::quantized, fo.budget = &opt.model, fo.requant_terms = opt.requant_test;
  const ShardedReference ref = sharded_reference(full, plan, std::move(whole), fo);
  // Layer: near-tie tokens re-run through the sharded reference, so their budget holds the ranks' too.
  CompareOptions lopt = opt;
  lopt.forward = [plan](const MoeProblem& p, const ForwardOptions& f) {
    return sharded_reference(p, plan, moe_forward(p, f), f).whole;
  };
  Observation layer = obs.layer;
  layer.expert_outputs.clear();
  CompareResult R = compare_output(full, ref.whole, layer, lopt);
  // Ranks: each partial against its shard's reference. A rank without tokens for its experts has
  // an all-zero partial: vacuous, and allowed to be.
  auto v = std::make_shared<ShardedVerdict>();
  v->plan = plan;
  CompareOptions ropt = opt;
  ropt.allow_vacuous = true;
  for (int64_t r = 0; r < plan.ranks; ++r) {
    v->ranks.push_back(compare_output(shard_problem(full, plan, r), ref.ranks[size_t(r)], obs.ranks[size_t(r)], ropt));
    v->ranks.back().name = fmt::format("rank {}", r);
  }
  judge_reduction(obs, *v);
  R.checks += plan.ranks + 1;
  R.checks_failed += int64_t(v->failing_ranks().size()) + !v->reduction_pass();
  R.pass = R.pass && v->pass();
  R.sharded = std::move(v);
  return R;
}

std::string ShardedVerdict::text() const {
  std::string s;
  for (const CompareResult& r : ranks) {
    s += fmt::format("  {}: {} (max ratio {:.3g}", r.name, upper(verdict_label(r)), r.max_ratio);
    if (r.worst_token >= 0 && !r.pass) s += fmt::format(" at token {}, column {}", r.worst_token, r.worst_col);
    s += fmt::format("; {} of {} checks failed)\n", r.checks_failed, r.checks);
    if (const std::string e = failing_experts(r); !e.empty()) s += "    failing experts " + e + "\n";
  }
  s += fmt::format("  reduction: {} ({} element{} outside the float32 all-reduce of the ranks' partials)\n",
                   reduction_pass() ? "PASS" : "FAIL", reduction_outside, reduction_outside == 1 ? "" : "s");
  if (blamed_rank >= 0)
    s += fmt::format("    the residual is rank {}'s partial x {:.3f} ({:.0f}% of its energy)\n", blamed_rank, blamed_beta,
                     100 * blamed_share);
  return s;
}

}  // namespace moecheck
