// `moecheck dump`: one MoE layer of a Hugging Face FP8 checkpoint -> a case (tools/README.md,
// tools/checkpoint/README.md).
//
//   moecheck dump --checkpoint DIR --layer L (--hidden-states FILE [--hidden-dataset NAME] |
//                 --tokens T --seed S [--dist realistic|uniform|adversarial])
//                 [--experts all|routed] [--tp N --tp-rank r] [--ep N --ep-rank r]
//                 [--gate-up-layout gate_up|up_gate] [--hidden-dtype bf16|f32]
//                 [--intermediate-dtype f32|bf16] [--routing-weight-dtype f32|bf16] [--dry-run] [-q] -o CASE
//
// What it does, in order: reads config.json (hf_config.hpp; a dense layer is an input error),
// the hidden states (a captured file, or make-case's synthetic distribution drawn from the
// layer's H), the router (mlp.gate.weight, + e_score_correction_bias for the DeepSeek family),
// computes the router logits in float32, routes the tokens with the reference routing when
// `--experts routed`, and writes the case expert by expert through CaseWriter (atomic): each
// expert's six tensors are read from the memory-mapped shard, sliced for TP, packed into w13 in
// the case's gate_up_layout, written, and their pages released, so peak memory is one expert.
//
// Router logits: logits[t, e] = sum over h = 0, 1, ..., H-1 in that order of
// float(hidden[t, h]) * float(gate[e, h]), accumulated in one float32 (this file is compiled
// with -ffp-contract=off: every product and sum is rounded separately). hidden is the value the
// case stores (after bf16 rounding when stored as bf16). An engine's GEMM sums in another order;
// the case records the logits it was given, so the order only has to be fixed, not the same.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>

#include "golden/case_file.hpp"
#include "golden/case_generator.hpp"
#include "golden/generator_data.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_routing.hpp"
#include "tools/checkpoint/checkpoint.hpp"
#include "tools/checkpoint/hf_config.hpp"
#include "tools/checkpoint/hidden_input.hpp"
#include "tools/cli/cli_common.hpp"

