// Writers for /config, typed datasets, /outputs/<name> and /reference/<tier> (case_groups.hpp).
#include "golden/case_groups.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <stdexcept>

#include "golden/case_layout.hpp"
#include "golden/hdf5_io.hpp"
#include "reference/tail_bound.hpp"
#include "reference/fp8_formats.hpp"
#include "reference/moe_sharding.hpp"

namespace moecheck::groups {

namespace {

void need_size(size_t got, const std::vector<uint64_t>& dims, const std::string& what) {
  const uint64_t want = h5::checked_bytes(dims, 1).value_or(0);
  if (got != want)
    throw std::invalid_argument(fmt::format("{}: {} values given, shape {} needs {}", what, got, h5::shape_text(dims), want));
}

std::vector<uint64_t> row_chunk(const std::vector<uint64_t>& dims, uint64_t elem) {
  return h5::chunk_for(dims, elem, 0, kChunkBytes);
}

bool chunked(const std::vector<uint64_t>& dims) { return dims.size() > 1 && dims[0] > 1; }

// /outputs/<name>/ranks: the split as its attribute `shard`, one dataset per rank named by its index.
void write_ranks(const H5::Group& output, const OutputData& o, uint64_t t, uint64_t h) {
  const std::optional<ShardPlan> plan = parse_shard_plan(o.shard);
  if (!plan || int64_t(o.ranks.size()) != plan->ranks)
    throw std::invalid_argument(fmt::format("output ranks: {} rank outputs for shard \"{}\"", o.ranks.size(), o.shard));
  const H5::Group g = h5::create_group(output, "ranks");
  h5::write_attr(g, "shard", o.shard);
  for (size_t r = 0; r < o.ranks.size(); ++r) write_float_tensor(g, std::to_string(r), {t, h}, o.ranks[r], o.ranks_dtype);
}

}  // namespace

void write_config(const H5::Group& g, const MoeConfig& c) {
  for (const layout::ConfigAttr& a : layout::config_attrs()) {
    const std::string name(a.name), text = layout::config_value_text(c, a.name);
    if (a.kind == layout::AttrKind::integer) h5::write_attr(g, name, int64_t(std::stoll(text)));
    if (a.kind == layout::AttrKind::text) h5::write_attr(g, name, text);
  }
  h5::write_attr(g, "routed_scaling_factor", c.routed_scaling_factor);
  h5::write_attr(g, "act_eps", c.act_eps);
}

void write_float_tensor(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
                        std::span<const float> values, Precision storage, int deflate) {
  need_size(values.size(), dims, name);
  if (storage == Precision::bf16) {
    std::vector<uint16_t> bits(values.size());
    for (size_t i = 0; i < values.size(); ++i) bits[i] = bf16_encode(values[i]);
    return write_bf16_bits(g, name, dims, bits, deflate);
  }
  const H5::DataSet ds = h5::create_dataset(g, name, H5::PredType::IEEE_F32LE, dims,
                                            chunked(dims) ? row_chunk(dims, 4) : std::vector<uint64_t>{},
                                            chunked(dims) ? deflate : 0);
  ds.write(values.data(), H5::PredType::NATIVE_FLOAT);
}

void write_bf16_bits(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
                     std::span<const uint16_t> bits, int deflate) {
  need_size(bits.size(), dims, name);
  const H5::DataSet ds = h5::create_dataset(g, name, H5::PredType::STD_U16LE, dims,
                                            chunked(dims) ? row_chunk(dims, 2) : std::vector<uint64_t>{},
                                            chunked(dims) ? deflate : 0);
  ds.write(bits.data(), H5::PredType::NATIVE_UINT16);
  h5::write_attr(ds, "dtype", std::string("bfloat16"));
}

void write_f64(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
               std::span<const double> values) {
  need_size(values.size(), dims, name);
  const H5::DataSet ds = h5::create_dataset(g, name, H5::PredType::IEEE_F64LE, dims,
                                            chunked(dims) ? row_chunk(dims, 8) : std::vector<uint64_t>{});
  ds.write(values.data(), H5::PredType::NATIVE_DOUBLE);
}

void write_i32(const H5::Group& g, const std::string& name, const std::vector<uint64_t>& dims,
               std::span<const int32_t> values) {
  need_size(values.size(), dims, name);
  const H5::DataSet ds = h5::create_dataset(g, name, H5::PredType::STD_I32LE, dims);
  ds.write(values.data(), H5::PredType::NATIVE_INT32);
}

void write_output(const H5::Group& outputs, const std::string& name, const OutputData& o, const MoeConfig& c,
                  int64_t T) {
  if (!is_valid_output_name(name))
    throw std::invalid_argument("output name \"" + name + "\": use 1-128 characters of A-Z a-z 0-9 _ . : + -");
  const uint64_t t = uint64_t(T), h = uint64_t(c.hidden_size), k = uint64_t(c.top_k);
  const H5::Group g = h5::create_group(outputs, name);
  for (const auto& [key, value] : o.attributes) h5::write_attr(g, key, value);
  write_float_tensor(g, "output", {t, h}, o.output, o.output_dtype);
  if (!o.topk_ids.empty()) write_i32(g, "topk_ids", {t, k}, o.topk_ids);
  if (!o.topk_weights.empty()) write_float_tensor(g, "topk_weights", {t, k}, o.topk_weights, Precision::f32);
  if (!o.expert_outputs.empty())
    write_float_tensor(g, "expert_outputs", {t, k, h}, o.expert_outputs, o.expert_outputs_dtype);
  if (!o.shard.empty() || !o.ranks.empty()) write_ranks(g, o, t, h);
}

void write_reference(const H5::Group& reference, const std::string& tier, const ReferenceData& r, const MoeConfig& c,
                     int64_t T) {
  if (!is_reference_tier(tier)) throw std::invalid_argument("reference tier \"" + tier + "\": use ideal | quantized");
  const uint64_t t = uint64_t(T), h = uint64_t(c.hidden_size), k = uint64_t(c.top_k);
  const H5::Group g = h5::create_group(reference, tier);
  h5::write_attr(g, "tool_version", r.tool_version);
  h5::write_attr(g, "input_hash", r.input_hash);
  for (const auto& [key, value] : r.attributes) h5::write_attr(g, key, value);
  write_f64(g, "output", {t, h}, r.output);
  write_i32(g, "topk_ids", {t, k}, r.topk_ids);
  write_f64(g, "topk_weights", {t, k}, r.topk_weights);
  write_f64(g, "selection_margin", {t}, r.selection_margin);
  if (!r.expert_outputs.empty()) write_f64(g, "expert_outputs", {t, k, h}, r.expert_outputs);
  if (!r.budget.empty()) write_f64(g, "budget", {t, h}, r.budget);
  if (!r.slot_budget.empty()) write_f64(g, "slot_budget", {t, k, h}, r.slot_budget);
  if (!r.noise_var.empty()) write_f64(g, "noise_var", {t, h}, r.noise_var);
  if (!r.slot_flip_projection.empty()) write_f64(g, "slot_flip_projection", {t, k}, r.slot_flip_projection);
  if (!r.slot_flip_tail.empty()) write_f64(g, "slot_flip_tail", {t, k, uint64_t(kFlipTailWidth)}, r.slot_flip_tail);
  if (!r.slot_energy_tail.empty())
    write_f64(g, "slot_energy_tail", {t, k, uint64_t(kEnergyTailWidth)}, r.slot_energy_tail);
  if (!r.slot_noise_var.empty()) write_f64(g, "slot_noise_var", {t, k, h}, r.slot_noise_var);
  if (!r.requant_direction.empty()) write_f64(g, "requant_direction", {t, h}, r.requant_direction);
  if (!r.requant_terms.empty()) write_f64(g, "requant_terms", {t, 4}, r.requant_terms);
  if (!r.requant_flip_tail.empty())
    write_f64(g, "requant_flip_tail", {t, k, uint64_t(kFlipTailWidth)}, r.requant_flip_tail);
}

std::string temporary_for(const std::string& path) { return fmt::format("{}.tmp.{}", path, ::getpid()); }

}  // namespace moecheck::groups
