// Judging a recorded output (contract: moe_compare.hpp; derivation: reference/BUDGETS.md): the
// stages of compare_stages.hpp, in order.
#include "reference/moe_compare.hpp"

#include <stdexcept>

#include "reference/compare_stages.hpp"

namespace moecheck {

namespace {
void check_shapes(const MoeProblem& p, const ForwardResult& ref, const Observation& obs) {
  const size_t T = size_t(p.tokens), H = size_t(p.config.hidden_size), k = size_t(p.config.top_k);
  if (ref.budget.size() != T * H || ref.expert_outputs.size() != T * k * H)
    throw std::invalid_argument("compare_output: the reference was not computed with a budget");
  if (obs.output.size() != T * H) throw std::invalid_argument("compare_output: output has the wrong size");
  if (!obs.topk_ids.empty() && obs.topk_ids.size() != T * k)
    throw std::invalid_argument("compare_output: topk_ids has the wrong size");
  if (!obs.expert_outputs.empty() && obs.expert_outputs.size() != T * k * H)
    throw std::invalid_argument("compare_output: expert_outputs has the wrong size");
}
}  // namespace

CompareResult compare_output(const MoeProblem& p, const ForwardResult& ref, const Observation& obs,
                             const CompareOptions& opt) {
  check_shapes(p, ref, obs);
  CompareResult R;
  R.name = obs.name, R.model = opt.model, R.tokens = p.tokens, R.hidden = p.config.hidden_size, R.top_k = p.config.top_k;
  R.elements = R.tokens * R.hidden;

  compare::JudgedReference J = compare::agree_routing(p, ref, obs, opt, R);
  const compare::Ratios X = compare::elementwise_ratios(p, J, obs, opt.keep_ratios, R);
  const compare::Attribution A = compare::attribute_failures(p, J, X, R);
  compare::aggregate_tests(p, J, obs, X, A, opt, R);
  compare::token_scale_tests(p, J, obs, opt, R);
  compare::requant_test(p, J, obs, opt, R);
  compare::judge_power(J, opt, R);
  compare::give_verdict(p, opt, R);
  R.metrics = familiar_metrics(J.output, obs.output);
  R.reference_output = std::move(J.output);
  return R;
}

}  // namespace moecheck