namespace moecheck::cli {

namespace {

using ckpt::Dtype;

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

// The TP slice of the intermediate dimension: rows [offset, offset + local) of gate/up, the
// same columns of down. Block scales are sliced, never recomputed, so the slice must start and
// (because gate and up are stacked into w13) span whole weight blocks.
struct Slice {
  int64_t full = 0, offset = 0, local = 0;
};

Slice tp_slice(const DumpOptions& o, const MoeConfig& layer) {
  if (o.tp < 1) throw InputError("", "--tp", fmt::format("must be >= 1, got {}", o.tp));
  if (o.tp_rank < 0 || o.tp_rank >= o.tp) throw InputError("", "--tp-rank", fmt::format("must be in [0, --tp = {}), got {}", o.tp, o.tp_rank));
  const int64_t I = layer.intermediate_size, B = layer.weight_block;
  if (I % o.tp != 0)
    throw InputError("", "--tp", fmt::format("moe_intermediate_size {} is not divisible by --tp {}", I, o.tp));
  Slice s{I, o.tp_rank * (I / o.tp), I / o.tp};
  if (s.local % B != 0)
    throw InputError("", "--tp",
                     fmt::format("each rank's intermediate size {} (moe_intermediate_size {} / --tp {}) is not a multiple of the "
                                 "{}-wide weight blocks: the block scales cannot be sliced (and gate and up rows would share a "
                                 "w13 scale block)",
                                 s.local, I, o.tp, B));
  return s;
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

// float32 router logits, summation order in the file header.
std::vector<float> router_logits(const std::vector<float>& x, const std::vector<float>& gate, int64_t T, int64_t E, int64_t H) {
  std::vector<float> logits(size_t(T * E));
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x.data() + t * H;
    for (int64_t e = 0; e < E; ++e) {
      const float* ge = gate.data() + e * H;
      float acc = 0.0f;
      for (int64_t h = 0; h < H; ++h) acc += xt[h] * ge[h];
      logits[size_t(t * E + e)] = acc;
    }
  }
  return logits;
}

// One expert from the checkpoint: checked dtypes and shapes, sliced and packed.
ExpertWeights read_expert(const ckpt::Checkpoint& ck, const ckpt::LayerTensors& names, int64_t e, const Slice& s,
                          const MoeConfig& c) {
  static constexpr Dtype kF8[] = {Dtype::F8_E4M3};
  static constexpr Dtype kF32[] = {Dtype::F32};
  const uint64_t H = uint64_t(c.hidden_size), I = uint64_t(s.full), Il = uint64_t(s.local), off = uint64_t(s.offset);
  const uint64_t B = uint64_t(c.weight_block), nbH = (H + B - 1) / B, nbI = (I + B - 1) / B, nbIl = Il / B, ob = off / B;
  const ckpt::TensorView gate = ck.expect(names.expert(e, "gate_proj", false), kF8, {I, H});
  const ckpt::TensorView gate_s = ck.expect(names.expert(e, "gate_proj", true), kF32, {nbI, nbH});
  const ckpt::TensorView up = ck.expect(names.expert(e, "up_proj", false), kF8, {I, H});
  const ckpt::TensorView up_s = ck.expect(names.expert(e, "up_proj", true), kF32, {nbI, nbH});
  const ckpt::TensorView down = ck.expect(names.expert(e, "down_proj", false), kF8, {H, I});
  const ckpt::TensorView down_s = ck.expect(names.expert(e, "down_proj", true), kF32, {nbH, nbI});

  ExpertWeights w;
  w.expert = e;
  w.w13.resize(2 * Il * H);
  w.w13_scale.resize(2 * nbIl * nbH);
  const bool gate_first = c.gate_up_layout == GateUpLayout::gate_up;
  const ckpt::TensorView& first = gate_first ? gate : up;
  const ckpt::TensorView& second = gate_first ? up : gate;
  const ckpt::TensorView& first_s = gate_first ? gate_s : up_s;
  const ckpt::TensorView& second_s = gate_first ? up_s : gate_s;
  // w13 rows [0, Il) <- first[off, off + Il), rows [Il, 2 Il) <- second[off, off + Il); the scale
  // rows likewise in blocks (Il and off are multiples of B).
  std::memcpy(w.w13.data(), first.data.data() + off * H, Il * H);
  std::memcpy(w.w13.data() + Il * H, second.data.data() + off * H, Il * H);
  std::memcpy(w.w13_scale.data(), first_s.data.data() + ob * nbH * 4, nbIl * nbH * 4);
  std::memcpy(w.w13_scale.data() + nbIl * nbH, second_s.data.data() + ob * nbH * 4, nbIl * nbH * 4);
  // w2 [H, Il] <- columns [off, off + Il) of down [H, I]; its scales [nbH, nbIl] likewise.
  w.w2.resize(H * Il);
  w.w2_scale.resize(nbH * nbIl);
  for (uint64_t h = 0; h < H; ++h) std::memcpy(w.w2.data() + h * Il, down.data.data() + h * I + off, Il);
  for (uint64_t r = 0; r < nbH; ++r)
    std::memcpy(w.w2_scale.data() + r * nbIl, down_s.data.data() + (r * nbI + ob) * 4, nbIl * 4);
  for (const auto* t : {&gate, &gate_s, &up, &up_s, &down, &down_s}) ck.release(*t);
  return w;
}

int run_dump(DumpOptions& o) {
  // --- Options ---
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
  const Distribution dist = parsed(parse_distribution(o.dist), "--dist", o.dist, "realistic | uniform | adversarial");
  const GateUpLayout layout = parsed(parse_gate_up_layout(o.gate_up_layout), "--gate-up-layout", o.gate_up_layout, "gate_up | up_gate");
  const Precision inter = parsed(parse_precision(o.intermediate_dtype), "--intermediate-dtype", o.intermediate_dtype, "f32 | bf16");
  const Precision rw = parsed(parse_precision(o.routing_weight_dtype), "--routing-weight-dtype", o.routing_weight_dtype, "f32 | bf16");
  std::optional<Precision> hidden_dtype;
  if (!o.hidden_dtype.empty()) hidden_dtype = parsed(parse_precision(o.hidden_dtype), "--hidden-dtype", o.hidden_dtype, "bf16 | f32");

  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  // --- Checkpoint and config.json ---
  const ckpt::Checkpoint ck(o.checkpoint);
  const std::string config_path = (std::filesystem::path(o.checkpoint) / "config.json").string();
  const ckpt::HfMoeLayer hl = ckpt::read_hf_moe_layer(config_path, o.layer);
  const ckpt::LayerTensors names = ckpt::layer_tensors(hl.family, o.layer);
  const MoeConfig& layer = hl.config;
  const int64_t E = layer.num_experts, H = layer.hidden_size;
  const Slice slice = tp_slice(o, layer);
  if (o.ep < 1) throw InputError("", "--ep", fmt::format("must be >= 1, got {}", o.ep));
  if (o.ep_rank < 0 || o.ep_rank >= o.ep) throw InputError("", "--ep-rank", fmt::format("must be in [0, --ep = {}), got {}", o.ep, o.ep_rank));
  if (E % o.ep != 0) throw InputError("", "--ep", fmt::format("the {} routed experts are not divisible by --ep {}", E, o.ep));

  MoeConfig c = layer;
  c.intermediate_size = slice.local;
  c.local_expert_offset = o.ep_rank * (E / o.ep);
  c.local_num_experts = E / o.ep;
  c.gate_up_layout = layout;
  c.intermediate_dtype = inter;
  c.routing_weight_dtype = rw;
  if (const auto p = config_problems(c); !p.empty())
    throw InputError(config_path, "", fmt::format("the layer's configuration is not a valid case configuration: {}", fmt::join(p, "; ")));

  // --- Hidden states ---
  std::vector<float> hidden;
  int64_t T = 0;
  Precision stored_dtype = Precision::bf16;
  if (from_file) {
    ckpt::HiddenStates hs = ckpt::read_hidden_states_file(o.hidden_file, o.hidden_dataset);
    if (hs.hidden != H)
      throw InputError(o.hidden_file, "", fmt::format("holds [{}, {}]: its hidden size {} is not the layer's hidden_size {} (config.json)",
                                                      hs.tokens, hs.hidden, hs.hidden, H));
    T = hs.tokens;
    stored_dtype = hidden_dtype.value_or(hs.dtype);
    hidden = std::move(hs.values);
  } else {
    gen::DataSpec spec;
    spec.seed = o.seed;
    spec.dist = dist;
    spec.near_ties = false;
    spec.layer = layer;
    T = o.tokens;
    hidden = gen::hidden_states(spec, T);
    stored_dtype = hidden_dtype.value_or(Precision::bf16);
  }
  if (stored_dtype == Precision::bf16)
    for (float& v : hidden) v = bf16_round(v);  // what the case stores, and what the router sees

  // --- Router ---
  static constexpr Dtype kRouterDtypes[] = {Dtype::BF16, Dtype::F32, Dtype::F16};
  const ckpt::TensorView gate_t = ck.expect(names.gate_weight, kRouterDtypes, {uint64_t(E), uint64_t(H)});
  const std::vector<float> gate = ckpt::to_float32(gate_t);
  ck.release(gate_t);
  std::vector<float> bias;
  if (hl.routing_bias) {
    const ckpt::TensorView b = ck.expect(names.gate_bias, kRouterDtypes, {uint64_t(E)});
    bias = ckpt::to_float32(b);
    for (size_t e = 0; e < bias.size(); ++e)
      if (!std::isfinite(bias[e])) throw InputError(*b.file, names.gate_bias, fmt::format("must be finite; expert {} is {}", e, bias[e]));
  }
  for (size_t i = 0; i < gate.size(); ++i)
    if (!std::isfinite(gate[i]))
      throw InputError(*gate_t.file, names.gate_weight, fmt::format("must be finite; row {}, column {} is {}", i / size_t(H), i % size_t(H), gate[i]));
  const std::vector<float> logits = router_logits(hidden, gate, T, E, H);
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      throw InputError("", "router logits", fmt::format("token {}, expert {} overflows float32 ({})", i / size_t(E), i % size_t(E), logits[i]));

  // --- Which experts ---
  std::vector<int64_t> stored;
  std::string stand_in;
  if (o.experts == "routed") {
    const Routing r = route(c, logits.data(), bias.empty() ? nullptr : bias.data(), T);
    std::set<int64_t> used;
    for (const int32_t id : r.ids)
      if (c.is_local(id)) used.insert(id);
    stored.assign(used.begin(), used.end());
    if (stored.empty()) {
      stored.push_back(c.local_expert_offset);
      stand_in = fmt::format(" (no token routes to this rank's experts: expert {} stands in, as a case stores at least one)",
                             c.local_expert_offset);
    }
  } else {
    for (int64_t e = c.local_expert_offset; e < c.local_expert_offset + c.local_experts(); ++e) stored.push_back(e);
  }
  const int64_t B = c.weight_block, Il = slice.local;
  const int64_t expert_bytes = 3 * Il * H + 4 * (2 * (Il / B) * ceil_div(H, B) + ceil_div(H, B) * (Il / B));

  std::vector<std::string> notes = hl.notes;
  if (hl.shared_experts > 0 || (!names.shared_prefix.empty() && ck.contains(names.shared_prefix + "gate_proj.weight")))
    notes.push_back(fmt::format("the layer has {} shared expert(s) ({}*): not part of the case, which holds the routed experts "
                                "only (the case's output is the routed experts' sum; the engine adds the shared expert)",
                                std::max<int64_t>(hl.shared_experts, 1), names.shared_prefix));

  CaseHeader header;
  header.config = c;
  header.tokens = T;
  header.hidden_dtype = stored_dtype;
  header.routing_bias = hl.routing_bias;
  header.routing_bias_dtype = Precision::f32;
  if (o.experts == "routed") header.expert_ids = stored;
  header.source = command_line(o, o.out);
  header.description = fmt::format("layer {} of the {} checkpoint {} ({}): routed experts{}, hidden states {}", o.layer,
                                   hl.model_type.empty() ? std::string(to_string(hl.family)) : hl.model_type, o.checkpoint,
                                   to_string(hl.family), hl.shared_experts > 0 ? " only (shared experts not included)" : "",
                                   from_file ? "from " + o.hidden_file : fmt::format("synthetic (seed {})", o.seed));

  auto summary = [&](std::ostream& out) {
    out << fmt::format("layer:         {} of {} ({}), {} of {} shard(s) opened\n", o.layer, o.checkpoint, to_string(hl.family),
                       ck.shards_opened(), ck.shard_count());
    out << fmt::format("config:        E={} top_k={} H={} I={} (of {}) routing={} n_group={} topk_group={} rsf={} "
                       "scale_format={} weight_block={}\n",
                       c.num_experts, c.top_k, c.hidden_size, c.intermediate_size, slice.full, to_string(c.routing), c.n_group,
                       c.topk_group, c.routed_scaling_factor, to_string(c.scale_format), c.weight_block);
    out << fmt::format("               local experts [{}, {}) gate_up_layout={}\n", c.local_expert_offset,
                       c.local_expert_offset + c.local_experts(), to_string(c.gate_up_layout));
    out << fmt::format("inputs:        hidden_states [{}, {}] {}, router_logits [{}, {}] float32{}\n", T, H, to_string(stored_dtype), T,
                       E, hl.routing_bias ? fmt::format(", routing_bias [{}] float32", E) : "");
    const size_t shown = std::min<size_t>(stored.size(), 64);
    out << fmt::format("experts:       {} stored{}: {}{}{}\n", stored.size(), o.experts == "all" ? " (every local expert)" : " (routed)",
                       fmt::join(stored.begin(), stored.begin() + std::ptrdiff_t(shown), " "), shown < stored.size() ? " ..." : "",
                       stand_in);
    for (const std::string& n : notes) out << "note:          " << n << "\n";
  };
  if (o.dry_run) {
    summary(std::cout);
    return kExitOk;
  }

  // --- Write, expert by expert ---
  CaseWriter w(o.out, header);
  w.write_hidden_states(hidden);
  w.write_router_logits(logits);
  if (hl.routing_bias) w.write_routing_bias(bias);
  const bool tty = isatty(STDERR_FILENO) != 0;
  for (size_t s = 0; s < stored.size(); ++s) {
    w.write_expert(int64_t(s), read_expert(ck, names, stored[s], slice, c));
    if (!o.quiet) {
      std::fprintf(stderr, "%sdump: expert %zu/%zu (id %lld), %.1f MiB, %.1f s%s", tty ? "\r" : "", s + 1, stored.size(),
                   static_cast<long long>(stored[s]), double(int64_t(s + 1) * expert_bytes) / (1 << 20), seconds(),
                   tty && s + 1 != stored.size() ? "" : "\n");
      std::fflush(stderr);
    }
  }
  w.commit();
  if (!o.quiet) {
    summary(std::cout);
    std::cout << fmt::format("wrote {}: {} tokens, {} experts, {:.1f} MiB of weights, {:.1f} s\n", o.out, T, stored.size(),
                             double(int64_t(stored.size()) * expert_bytes) / (1 << 20), seconds());
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
