// What a version-1 case contains (golden/FORMAT.md): the /config attributes, every dataset's
// encoding and shape, and the checks of one dataset's type against its encoding. Shared by the
// reader (validation), the writer and inspect, so that one table defines the format.
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "reference/moe_config.hpp"

namespace moecheck::layout {

// --- /config --------------------------------------------------------------------------
enum class AttrKind { integer, real, text };
struct ConfigAttr {
  std::string_view name;
  AttrKind kind;
  bool required;
};
std::span<const ConfigAttr> config_attrs();
// The value of attribute `name` of c, as FORMAT.md / inspect show it ("deepseek_v3", "2.5", "8").
std::string config_value_text(const MoeConfig& c, std::string_view name);
// Sets attribute `name` of c from an integer / real / text value; returns "" or the rule broken
// ("must be one of gate_up | up_gate, got \"x\"").
std::string set_config_int(MoeConfig& c, std::string_view name, int64_t v);
std::string set_config_real(MoeConfig& c, std::string_view name, double v);
std::string set_config_text(MoeConfig& c, std::string_view name, const std::string& v);

// --- Datasets -------------------------------------------------------------------------
enum class Encoding {
  float_tensor,  // float32, or uint16 holding bfloat16 bits with attribute dtype = "bfloat16"
  f32,           // float32 only
  f64,           // float64 only
  fp8_codes,     // uint8 holding float8_e4m3fn codes with attribute dtype = "float8_e4m3fn"
  int_ids,       // any integer type of up to 8 bytes (values checked where they are used)
  int32,         // int32 only
  group,         // not a dataset: a group whose members its own specs describe (ranks_spec)
};
std::string encoding_rule(Encoding e);  // "must be float32, or uint16 ... ; got"

struct Dim {
  int64_t value;       // -1: not checked (config or T unknown)
  std::string symbol;  // "T", "H", "2I", "ceil(H/128)"
};
enum class Presence { required, optional, forbidden };
struct Spec {
  Spec(std::string n, Encoding e, std::vector<Dim> s, Presence p = Presence::required)
      : name(std::move(n)), enc(e), shape(std::move(s)), presence(p) {}
  std::string name;  // dataset name inside its group
  Encoding enc;
  std::vector<Dim> shape;
  Presence presence;
  std::string forbidden_rule;  // why, when forbidden
};

// Specs of /inputs, /weights, /outputs/<name>, /reference/<tier>. config_ok = false (or T < 0)
// leaves the dims that depend on them unchecked; `stored` = stored experts (-1 unknown).
std::vector<Spec> input_specs(const MoeConfig& c, bool config_ok, int64_t T);
std::vector<Spec> weight_specs(const MoeConfig& c, bool config_ok, int64_t stored);
std::vector<Spec> output_specs(const MoeConfig& c, bool config_ok, int64_t T);
std::vector<Spec> reference_specs(const MoeConfig& c, bool config_ok, int64_t T);
// An output recorded over N ranks (a tensor- or expert-parallel layer, reference/moe_sharding.hpp)
// holds, besides output_specs' datasets, the group `ranks` (ranks_spec(); in a case file, not in
// an exec backend's output file) with attribute `shard` ("tp N" / "ep N") and one [T, H] float
// tensor per rank, named by its index (rank_specs).
Spec ranks_spec();
std::vector<Spec> rank_specs(const MoeConfig& c, bool config_ok, int64_t T, int64_t ranks);
const Spec* find_spec(const std::vector<Spec>& specs, std::string_view name);
std::string spec_names(const std::vector<Spec>& specs);  // "hidden_states, router_logits, ..." (more than 8: "0, 1, 2, ..., 15")

// "[T, H] = [16, 256]" (the known values only when some are unknown: "[T, H] = [?, 256]").
std::string shape_text(const std::vector<Dim>& shape);

// Checks the stored type of ds (and its dtype attribute) against enc. Returns the dtype the
// data means ("bfloat16", "float32", "float8_e4m3fn", "int64", ...); throws
// InputError(file, path or path@dtype, rule) on a mismatch.
std::string check_encoding(const H5::DataSet& ds, Encoding enc, const std::string& file, const std::string& path);

}  // namespace moecheck::layout
