// The emulated backend over N ranks (emulated_sharded.hpp).
#include "kernels/emulated/emulated_sharded.hpp"

#include <array>
#include <stdexcept>

#include "reference/fp8_formats.hpp"

namespace moecheck {

namespace {
constexpr std::array<std::pair<ShardFault, std::string_view>, 4> kNames{{{ShardFault::none, "none"},
                                                                         {ShardFault::tp_slice_misplaced, "tp_slice_misplaced"},
                                                                         {ShardFault::reduce_bf16, "reduce_bf16"},
                                                                         {ShardFault::rank_added_twice, "rank_added_twice"}}};
}  // namespace

std::string_view to_string(ShardFault f) {
  for (const auto& [v, n] : kNames)
    if (v == f) return n;
  return "?";
}
std::optional<ShardFault> parse_shard_fault(std::string_view s) {
  for (const auto& [v, n] : kNames)
    if (n == s) return v;
  return std::nullopt;
}

ShardedOutput run_emulated_sharded(const MoeProblem& full, const ShardPlan& plan, const ShardedOptions& opt) {
  if (opt.fault_rank < 0 || opt.fault_rank >= plan.ranks)
    throw std::invalid_argument("run_emulated_sharded: fault_rank out of range");
  ShardedOutput out;
  std::vector<std::vector<float>> partials;
  for (int64_t r = 0; r < plan.ranks; ++r) {
    MoeProblem p = shard_problem(full, plan, r);
    if (opt.shard_fault == ShardFault::tp_slice_misplaced && plan.kind == ShardKind::tp && r == opt.fault_rank) {
      // faulty tp_slice_misplaced: W2's columns of the next rank's slice (W13's own slice)
      const MoeProblem next = shard_problem(full, plan, (r + 1) % plan.ranks);
      const ExpertLoader own = p.load_expert, other = next.load_expert;
      p.load_expert = [own, other](int64_t e) {
        ExpertView a = own(e), b = other(e);
        ExpertView v{a.w13, a.w13_scale, b.w2, b.w2_scale, {}};
        v.owner = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(a.owner, b.owner);
        return v;
      };
    }
    EmulatedOptions eo;
    eo.expert_outputs = opt.expert_outputs;
    eo.fault = r == opt.fault_rank ? opt.fault : Fault::none;
    eo.tensor_core = opt.tensor_core;
    eo.int32_overflow_threshold = opt.int32_overflow_threshold;
    out.ranks.push_back(run_emulated(p, eo));
    std::vector<float> part;
    for (uint16_t v : out.ranks.back().output_bf16) part.push_back(bf16_decode(v));
    partials.push_back(std::move(part));
    if (opt.shard_fault == ShardFault::rank_added_twice && r == opt.fault_rank) partials.push_back(partials.back());
  }
  if (opt.shard_fault == ShardFault::reduce_bf16) {
    // faulty reduce_bf16: every partial sum rounded to bf16
    out.output.assign(partials[0].size(), 0.0f);
    for (size_t i = 0; i < out.output.size(); ++i) {
      float acc = 0.0f;
      for (const auto& p : partials) acc = bf16_round(double(acc) + double(p[i]));
      out.output[i] = acc;
    }
  } else {
    out.output = reduce_partials(partials);
  }
  return out;
}

}  // namespace moecheck
