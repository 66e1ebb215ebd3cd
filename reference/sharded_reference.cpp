// The reference of a layer run over N ranks (sharded_reference.hpp).
#include "reference/sharded_reference.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "reference/moe_budget.hpp"
#include "reference/moe_combine.hpp"

namespace moecheck {

namespace {

// The bf16 spacing at the centre a correct device's value is judged from (bf16_of_f32 of the
// reference), at least bf16's subnormal step: the unit of every rounding residual below.
double centre_ulp(double o) { return bf16_rounding_unit(bf16_of_f32(o)); }

}  // namespace

ShardedReference sharded_reference(const MoeProblem& full, const ShardPlan& plan, ForwardResult whole,
                                   const ForwardOptions& fo) {
  const size_t n = size_t(full.tokens * full.config.hidden_size);
  if (!fo.budget || whole.budget.size() != n || whole.output.size() != n)
    throw std::invalid_argument("sharded_reference: the layer's reference needs a budget");
  ShardedReference s;
  s.plan = plan;
  ForwardOptions ro = fo;
  ro.ideal_bound = false, ro.progress = {};
  std::vector<double> sum_ref(n, 0.0), sum_budget(n, 0.0), mag(n, 0.0), var(n, 0.0);
  for (int64_t r = 0; r < plan.ranks; ++r) {
    s.ranks.push_back(moe_forward(shard_problem(full, plan, r), ro));
    const ForwardResult& f = s.ranks.back();
    for (size_t i = 0; i < n; ++i) {
      const double u = centre_ulp(f.output[i]);
      sum_ref[i] += f.output[i], sum_budget[i] += f.budget[i], mag[i] += std::fabs(f.output[i]) + f.budget[i];
      const double v = f.noise_var.size() == n ? f.noise_var[i] : f.budget[i] * f.budget[i];  // no model: the worst case
      var[i] += std::max(v, u * u / 12) + u * u / 12;
    }
  }
  const bool exact = sharded_recipe_is_exact(full.config, plan.kind);
  whole.noise_var.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double e = double(plan.ranks) * 0x1p-24 * mag[i];
    const double recipe = exact ? 0x1p-10 * sum_budget[i] : std::fabs(sum_ref[i] - whole.output[i]);
    const double u = centre_ulp(whole.output[i]);
    whole.budget[i] = sum_budget[i] + recipe + e + 0x1p-8 * (mag[i] + e) + 0x1p-133;
    whole.noise_var[i] = var[i] + e * e / 3 + u * u / 6 + recipe * recipe;
  }
  s.whole = std::move(whole);
  return s;
}

}  // namespace moecheck
