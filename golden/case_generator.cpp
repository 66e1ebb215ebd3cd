// `moecheck make-case` as a library (case_generator.hpp): option checks, the regenerating
// command line, the plan (inputs, routing, stored experts) and the expert-by-expert writer.
// The distributions themselves are in generator_data.cpp.
#include "golden/case_generator.hpp"

#include "golden/engine_recipes.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <set>

#include <fmt/format.h>

#include "golden/engine_recipes.hpp"
#include "golden/generator_data.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_budget.hpp"
#include "reference/moe_routing.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck {

namespace {

constexpr std::pair<Distribution, std::string_view> kDistributions[] = {
    {Distribution::realistic, "realistic"}, {Distribution::uniform, "uniform"}, {Distribution::adversarial, "adversarial"}};

void need(bool ok, const std::string& option, const std::string& rule) {
  if (!ok) throw InputError("", option, rule);
}

// Single-quotes a shell word unless it is made of safe characters only.
std::string shell_word(const std::string& s) {
  const bool safe = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("-_./:+=,@%").find(c) != std::string_view::npos;
  });
  if (safe) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

gen::DataSpec data_spec(const GeneratorOptions& o, const ModelPreset& p) {
  gen::DataSpec s;
  s.seed = o.seed;
  s.dist = o.dist;
  s.near_ties = o.near_ties || o.dist == Distribution::adversarial;
  s.layer = p.config;
  s.routing_bias = p.routing_bias;
  s.bias_dtype = o.bias_dtype;
  return s;
}

void check_options(const GeneratorOptions& o, const ModelPreset* p) {
  need(p != nullptr, "--preset",
       fmt::format("unknown preset \"{}\"; known presets: {} (see --list-presets)", o.preset, model_preset_names()));
  const MoeConfig& c = p->config;
  need(o.tokens >= 1 && o.tokens <= kMaxTokens, "--tokens", fmt::format("must be in [1, 2^24], got {}", o.tokens));
  // The generator holds the inputs in memory ([T, H] and [T, E] floats).
  need(o.tokens * std::max(c.hidden_size, c.num_experts) <= (int64_t(1) << 30), "--tokens",
       fmt::format("T * max(H, E) = {} * {} exceeds 2^30 values held in memory", o.tokens,
                   std::max(c.hidden_size, c.num_experts)));
  need(o.tp >= 1, "--tp", fmt::format("must be >= 1, got {}", o.tp));
  need(o.tp_rank >= 0 && o.tp_rank < o.tp, "--tp-rank", fmt::format("must be in [0, --tp = {}), got {}", o.tp, o.tp_rank));
  // The split rule is moe_sharding's, so a rank's case holds what the emulated rank holds.
  const std::string tp_rule = shard_split_rule(c, {ShardKind::tp, o.tp});
  need(tp_rule.empty(), "--tp", fmt::format("preset {}: {}", p->name, tp_rule));
  need(o.ep >= 1, "--ep", fmt::format("must be >= 1, got {}", o.ep));
  need(o.ep_rank >= 0 && o.ep_rank < o.ep, "--ep-rank", fmt::format("must be in [0, --ep = {}), got {}", o.ep, o.ep_rank));
  const std::string ep_rule = shard_split_rule(c, {ShardKind::ep, o.ep});
  need(ep_rule.empty(), "--ep", fmt::format("preset {}: {}", p->name, ep_rule));
  need(o.experts_limit >= 0, "--experts-limit", fmt::format("must be >= 0 (0 = no limit), got {}", o.experts_limit));
}

std::string describe(const CasePlan& p, const MoeConfig& c) {
  const GeneratorOptions& o = p.options;
  const MoeConfig& g = p.preset->config;
  std::string s = fmt::format(
      "synthetic {} ({}: E={} H={} I={} top-{} {} routing, n_group {}, topk_group {}, routed_scaling_factor {}); "
      "moecheck make-case generator v{} (golden/GENERATOR.md), dist {}{}, seed {}, T={}",
      p.preset->name, p.preset->model, g.num_experts, g.hidden_size, g.intermediate_size, g.top_k, to_string(g.routing),
      g.n_group, g.topk_group, g.routed_scaling_factor, kGeneratorVersion, to_string(o.dist),
      o.near_ties && o.dist != Distribution::adversarial ? " with near-ties" : "", o.seed, o.tokens);
  if (o.tp > 1) s += fmt::format("; TP rank {}/{}: I slice [{}, {})", o.tp_rank, o.tp, p.intermediate_offset,
                                 p.intermediate_offset + c.intermediate_size);
  if (o.ep > 1) s += fmt::format("; EP rank {}/{}: experts [{}, {})", o.ep_rank, o.ep, c.local_expert_offset,
                                 c.local_expert_offset + c.local_experts());
  if (o.routed_only || o.experts_limit > 0)
    s += fmt::format("; {} of {} local experts stored{}{}", p.stored.size(), c.local_experts(),
                     o.routed_only ? " (routed-only)" : "",
                     o.experts_limit > 0 ? fmt::format(" (--experts-limit {}: tokens may route to experts "
                                                       "that are not stored; for tests only)", o.experts_limit)
                                         : "");
  if (!p.dead_experts.empty()) s += fmt::format("; dead experts (block scales <= ~1e-23): {}", fmt::join(p.dead_experts, ", "));
  return s;
}

}  // namespace

