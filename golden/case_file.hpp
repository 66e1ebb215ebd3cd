// The case file (golden/FORMAT.md, format "moecheck.case" version 1): one HDF5 file holding one
// MoE layer problem: config, inputs, FP8 block-scale weights, backend outputs and references.
//
// CaseReader opens a case read-only and checks its structure (attributes, names, shapes, dtypes,
// that the data is stored) without reading bulk data; validate() adds the data checks (finite
// inputs, finite positive scales, no NaN-coded FP8 weights), streaming expert by expert and token
// block by token block. Bad files give InputError(file, dataset-or-attribute, rule), never a
// crash or an unbounded allocation.
//
// CaseWriter writes a new case atomically (a temporary in the same directory, renamed at
// commit()); add_output_to_case / add_reference_to_case add a group to an existing case, also
// atomically. Encodings: bfloat16 tensors are read back as float exactly (bits << 16); FP8 weights
// are raw float8_e4m3fn codes; every scale is a float32 dequantization multiplier.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "reference/errors.hpp"
#include "reference/moe_config.hpp"

namespace moecheck {

inline constexpr const char* kCaseFormat = "moecheck.case";
inline constexpr int64_t kCaseFormatVersion = 1;
inline constexpr int64_t kMaxTokens = int64_t(1) << 24;  // T is in [1, 2^24]

// One rule a case file breaks. where: "" (the file), a dataset ("/inputs/hidden_states") or an
// attribute ("/config@top_k", "/@format_version").
struct Problem {
  std::string where;
  std::string rule;
};

// One dataset as stored: dtype is what it means ("bfloat16", "float32", "float8_e4m3fn", "int32",
// ...), storage the HDF5 type ("uint16", "float32", ...).
struct DatasetInfo {
  std::string path;
  std::vector<int64_t> shape;
  std::string dtype;
  std::string storage;
};

// The weights of one stored expert, read by hyperslab (never the whole layer).
struct ExpertWeights {
  int64_t expert = -1;             // global expert id
  std::vector<uint8_t> w13;        // [2I, H] float8_e4m3fn codes; gate_up_layout says which half gates
  std::vector<float> w13_scale;    // [ceil(2I/B), ceil(H/B)], B = weight_block
  std::vector<uint8_t> w2;         // [H, I]
  std::vector<float> w2_scale;     // [ceil(H/B), ceil(I/B)]
};

// Activations the engine quantized itself: codes [n, H], scales row-major [n, ceil(H/G)].
struct HiddenFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

struct OutputInfo {
  std::string name;
  std::map<std::string, std::string> attributes;  // backend, device, created, free text
  Precision output_dtype = Precision::f32;
  bool has_topk_ids = false, has_topk_weights = false, has_expert_outputs = false;
  std::string shard;  // "tp N" / "ep N" when the output records its ranks (/outputs/<name>/ranks), else ""
};

// One backend run (/outputs/<name>). An empty optional vector means "absent". When writing,
// bf16 dtypes store the bfloat16 rounding (RNE) of the values: exact for a bf16 backend's output.
// A run over N ranks (reference/moe_sharding.hpp) records each rank's partial output: `shard`
// names the split ("tp 4", "ep 8"), ranks[r] is rank r's [n, H] output, `output` the reduced one.
struct OutputData {
  std::map<std::string, std::string> attributes;
  Precision output_dtype = Precision::f32;
  std::vector<float> output;          // [n, H]
  std::vector<int32_t> topk_ids;      // [n, k] global expert ids, optional
  std::vector<float> topk_weights;    // [n, k], optional
  Precision expert_outputs_dtype = Precision::f32;
  std::vector<float> expert_outputs;  // [n, k, H] each slot's GEMM2 output before weighting, optional
  std::string shard;                        // "" : one device, no ranks
  Precision ranks_dtype = Precision::bf16;
  std::vector<std::vector<float>> ranks;    // [N][n, H] each rank's partial output, with shard
  int64_t token_begin = 0;            // rows [token_begin, token_begin + n) when read by range
};

struct ReferenceInfo {
  std::string tier;
  std::map<std::string, std::string> attributes;  // tool_version, input_hash, ...
};

// A reference tier (/reference/ideal or /reference/quantized), written by moecheck itself.
struct ReferenceData {
  std::string tool_version;
  std::string input_hash;
  std::map<std::string, std::string> attributes;  // any further string attributes
  std::vector<double> output;            // [T, H]
  std::vector<int32_t> topk_ids;         // [T, k]
  std::vector<double> topk_weights;      // [T, k]
  std::vector<double> selection_margin;  // [T]
  std::vector<double> expert_outputs;    // [T, k, H], optional
  // With a budget model (attributes["budget_model"]; reference/BUDGETS.md), optional:
  std::vector<double> budget;            // [T, H] per-element budget of a correct device
  std::vector<double> slot_budget;       // [T, k, H] per-slot budget before weighting
  std::vector<double> noise_var;         // [T, H] noise variance of the aggregate tests
  std::vector<double> slot_flip_projection;  // [T, k] re-quantization flips' projections (bias test's SE)
  std::vector<double> slot_flip_tail;        // [T, k, 65] the crossings among the flips (reference/tail_bound.hpp)
  std::vector<double> slot_energy_tail;      // [T, k, 66] the same crossings by the norm of their move
  std::vector<double> slot_noise_var;        // [T, k, H] noise variance of the slot outputs
  // The re-quantization test's terms (reference/BUDGETS.md §10.7), optional: its direction
  // [T, H] and per token [T, 4] the skipped step's signal, the variance, the mean and its bound.
  std::vector<double> requant_direction;
  std::vector<double> requant_terms;
  std::vector<double> requant_flip_tail;  // [T, k, 65] the codes' crossings among its variance terms
};

bool is_reference_tier(std::string_view tier);  // "ideal" | "quantized"
bool is_valid_output_name(std::string_view name);  // 1-128 of [A-Za-z0-9_.:+-]

enum class CaseOpen {
  strict,   // the constructor throws the first structural problem
  lenient,  // structural problems are collected (structure_problems()); for inspect
};

class CaseReader {
 public:
  explicit CaseReader(const std::string& path, CaseOpen mode = CaseOpen::strict);
  ~CaseReader();
  CaseReader(CaseReader&&) noexcept;
  CaseReader& operator=(CaseReader&&) noexcept;

