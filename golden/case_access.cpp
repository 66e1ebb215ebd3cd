// CaseReader accessors: listings, and reads by hyperslab (token rows, one expert at a time).
// bfloat16 datasets are decoded exactly (bits << 16); FP8 codes are returned raw.
#include <algorithm>

#include <fmt/format.h>

#include "golden/case_reader_impl.hpp"
#include "reference/tail_bound.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/fp8_quant.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck {

// --- Impl helpers -----------------------------------------------------------------------
void CaseReader::Impl::require_usable() const {
  if (!problems.empty()) throw InputError(path, problems.front().where, problems.front().rule);
  if (!file) throw InputError(path, "", "not a readable HDF5 file");
}

H5::DataSet CaseReader::Impl::open_good(const std::string& p) const {
  if (!good.count(p)) throw InputError(path, p, "dataset not present in this case");
  return h5::guard(path, p, [&] { return file->openDataSet(p); });
}

std::pair<int64_t, int64_t> CaseReader::Impl::token_range(const std::string& p, int64_t t0, int64_t count) const {
  if (count < 0) count = tokens - t0;
  if (t0 < 0 || count < 0 || t0 > tokens || count > tokens - t0)
    throw InputError(path, p, fmt::format("token range [{}, {}) is outside [0, T = {})", t0, t0 + count, tokens));
  return {t0, count};
}

std::vector<float> CaseReader::Impl::read_float_rows(const std::string& p, int64_t t0, int64_t n) const {
  const H5::DataSet ds = open_good(p);
  std::vector<uint64_t> offset(1, uint64_t(t0)), count = h5::extent(ds);
  count[0] = uint64_t(n);
  offset.resize(count.size(), 0);
  if (dtype.at(p) != "bfloat16") return h5::read_box_as<float>(ds, H5::PredType::NATIVE_FLOAT, offset, count, path, p);
  const auto bits = h5::read_box_as<uint16_t>(ds, H5::PredType::NATIVE_UINT16, offset, count, path, p);
  std::vector<float> out(bits.size());
  std::transform(bits.begin(), bits.end(), out.begin(), bf16_decode);
  return out;
}

// --- Listings ----------------------------------------------------------------------------
const std::string& CaseReader::path() const { return impl_->path; }
const std::vector<Problem>& CaseReader::structure_problems() const { return impl_->problems; }
int64_t CaseReader::format_version() const { return impl_->format_version; }
std::optional<std::string> CaseReader::description() const { return impl_->description; }
std::optional<std::string> CaseReader::source() const { return impl_->source; }
bool CaseReader::config_ok() const { return impl_->config_ok; }
const MoeConfig& CaseReader::config() const { return impl_->config; }
const std::vector<std::string>& CaseReader::config_defaults() const { return impl_->config_defaults; }
int64_t CaseReader::tokens() const { return impl_->tokens; }
const std::vector<DatasetInfo>& CaseReader::datasets() const { return impl_->datasets; }
std::vector<std::string> CaseReader::reference_tiers() const { return impl_->tiers; }
const std::vector<int64_t>& CaseReader::expert_ids() const { return impl_->expert_ids; }
bool CaseReader::experts_subset() const { return impl_->experts_subset; }

bool CaseReader::has_config() const { return impl_->root_groups.count("config") > 0; }

std::map<std::string, std::string> CaseReader::Impl::group_attributes(const std::string& p) const {
  std::map<std::string, std::string> out;
  try {
    const H5::Group g = file->openGroup(p);
    for (const std::string& a : h5::attribute_names(g, path, p))
      out[a] = h5::attr_as_text(g.openAttribute(a), path, p + "@" + a);
  } catch (const InputError&) {
    // listed as a problem already; the listing shows what could be read
  } catch (const H5::Exception&) {
  }
  return out;
}

std::vector<ReferenceInfo> CaseReader::references() const {
  std::vector<ReferenceInfo> out;
  for (const std::string& tier : impl_->tiers) out.push_back({tier, impl_->group_attributes("/reference/" + tier)});
  return out;
}

std::vector<OutputInfo> CaseReader::outputs() const {
  const Impl& m = *impl_;
  std::vector<OutputInfo> out;
  for (const std::string& name : m.outputs) {
    const std::string p = "/outputs/" + name;
    OutputInfo info{name, {}, Precision::f32, m.dtype.count(p + "/topk_ids") > 0,
                    m.dtype.count(p + "/topk_weights") > 0, m.dtype.count(p + "/expert_outputs") > 0, ""};
    const auto it = m.dtype.find(p + "/output");
    if (it != m.dtype.end() && it->second == "bfloat16") info.output_dtype = Precision::bf16;
    info.attributes = m.group_attributes(p);
    if (const auto sh = m.shards.find(name); sh != m.shards.end()) info.shard = sh->second;
    out.push_back(std::move(info));
  }
  return out;
}

