// The --json report of `moecheck compare` (report.hpp). The schema is tools/report/REPORT-SCHEMA.md;
// any change to a key's name or meaning bumps kSchemaVersion. Keys keep insertion order
// (ordered_json) so the document reads in the order of the terminal report.
//
// JSON has no Infinity or NaN: every number that may be non-finite goes through real(), which
// writes the strings "inf", "-inf" and "nan" instead (ratios are infinite wherever a budget of 0
// meets a nonzero difference or the backend wrote a non-finite value).
#include <cmath>
#include <nlohmann/json.hpp>

#include "reference/compare_sharded.hpp"
#include "tools/report/report.hpp"

namespace moecheck::report {

namespace {

using Json = nlohmann::ordered_json;

Json real(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

const char* status(bool pass) { return pass ? "pass" : "fail"; }

Json expert_json(const ExpertVerdict& v) {
  Json e;
  e["expert"] = v.expert;
  e["tokens"] = v.tokens;
  e["slots"] = v.slots;
  e["max_ratio"] = real(v.max_ratio);
  e["rel_l2"] = real(v.rel_l2);
  e["blamed"] = v.blamed;
  e["bias"] = {{"beta", real(v.beta)},
               {"se", real(v.beta_se)},
               {"allow", real(v.beta_allow)},
               {"ok", v.bias_ok},
               {"detectable", real(v.beta_detectable)}};
  e["energy"] = {{"ratio", real(v.energy_ratio)}, {"limit", real(v.energy_limit)}, {"ok", v.energy_ok}};
  e["status"] = status(v.pass);
  return e;
}

Json metrics_json(const FamiliarMetrics& m) {
  Json j;
  j["max_abs"] = real(m.max_abs);
  j["max_rel"] = real(m.max_rel);
  j["rel_l2"] = real(m.rel_l2);
  j["sqnr_db"] = real(m.sqnr_db);
  j["cos_diff"] = real(m.cos_diff);
  j["mean_rel"] = real(m.mean_rel);
  j["nmse"] = real(m.nmse);
  j["allclose_fraction"] = real(m.allclose_fraction);
  j["nonfinite"] = m.nonfinite;
  j["familiar_checks"] = {{"deepgemm_calc_diff", m.deepgemm_pass},
                          {"sglang_mean_rel", m.sglang_pass},
                          {"vllm_assert_close", m.vllm_pass},
                          {"nmse", m.nmse_pass}};
  return j;
}

// A layer over ranks (reference/compare_sharded.hpp).
Json sharding_json(const ShardedVerdict& v) {
  Json ranks = Json::array();
  for (size_t i = 0; i < v.ranks.size(); ++i) {
    const CompareResult& x = v.ranks[i];
    ranks.push_back({{"rank", int64_t(i)},
                     {"status", verdict_label(x)},
                     {"max_ratio", real(x.max_ratio)},
                     {"worst", x.worst_token >= 0 ? Json{{"token", x.worst_token}, {"col", x.worst_col}} : Json(nullptr)},
                     {"elements_over", x.elements_over},
                     {"checks", x.checks},
                     {"checks_failed", x.checks_failed},
                     {"failing_experts", failing_expert_ids(x)}});
  }
  const bool blamed = v.blamed_rank >= 0;
  Json reduction = {{"status", status(v.reduction_pass())},
                    {"elements_outside", v.reduction_outside},
                    {"blamed_rank", blamed ? Json(v.blamed_rank) : Json(nullptr)},
                    {"beta", blamed ? real(v.blamed_beta) : Json(nullptr)},
                    {"share", blamed ? real(v.blamed_share) : Json(nullptr)}};
  return {{"shard", to_string(v.plan)}, {"status", status(v.pass())}, {"failing_ranks", v.failing_ranks()},
          {"ranks", std::move(ranks)}, {"reduction", std::move(reduction)}};
}

Json output_json(const CompareResult& r) {
  Json o;
  o["name"] = r.name;
  o["status"] = verdict_label(r);
  o["budget_model"] = budget_model_name(r.model.acc);
  o["budget_model_description"] = describe_budget_model(r.model);
  o["checks"] = r.checks;
  o["checks_failed"] = r.checks_failed;
  o["tokens"] = r.tokens;
  o["hidden"] = r.hidden;
  o["top_k"] = r.top_k;
  o["max_ratio"] = real(r.max_ratio);
  o["worst"] = r.worst_token >= 0 ? Json{{"token", r.worst_token}, {"col", r.worst_col}} : Json(nullptr);
  o["elements"] = r.elements;
  o["elements_over"] = r.elements_over;
  o["routing"] = {{"mismatched_tokens", r.mismatched_tokens},
                  {"ambiguous_tokens", r.ambiguous_tokens},
                  {"mismatched", r.mismatched},
                  {"ambiguous", r.ambiguous}};
  Json experts = Json::array();
  for (const ExpertVerdict& v : r.experts) experts.push_back(expert_json(v));
  o["experts"] = std::move(experts);
  Json failures = Json::array();
  for (int64_t t : r.failing_tokens_unexplained) {
    double m = 0;
    int64_t col = -1;
    const bool have = token_worst(r, t, &m, &col);
    failures.push_back({{"token", t}, {"max_ratio", have ? real(m) : Json(nullptr)}, {"col", have ? Json(col) : Json(nullptr)}});
  }
  o["token_failures"] = std::move(failures);
  Json scale = Json::array();
  for (const TokenScale& t : r.token_scale)
    if (!t.ok)
      scale.push_back({{"token", t.token}, {"beta", real(t.beta)}, {"se", real(t.se)}, {"detectable", real(t.detectable)}});
  o["token_scale_failures"] = std::move(scale);
  o["output_scale"] = {{"beta", real(r.output_scale.beta)}, {"se", real(r.output_scale.se)},
                       {"detectable", real(r.output_scale.detectable)}, {"ok", r.output_scale.ok}};
  o["requant"] = {{"beta", real(r.requant.beta)},   {"se", real(r.requant.se)},
                  {"allow", real(r.requant.allow)}, {"detectable", real(r.requant.detectable)},
                  {"ok", r.requant.ok},             {"fitted", r.requant.fitted}};
  o["power"] = {{"scale_error", real(r.power.scale_output)},
                {"scale_error_any_expert", real(r.power.scale_any_expert)},
                {"token_scale_error", real(r.power.token_scale)},
                {"token_scale_error_median", real(r.power.token_scale_median)},
                {"token_rel_l2", real(r.power.token_rel_l2)},
                {"token_rel_l2_median", real(r.power.token_rel_l2_median)},
                {"budget_over_magnitude", real(r.power.over_magnitude)},
                {"noise_over_magnitude", real(r.power.noise_over_magnitude)},
                {"z", real(r.aggregate_z)},
                {"vacuous", r.power.vacuous}};
  o["metrics"] = metrics_json(r.metrics);
  if (r.sharded) o["sharding"] = sharding_json(*r.sharded);  // absent for a one-device output
  return o;
}

}  // namespace

std::string render_json(const ReportContext& ctx, const std::vector<CompareResult>& results) {
  const Totals t = totals(results);
  Json doc;
  doc["schema_version"] = kSchemaVersion;
  doc["tool_version"] = ctx.tool_version;
  doc["case"] = ctx.case_path;
  doc["config"] = ctx.config;
  doc["tier"] = ctx.tier;
  doc["budget_model"] = ctx.budget_model;
  doc["reference_seconds"] = ctx.reference_seconds >= 0 ? Json(ctx.reference_seconds) : Json(nullptr);
  doc["reference_device"] = ctx.reference_device.empty() ? Json(nullptr) : Json(ctx.reference_device);
  doc["status"] = !t.pass() && t.checks_failed == 0 && t.outputs_vacuous > 0 ? "vacuous" : status(t.pass());
  doc["checks"] = t.checks;
  doc["checks_failed"] = t.checks_failed;
  doc["summary"] = closing_line(t);
  Json outs = Json::array();
  for (const CompareResult& r : results) outs.push_back(output_json(r));
  doc["outputs"] = std::move(outs);
  // Invalid UTF-8 in a name (an HDF5 attribute can hold any bytes) becomes U+FFFD, not an exception.
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void write_json_file(const std::string& path, const ReportContext& ctx, const std::vector<CompareResult>& results) {
  write_file_atomically(path, render_json(ctx, results), "--json");
}

}  // namespace moecheck::report
