// One checkpoint layer -> a case (layer_dump.hpp). Compiled with -ffp-contract=off: the router
// logits' summation order is documented (layer_dump.hpp) and must not change with the compiler.
#include "tools/checkpoint/layer_dump.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "golden/case_generator.hpp"
#include "reference/errors.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_routing.hpp"
#include "reference/moe_sharding.hpp"
#include "tools/checkpoint/hidden_input.hpp"

namespace moecheck::ckpt {

namespace {

// The TP slice of the intermediate dimension: rows [offset, offset + local) of gate/up, the
// same columns of down. Block scales are sliced, never recomputed, so the slice must start and
// (because gate and up are stacked into w13) span whole weight blocks: moe_sharding's rule.
struct Slice {
  int64_t full = 0, offset = 0, local = 0;
};

Slice tp_slice(const DumpRequest& o, const MoeConfig& layer) {
  if (o.tp < 1) throw InputError("", "--tp", fmt::format("must be >= 1, got {}", o.tp));
  if (o.tp_rank < 0 || o.tp_rank >= o.tp) throw InputError("", "--tp-rank", fmt::format("must be in [0, --tp = {}), got {}", o.tp, o.tp_rank));
  const ShardPlan plan{ShardKind::tp, o.tp};
  if (const std::string rule = shard_split_rule(layer, plan); !rule.empty()) throw InputError("", "--tp", rule);
  const ShardRange r = shard_range(layer, plan, o.tp_rank);
  return Slice{layer.intermediate_size, r.begin, r.size};
}

void check_ep(const DumpRequest& o, const MoeConfig& layer) {
  if (o.ep < 1) throw InputError("", "--ep", fmt::format("must be >= 1, got {}", o.ep));
  if (o.ep_rank < 0 || o.ep_rank >= o.ep) throw InputError("", "--ep-rank", fmt::format("must be in [0, --ep = {}), got {}", o.ep, o.ep_rank));
  if (const std::string rule = shard_split_rule(layer, {ShardKind::ep, o.ep}); !rule.empty()) throw InputError("", "--ep", rule);
}

// The case's configuration: the layer's, with this rank's TP slice and EP range and the
// requested layouts and dtypes.
MoeConfig case_config(const DumpRequest& o, const MoeConfig& layer, const Slice& slice, const std::string& config_path) {
  const ShardRange experts = shard_range(layer, {ShardKind::ep, o.ep}, o.ep_rank);
  MoeConfig c = layer;
  c.intermediate_size = slice.local;
  c.local_expert_offset = experts.begin;
  c.local_num_experts = experts.size;
  c.gate_up_layout = o.gate_up_layout;
  c.intermediate_dtype = o.intermediate_dtype;
  c.routing_weight_dtype = o.routing_weight_dtype;
  if (const auto p = config_problems(c); !p.empty())
    throw InputError(config_path, "", fmt::format("the layer's configuration is not a valid case configuration: {}", fmt::join(p, "; ")));
  return c;
}

// The hidden states as the case stores them (bf16-rounded when stored as bf16: what the router sees).
void read_hidden(const DumpRequest& o, const MoeConfig& layer, LayerDump& d) {
  const int64_t H = layer.hidden_size;
  if (!o.hidden_file.empty()) {
    HiddenStates hs = read_hidden_states_file(o.hidden_file, o.hidden_dataset);
    if (hs.hidden != H)
      throw InputError(o.hidden_file, "", fmt::format("holds [{}, {}]: its hidden size {} is not the layer's hidden_size {} (config.json)",
                                                      hs.tokens, hs.hidden, hs.hidden, H));
    d.tokens = hs.tokens;
    d.hidden_dtype = o.hidden_dtype.value_or(hs.dtype);
    d.hidden = std::move(hs.values);
  } else {
    gen::DataSpec spec;
    spec.seed = o.seed;
    spec.dist = o.dist;
    spec.near_ties = false;
    spec.layer = layer;
    d.tokens = o.tokens;
    d.hidden = gen::hidden_states(spec, d.tokens);
    d.hidden_dtype = o.hidden_dtype.value_or(Precision::bf16);
  }
  if (d.hidden_dtype == Precision::bf16)
    for (float& v : d.hidden) v = bf16_round(v);
}

// float32 router logits, summation order in layer_dump.hpp.
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

// The router's weight (and bias) from the checkpoint, every value finite, and the logits of
// the stored hidden states.
void route_inputs(const Checkpoint& ck, LayerDump& d) {
  static constexpr Dtype kRouterDtypes[] = {Dtype::BF16, Dtype::F32, Dtype::F16};
  const int64_t E = d.layer.config.num_experts, H = d.layer.config.hidden_size;
  const TensorView gate_t = ck.expect(d.names.gate_weight, kRouterDtypes, {uint64_t(E), uint64_t(H)});
  const std::vector<float> gate = to_float32(gate_t);
  ck.release(gate_t);
  if (d.layer.routing_bias) {
    const TensorView b = ck.expect(d.names.gate_bias, kRouterDtypes, {uint64_t(E)});
    d.bias = to_float32(b);
    for (size_t e = 0; e < d.bias.size(); ++e)
      if (!std::isfinite(d.bias[e])) throw InputError(*b.file, d.names.gate_bias, fmt::format("must be finite; expert {} is {}", e, d.bias[e]));
  }
  for (size_t i = 0; i < gate.size(); ++i)
    if (!std::isfinite(gate[i]))
      throw InputError(*gate_t.file, d.names.gate_weight, fmt::format("must be finite; row {}, column {} is {}", i / size_t(H), i % size_t(H), gate[i]));
  d.logits = router_logits(d.hidden, gate, d.tokens, E, H);
  for (size_t i = 0; i < d.logits.size(); ++i)
    if (!std::isfinite(d.logits[i]))
      throw InputError("", "router logits", fmt::format("token {}, expert {} overflows float32 ({})", i / size_t(E), i % size_t(E), d.logits[i]));
}

// Every local expert, or (routed_only) those the reference routing picks, the lowest local one
// standing in when none is picked.
void choose_experts(const DumpRequest& o, LayerDump& d) {
  const MoeConfig& c = d.config;
  if (o.routed_only) {
    const Routing r = route(c, d.logits.data(), d.bias.empty() ? nullptr : d.bias.data(), d.tokens);
    std::set<int64_t> used;
    for (const int32_t id : r.ids)
      if (c.is_local(id)) used.insert(id);
    d.experts.assign(used.begin(), used.end());
    if (d.experts.empty()) {
      d.experts.push_back(c.local_expert_offset);
      d.stand_in = true;
    }
  } else {
    for (int64_t e = c.local_expert_offset; e < c.local_expert_offset + c.local_experts(); ++e) d.experts.push_back(e);
  }
  const int64_t B = c.weight_block, Il = c.intermediate_size, H = c.hidden_size;
  d.expert_bytes = 3 * Il * H + 4 * (2 * (Il / B) * ceil_div(H, B) + ceil_div(H, B) * (Il / B));
}

CaseHeader case_header(const DumpRequest& o, const LayerDump& d) {
  CaseHeader header;
  header.config = d.config;
  header.tokens = d.tokens;
  header.hidden_dtype = d.hidden_dtype;
  header.routing_bias = d.layer.routing_bias;
  header.routing_bias_dtype = Precision::f32;
  if (o.routed_only) header.expert_ids = d.experts;
  header.source = o.source;
  const HfMoeLayer& hl = d.layer;
  header.description = fmt::format("layer {} of the {} checkpoint {} ({}): routed experts{}, hidden states {}", o.layer,
                                   hl.model_type.empty() ? std::string(to_string(hl.family)) : hl.model_type, o.checkpoint,
                                   to_string(hl.family), hl.shared_experts > 0 ? " only (shared experts not included)" : "",
                                   !o.hidden_file.empty() ? "from " + o.hidden_file : fmt::format("synthetic (seed {})", o.seed));
  return header;
}

// One expert from the checkpoint: checked dtypes and shapes, sliced and packed.
ExpertWeights read_expert(const Checkpoint& ck, const LayerTensors& names, int64_t e, const Slice& s, const MoeConfig& c) {
  static constexpr Dtype kF8[] = {Dtype::F8_E4M3};
  static constexpr Dtype kF32[] = {Dtype::F32};
  const uint64_t H = uint64_t(c.hidden_size), I = uint64_t(s.full), Il = uint64_t(s.local), off = uint64_t(s.offset);
  const uint64_t B = uint64_t(c.weight_block), nbH = (H + B - 1) / B, nbI = (I + B - 1) / B, nbIl = Il / B, ob = off / B;
  const TensorView gate = ck.expect(names.expert(e, "gate_proj", false), kF8, {I, H});
  const TensorView gate_s = ck.expect(names.expert(e, "gate_proj", true), kF32, {nbI, nbH});
  const TensorView up = ck.expect(names.expert(e, "up_proj", false), kF8, {I, H});
  const TensorView up_s = ck.expect(names.expert(e, "up_proj", true), kF32, {nbI, nbH});
  const TensorView down = ck.expect(names.expert(e, "down_proj", false), kF8, {H, I});
  const TensorView down_s = ck.expect(names.expert(e, "down_proj", true), kF32, {nbH, nbI});

  ExpertWeights w;
  w.expert = e;
  w.w13.resize(2 * Il * H);
  w.w13_scale.resize(2 * nbIl * nbH);
  const bool gate_first = c.gate_up_layout == GateUpLayout::gate_up;
  const TensorView& first = gate_first ? gate : up;
  const TensorView& second = gate_first ? up : gate;
  const TensorView& first_s = gate_first ? gate_s : up_s;
  const TensorView& second_s = gate_first ? up_s : gate_s;
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

}  // namespace

LayerDump plan_layer_dump(const DumpRequest& o) {
  LayerDump d;
  d.checkpoint = std::make_unique<Checkpoint>(o.checkpoint);
  const Checkpoint& ck = *d.checkpoint;
  const std::string config_path = (std::filesystem::path(o.checkpoint) / "config.json").string();
  d.layer = read_hf_moe_layer(config_path, o.layer);
  d.names = layer_tensors(d.layer.family, o.layer);
  const Slice slice = tp_slice(o, d.layer.config);
  check_ep(o, d.layer.config);
  d.config = case_config(o, d.layer.config, slice, config_path);
  d.intermediate_offset = slice.offset;
  read_hidden(o, d.layer.config, d);
  route_inputs(ck, d);
  choose_experts(o, d);
  d.notes = d.layer.notes;
  if (d.layer.shared_experts > 0 || (!d.names.shared_prefix.empty() && ck.contains(d.names.shared_prefix + "gate_proj.weight")))
    d.notes.push_back(fmt::format("the layer has {} shared expert(s) ({}*): not part of the case, which holds the routed experts "
                                  "only (the case's output is the routed experts' sum; the engine adds the shared expert)",
                                  std::max<int64_t>(d.layer.shared_experts, 1), d.names.shared_prefix));
  d.header = case_header(o, d);
  return d;
}

void write_layer_dump(const LayerDump& d, const std::string& path, const std::function<void(size_t)>& after_expert) {
  const Slice slice{d.layer.config.intermediate_size, d.intermediate_offset, d.config.intermediate_size};
  CaseWriter w(path, d.header);
  w.write_hidden_states(d.hidden);
  w.write_router_logits(d.logits);
  if (d.layer.routing_bias) w.write_routing_bias(d.bias);
  for (size_t s = 0; s < d.experts.size(); ++s) {
    w.write_expert(int64_t(s), read_expert(*d.checkpoint, d.names, d.experts[s], slice, d.config));
    if (after_expert) after_expert(s);
  }
  w.commit();
}

}  // namespace moecheck::ckpt
