// `moecheck dump`: one MoE layer of a Hugging Face FP8 checkpoint -> a case (tools/README.md,
// tools/checkpoint/README.md).
//
//   moecheck dump --checkpoint DIR --layer L (--hidden-states FILE [--hidden-dataset NAME] |
//                 --tokens T --seed S [--dist realistic|uniform|adversarial])
//                 [--experts all|routed] [--tp N --tp-rank r] [--ep N --ep-rank r]
//                 [--gate-up-layout gate_up|up_gate] [--hidden-dtype bf16|f32]
//                 [--intermediate-dtype f32|bf16] [--routing-weight-dtype f32|bf16] [--dry-run] [-q] -o CASE
//
// The options are checked here; the conversion (config.json, the TP and EP split, the hidden
// states, the float32 router logits in their documented order, the experts chosen, read, packed
// and written one at a time) is ckpt::plan_layer_dump and ckpt::write_layer_dump
// (tools/checkpoint/layer_dump.hpp). This file prints the summary and the per-expert progress.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "golden/case_generator.hpp"
#include "reference/errors.hpp"
#include "tools/checkpoint/layer_dump.hpp"
#include "tools/cli/cli_common.hpp"

namespace moecheck::cli {

namespace {

struct DumpOptions {
  std::string checkpoint, hidden_file, hidden_dataset = "hidden_states", experts = "all", out;
  int64_t layer = -1, tokens = 0;
  uint64_t seed = 0;
  int64_t tp = 1, tp_rank = 0, ep = 1, ep_rank = 0;
  std::string dist = "realistic", gate_up_layout = "gate_up", hidden_dtype, intermediate_dtype = "f32",
              routing_weight_dtype = "f32";
  bool quiet = false, dry_run = false;
  const CLI::Option *layer_opt = nullptr, *tokens_opt = nullptr, *seed_opt = nullptr, *dataset_opt = nullptr,
                    *dist_opt = nullptr;
};

template <class T>
T parsed(const std::optional<T>& v, const char* option, const std::string& given, std::string_view names) {
  if (!v) throw InputError("", option, fmt::format("must be one of {}, got \"{}\"", names, given));
  return *v;
}

std::string command_line(const DumpOptions& o, const std::string& out) {
  std::string s = fmt::format("moecheck dump --checkpoint {} --layer {}", o.checkpoint, o.layer);
  if (!o.hidden_file.empty()) {
    s += " --hidden-states " + o.hidden_file;
    if (o.dataset_opt->count()) s += " --hidden-dataset " + o.hidden_dataset;
  } else {
    s += fmt::format(" --tokens {} --seed {}", o.tokens, o.seed);
    if (o.dist != "realistic") s += " --dist " + o.dist;
  }
  if (o.experts != "all") s += " --experts " + o.experts;
  if (o.tp != 1) s += fmt::format(" --tp {} --tp-rank {}", o.tp, o.tp_rank);
  if (o.ep != 1) s += fmt::format(" --ep {} --ep-rank {}", o.ep, o.ep_rank);
  if (o.gate_up_layout != "gate_up") s += " --gate-up-layout " + o.gate_up_layout;
  if (!o.hidden_dtype.empty()) s += " --hidden-dtype " + o.hidden_dtype;
  if (o.intermediate_dtype != "f32") s += " --intermediate-dtype " + o.intermediate_dtype;
  if (o.routing_weight_dtype != "f32") s += " --routing-weight-dtype " + o.routing_weight_dtype;
  return s + " -o " + out;
}

// The options checked (which are required, which go together) and turned into the request.
ckpt::DumpRequest dump_request(const DumpOptions& o) {
  if (o.checkpoint.empty()) throw InputError("", "--checkpoint", "required (the checkpoint directory)");
  if (!o.layer_opt->count()) throw InputError("", "--layer", "required (the index L of model.layers.L)");
  if (o.out.empty() && !o.dry_run) throw InputError("", "-o", "required (the case file to write)");
  const bool from_file = !o.hidden_file.empty();
  if (from_file && (o.tokens_opt->count() || o.seed_opt->count()))
    throw InputError("", o.tokens_opt->count() ? "--tokens" : "--seed", "not with --hidden-states (the file gives the tokens)");
  if (from_file && o.dist_opt->count()) throw InputError("", "--dist", "only with --tokens/--seed (synthetic hidden states)");
  if (!from_file && o.dataset_opt->count()) throw InputError("", "--hidden-dataset", "only with --hidden-states");
  if (!from_file && !o.tokens_opt->count())
    throw InputError("", "--tokens", "required without --hidden-states (synthetic hidden states need --tokens T --seed S)");
  if (!from_file && !o.seed_opt->count()) throw InputError("", "--seed", "required with --tokens (every synthetic value comes from a seed)");
  if (!from_file && (o.tokens < 1 || o.tokens > kMaxTokens))
    throw InputError("", "--tokens", fmt::format("must be in [1, 2^24], got {}", o.tokens));
  if (o.experts != "all" && o.experts != "routed")
    throw InputError("", "--experts", fmt::format("must be all | routed, got \"{}\"", o.experts));
  ckpt::DumpRequest r;
  r.dist = parsed(parse_distribution(o.dist), "--dist", o.dist, "realistic | uniform | adversarial");
  r.gate_up_layout = parsed(parse_gate_up_layout(o.gate_up_layout), "--gate-up-layout", o.gate_up_layout, "gate_up | up_gate");
  r.intermediate_dtype = parsed(parse_precision(o.intermediate_dtype), "--intermediate-dtype", o.intermediate_dtype, "f32 | bf16");
  r.routing_weight_dtype = parsed(parse_precision(o.routing_weight_dtype), "--routing-weight-dtype", o.routing_weight_dtype, "f32 | bf16");
  if (!o.hidden_dtype.empty()) r.hidden_dtype = parsed(parse_precision(o.hidden_dtype), "--hidden-dtype", o.hidden_dtype, "bf16 | f32");
  r.checkpoint = o.checkpoint;
  r.layer = o.layer;
  r.hidden_file = o.hidden_file;
  r.hidden_dataset = o.hidden_dataset;
  r.tokens = o.tokens;
  r.seed = o.seed;
  r.routed_only = o.experts == "routed";
  r.tp = o.tp, r.tp_rank = o.tp_rank, r.ep = o.ep, r.ep_rank = o.ep_rank;
  r.source = command_line(o, o.out);
  return r;
}

void print_summary(std::ostream& out, const DumpOptions& o, const ckpt::LayerDump& d) {
  const MoeConfig& c = d.config;
  const int64_t E = c.num_experts, H = c.hidden_size;
  const ckpt::Checkpoint& ck = *d.checkpoint;
  out << fmt::format("layer:         {} of {} ({}), {} of {} shard(s) opened\n", o.layer, o.checkpoint, to_string(d.layer.family),
                     ck.shards_opened(), ck.shard_count());
  out << fmt::format("config:        E={} top_k={} H={} I={} (of {}) routing={} n_group={} topk_group={} rsf={} "
                     "scale_format={} weight_block={}\n",
                     c.num_experts, c.top_k, c.hidden_size, c.intermediate_size, d.layer.config.intermediate_size,
                     to_string(c.routing), c.n_group, c.topk_group, c.routed_scaling_factor, to_string(c.scale_format),
                     c.weight_block);
  out << fmt::format("               local experts [{}, {}) gate_up_layout={}\n", c.local_expert_offset,
                     c.local_expert_offset + c.local_experts(), to_string(c.gate_up_layout));
  out << fmt::format("inputs:        hidden_states [{}, {}] {}, router_logits [{}, {}] float32{}\n", d.tokens, H,
                     to_string(d.hidden_dtype), d.tokens, E,
                     d.layer.routing_bias ? fmt::format(", routing_bias [{}] float32", E) : "");
  const std::vector<int64_t>& stored = d.experts;
  const size_t shown = std::min<size_t>(stored.size(), 64);
  const std::string stand_in =
      d.stand_in ? fmt::format(" (no token routes to this rank's experts: expert {} stands in, as a case stores at least one)",
                               c.local_expert_offset)
                 : "";
  out << fmt::format("experts:       {} stored{}: {}{}{}\n", stored.size(), o.experts == "all" ? " (every local expert)" : " (routed)",
                     fmt::join(stored.begin(), stored.begin() + std::ptrdiff_t(shown), " "), shown < stored.size() ? " ..." : "",
                     stand_in);
  for (const std::string& n : d.notes) out << "note:          " << n << "\n";
}

int run_dump(const DumpOptions& o) {
  const ckpt::DumpRequest req = dump_request(o);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const ckpt::LayerDump d = ckpt::plan_layer_dump(req);
  if (o.dry_run) {
    print_summary(std::cout, o, d);
    return kExitOk;
  }
  const bool tty = isatty(STDERR_FILENO) != 0;
  const size_t n = d.experts.size();
  ckpt::write_layer_dump(d, o.out, [&](size_t s) {
    if (o.quiet) return;
    std::fprintf(stderr, "%sdump: expert %zu/%zu (id %lld), %.1f MiB, %.1f s%s", tty ? "\r" : "", s + 1, n,
                 static_cast<long long>(d.experts[s]), double(int64_t(s + 1) * d.expert_bytes) / (1 << 20), seconds(),
                 tty && s + 1 != n ? "" : "\n");
    std::fflush(stderr);
  });
  if (!o.quiet) {
    print_summary(std::cout, o, d);
    std::cout << fmt::format("wrote {}: {} tokens, {} experts, {:.1f} MiB of weights, {:.1f} s\n", o.out, d.tokens, n,
                             double(int64_t(n) * d.expert_bytes) / (1 << 20), seconds());
  }
  return kExitOk;
}

}  // namespace

void register_dump(CLI::App& app) {
  auto o = std::make_shared<DumpOptions>();
  CLI::App* sub = app.add_subcommand("dump", "Write a case from one MoE layer of a Hugging Face FP8 checkpoint (tools/checkpoint/README.md)");
  sub->add_option("--checkpoint", o->checkpoint, "checkpoint directory (config.json + model.safetensors or its index and shards)");
  o->layer_opt = sub->add_option("--layer", o->layer, "layer index L (model.layers.L); must be an MoE layer");
  sub->add_option("--hidden-states", o->hidden_file, "captured hidden states [T, H]: .npy ('<f4' or '<u2' bf16 bits) or HDF5");
  o->dataset_opt = sub->add_option("--hidden-dataset", o->hidden_dataset, "HDF5 dataset of --hidden-states (default hidden_states)");
  o->tokens_opt = sub->add_option("--tokens", o->tokens, "synthetic hidden states: number of tokens T");
  o->seed_opt = sub->add_option("--seed", o->seed, "synthetic hidden states: seed (make-case's distribution)")->check(seed_text());
  o->dist_opt = sub->add_option("--dist", o->dist, "synthetic hidden states: realistic (default) | uniform | adversarial");
  sub->add_option("--experts", o->experts, "all (default: every local expert) | routed (only those some token routes to)");
  sub->add_option("--tp", o->tp, "tensor-parallel ranks: each holds I/N of the intermediate dimension (default 1)");
  sub->add_option("--tp-rank", o->tp_rank, "this case's TP rank in [0, --tp)");
  sub->add_option("--ep", o->ep, "expert-parallel ranks: each holds E/N experts (default 1)");
  sub->add_option("--ep-rank", o->ep_rank, "this case's EP rank in [0, --ep)");
  sub->add_option("--gate-up-layout", o->gate_up_layout, "w13 row order: gate_up (default, the checkpoint's [w1; w3]) | up_gate");
  sub->add_option("--hidden-dtype", o->hidden_dtype, "storage of hidden_states: bf16 | f32 (default: the file's; synthetic: bf16)");
  sub->add_option("--intermediate-dtype", o->intermediate_dtype, "/config intermediate_dtype: f32 (default) | bf16");
  sub->add_option("--routing-weight-dtype", o->routing_weight_dtype, "/config routing_weight_dtype: f32 (default) | bf16");
  sub->add_option("-o,--output", o->out, "case file to write (atomically)")->check(output_file());
  sub->add_flag("--dry-run", o->dry_run, "print what would be written; write nothing");
  sub->add_flag("-q,--quiet", o->quiet, "no progress and no summary");
  set_runner(sub, [o] { return run_dump(*o); });
}

}  // namespace moecheck::cli
