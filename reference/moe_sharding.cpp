// Sharding a layer over ranks and reducing it back (contract: moe_sharding.hpp).
#include "reference/moe_sharding.hpp"

#include <cmath>
#include <fmt/format.h>

#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"

namespace moecheck {

std::string_view to_string(ShardKind k) { return k == ShardKind::tp ? "tp" : "ep"; }

std::string to_string(const ShardPlan& s) { return fmt::format("{} {}", to_string(s.kind), s.ranks); }

std::optional<ShardPlan> parse_shard_plan(std::string_view s) {
  ShardPlan p;
  if (s.starts_with("tp ")) p.kind = ShardKind::tp;
  else if (s.starts_with("ep ")) p.kind = ShardKind::ep;
  else return std::nullopt;
  const std::string_view n = s.substr(3);
  if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  p.ranks = std::stoll(std::string(n));
  if (p.ranks < 1 || p.ranks > kMaxShardRanks || std::to_string(p.ranks) != n) return std::nullopt;
  return p;
}

std::string shard_split_rule(const MoeConfig& c, const ShardPlan& s) {
  const int64_t N = s.ranks;
  if (N < 1) return fmt::format("must be at least 1, got {}", N);
  if (N == 1) return "";
  if (s.kind == ShardKind::ep) {
    if (c.num_experts % N == 0) return "";
    return fmt::format("num_experts E = {} does not divide into {} equal expert ranges (each rank holds E/N experts)",
                       c.num_experts, N);
  }
  const int64_t I = c.intermediate_size, B = c.weight_block, G = c.group_size;
  if (I % N == 0 && (I / N) % B == 0 && (I / N) % G == 0) return "";
  const std::string unit = B == G ? fmt::format("the {}-wide weight block and quantization group", B)
                                  : fmt::format("the {}-wide weight block and of the {}-wide quantization group", B, G);
  return fmt::format("intermediate_size I = {} must split into {} equal slices whose size I/N is a multiple of {} "
                     "(I/N = {}), so that no block scale and no re-quantization group straddles two ranks",
                     I, N, unit, I % N == 0 ? std::to_string(I / N) : fmt::format("{}/{}, not an integer", I, N));
}

ShardRange shard_range(const MoeConfig& c, const ShardPlan& s, int64_t rank) {
  const int64_t n = (s.kind == ShardKind::tp ? c.intermediate_size : c.num_experts) / s.ranks;
  return {rank * n, n};
}

void require_shardable(const MoeConfig& c, const ShardPlan& s, const std::string& source) {
  const std::string where = to_string(s);
  if (s.ranks < 1) throw InputError(source, where, fmt::format("must be at least 1, got {}", s.ranks));
  if (c.local_expert_offset != 0 || c.local_experts() != c.num_experts)
    throw InputError(source, where, "the case must hold the whole layer (local_expert_offset 0, every expert local)");
  if (const std::string rule = shard_split_rule(c, s); !rule.empty()) throw InputError(source, where, rule);
}

namespace {

// A rank's slice of one expert: W13 rows [begin, begin + size) of each half, W2 columns of the
// same range, with their block scales (whole blocks: begin and size are multiples of B).
ExpertView tp_slice(const ExpertView& w, const MoeConfig& full, const ShardRange& slice) {
  const int64_t H = full.hidden_size, I = full.intermediate_size, B = full.weight_block, Is = slice.size;
  const int64_t hb = ceil_div(H, B), ib = ceil_div(I, B), isb = Is / B;
  struct Owned {
    std::vector<uint8_t> w13, w2;
    std::vector<float> s13, s2;
  };
  auto o = std::make_shared<Owned>();
  o->w13.resize(size_t(2 * Is * H));
  o->s13.resize(size_t(2 * isb * hb));
  for (int half = 0; half < 2; ++half) {
    const int64_t src = half * I + slice.begin, dst = half * Is;
    std::copy_n(w.w13 + src * H, Is * H, o->w13.data() + dst * H);
    std::copy_n(w.w13_scale + (src / B) * hb, isb * hb, o->s13.data() + (dst / B) * hb);
  }
  o->w2.resize(size_t(H * Is));
  o->s2.resize(size_t(hb * isb));
  for (int64_t row = 0; row < H; ++row) std::copy_n(w.w2 + row * I + slice.begin, Is, o->w2.data() + row * Is);
  for (int64_t br = 0; br < hb; ++br) std::copy_n(w.w2_scale + br * ib + slice.begin / B, isb, o->s2.data() + br * isb);
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
  if (s.ranks == 1) return p;  // the layer itself (also where I has a ragged last block)
  const ShardRange range = shard_range(full.config, s, rank);
  if (s.kind == ShardKind::ep) {
    p.config.local_expert_offset = range.begin;
    p.config.local_num_experts = range.size;
    p.stored_experts.clear();
    for (int64_t e : full.stored_experts)
      if (p.config.is_local(e)) p.stored_experts.push_back(e);
    return p;
  }
  p.config.intermediate_size = range.size;
  const MoeConfig fc = full.config;
  const ExpertLoader load = full.load_expert;
  p.load_expert = [load, fc, range](int64_t e) { return tp_slice(load(e), fc, range); };
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