std::string_view to_string(Distribution d) {
  for (const auto& [v, n] : kDistributions)
    if (v == d) return n;
  return "?";
}

std::optional<Distribution> parse_distribution(std::string_view s) {
  for (const auto& [v, n] : kDistributions)
    if (n == s) return v;
  return std::nullopt;
}

int64_t CasePlan::expert_bytes() const {
  const MoeConfig& c = header.config;
  const int64_t B = c.weight_block, H = c.hidden_size, I = c.intermediate_size;
  return 3 * I * H + 4 * (ceil_div(2 * I, B) * ceil_div(H, B) + ceil_div(H, B) * ceil_div(I, B));
}

std::string make_case_command(const GeneratorOptions& o, const std::string& out_path) {
  const ModelPreset* p = find_model_preset(o.preset);
  std::string s = fmt::format("moecheck make-case --preset {} --tokens {} --seed {}", shell_word(p ? std::string(p->name) : o.preset),
                              o.tokens, o.seed);
  if (o.dist != Distribution::realistic) s += fmt::format(" --dist {}", to_string(o.dist));
  if (o.near_ties) s += " --near-ties";
  if (o.tp != 1) s += fmt::format(" --tp {} --tp-rank {}", o.tp, o.tp_rank);
  if (o.ep != 1) s += fmt::format(" --ep {} --ep-rank {}", o.ep, o.ep_rank);
  if (o.routed_only) s += " --routed-only";
  if (o.experts_limit > 0) s += fmt::format(" --experts-limit {}", o.experts_limit);
  if (o.scale_format != ScaleFormat::f32) s += fmt::format(" --scale-format {}", to_string(o.scale_format));
  if (o.intermediate_dtype != Precision::f32) s += fmt::format(" --intermediate-dtype {}", to_string(o.intermediate_dtype));
  if (o.routing_weight_dtype != Precision::f32)
    s += fmt::format(" --routing-weight-dtype {}", to_string(o.routing_weight_dtype));
  for (const std::string& r : recipe_settings(o.recipe)) s += " --recipe " + r;
  if (o.gate_up_layout != GateUpLayout::gate_up) s += fmt::format(" --gate-up-layout {}", to_string(o.gate_up_layout));
  if (o.hidden_dtype != Precision::bf16) s += fmt::format(" --hidden-dtype {}", to_string(o.hidden_dtype));
  if (o.bias_dtype != Precision::f32) s += fmt::format(" --bias-dtype {}", to_string(o.bias_dtype));
  if (!out_path.empty()) s += " -o " + shell_word(out_path);
  return s;
}

namespace {
// Near-tie partners of one token (BUDGETS.md §6): the experts a correct backend may choose
// instead of the reference's, which `compare` then re-runs the token with, so a routed-only case
// must store them too. Generous on purpose (4 times the default budget's score uncertainty
// delta): every unchosen expert of the kept groups whose selection score is within 2 delta of
// the weakest chosen one, and every expert of a group whose score is within 4 delta of the
// weakest kept group (the relaxation judge_topk accepts; moe_routing.hpp).
std::vector<int64_t> near_tie_partners(const MoeConfig& g, const float* logits, const float* bias, const int32_t* ids) {
  const TokenScores s = selection_scores(g, logits, bias);
  const double mag = *std::max_element(s.magnitude.begin(), s.magnitude.end());
  const double delta = 4 * BudgetModel{}.routing_ulps * 0x1p-24 * std::max(mag, 1e-30);
  const int64_t E = g.num_experts, k = g.top_k;
  const bool grouped = !s.group_score.empty();
  const int64_t per_group = grouped ? E / g.n_group : E;
  double weakest = INFINITY;
  std::vector<char> chosen(size_t(E), 0), group_kept(size_t(grouped ? g.n_group : 1), 0);
  for (int64_t j = 0; j < k; ++j) {
    chosen[size_t(ids[j])] = 1, weakest = std::min(weakest, s.sel[size_t(ids[j])]);
    if (grouped) group_kept[size_t(ids[j] / per_group)] = 1;
  }
  std::vector<int64_t> out;
  if (grouped) {
    // The kept groups are those with the top topk_group scores; the chosen experts' groups are
    // among them, and any group within 4 delta of the weakest kept one may replace it.
    const std::vector<double>& gs = s.group_score;
    std::vector<double> sorted = gs;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const double weakest_group = sorted[size_t(std::min<int64_t>(g.topk_group, g.n_group) - 1)];
    for (int64_t q = 0; q < g.n_group; ++q)
      if (gs[size_t(q)] >= weakest_group) group_kept[size_t(q)] = 1;
    for (int64_t q = 0; q < g.n_group; ++q)
      if (!group_kept[size_t(q)] && gs[size_t(q)] >= weakest_group - 4 * delta)
        for (int64_t e = q * per_group; e < (q + 1) * per_group; ++e) out.push_back(e);
  }
  for (int64_t e = 0; e < E; ++e)
    if (!chosen[size_t(e)] && (!grouped || group_kept[size_t(e / per_group)]) && s.sel[size_t(e)] >= weakest - 2 * delta)
      out.push_back(e);
  return out;
}
}  // namespace