// --- Inputs ------------------------------------------------------------------------------
Precision CaseReader::hidden_dtype() const {
  impl_->require_usable();
  return impl_->dtype.at("/inputs/hidden_states") == "bfloat16" ? Precision::bf16 : Precision::f32;
}
bool CaseReader::has_hidden_fp8() const { return impl_->good.count("/inputs/hidden_states_fp8") > 0; }
bool CaseReader::has_routing_bias() const { return impl_->good.count("/inputs/routing_bias") > 0; }

std::vector<float> CaseReader::read_hidden_states(int64_t t0, int64_t count) const {
  impl_->require_usable();
  const auto [b, n] = impl_->token_range("/inputs/hidden_states", t0, count);
  return impl_->read_float_rows("/inputs/hidden_states", b, n);
}

HiddenFp8 CaseReader::Impl::read_hidden_fp8(int64_t b, int64_t n) const {
  const std::string cp = "/inputs/hidden_states_fp8", sp = "/inputs/hidden_states_scale";
  const H5::DataSet codes = open_good(cp), scales = open_good(sp);
  const uint64_t H = uint64_t(config.hidden_size), G = uint64_t(ceil_div(config.hidden_size, config.group_size));
  return {h5::read_box_as<uint8_t>(codes, H5::PredType::NATIVE_UINT8, {uint64_t(b), 0}, {uint64_t(n), H}, path, cp),
          h5::read_box_as<float>(scales, H5::PredType::NATIVE_FLOAT, {uint64_t(b), 0}, {uint64_t(n), G}, path, sp)};
}

HiddenFp8 CaseReader::read_hidden_fp8(int64_t t0, int64_t count) const {
  impl_->require_usable();
  const auto [b, n] = impl_->token_range("/inputs/hidden_states_fp8", t0, count);
  return impl_->read_hidden_fp8(b, n);
}

std::vector<float> CaseReader::read_router_logits(int64_t t0, int64_t count) const {
  impl_->require_usable();
  const auto [b, n] = impl_->token_range("/inputs/router_logits", t0, count);
  return impl_->read_float_rows("/inputs/router_logits", b, n);
}

std::optional<std::vector<float>> CaseReader::read_routing_bias() const {
  impl_->require_usable();
  if (!has_routing_bias()) return std::nullopt;
  return impl_->read_float_rows("/inputs/routing_bias", 0, impl_->config.num_experts);
}

// --- Weights -----------------------------------------------------------------------------
std::optional<int64_t> CaseReader::slot_of(int64_t expert) const {
  const auto& ids = impl_->expert_ids;
  const auto it = std::lower_bound(ids.begin(), ids.end(), expert);
  if (it == ids.end() || *it != expert) return std::nullopt;
  return it - ids.begin();
}

ExpertWeights CaseReader::Impl::read_expert_slot(int64_t slot) const {
  const int64_t stored = int64_t(expert_ids.size());
  if (slot < 0 || slot >= stored)
    throw InputError(path, "/weights", fmt::format("expert slot {} is outside [0, {})", slot, stored));
  const MoeConfig& c = config;
  const uint64_t s = uint64_t(slot), H = uint64_t(c.hidden_size), I = uint64_t(c.intermediate_size),
                 B = uint64_t(c.weight_block);
  const uint64_t bi2 = (2 * I + B - 1) / B, bh = (H + B - 1) / B, bi = (I + B - 1) / B;
  auto codes = [&](const char* name, uint64_t rows, uint64_t cols) {
    const std::string p = std::string("/weights/") + name;
    return h5::read_box_as<uint8_t>(open_good(p), H5::PredType::NATIVE_UINT8, {s, 0, 0}, {1, rows, cols}, path, p);
  };
  auto scales = [&](const char* name, uint64_t rows, uint64_t cols) {
    const std::string p = std::string("/weights/") + name;
    return h5::read_box_as<float>(open_good(p), H5::PredType::NATIVE_FLOAT, {s, 0, 0}, {1, rows, cols}, path, p);
  };
  ExpertWeights w;
  w.expert = expert_ids[size_t(slot)];
  w.w13 = codes("w13", 2 * I, H);
  w.w13_scale = scales("w13_scale", bi2, bh);
  w.w2 = codes("w2", H, I);
  w.w2_scale = scales("w2_scale", bh, bi);
  return w;
}

ExpertWeights CaseReader::read_expert_slot(int64_t slot) const {
  impl_->require_usable();
  return impl_->read_expert_slot(slot);
}

ExpertWeights CaseReader::read_expert(int64_t expert) const {
  impl_->require_usable();
  const auto slot = slot_of(expert);
  if (!slot) throw InputError(impl_->path, "/weights/expert_ids", fmt::format("expert {} is not stored in this case", expert));
  return read_expert_slot(*slot);
}

