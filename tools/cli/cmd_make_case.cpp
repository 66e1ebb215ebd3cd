// `moecheck make-case`: write a synthetic case from a model preset (golden/GENERATOR.md).
//
//   moecheck make-case --preset NAME --tokens T --seed S [--tp N --tp-rank r] [--ep N --ep-rank r]
//                      [--dist realistic|uniform|adversarial] [--near-ties] [--routed-only]
//                      [--scale-format f32|ue8m0] [--intermediate-dtype f32|bf16]
//                      [--routing-weight-dtype f32|bf16] [--gate-up-layout gate_up|up_gate]
//                      [--hidden-dtype bf16|f32] [--bias-dtype f32|bf16] [--experts-limit N]
//                      [--recipe sglang|transformers|default|KEY=VALUE]... -o CASE
//   moecheck make-case --list-presets
//   moecheck make-case ... --dry-run      (print the plan, write nothing; -o optional)
//
// Bad options are InputErrors naming the option (exit 2). The case is written atomically by
// CaseWriter; progress goes to stderr for cases over 64 MiB of weights.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "golden/case_generator.hpp"
#include "golden/engine_recipes.hpp"
#include "golden/interrupt.hpp"
#include "golden/model_presets.hpp"
#include "tools/cli/cli_common.hpp"