CasePlan plan_case(const GeneratorOptions& o, const std::string& out_path) {
  const ModelPreset* preset = find_model_preset(o.preset);
  check_options(o, preset);
  CasePlan p;
  p.options = o;
  p.preset = preset;
  const MoeConfig& g = preset->config;
  const gen::DataSpec spec = data_spec(o, *preset);

  // The case's config: the preset's layer, sliced by TP (I) and EP (local experts).
  MoeConfig c = g;
  c.gate_up_layout = o.gate_up_layout;
  c.scale_format = o.scale_format;
  c.intermediate_dtype = o.intermediate_dtype;
  c.routing_weight_dtype = o.routing_weight_dtype;
  c.recipe = o.recipe;
  const ShardRange slice = shard_range(g, {ShardKind::tp, o.tp}, o.tp_rank);
  const ShardRange experts = shard_range(g, {ShardKind::ep, o.ep}, o.ep_rank);
  c.intermediate_size = slice.size;
  c.local_num_experts = experts.size;
  c.local_expert_offset = experts.begin;
  p.full_intermediate = g.intermediate_size;
  p.intermediate_offset = slice.begin;

  // Inputs: bias first (the planted ties need the stored bias values), then logits, hidden.
  p.bias = gen::routing_bias(spec);
  p.logits = gen::router_logits(spec, o.tokens, p.bias);
  p.hidden = gen::hidden_states(spec, o.tokens);
  if (o.hidden_dtype == Precision::bf16)
    for (float& v : p.hidden) v = bf16_round(v);
  p.routing = route(g, p.logits.data(), p.bias.empty() ? nullptr : p.bias.data(), o.tokens);
  p.dead_experts = gen::dead_experts(spec, route_token(g, p.logits.data(), p.bias.empty() ? nullptr : p.bias.data()));

  // Stored experts: every local one, or those some token routes to (at least one: the format
  // stores >= 1 expert; when no token routes locally, the lowest local expert stands in).
  const int64_t lo = c.local_expert_offset, hi = lo + c.local_num_experts;
  if (o.routed_only) {
    std::set<int64_t> used;
    for (int32_t id : p.routing.ids)
      if (id >= lo && id < hi) used.insert(id);
    for (int64_t t = 0; t < o.tokens; ++t)
      for (int64_t e : near_tie_partners(g, p.logits.data() + t * g.num_experts, p.bias.empty() ? nullptr : p.bias.data(),
                                         &p.routing.ids[size_t(t * g.top_k)]))
        if (e >= lo && e < hi) used.insert(e);
    if (used.empty()) used.insert(lo);
    p.stored.assign(used.begin(), used.end());
  } else {
    for (int64_t e = lo; e < hi; ++e) p.stored.push_back(e);
  }
  if (o.experts_limit > 0 && int64_t(p.stored.size()) > o.experts_limit) p.stored.resize(size_t(o.experts_limit));

  CaseHeader& h = p.header;
  h.config = c;
  h.tokens = o.tokens;
  h.source = make_case_command(o, out_path);
  h.hidden_dtype = o.hidden_dtype;
  h.routing_bias = preset->routing_bias;
  h.routing_bias_dtype = o.bias_dtype;
  if (int64_t(p.stored.size()) < c.local_num_experts) h.expert_ids = p.stored;
  h.description = describe(p, c);
  return p;
}

ExpertWeights generate_expert(const CasePlan& p, int64_t global_expert) {
  const gen::DataSpec spec = data_spec(p.options, *p.preset);
  gen::WeightSlice w;
  w.full_intermediate = p.full_intermediate;
  w.offset = p.intermediate_offset;
  w.local_intermediate = p.header.config.intermediate_size;
  w.layout = p.header.config.gate_up_layout;
  w.scale_format = p.header.config.scale_format;
  const bool dead = std::binary_search(p.dead_experts.begin(), p.dead_experts.end(), global_expert);
  return gen::expert_weights(spec, w, global_expert, dead);
}

void write_case(const CasePlan& p, const std::string& out_path, const GeneratorProgress& progress) {
  CaseWriter w(out_path, p.header);
  w.write_hidden_states(p.hidden);
  w.write_router_logits(p.logits);
  if (p.header.routing_bias) w.write_routing_bias(p.bias);
  const int64_t n = int64_t(p.stored.size());
  for (int64_t slot = 0; slot < n; ++slot) {
    w.write_expert(slot, generate_expert(p, p.stored[size_t(slot)]));
    if (progress) progress(slot + 1, n, p.stored[size_t(slot)]);
  }
  w.commit();
}

}  // namespace moecheck
