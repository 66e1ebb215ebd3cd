// Validation rules one by one: each case writes a valid small case, breaks exactly one rule in
// it, and checks that the reader names the file, the dataset or attribute and the rule.
// Structural rules: the strict CaseReader throws that InputError on open, and the lenient
// reader lists it. Data rules (finite values, scales, NaN codes): open succeeds, validate()
// lists it. The unmodified case passes (so a test cannot pass on a case that was broken anyway).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/golden_test_support.hpp"

namespace moecheck {
namespace {

using test::SmallCase;
using Edit = std::function<void(H5::H5File&)>;

struct RuleCase {
  std::string name;
  Edit edit;
  std::string where;
  std::string rule;  // substring of the rule
  bool data_only = false;
  std::function<void(SmallCase&)> base = nullptr;
};

std::ostream& operator<<(std::ostream& os, const RuleCase& c) { return os << c.name; }

const float kNaN = std::numeric_limits<float>::quiet_NaN();

Edit attr_str(const std::string& obj, const std::string& name, const std::string& v) {
  return [=](H5::H5File& f) { test::set_attr(obj == "/" ? f.openGroup("/") : f.openGroup(obj), name, v); };
}
Edit attr_int(const std::string& obj, const std::string& name, int64_t v) {
  return [=](H5::H5File& f) { test::set_attr(obj == "/" ? f.openGroup("/") : f.openGroup(obj), name, v); };
}
Edit attr_real(const std::string& obj, const std::string& name, double v) {
  return [=](H5::H5File& f) { test::set_attr(obj == "/" ? f.openGroup("/") : f.openGroup(obj), name, v); };
}
Edit remove_attr(const std::string& obj, const std::string& name) {
  return [=](H5::H5File& f) { f.openGroup(obj).removeAttr(name); };
}
Edit remove(const std::string& path) {
  return [=](H5::H5File& f) { test::unlink(f, path); };
}
Edit replace(const std::string& path, const H5::PredType& type, std::vector<hsize_t> dims, double fill = 1.0) {
  return [=, &type](H5::H5File& f) { test::replace_dataset(f, path, type, dims, fill); };
}
Edit with_dtype(Edit e, const std::string& path, const std::string& dtype) {
  return [=](H5::H5File& f) {
    e(f);
    test::set_attr(f.openDataSet(path), "dtype", dtype);
  };
}

// /outputs/x with a valid output and a ranks group: attribute shard (absent when empty) and
// one dataset per (name, shape) given, float32.
Edit output_with_ranks(const std::string& shard, std::vector<std::pair<std::string, std::vector<hsize_t>>> ranks) {
  return [=](H5::H5File& f) {
    f.createGroup("/outputs");
    f.createGroup("/outputs/x");
    test::replace_dataset(f, "/outputs/x/output", H5::PredType::IEEE_F32LE, {5, 160});
    H5::Group g = f.createGroup("/outputs/x/ranks");
    if (!shard.empty()) test::set_attr(g, "shard", shard);
    for (const auto& [name, dims] : ranks) test::replace_dataset(f, "/outputs/x/ranks/" + name, H5::PredType::IEEE_F32LE, dims);
  };
}

void renormalize_base(SmallCase& s) {
  s.header.config.routing = RoutingMethod::renormalize;
  s.header.config.n_group = s.header.config.topk_group = 1;
  s.header.routing_bias = false;
}

// T = 5, H = 160, E = 8, k = 2, I = 96, w13 [8, 192, 160], w13_scale [8, 2, 2], w2 [8, 160, 96].
std::vector<RuleCase> rule_cases() {
  const auto& F32 = H5::PredType::IEEE_F32LE;
  const auto& F64 = H5::PredType::IEEE_F64LE;
  const auto& U8 = H5::PredType::STD_U8LE;
  const auto& U16 = H5::PredType::STD_U16LE;
  const auto& I8 = H5::PredType::STD_I8LE;
  const auto& I32 = H5::PredType::STD_I32LE;
  const auto& I64 = H5::PredType::STD_I64LE;
  return {
      // Root
      {"FormatMissing", remove_attr("/", "format"), "/@format", "required attribute missing"},
      {"FormatWrong", attr_str("/", "format", "other.case"), "/@format", "must be \"moecheck.case\""},
      {"FormatNotString", attr_int("/", "format", 1), "/@format", "must be a string"},
      {"FormatVersion2", attr_int("/", "format_version", 2), "/@format_version", "unsupported format version 2"},
      {"FormatVersionFloat", attr_real("/", "format_version", 1.0), "/@format_version", "must be an integer"},
      {"FormatVersionMissing", remove_attr("/", "format_version"), "/@format_version", "required attribute missing"},
      {"DescriptionNotString", attr_int("/", "description", 3), "/@description", "must be a string"},
      {"UnknownRootMember", [](H5::H5File& f) { f.createGroup("stuff"); }, "/stuff", "unknown member"},
      {"ConfigMissing", remove("/config"), "/config", "required group missing"},
      {"InputsMissing", remove("/inputs"), "/inputs", "required group missing"},
      {"WeightsMissing", remove("/weights"), "/weights", "required group missing"},
      {"ConfigIsDataset", [](H5::H5File& f) { f.unlink("/config"); test::replace_dataset(f, "/config", H5::PredType::IEEE_F32LE, {1}); },
       "/config", "must be a group, got a dataset"},
      {"SoftLink", [](H5::H5File& f) { H5Lcreate_soft("/inputs", f.getId(), "outputs", H5P_DEFAULT, H5P_DEFAULT); },
       "/outputs", "soft links are not allowed"},
      {"ExternalLink",
       [](H5::H5File& f) { H5Lcreate_external("/etc/passwd", "/x", f.getId(), "reference", H5P_DEFAULT, H5P_DEFAULT); },
       "/reference", "external links are not allowed"},
      {"ExternalLinkInGroup",
       [](H5::H5File& f) {
         f.unlink("/inputs/routing_bias");
         H5Lcreate_external("other.h5", "/bias", f.openGroup("/inputs").getId(), "routing_bias", H5P_DEFAULT, H5P_DEFAULT);
       },
       "/inputs/routing_bias", "external links are not allowed"},
      // /config
      {"ConfigUnknownAttribute", attr_int("/config", "routed_scaling_factr", 2), "/config@routed_scaling_factr", "unknown attribute"},
      {"ConfigRequiredMissing", remove_attr("/config", "hidden_size"), "/config@hidden_size", "required attribute missing"},
      {"ConfigIntIsFloat", attr_real("/config", "top_k", 2.0), "/config@top_k", "must be an integer"},
      {"ConfigRealIsString", attr_str("/config", "routed_scaling_factor", "2.5"), "/config@routed_scaling_factor", "must be a number"},
      {"ConfigTextIsInt", attr_int("/config", "routing", 2), "/config@routing", "must be a string"},
      {"ConfigRoutingUnknown", attr_str("/config", "routing", "deepseek"), "/config@routing", "must be one of deepseek_v3 |"},
      {"ConfigLayoutUnknown", attr_str("/config", "gate_up_layout", "w31"), "/config@gate_up_layout", "must be one of gate_up | up_gate"},
      {"ConfigTopKAboveE", attr_int("/config", "top_k", 9), "/config@top_k", "must be in [1, num_experts = 8]"},
      {"ConfigENotDivisibleByNGroup", attr_int("/config", "n_group", 3), "/config@n_group", "must be divisible by n_group = 3"},
      {"ConfigHugeHiddenSize", attr_int("/config", "hidden_size", 1000000000000), "/config@hidden_size", "must be in [1, 2^24]"},
      {"ConfigScalingNaN", attr_real("/config", "routed_scaling_factor", std::nan("")), "/config@routed_scaling_factor", "finite and > 0"},
      {"ConfigLocalRange", attr_int("/config", "local_expert_offset", 2), "/config@local_num_experts", "exceeds num_experts = 8"},
      {"ConfigArrayAttribute",
       [](H5::H5File& f) {
         H5::Group g = f.openGroup("/config");
         g.removeAttr("top_k");
         const hsize_t n = 2;
         const int64_t v[2] = {2, 2};
         g.createAttribute("top_k", H5::PredType::STD_I64LE, H5::DataSpace(1, &n)).write(H5::PredType::NATIVE_INT64, v);
       },
       "/config@top_k", "must be a single value, got 2 elements"},
      {"ConfigHoldsDataset", replace("/config/x", F32, {1}), "/config", "must hold attributes only"},
      // /inputs
      {"HiddenMissing", remove("/inputs/hidden_states"), "/inputs/hidden_states", "required dataset missing"},
      {"HiddenFloat64", replace("/inputs/hidden_states", F64, {5, 160}), "/inputs/hidden_states", "must be float32, or uint16"},
      {"HiddenU16WithoutDtype", replace("/inputs/hidden_states", U16, {5, 160}), "/inputs/hidden_states", "needs attribute dtype = \"bfloat16\""},
      {"HiddenF32TaggedBf16", with_dtype(replace("/inputs/hidden_states", F32, {5, 160}), "/inputs/hidden_states", "bfloat16"),
       "/inputs/hidden_states@dtype", "must be \"float32\" for float32 data"},
      {"HiddenRank3", replace("/inputs/hidden_states", F32, {5, 160, 1}), "/inputs/hidden_states", "must have rank 2"},
      {"HiddenShape", replace("/inputs/hidden_states", F32, {5, 161}), "/inputs/hidden_states", "shape must be [T, H] = [5, 160]"},
      {"HiddenZeroTokens", replace("/inputs/hidden_states", F32, {0, 160}), "/inputs/hidden_states", "tokens T) must be in [1, 2^24]"},
      {"LogitsInt8", replace("/inputs/router_logits", I8, {5, 8}), "/inputs/router_logits", "must be float32; got int8"},
      {"LogitsShape", replace("/inputs/router_logits", F32, {5, 7}), "/inputs/router_logits", "shape must be [T, E] = [5, 8]"},
      {"LogitsTokensDiffer", replace("/inputs/router_logits", F32, {6, 8}), "/inputs/router_logits", "shape must be [T, E] = [5, 8]"},
      {"InputsUnknownDataset", replace("/inputs/hidden_state", F32, {5, 160}), "/inputs/hidden_state", "unknown dataset"},
      {"Fp8WithoutScale", remove("/inputs/hidden_states_scale"), "/inputs/hidden_states_scale", "both or neither"},
      {"Fp8DtypeE5M2", [](H5::H5File& f) { test::set_attr(f.openDataSet("/inputs/hidden_states_fp8"), "dtype", std::string("float8_e5m2")); },
       "/inputs/hidden_states_fp8@dtype", "must be \"float8_e4m3fn\""},
      {"Fp8ScaleShape", replace("/inputs/hidden_states_scale", F32, {5, 1}), "/inputs/hidden_states_scale", "shape must be [T, ceil(H/128)] = [5, 2]"},
      {"BiasMissingForDeepseek", remove("/inputs/routing_bias"), "/inputs/routing_bias", "required dataset missing"},
      {"BiasForRenormalize", replace("/inputs/routing_bias", F32, {8}), "/inputs/routing_bias", "does not use a routing bias", false, renormalize_base},
      {"BiasShape", replace("/inputs/routing_bias", F32, {9}), "/inputs/routing_bias", "shape must be [E] = [8]"},
      {"HiddenIsGroup", [](H5::H5File& f) { f.unlink("/inputs/hidden_states"); f.createGroup("/inputs/hidden_states"); },
       "/inputs/hidden_states", "must be a dataset, got a group"},
      {"HiddenChunkedUnwritten",
       [](H5::H5File& f) {
         f.unlink("/inputs/hidden_states");
         const hsize_t d[2] = {5, 160}, c[2] = {1, 160};
         H5::DSetCreatPropList p;
         p.setChunk(2, c);
         f.createDataSet("/inputs/hidden_states", H5::PredType::IEEE_F32LE, H5::DataSpace(2, d), p);
       },
       "/inputs/hidden_states", "no data written"},
      {"HiddenPartlyWritten",
       [](H5::H5File& f) {
         f.unlink("/inputs/hidden_states");
         const hsize_t d[2] = {5, 160}, c[2] = {1, 160};
         H5::DSetCreatPropList p;
         p.setChunk(2, c);
         H5::DataSet ds = f.createDataSet("/inputs/hidden_states", H5::PredType::IEEE_F32LE, H5::DataSpace(2, d), p);
         std::vector<float> row(160, 1.0f);
         H5::DataSpace fs = ds.getSpace();
         const hsize_t off[2] = {0, 0}, cnt[2] = {1, 160};
         fs.selectHyperslab(H5S_SELECT_SET, cnt, off);
         ds.write(row.data(), H5::PredType::NATIVE_FLOAT, H5::DataSpace(2, cnt), fs);
       },
       "/inputs/hidden_states", "only 1 of 5 chunks are written"},
      // /weights
      {"W13Missing", remove("/weights/w13"), "/weights/w13", "required dataset missing"},
      {"W13Float64Codes", replace("/weights/w13", F64, {8, 192, 160}), "/weights/w13", "must be uint8 holding float8_e4m3fn codes"},
      {"W13WithoutDtype", replace("/weights/w13", U8, {8, 192, 160}), "/weights/w13", "need attribute dtype = \"float8_e4m3fn\""},
      {"W13Shape", with_dtype(replace("/weights/w13", U8, {8, 96, 160}), "/weights/w13", "float8_e4m3fn"), "/weights/w13",
       "shape must be [E_stored, 2I, H] = [8, 192, 160]"},
      {"W2ScaleShape", replace("/weights/w2_scale", F32, {8, 2, 2}), "/weights/w2_scale", "shape must be [E_stored, ceil(H/128), ceil(I/128)] = [8, 2, 1]"},
      {"W13ScaleFloat64", replace("/weights/w13_scale", F64, {8, 2, 2}), "/weights/w13_scale", "must be float32"},
      {"ExpertIdsNotIncreasing", [](H5::H5File& f) { test::replace_dataset(f, "/weights/expert_ids", H5::PredType::STD_I32LE, {8}, 1.0); },
       "/weights/expert_ids", "strictly increasing"},
      {"ExpertIdsOutOfRange", replace("/weights/expert_ids", I32, {1}, 8.0), "/weights/expert_ids", "outside the local experts [0, 8)"},
      {"ExpertIdsTooMany", replace("/weights/expert_ids", I64, {9}, 0.0), "/weights/expert_ids", "length must be in [1, local_num_experts = 8]"},
      {"ExpertIdsFloat", replace("/weights/expert_ids", F32, {8}), "/weights/expert_ids", "must be an integer type"},
      {"ExpertIdsLengthVsWeights", replace("/weights/expert_ids", I32, {1}, 3.0), "/weights/w13", "shape must be [E_stored, 2I, H] = [1, 192, 160]"},
      // /outputs and /reference
      {"OutputWithoutOutput", [](H5::H5File& f) { f.createGroup("/outputs"); f.createGroup("/outputs/x"); },
       "/outputs/x/output", "required dataset missing"},
      {"OutputShape", [](H5::H5File& f) { f.createGroup("/outputs"); f.createGroup("/outputs/x"); test::replace_dataset(f, "/outputs/x/output", H5::PredType::IEEE_F32LE, {5, 8}); },
       "/outputs/x/output", "shape must be [T, H] = [5, 160]"},
      {"OutputTopkIdsFloat",
       [](H5::H5File& f) {
         f.createGroup("/outputs");
         f.createGroup("/outputs/x");
         test::replace_dataset(f, "/outputs/x/output", H5::PredType::IEEE_F32LE, {5, 160});
         test::replace_dataset(f, "/outputs/x/topk_ids", H5::PredType::IEEE_F32LE, {5, 2});
       },
       "/outputs/x/topk_ids", "must be an integer type"},
      {"OutputUnknownDataset",
       [](H5::H5File& f) {
         f.createGroup("/outputs");
         f.createGroup("/outputs/x");
         test::replace_dataset(f, "/outputs/x/output", H5::PredType::IEEE_F32LE, {5, 160});
         test::replace_dataset(f, "/outputs/x/topk_weight", H5::PredType::IEEE_F32LE, {5, 2});
       },
       "/outputs/x/topk_weight", "unknown dataset"},
      {"OutputBadName", [](H5::H5File& f) { f.createGroup("/outputs"); f.createGroup("/outputs/a b"); }, "/outputs/a b", "output names are"},
      {"OutputIsDataset", [](H5::H5File& f) { f.createGroup("/outputs"); test::replace_dataset(f, "/outputs/x", H5::PredType::IEEE_F32LE, {5, 160}); },
       "/outputs/x", "must be a group, got a dataset"},
      {"OutputBackendNotString",
       [](H5::H5File& f) {
         f.createGroup("/outputs");
         test::set_attr(f.createGroup("/outputs/x"), "backend", int64_t(1));
         test::replace_dataset(f, "/outputs/x/output", H5::PredType::IEEE_F32LE, {5, 160});
       },
       "/outputs/x@backend", "must be a string"},
      // /outputs/<name>/ranks (the small case: E = 8, I = 96, so only ep splits it)
      {"RanksWithoutShard", output_with_ranks("", {{"0", {5, 160}}, {"1", {5, 160}}}), "/outputs/x/ranks@shard",
       "required attribute missing"},
      {"RanksShardNotAPlan", output_with_ranks("ep2", {{"0", {5, 160}}, {"1", {5, 160}}}), "/outputs/x/ranks@shard",
       "must be \"tp N\" or \"ep N\" with N in [1, 4096], got \"ep2\""},
      {"RanksShardZero", output_with_ranks("ep 0", {}), "/outputs/x/ranks@shard", "got \"ep 0\""},
      {"RanksShardTpBreaksBlocks", output_with_ranks("tp 2", {{"0", {5, 160}}, {"1", {5, 160}}}), "/outputs/x/ranks@shard",
       "intermediate_size I = 96 must split into 2 equal slices"},
      {"RanksShardEpNotDividing", output_with_ranks("ep 3", {{"0", {5, 160}}, {"1", {5, 160}}, {"2", {5, 160}}}),
       "/outputs/x/ranks@shard", "num_experts E = 8 does not divide into 3"},
      {"RanksTooFew", output_with_ranks("ep 4", {{"0", {5, 160}}, {"1", {5, 160}}}), "/outputs/x/ranks",
       "holds 2 members; shard = \"ep 4\" needs one dataset per rank, named 0 to 3"},
      {"RanksTooMany", output_with_ranks("ep 2", {{"0", {5, 160}}, {"1", {5, 160}}, {"2", {5, 160}}}), "/outputs/x/ranks",
       "holds 3 members"},
      {"RankBadName", output_with_ranks("ep 2", {{"0", {5, 160}}, {"01", {5, 160}}}), "/outputs/x/ranks/01",
       "unknown dataset (this group holds only 0, 1)"},
      {"RankWrongShape", output_with_ranks("ep 2", {{"0", {5, 160}}, {"1", {5, 8}}}), "/outputs/x/ranks/1",
       "shape must be [T, H] = [5, 160], got [5, 8]"},
      {"RankWrongRank", output_with_ranks("ep 2", {{"0", {5, 160}}, {"1", {800}}}), "/outputs/x/ranks/1", "must have rank 2"},
      {"RankBf16WithoutDtype",
       [](H5::H5File& f) {
         output_with_ranks("ep 2", {{"0", {5, 160}}})(f);
         test::replace_dataset(f, "/outputs/x/ranks/1", H5::PredType::STD_U16LE, {5, 160});
       },
       "/outputs/x/ranks/1", "uint16 data needs attribute dtype = \"bfloat16\""},
      {"RankIsGroup",
       [](H5::H5File& f) {
         output_with_ranks("ep 2", {{"0", {5, 160}}})(f);
         f.createGroup("/outputs/x/ranks/1");
       },
       "/outputs/x/ranks/1", "must be a dataset, got a group"},
      {"RanksIsDataset",
       [](H5::H5File& f) {
         f.createGroup("/outputs");
         f.createGroup("/outputs/x");
         test::replace_dataset(f, "/outputs/x/output", H5::PredType::IEEE_F32LE, {5, 160});
         test::replace_dataset(f, "/outputs/x/ranks", H5::PredType::IEEE_F32LE, {5, 160});
       },
       "/outputs/x/ranks", "must be a group, got a dataset"},
      {"RanksOfAShard", output_with_ranks("ep 2", {{"0", {5, 160}}, {"1", {5, 160}}}), "/outputs/x/ranks@shard",
       "the case must hold the whole layer",
       false,
       [](SmallCase& s) {
         s.header.config.local_expert_offset = 4, s.header.config.local_num_experts = 4;
         s.experts.resize(4);
       }},
      {"ReferenceTopkIdsInt64",
       [](H5::H5File& f) {
         f.createGroup("/reference");
         H5::Group g = f.createGroup("/reference/quantized");
         test::set_attr(g, "tool_version", std::string("t"));
         test::set_attr(g, "input_hash", std::string("h"));
         test::replace_dataset(f, "/reference/quantized/output", H5::PredType::IEEE_F64LE, {5, 160});
         test::replace_dataset(f, "/reference/quantized/topk_ids", H5::PredType::STD_I64LE, {5, 2});
         test::replace_dataset(f, "/reference/quantized/topk_weights", H5::PredType::IEEE_F64LE, {5, 2});
         test::replace_dataset(f, "/reference/quantized/selection_margin", H5::PredType::IEEE_F64LE, {5});
       },
       "/reference/quantized/topk_ids", "must be int32; got int64"},
      {"ReferenceUnknownTier", [](H5::H5File& f) { f.createGroup("/reference"); f.createGroup("/reference/best"); }, "/reference/best", "unknown reference tier"},
      {"ReferenceWithoutToolVersion", [](H5::H5File& f) { f.createGroup("/reference"); f.createGroup("/reference/ideal"); },
       "/reference/ideal@tool_version", "required attribute missing"},
      {"ReferenceOutputFloat32",
       [](H5::H5File& f) {
         f.createGroup("/reference");
         H5::Group g = f.createGroup("/reference/ideal");
         test::set_attr(g, "tool_version", std::string("t"));
         test::set_attr(g, "input_hash", std::string("h"));
         test::replace_dataset(f, "/reference/ideal/output", H5::PredType::IEEE_F32LE, {5, 160});
         test::replace_dataset(f, "/reference/ideal/topk_ids", H5::PredType::STD_I32LE, {5, 2});
         test::replace_dataset(f, "/reference/ideal/topk_weights", H5::PredType::IEEE_F64LE, {5, 2});
         test::replace_dataset(f, "/reference/ideal/selection_margin", H5::PredType::IEEE_F64LE, {5});
       },
       "/reference/ideal/output", "must be float64"},
      // Data rules (validate() only)
      {"HiddenNaN", [](H5::H5File& f) { test::replace_dataset(f, "/inputs/hidden_states", H5::PredType::IEEE_F32LE, {5, 160}, std::nan("")); },
       "/inputs/hidden_states", "must be finite; 800 values are not finite (first at token 0, column 0", true},
      {"LogitInf", [](H5::H5File& f) { test::poke_float(f, "/inputs/router_logits", 13, INFINITY); },
       "/inputs/router_logits", "must be finite; 1 value is not finite (first at token 1, column 5: inf)", true},
      {"BiasNaN", [](H5::H5File& f) { test::poke_float(f, "/inputs/routing_bias", 3, kNaN); }, "/inputs/routing_bias", "must be finite", true},
      {"W13NaNCode", [](H5::H5File& f) { test::poke_byte(f, "/weights/w13", 3 * 192 * 160 + 161, 0x7F); },
       "/weights/w13", "1 code is NaN (first at expert 3, row 1, column 1)", true},
      {"W2NegativeNaNCode", [](H5::H5File& f) { test::poke_byte(f, "/weights/w2", 5, 0xFF); }, "/weights/w2", "must not hold the NaN codes", true},
      {"W13ScaleNaN", [](H5::H5File& f) { test::poke_float(f, "/weights/w13_scale", 6, kNaN); },
       "/weights/w13_scale", "scales must be finite and > 0; 1 scale is not (first at expert 1, block [1, 0]: nan)", true},
      {"W2ScaleNegative", [](H5::H5File& f) { test::poke_float(f, "/weights/w2_scale", 0, -0.5f); }, "/weights/w2_scale", "finite and > 0", true},
      {"W2ScaleZero", [](H5::H5File& f) { test::poke_float(f, "/weights/w2_scale", 15, 0.0f); }, "/weights/w2_scale", "finite and > 0", true},
      {"Ue8m0NotPowerOfTwo", [](H5::H5File& f) { test::poke_float(f, "/weights/w13_scale", 2, 0.75f); },
       "/weights/w13_scale", "ue8m0 needs powers of two", true,
       [](SmallCase& s) { s.header.config.scale_format = ScaleFormat::ue8m0; }},
      {"HiddenFp8NaNCode", [](H5::H5File& f) { test::poke_byte(f, "/inputs/hidden_states_fp8", 7, 0x7F); },
       "/inputs/hidden_states_fp8", "must not hold the NaN codes", true},
      {"HiddenScaleNegative", [](H5::H5File& f) { test::poke_float(f, "/inputs/hidden_states_scale", 1, -1.0f); },
       "/inputs/hidden_states_scale", "finite and > 0", true},
  };
}

class CaseRule : public ::testing::TestWithParam<RuleCase> {};

bool lists(const std::vector<Problem>& ps, const RuleCase& c) {
  for (const Problem& p : ps)
    if (p.where == c.where && p.rule.find(c.rule) != std::string::npos) return true;
  return false;
}

std::string dump(const std::vector<Problem>& ps) {
  std::string s;
  for (const Problem& p : ps) s += "\n  " + p.where + ": " + p.rule;
  return s;
}

TEST_P(CaseRule, IsReportedWithFileWhereAndRule) {
  const RuleCase& c = GetParam();
  test::TempDir dir("rule");
  SmallCase s = test::small_case();
  if (c.base) c.base(s);
  const std::string path = dir.file("case.h5");
  test::write_case(path, s);
  ASSERT_TRUE(CaseReader(path).validate().empty()) << "the unmodified case must be valid";
  test::mutate(path, c.edit);

  if (c.data_only) {
    const CaseReader r(path);  // structure fine
    const auto problems = r.validate();
    EXPECT_TRUE(lists(problems, c)) << "expected " << c.where << ": " << c.rule << "\ngot:" << dump(problems);
    return;
  }
  try {
    const CaseReader r(path);
    FAIL() << "opened without error; expected " << c.where << ": " << c.rule;
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(e.where(), c.where) << e.what();
    EXPECT_NE(e.rule().find(c.rule), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  const CaseReader lenient(path, CaseOpen::lenient);
  EXPECT_TRUE(lists(lenient.validate(), c)) << "lenient reader:" << dump(lenient.validate());
}

INSTANTIATE_TEST_SUITE_P(Rules, CaseRule, ::testing::ValuesIn(rule_cases()),
                         [](const ::testing::TestParamInfo<RuleCase>& i) { return i.param.name; });

TEST(CaseRules, LenientReaderCollectsEveryProblem) {
  test::TempDir dir("many");
  const std::string path = dir.file("case.h5");
  test::write_case(path, test::small_case());
  test::mutate(path, [](H5::H5File& f) {
    test::set_attr(f.openGroup("/config"), "bogus", int64_t(1));
    test::replace_dataset(f, "/inputs/router_logits", H5::PredType::STD_I8LE, {5, 8});
    test::poke_float(f, "/weights/w2_scale", 0, -1.0f);
  });
  const auto problems = CaseReader(path, CaseOpen::lenient).validate();
  ASSERT_EQ(problems.size(), 2u) << dump(problems);  // config invalid: no data checks
  EXPECT_EQ(problems[0].where, "/config@bogus");
  EXPECT_EQ(problems[1].where, "/inputs/router_logits");
  test::mutate(path, [](H5::H5File& f) { f.openGroup("/config").removeAttr("bogus"); });
  const auto after = CaseReader(path, CaseOpen::lenient).validate();
  ASSERT_EQ(after.size(), 2u) << dump(after);
  EXPECT_EQ(after[0].where, "/inputs/router_logits");
  EXPECT_EQ(after[1].where, "/weights/w2_scale");
}

}  // namespace
}  // namespace moecheck