// --- Outputs and references --------------------------------------------------------------
OutputData CaseReader::read_output(const std::string& name, int64_t t0, int64_t count, bool with_expert_outputs) const {
  const Impl& m = *impl_;
  m.require_usable();
  const std::string p = "/outputs/" + name;
  if (std::find(m.outputs.begin(), m.outputs.end(), name) == m.outputs.end())
    throw InputError(m.path, p, "no such output in this case");
  const auto [b, n] = m.token_range(p + "/output", t0, count);
  OutputData o;
  o.token_begin = b;
  for (const OutputInfo& info : outputs())
    if (info.name == name) o.attributes = info.attributes;
  o.output_dtype = m.dtype.at(p + "/output") == "bfloat16" ? Precision::bf16 : Precision::f32;
  o.output = m.read_float_rows(p + "/output", b, n);
  if (m.good.count(p + "/topk_ids")) {
    const std::string ip = p + "/topk_ids";
    o.topk_ids = h5::read_box_as<int32_t>(m.open_good(ip), H5::PredType::NATIVE_INT32, {uint64_t(b), 0},
                                          {uint64_t(n), uint64_t(m.config.top_k)}, m.path, ip);
  }
  if (m.good.count(p + "/topk_weights")) o.topk_weights = m.read_float_rows(p + "/topk_weights", b, n);
  if (with_expert_outputs && m.good.count(p + "/expert_outputs")) {
    o.expert_outputs_dtype = m.dtype.at(p + "/expert_outputs") == "bfloat16" ? Precision::bf16 : Precision::f32;
    o.expert_outputs = m.read_float_rows(p + "/expert_outputs", b, n);
  }
  if (const auto sh = m.shards.find(name); sh != m.shards.end()) {
    o.shard = sh->second;
    const int64_t ranks = parse_shard_plan(o.shard)->ranks;
    o.ranks_dtype = m.dtype.at(p + "/ranks/0") == "bfloat16" ? Precision::bf16 : Precision::f32;
    for (int64_t r = 0; r < ranks; ++r) o.ranks.push_back(m.read_float_rows(fmt::format("{}/ranks/{}", p, r), b, n));
  }
  return o;
}

std::optional<ReferenceData> CaseReader::read_reference(const std::string& tier) const {
  const Impl& m = *impl_;
  m.require_usable();
  if (std::find(m.tiers.begin(), m.tiers.end(), tier) == m.tiers.end()) return std::nullopt;
  const std::string p = "/reference/" + tier;
  const uint64_t T = uint64_t(m.tokens), H = uint64_t(m.config.hidden_size), k = uint64_t(m.config.top_k);
  auto doubles = [&](const std::string& name, std::vector<uint64_t> count) {
    const std::string dp = p + "/" + name;
    return h5::read_box_as<double>(m.open_good(dp), H5::PredType::NATIVE_DOUBLE, std::vector<uint64_t>(count.size(), 0),
                                   count, m.path, dp);
  };
  ReferenceData r;
  for (const auto& [a, v] : m.group_attributes(p)) {
    if (a == "tool_version")
      r.tool_version = v;
    else if (a == "input_hash")
      r.input_hash = v;
    else
      r.attributes[a] = v;
  }
  r.output = doubles("output", {T, H});
  r.topk_ids = h5::read_box_as<int32_t>(m.open_good(p + "/topk_ids"), H5::PredType::NATIVE_INT32, {0, 0}, {T, k},
                                        m.path, p + "/topk_ids");
  r.topk_weights = doubles("topk_weights", {T, k});
  r.selection_margin = doubles("selection_margin", {T});
  if (m.good.count(p + "/expert_outputs")) r.expert_outputs = doubles("expert_outputs", {T, k, H});
  if (m.good.count(p + "/budget")) r.budget = doubles("budget", {T, H});
  if (m.good.count(p + "/slot_budget")) r.slot_budget = doubles("slot_budget", {T, k, H});
  if (m.good.count(p + "/noise_var")) r.noise_var = doubles("noise_var", {T, H});
  if (m.good.count(p + "/slot_flip_projection")) r.slot_flip_projection = doubles("slot_flip_projection", {T, k});
  if (m.good.count(p + "/slot_flip_tail")) r.slot_flip_tail = doubles("slot_flip_tail", {T, k, kFlipTailWidth});
  if (m.good.count(p + "/slot_energy_tail"))
    r.slot_energy_tail = doubles("slot_energy_tail", {T, k, kEnergyTailWidth});
  if (m.good.count(p + "/slot_noise_var")) r.slot_noise_var = doubles("slot_noise_var", {T, k, H});
  if (m.good.count(p + "/requant_direction")) r.requant_direction = doubles("requant_direction", {T, H});
  if (m.good.count(p + "/requant_terms")) r.requant_terms = doubles("requant_terms", {T, 4});
  if (m.good.count(p + "/requant_flip_tail"))
    r.requant_flip_tail = doubles("requant_flip_tail", {T, k, kFlipTailWidth});
  return r;
}

}  // namespace moecheck