  const std::string& path() const;
  // Lenient mode: the structural problems found on open (empty = structure valid). Accessors
  // below (except the listing ones) throw the first of them as InputError.
  const std::vector<Problem>& structure_problems() const;
  bool structure_ok() const { return structure_problems().empty(); }
  // Every problem: structure, then the data checks (reads everything once, streaming).
  std::vector<Problem> validate() const;

  // --- Header (listing accessors: usable on a lenient reader with problems) ---
  int64_t format_version() const;                 // -1 when unreadable
  std::optional<std::string> description() const;
  std::optional<std::string> source() const;
  bool config_ok() const;
  const MoeConfig& config() const;                // local_num_experts resolved
  const std::vector<std::string>& config_defaults() const;  // /config attributes absent (default used)
  int64_t tokens() const;                         // T; -1 when unknown
  const std::vector<DatasetInfo>& datasets() const;
  std::vector<OutputInfo> outputs() const;
  std::vector<std::string> reference_tiers() const;
  std::vector<ReferenceInfo> references() const;
  bool has_config() const;                        // a /config group was found (its values may be invalid)
  const std::vector<int64_t>& expert_ids() const; // global ids of the stored experts, increasing
  bool experts_subset() const;                    // /weights/expert_ids present

  // --- Inputs: rows [t0, t0 + count) (count < 0: to the end), row-major ---
  Precision hidden_dtype() const;
  bool has_hidden_fp8() const;
  bool has_routing_bias() const;
  std::vector<float> read_hidden_states(int64_t t0 = 0, int64_t count = -1) const;  // [n, H]
  HiddenFp8 read_hidden_fp8(int64_t t0 = 0, int64_t count = -1) const;
  std::vector<float> read_router_logits(int64_t t0 = 0, int64_t count = -1) const;  // [n, E]
  std::optional<std::vector<float>> read_routing_bias() const;                      // [E]

  // --- Weights ---
  int64_t stored_experts() const { return static_cast<int64_t>(expert_ids().size()); }
  std::optional<int64_t> slot_of(int64_t expert) const;  // storage index of a global expert id
  ExpertWeights read_expert_slot(int64_t slot) const;
  ExpertWeights read_expert(int64_t expert) const;       // InputError when not stored

  // --- Outputs and references ---
  OutputData read_output(const std::string& name, int64_t t0 = 0, int64_t count = -1,
                         bool with_expert_outputs = true) const;
  std::optional<ReferenceData> read_reference(const std::string& tier) const;  // nullopt when absent

  struct Impl;  // golden/case_reader_impl.hpp

 private:
  std::unique_ptr<Impl> impl_;
};

// What a new case holds besides its data.
struct CaseHeader {
  MoeConfig config;
  int64_t tokens = 0;
  std::string description, source;
  Precision hidden_dtype = Precision::bf16;       // storage of /inputs/hidden_states
  bool hidden_fp8 = false;                        // write hidden_states_fp8 + hidden_states_scale
  bool routing_bias = false;                      // required for deepseek_v3 (FORMAT.md)
  Precision routing_bias_dtype = Precision::f32;
  std::vector<int64_t> expert_ids;                // empty: every local expert, no expert_ids dataset
  int deflate = 0;                                // gzip level for bulk datasets (0 = no filter)
};

// Writes <path>.tmp.<pid> and renames it to path at commit(); the destructor removes the
// temporary when commit() was not reached (an exception, a missing dataset).
class CaseWriter {
 public:
  CaseWriter(std::string path, CaseHeader header);
  ~CaseWriter();
  CaseWriter(const CaseWriter&) = delete;
  CaseWriter& operator=(const CaseWriter&) = delete;

  // [T, H]; with bf16 storage the values are rounded to bfloat16 (RNE).
  void write_hidden_states(std::span<const float> x);
  void write_hidden_states_bf16(std::span<const uint16_t> bits);  // needs hidden_dtype = bf16
  void write_hidden_fp8(std::span<const uint8_t> codes, std::span<const float> scales);  // [T,H], [T,ceil(H/G)]
  void write_router_logits(std::span<const float> logits);  // [T, E]
  void write_routing_bias(std::span<const float> bias);     // [E]
  // One expert at a time, slot in [0, stored experts); w.expert is ignored (the slot decides).
  void write_expert(int64_t slot, const ExpertWeights& w);
  void add_output(const std::string& name, const OutputData& out);
  void add_reference(const std::string& tier, const ReferenceData& ref);
  // Checks that every required dataset and expert was written, re-opens the result with a
  // strict CaseReader, then renames it into place.
  void commit();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Adds (or replaces) /outputs/<name> or /reference/<tier> of an existing case, atomically: the
// case is copied to a temporary next to the destination, the group written there, and the copy
// renamed over out_path (default: the case itself). A replaced group's old bytes stay in the
// file as free space (h5repack reclaims them).
void add_output_to_case(const std::string& case_path, const std::string& name, const OutputData& out,
                        const std::string& out_path = "");
void add_reference_to_case(const std::string& case_path, const std::string& tier, const ReferenceData& ref,
                           const std::string& out_path = "");

}  // namespace moecheck
