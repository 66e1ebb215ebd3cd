// CaseWriter: a new case written to <path>.tmp.<pid>, checked and renamed into place at commit().
// Weights are created up front as chunked datasets (one chunk = one expert slab of at most
// 4 MiB) and filled one expert at a time, so a generator never holds the whole layer.
#include <filesystem>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "golden/case_groups.hpp"
#include "golden/case_layout.hpp"
#include "golden/hdf5_io.hpp"
#include "golden/interrupt.hpp"
#include "reference/fp8_quant.hpp"

namespace moecheck {

struct CaseWriter::Impl {
  std::string path, tmp;
  std::optional<interrupt::ScratchPath> scratch;  // tmp, removed if the process is interrupted
  CaseHeader h;
  int64_t stored = 0;
  std::unique_ptr<H5::H5File> file;
  std::optional<H5::Group> inputs, weights, outputs, reference;  // H5::Group has no operator=
  H5::DataSet w13, w13_scale, w2, w2_scale;
  std::set<std::string> written;
  std::vector<bool> expert_written;
  bool committed = false;

  void close() {
    w13 = w13_scale = w2 = w2_scale = H5::DataSet();
    inputs.reset(), weights.reset(), outputs.reset(), reference.reset();
    if (file) file->close();
    file.reset();
  }
  void once(const std::string& name) {
    if (!written.insert(name).second) throw std::logic_error("CaseWriter: " + name + " written twice");
  }
  void create();
};

namespace {

void need(bool ok, const std::string& file, const std::string& where, const std::string& rule) {
  if (!ok) throw InputError(file, where, rule);
}

H5::DataSet create_codes(const H5::Group& g, const std::string& name, std::vector<uint64_t> dims, uint64_t block,
                         int deflate) {
  const H5::DataSet ds = h5::create_dataset(g, name, H5::PredType::STD_U8LE, dims,
                                            h5::chunk_for(dims, 1, 1, groups::kChunkBytes, block), deflate);
  h5::write_attr(ds, "dtype", std::string("float8_e4m3fn"));
  return ds;
}

void check_span(size_t got, uint64_t want, const char* what) {
  if (got != want) throw std::invalid_argument(fmt::format("CaseWriter: {} has {} values, expected {}", what, got, want));
}

}  // namespace

CaseWriter::CaseWriter(std::string path, CaseHeader header) : impl_(std::make_unique<Impl>()) {
  h5::silence();
  Impl& m = *impl_;
  m.path = std::move(path);
  m.h = std::move(header);
  MoeConfig& c = m.h.config;
  if (c.local_num_experts < 0) c.local_num_experts = c.num_experts;
  // The same rules the reader enforces, so a writer never produces a file the reader refuses.
  for (const std::string& p : config_problems(c)) {
    const size_t colon = p.find(": ");
    throw InputError(m.path, "/config@" + p.substr(0, colon), p.substr(colon + 2));
  }
  need(m.h.tokens >= 1 && m.h.tokens <= kMaxTokens, m.path, "/inputs/hidden_states",
       fmt::format("dimension 0 (tokens T) must be in [1, 2^24], got {}", m.h.tokens));
  const std::vector<layout::Spec> inputs = layout::input_specs(c, true, m.h.tokens);
  const layout::Spec& bias = inputs.back();
  need(bias.presence != layout::Presence::required || m.h.routing_bias, m.path, "/inputs/routing_bias",
       "required dataset missing");
  need(bias.presence != layout::Presence::forbidden || !m.h.routing_bias, m.path, "/inputs/routing_bias",
       bias.forbidden_rule);
  const auto& ids = m.h.expert_ids;
  const int64_t lo = c.local_expert_offset, local = c.local_experts();
  need(int64_t(ids.size()) <= local, m.path, "/weights/expert_ids",
       fmt::format("length must be in [1, local_num_experts = {}], got {}", local, ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    need(ids[i] >= lo && ids[i] < lo + local, m.path, "/weights/expert_ids",
         fmt::format("id {} at index {} is outside the local experts [{}, {})", ids[i], i, lo, lo + local));
    need(i == 0 || ids[i] > ids[i - 1], m.path, "/weights/expert_ids",
         fmt::format("ids must be strictly increasing, got {} after {} at index {}", ids[i], ids[i - 1], i));
  }
  m.stored = ids.empty() ? local : int64_t(ids.size());
  m.expert_written.assign(size_t(m.stored), false);
  m.tmp = groups::temporary_for(m.path);
  m.scratch.emplace(m.tmp);
  try {
    h5::guard(m.path, "", [&] { m.create(); });
  } catch (...) {
    m.close();
    std::error_code ec;
    std::filesystem::remove(m.tmp, ec);
    throw;
  }
}

void CaseWriter::Impl::create() {
  const MoeConfig& c = h.config;
  file = std::make_unique<H5::H5File>(tmp, H5F_ACC_TRUNC);
  h5::write_attr(*file, "format", std::string(kCaseFormat));
  h5::write_attr(*file, "format_version", kCaseFormatVersion);
  if (!h.description.empty()) h5::write_attr(*file, "description", h.description);
  if (!h.source.empty()) h5::write_attr(*file, "source", h.source);
  groups::write_config(h5::create_group(*file, "config"), c);
  inputs.emplace(h5::create_group(*file, "inputs"));
  weights.emplace(h5::create_group(*file, "weights"));
  const uint64_t S = uint64_t(stored), H = uint64_t(c.hidden_size), I = uint64_t(c.intermediate_size),
                 B = uint64_t(c.weight_block);
  const uint64_t bi2 = uint64_t(ceil_div(2 * c.intermediate_size, c.weight_block)),
                 bh = uint64_t(ceil_div(c.hidden_size, c.weight_block)),
                 bi = uint64_t(ceil_div(c.intermediate_size, c.weight_block));
  w13 = create_codes(*weights, "w13", {S, 2 * I, H}, B, h.deflate);
  w2 = create_codes(*weights, "w2", {S, H, I}, B, h.deflate);
  w13_scale = h5::create_dataset(*weights, "w13_scale", H5::PredType::IEEE_F32LE, {S, bi2, bh});
  w2_scale = h5::create_dataset(*weights, "w2_scale", H5::PredType::IEEE_F32LE, {S, bh, bi});
  if (!h.expert_ids.empty()) {
    std::vector<int32_t> ids(h.expert_ids.begin(), h.expert_ids.end());
    groups::write_i32(*weights, "expert_ids", {S}, ids);
  }
}

CaseWriter::~CaseWriter() {
  if (!impl_ || impl_->committed) return;
  try {
    impl_->close();
  } catch (...) {
    // closing a file we are about to delete: nothing more to do
  }
  std::error_code ec;
  std::filesystem::remove(impl_->tmp, ec);
}

void CaseWriter::write_hidden_states(std::span<const float> x) {
  Impl& m = *impl_;
  m.once("hidden_states");
  h5::guard(m.tmp, "/inputs/hidden_states", [&] {
    groups::write_float_tensor(*m.inputs, "hidden_states", {uint64_t(m.h.tokens), uint64_t(m.h.config.hidden_size)}, x,
                               m.h.hidden_dtype, m.h.deflate);
  });
}

void CaseWriter::write_hidden_states_bf16(std::span<const uint16_t> bits) {
  Impl& m = *impl_;
  if (m.h.hidden_dtype != Precision::bf16) throw std::logic_error("CaseWriter: hidden_dtype is not bf16");
  m.once("hidden_states");
  h5::guard(m.tmp, "/inputs/hidden_states", [&] {
    groups::write_bf16_bits(*m.inputs, "hidden_states", {uint64_t(m.h.tokens), uint64_t(m.h.config.hidden_size)}, bits,
                            m.h.deflate);
  });
}

void CaseWriter::write_hidden_fp8(std::span<const uint8_t> codes, std::span<const float> scales) {
  Impl& m = *impl_;
  if (!m.h.hidden_fp8) throw std::logic_error("CaseWriter: the header does not declare hidden_fp8");
  m.once("hidden_states_fp8");
  const uint64_t T = uint64_t(m.h.tokens), H = uint64_t(m.h.config.hidden_size),
                 G = uint64_t(ceil_div(m.h.config.hidden_size, m.h.config.group_size));
  check_span(codes.size(), T * H, "hidden_states_fp8");
  check_span(scales.size(), T * G, "hidden_states_scale");
  h5::guard(m.tmp, "/inputs/hidden_states_fp8", [&] {
    const H5::DataSet q = h5::create_dataset(*m.inputs, "hidden_states_fp8", H5::PredType::STD_U8LE, {T, H},
                                             T > 1 ? h5::chunk_for({T, H}, 1, 0, groups::kChunkBytes) : std::vector<uint64_t>{},
                                             T > 1 ? m.h.deflate : 0);
    q.write(codes.data(), H5::PredType::NATIVE_UINT8);
    h5::write_attr(q, "dtype", std::string("float8_e4m3fn"));
    h5::create_dataset(*m.inputs, "hidden_states_scale", H5::PredType::IEEE_F32LE, {T, G})
        .write(scales.data(), H5::PredType::NATIVE_FLOAT);
  });
}

void CaseWriter::write_router_logits(std::span<const float> logits) {
  Impl& m = *impl_;
  m.once("router_logits");
  h5::guard(m.tmp, "/inputs/router_logits", [&] {
    groups::write_float_tensor(*m.inputs, "router_logits", {uint64_t(m.h.tokens), uint64_t(m.h.config.num_experts)},
                               logits, Precision::f32, m.h.deflate);
  });
}

void CaseWriter::write_routing_bias(std::span<const float> bias) {
  Impl& m = *impl_;
  if (!m.h.routing_bias) throw std::logic_error("CaseWriter: the header does not declare a routing bias");
  m.once("routing_bias");
  h5::guard(m.tmp, "/inputs/routing_bias", [&] {
    groups::write_float_tensor(*m.inputs, "routing_bias", {uint64_t(m.h.config.num_experts)}, bias,
                               m.h.routing_bias_dtype);
  });
}

void CaseWriter::write_expert(int64_t slot, const ExpertWeights& w) {
  Impl& m = *impl_;
  if (slot < 0 || slot >= m.stored)
    throw std::invalid_argument(fmt::format("CaseWriter: expert slot {} outside [0, {})", slot, m.stored));
  if (m.expert_written[size_t(slot)]) throw std::logic_error(fmt::format("CaseWriter: expert slot {} written twice", slot));
  const MoeConfig& c = m.h.config;
  const uint64_t s = uint64_t(slot), H = uint64_t(c.hidden_size), I = uint64_t(c.intermediate_size);
  const uint64_t bi2 = uint64_t(ceil_div(2 * c.intermediate_size, c.weight_block)),
                 bh = uint64_t(ceil_div(c.hidden_size, c.weight_block)),
                 bi = uint64_t(ceil_div(c.intermediate_size, c.weight_block));
  check_span(w.w13.size(), 2 * I * H, "w13");
  check_span(w.w13_scale.size(), bi2 * bh, "w13_scale");
  check_span(w.w2.size(), H * I, "w2");
  check_span(w.w2_scale.size(), bh * bi, "w2_scale");
  h5::guard(m.tmp, "/weights", [&] {
    h5::write_box(m.w13, H5::PredType::NATIVE_UINT8, w.w13.data(), {s, 0, 0}, {1, 2 * I, H});
    h5::write_box(m.w13_scale, H5::PredType::NATIVE_FLOAT, w.w13_scale.data(), {s, 0, 0}, {1, bi2, bh});
    h5::write_box(m.w2, H5::PredType::NATIVE_UINT8, w.w2.data(), {s, 0, 0}, {1, H, I});
    h5::write_box(m.w2_scale, H5::PredType::NATIVE_FLOAT, w.w2_scale.data(), {s, 0, 0}, {1, bh, bi});
  });
  m.expert_written[size_t(slot)] = true;
}

void CaseWriter::add_output(const std::string& name, const OutputData& out) {
  Impl& m = *impl_;
  m.once("outputs/" + name);
  h5::guard(m.tmp, "/outputs/" + name, [&] {
    if (!m.outputs) m.outputs.emplace(h5::create_group(*m.file, "outputs"));
    groups::write_output(*m.outputs, name, out, m.h.config, m.h.tokens);
  });
}

void CaseWriter::add_reference(const std::string& tier, const ReferenceData& ref) {
  Impl& m = *impl_;
  m.once("reference/" + tier);
  h5::guard(m.tmp, "/reference/" + tier, [&] {
    if (!m.reference) m.reference.emplace(h5::create_group(*m.file, "reference"));
    groups::write_reference(*m.reference, tier, ref, m.h.config, m.h.tokens);
  });
}

void CaseWriter::commit() {
  Impl& m = *impl_;
  if (m.committed) throw std::logic_error("CaseWriter: commit() called twice");
  std::vector<std::string> missing;
  for (const char* n : {"hidden_states", "router_logits"})
    if (!m.written.count(n)) missing.push_back(n);
  if (m.h.routing_bias && !m.written.count("routing_bias")) missing.push_back("routing_bias");
  if (m.h.hidden_fp8 && !m.written.count("hidden_states_fp8")) missing.push_back("hidden_states_fp8");
  for (size_t s = 0; s < m.expert_written.size(); ++s)
    if (!m.expert_written[s]) missing.push_back(fmt::format("expert slot {}", s));
  if (!missing.empty())
    throw std::logic_error(fmt::format("CaseWriter::commit: not written: {}", fmt::join(missing, ", ")));
  h5::guard(m.tmp, "", [&] { m.close(); });
  CaseReader check(m.tmp);  // strict: a file we write must pass our own structure checks
  std::error_code ec;
  std::filesystem::rename(m.tmp, m.path, ec);
  if (ec) throw InputError(m.path, "", "cannot write: " + ec.message());
  m.scratch->release();
  m.committed = true;
}

}  // namespace moecheck