namespace moecheck::cli {

namespace {

struct MakeCaseOptions {
  GeneratorOptions g;
  std::string out;
  std::string dist = "realistic", scale_format = "f32", intermediate_dtype = "f32", routing_weight_dtype = "f32",
              gate_up_layout = "gate_up", hidden_dtype = "bf16", bias_dtype = "f32";
  std::vector<std::string> recipes;
  bool list = false, dry_run = false, quiet = false;
  const CLI::Option *tokens = nullptr, *seed = nullptr, *preset = nullptr;
  const CLI::Option *intermediate = nullptr, *weight_dtype = nullptr;
};

template <class T>
T parsed(const std::optional<T>& v, const char* option, const std::string& given, std::string_view names) {
  if (!v) throw InputError("", option, fmt::format("must be one of {}, got \"{}\"", names, given));
  return *v;
}

void print_presets(std::ostream& out) {
  out << fmt::format("{:<26} {:>4} {:>5} {:>5} {:>3}  {:<20} {:>7} {:>10} {:>5} {:>5} {:>11}  {}\n", "preset", "E", "H",
                     "I", "k", "routing", "n_group", "topk_group", "rsf", "bias", "expert_MiB", "source");
  for (const ModelPreset& p : model_presets()) {
    const MoeConfig& c = p.config;
    const std::string name = p.aliases.empty() ? std::string(p.name) : fmt::format("{} ({})", p.name, p.aliases);
    out << fmt::format("{:<26} {:>4} {:>5} {:>5} {:>3}  {:<20} {:>7} {:>10} {:>5} {:>5} {:>11.2f}  {}\n", name,
                       c.num_experts, c.hidden_size, c.intermediate_size, c.top_k, to_string(c.routing), c.n_group,
                       c.topk_group, c.routed_scaling_factor, p.routing_bias ? "yes" : "no",
                       double(p.expert_bytes()) / (1 << 20), p.source);
  }
  out << "I is the full per-expert intermediate size (--tp N gives each rank I/N). A full layer is E x expert_MiB.\n";
}

void print_plan(const CasePlan& p, std::ostream& out) {
  const MoeConfig& c = p.header.config;
  out << fmt::format("source:        {}\n", p.header.source);
  out << fmt::format("description:   {}\n", p.header.description);
  out << fmt::format("tokens:        {}\n", p.header.tokens);
  out << fmt::format("config:        E={} top_k={} H={} I={} (of {}) routing={} n_group={} topk_group={} rsf={}\n",
                     c.num_experts, c.top_k, c.hidden_size, c.intermediate_size, p.full_intermediate,
                     to_string(c.routing), c.n_group, c.topk_group, c.routed_scaling_factor);
  out << fmt::format("               local experts [{}, {}) gate_up_layout={} scale_format={} intermediate={} "
                     "routing_weights={}\n",
                     c.local_expert_offset, c.local_expert_offset + c.local_experts(), to_string(c.gate_up_layout),
                     to_string(c.scale_format), to_string(c.intermediate_dtype), to_string(c.routing_weight_dtype));
  const std::vector<std::string> recipe = recipe_settings(c.recipe);
  out << fmt::format("recipe:        {}\n", recipe.empty() ? "default" : fmt::format("{}", fmt::join(recipe, " ")));
  out << fmt::format("inputs:        hidden_states [{}, {}] {}, router_logits [{}, {}] float32{}\n", p.header.tokens,
                     c.hidden_size, to_string(p.header.hidden_dtype), p.header.tokens, c.num_experts,
                     p.header.routing_bias ? fmt::format(", routing_bias [{}] {}", c.num_experts,
                                                         to_string(p.header.routing_bias_dtype))
                                           : "");
  out << fmt::format("weights:       w13 [{}, {}, {}], w2 [{}, {}, {}] float8_e4m3fn + float32 block scales\n",
                     p.stored.size(), 2 * c.intermediate_size, c.hidden_size, p.stored.size(), c.hidden_size,
                     c.intermediate_size);
  const size_t shown = std::min<size_t>(p.stored.size(), 64);
  out << fmt::format("experts:       {} stored{}: {}{}\n", p.stored.size(),
                     p.header.expert_ids.empty() ? " (every local expert)" : "",
                     fmt::join(p.stored.begin(), p.stored.begin() + std::ptrdiff_t(shown), " "),
                     shown < p.stored.size() ? " ..." : "");
  out << fmt::format("size:          {:.1f} MiB of weights ({:.2f} MiB per expert)\n",
                     double(p.weight_bytes()) / (1 << 20), double(p.expert_bytes()) / (1 << 20));
}

int run_make_case(MakeCaseOptions& o) {
  if (o.list) {
    print_presets(std::cout);
    return kExitOk;
  }
  if (!o.preset->count()) throw InputError("", "--preset", "required (see --list-presets)");
  if (!o.tokens->count()) throw InputError("", "--tokens", "required (the number of tokens T >= 1)");
  if (!o.seed->count()) throw InputError("", "--seed", "required (every case comes from an explicit seed)");
  if (o.out.empty() && !o.dry_run) throw InputError("", "-o", "required (the case file to write)");
  GeneratorOptions& g = o.g;
  g.dist = parsed(parse_distribution(o.dist), "--dist", o.dist, "realistic | uniform | adversarial");
  g.scale_format = parsed(parse_scale_format(o.scale_format), "--scale-format", o.scale_format, "f32 | ue8m0");
  g.intermediate_dtype = parsed(parse_precision(o.intermediate_dtype), "--intermediate-dtype", o.intermediate_dtype, "f32 | bf16");
  g.routing_weight_dtype =
      parsed(parse_precision(o.routing_weight_dtype), "--routing-weight-dtype", o.routing_weight_dtype, "f32 | bf16");
  // Recipes in the order given (a preset resets every recipe attribute); an explicit
  // --intermediate-dtype / --routing-weight-dtype wins over what a recipe says.
  MoeConfig rc;
  rc.intermediate_dtype = g.intermediate_dtype, rc.routing_weight_dtype = g.routing_weight_dtype;
  for (const std::string& r : o.recipes)
    if (const std::string rule = apply_recipe_setting(r, rc); !rule.empty()) throw InputError("", "--recipe", rule);
  if (!o.intermediate->count()) g.intermediate_dtype = rc.intermediate_dtype;
  if (!o.weight_dtype->count()) g.routing_weight_dtype = rc.routing_weight_dtype;
  g.recipe = rc.recipe;
  g.gate_up_layout = parsed(parse_gate_up_layout(o.gate_up_layout), "--gate-up-layout", o.gate_up_layout, "gate_up | up_gate");
  g.hidden_dtype = parsed(parse_precision(o.hidden_dtype), "--hidden-dtype", o.hidden_dtype, "bf16 | f32");
  g.bias_dtype = parsed(parse_precision(o.bias_dtype), "--bias-dtype", o.bias_dtype, "f32 | bf16");

  const CasePlan plan = plan_case(g, o.out);
  if (o.dry_run) {
    print_plan(plan, std::cout);
    return kExitOk;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const bool show = !o.quiet && plan.weight_bytes() > (int64_t(64) << 20);
  const bool tty = isatty(STDERR_FILENO) != 0;
  const int64_t every = tty ? 1 : std::max<int64_t>(1, int64_t(plan.stored.size()) / 20);
  GeneratorProgress progress = [&](int64_t done, int64_t total, int64_t expert) {
    interrupt::set_stage(fmt::format("make-case: writing {} (expert {} of {} done)", o.out, done, total));
    if (!show) return;
    if (done % every && done != total) return;
    std::fprintf(stderr, "%smake-case: expert %lld/%lld (id %lld), %.0f MiB, %.1f s%s", tty ? "\r" : "",
                 static_cast<long long>(done), static_cast<long long>(total), static_cast<long long>(expert),
                 double(done * plan.expert_bytes()) / (1 << 20), seconds(), tty && done != total ? "" : "\n");
    std::fflush(stderr);
  };
  interrupt::set_stage(fmt::format("make-case: writing {}", o.out));
  write_case(plan, o.out, progress);
  if (!o.quiet)
    std::cout << fmt::format("wrote {}: {} tokens, {} experts, {:.1f} MiB of weights, {:.1f} s\n", o.out,
                             plan.header.tokens, plan.stored.size(), double(plan.weight_bytes()) / (1 << 20), seconds());
  return kExitOk;
}

}  // namespace

void register_make_case(CLI::App& app) {
  auto o = std::make_shared<MakeCaseOptions>();
  CLI::App* sub = app.add_subcommand("make-case", "Write a synthetic case from a model preset (golden/GENERATOR.md)");
  o->preset = sub->add_option("--preset", o->g.preset, "model preset (--list-presets)");
  o->tokens = sub->add_option("--tokens", o->g.tokens, "number of tokens T (>= 1)");
  o->seed = sub->add_option("--seed", o->g.seed, "seed of every random value (unsigned 64-bit)")->check(seed_text());
  sub->add_option("--tp", o->g.tp, "tensor-parallel ranks: each holds I/N of the intermediate dimension (default 1)");
  sub->add_option("--tp-rank", o->g.tp_rank, "this case's TP rank in [0, --tp)");
  sub->add_option("--ep", o->g.ep, "expert-parallel ranks: each holds E/N experts (default 1)");
  sub->add_option("--ep-rank", o->g.ep_rank, "this case's EP rank in [0, --ep)");
  sub->add_option("--dist", o->dist, "realistic (default) | uniform | adversarial");
  sub->add_flag("--near-ties", o->g.near_ties, "plant exact ties and 1-ulp near-ties at the k-th routing place");
  sub->add_flag("--routed-only", o->g.routed_only,
                "store only the local experts that some token routes to (and their near-tie partners)");
  sub->add_option("--experts-limit", o->g.experts_limit, "store at most N of the chosen experts (for tests)");
  sub->add_option("--scale-format", o->scale_format, "weight block scales: f32 (default) | ue8m0");
  o->intermediate =
      sub->add_option("--intermediate-dtype", o->intermediate_dtype, "/config intermediate_dtype: f32 (default) | bf16");
  o->weight_dtype = sub->add_option("--routing-weight-dtype", o->routing_weight_dtype,
                                    "/config routing_weight_dtype: f32 (default) | bf16");
  sub->add_option("--recipe", o->recipes,
                  "engine recipe (golden/FORMAT.md): sglang | transformers | default | KEY=VALUE (combine, "
                  "act_scale_floor, quant_divide, expert_output_dtype, silu_dtype, intermediate_dtype, "
                  "routing_weight_dtype); repeatable, applied in order");
  sub->add_option("--gate-up-layout", o->gate_up_layout, "w13 row order: gate_up (default) | up_gate");
  sub->add_option("--hidden-dtype", o->hidden_dtype, "storage of hidden_states: bf16 (default) | f32");
  sub->add_option("--bias-dtype", o->bias_dtype, "storage of routing_bias: f32 (default) | bf16");
  sub->add_option("-o,--output", o->out, "case file to write (atomically)")->check(output_file());
  sub->add_flag("--list-presets", o->list, "print the presets with their values and sources, then exit");
  sub->add_flag("--dry-run", o->dry_run, "print what would be written (shapes, experts, size); write nothing");
  sub->add_flag("-q,--quiet", o->quiet, "no progress and no summary");
  set_runner(sub, [o] { return run_make_case(*o); });
}

}  // namespace moecheck::cli
