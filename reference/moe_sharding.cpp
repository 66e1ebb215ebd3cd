// Sharding a layer over ranks and reducing it back (contract: moe_sharding.hpp).
#include "reference/moe_sharding.hpp"

#include <cmath>
#include <fmt/format.h>

#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"

namespace moecheck {

std::string_view to_string(ShardKind k) { return k == ShardKind::tp ? "tp" : "ep"; }

void require_shardable(const MoeConfig& c, const ShardPlan& s, const std::string& source) {
  const std::string where = fmt::format("{} {}", to_string(s.kind), s.ranks);
  if (s.ranks < 1) throw InputError(source, where, fmt::format("must be at least 1, got {}", s.ranks));
  if (c.local_expert_offset != 0 || c.local_experts() != c.num_experts)
    throw InputError(source, where, "the case must hold the whole layer (local_expert_offset 0, every expert local)");
  if (s.kind == ShardKind::ep) {
    if (c.num_experts % s.ranks != 0)
      throw InputError(source, where, fmt::format("{} experts do not split evenly over {} ranks", c.num_experts, s.ranks));
    return;
  }
  const int64_t I = c.intermediate_size, unit = s.ranks * std::max(c.weight_block, c.group_size);
  if (I % unit != 0 || (I / s.ranks) % c.weight_block != 0 || (I / s.ranks) % c.group_size != 0)
    throw InputError(source, where,
                     fmt::format("intermediate_size {} must split into {} slices of whole {}-wide weight blocks and "
                                 "{}-wide quantization groups",
                                 I, s.ranks, c.weight_block, c.group_size));
}

namespace {

// Rank r's slice of one expert: W13 rows [r Is, (r+1) Is) of each half, W2 columns of the same
// range, with their block scales (whole blocks: Is is a multiple of B).
ExpertView tp_slice(const ExpertView& w, const MoeConfig& full, int64_t ranks, int64_t rank) {
  const int64_t H = full.hidden_size, I = full.intermediate_size, B = full.weight_block, Is = I / ranks;
  const int64_t hb = ceil_div(H, B), ib = ceil_div(I, B), isb = Is / B;
  struct Owned {
    std::vector<uint8_t> w13, w2;
    std::vector<float> s13, s2;
  };
  auto o = std::make_shared<Owned>();
  o->w13.resize(size_t(2 * Is * H));
  o->s13.resize(size_t(2 * isb * hb));
  for (int half = 0; half < 2; ++half) {
    const int64_t src = half * I + rank * Is, dst = half * Is;
    std::copy_n(w.w13 + src * H, Is * H, o->w13.data() + dst * H);
    std::copy_n(w.w13_scale + (src / B) * hb, isb * hb, o->s13.data() + (dst / B) * hb);
  }
  o->w2.resize(size_t(H * Is));
  o->s2.resize(size_t(hb * isb));
  for (int64_t row = 0; row < H; ++row) std::copy_n(w.w2 + row * I + rank * Is, Is, o->w2.data() + row * Is);
  for (int64_t br = 0; br < hb; ++br) std::copy_n(w.w2_scale + br * ib + rank * isb, isb, o->s2.data() + br * isb);
  ExpertView v{o->w13.data(), o->s13.data(), o->w2.data(), o->s2.data(), {}};
  v.owner = std::shared_ptr<void>(o, o.get());
  return v;
}

}  // namespace

MoeProblem shard_problem(const MoeProblem& full, const ShardPlan& s, int64_t rank) {
  require_shardable(full.config, s, full.source);
  if (rank < 0 || rank >= s.ranks) throw std::invalid_argument(fmt::format("shard_problem: rank {} of {}", rank, s.ranks));
  MoeProblem p = full;
  p.source = fmt::format("{} ({} rank {} of {})", full.source, to_string(s.kind), rank, s.ranks);
  if (s.kind == ShardKind::ep) {
    const int64_t n = full.config.num_experts / s.ranks;
    p.config.local_expert_offset = rank * n;
    p.config.local_num_experts = n;
    p.stored_experts.clear();
    for (int64_t e : full.stored_experts)
      if (p.config.is_local(e)) p.stored_experts.push_back(e);
    return p;
  }
  p.config.intermediate_size = full.config.intermediate_size / s.ranks;
  const MoeConfig fc = full.config;
  const ExpertLoader load = full.load_expert;
  const int64_t ranks = s.ranks;
  p.load_expert = [load, fc, ranks, rank](int64_t e) { return tp_slice(load(e), fc, ranks, rank); };
  return p;
}

bool sharded_recipe_is_exact(const MoeConfig& c, ShardKind kind) {
  if (kind == ShardKind::ep) return c.recipe.combine != Combine::bf16_expert_order;
  return c.recipe.combine == Combine::f32 && c.recipe.expert_output_dtype != Precision::bf16;
}

std::vector<float> reduce_partials(const std::vector<std::vector<float>>& partials) {
  std::vector<float> out(partials.empty() ? 0 : partials[0].size(), 0.0f);
  for (size_t i = 0; i < out.size(); ++i) {
    float acc = 0.0f;
    for (const auto& p : partials) acc += p[i];
    out[i] = bf16_round(acc);
  }
  return out;
}

void reduction_interval(const std::vector<std::vector<float>>& partials, std::vector<double>& lo,
                        std::vector<double>& hi) {
  const size_t n = partials.empty() ? 0 : partials[0].size();
  const double N = double(partials.size());
  const double g = N > 1 ? (N - 1) * 0x1p-24 / (1 - (N - 1) * 0x1p-24) : 0.0;
  lo.assign(n, 0.0), hi.assign(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    double s = 0, m = 0;
    for (const auto& p : partials) s += p[i], m += std::fabs(p[i]);
    // 2^-149: float32's smallest step, for sums that reach the subnormal range.
    const double e = g * m * (1 + 0x1p-50) + N * 0x1p-149;
    lo[i] = bf16_round(s - e), hi[i] = bf16_round(s + e);
  }
}

}  // namespace moecheck
