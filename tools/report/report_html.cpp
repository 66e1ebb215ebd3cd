// The --html report of `moecheck compare` (report.hpp): one self-contained page, inline CSS and
// SVG (report_charts.cpp), no script and nothing fetched, so it renders offline in any browser
// and can be attached to a bug report as one file.
//
// Page: header (run facts, the ratio legend, the closing line), then one <section> per output:
// verdict, charts (expert bars; scatter and heatmap side by side), routing table, token-local
// failures, per-expert table (worst first; passing experts past the first 20 folded into a
// <details>), familiar metrics, and for a layer over ranks its ranks and reduction. Every piece
// of text from the case or the command line goes through esc().
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "reference/compare_sharded.hpp"
#include "tools/report/report_html_parts.hpp"

namespace moecheck::report::html {

std::string esc(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

namespace {

constexpr size_t kExpertRows = 20;    // passing experts shown before the <details> fold
constexpr size_t kRoutingRows = 200;  // tokens listed per routing category

constexpr const char* kStyle = R"(
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;margin:16px auto;max-width:1220px;padding:0 12px}
h1{font-size:20px;margin:4px 0}h2{font-size:17px;margin:28px 0 6px;border-bottom:2px solid #ccc;padding-bottom:3px}
h3{font-size:14px;margin:16px 0 4px}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #d8d8d8;padding:2px 7px;text-align:right}
th{background:#f2f2f2}td.l,th.l{text-align:left}tr.failrow td{background:#fdecea}
.ctx td{text-align:left;border:none;padding:1px 10px 1px 0}.ctx td:first-child{color:#666}
.pass{color:#1b7f3b;font-weight:600}.fail{color:#c62828;font-weight:700}
.badge{display:inline-block;padding:1px 8px;border-radius:4px;color:#fff;font-weight:700}
.badge.pass{background:#2e7d32;color:#fff}.badge.fail{background:#c62828;color:#fff}
.legend-text{color:#444;margin:2px 0}.summary{font-size:15px;font-weight:700;margin:8px 0}
.charts{display:flex;flex-wrap:wrap;gap:8px}figure{margin:4px 0}figcaption{font-weight:600;margin-bottom:2px}
.caption{color:#555;font-size:12px;margin:2px 0 0;max-width:580px}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .tick{font-size:10px;fill:#555}svg .label{font-size:11px;fill:#222}
svg .note{font-size:11px;fill:#b71c1c}svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axis{stroke:#888}
svg .frame{fill:none;stroke:#aaa}svg .budget-line{stroke:#c62828;stroke-width:1.5;stroke-dasharray:6 3}
svg .guide{stroke:#999;stroke-width:1;stroke-dasharray:2 3}
details summary{cursor:pointer;color:#333;margin:4px 0}code{background:#f4f4f4;padding:0 3px}
)";

std::string verdict(bool ok, const char* yes = "pass", const char* no = "FAIL") {
  return fmt::format("<span class='{}'>{}</span>", ok ? "pass" : "fail", ok ? yes : no);
}

std::string header_html(const ReportContext& ctx, const std::vector<CompareResult>& results) {
  const Totals t = totals(results);
  std::string s = fmt::format("<header><h1>moecheck compare <span class='badge {}'>{}</span></h1><table class='ctx'>",
                              t.pass() ? "pass" : "fail", t.pass() ? "PASS" : "FAIL");
  auto row = [&](const char* k, const std::string& v) {
    s += fmt::format("<tr><td>{}</td><td>{}</td></tr>", k, esc(v));
  };
  row("case", ctx.case_path.empty() ? "(not named)" : ctx.case_path);
  if (!ctx.config.empty()) row("config", ctx.config);
  row("tier", ctx.tier);
  if (!ctx.budget_model.empty()) row("budget model", ctx.budget_model);
  row("tool", "moecheck " + ctx.tool_version);
  if (ctx.reference_seconds >= 0)
    row("reference", fmt::format("computed in {:.2f} s{}", ctx.reference_seconds,
                                 ctx.reference_device.empty() ? "" : " on " + ctx.reference_device));
  s += "</table>";
  s += "<p class='legend-text'><b>ratio = |observed - reference| / budget</b>; an element passes when ratio &lt;= 1; "
       "budgets: <code>reference/BUDGETS.md</code>. Per expert: the max ratio of its elements, the bias test (fitted "
       "relative scale error &beta; &plusmn; SE against the allowance) and the energy test (observed / predicted error "
       "energy against its limit), BUDGETS.md &sect;7; an expert fails when any of the three fails.</p>";
  s += fmt::format("<p class='summary'>{}</p>", esc(closing_line(t)));
  if (results.size() > 1) {
    s += "<p>Outputs: ";
    for (size_t i = 0; i < results.size(); ++i)
      s += fmt::format("{}<a href='#output-{}'>{}</a> {}", i ? " &middot; " : "", i, esc(results[i].name),
                       verdict(results[i].pass));
    s += "</p>";
  }
  return s + "</header>";
}

std::string routing_html(const CompareResult& r) {
  std::string s = "<h3>Routing</h3>";
  if (r.mismatched_tokens == 0)
    return s + fmt::format("<p>No token of {} chose experts other than the reference's.</p>", r.tokens);
  s += fmt::format("<p>{} of {} tokens chose experts other than the reference's; {} of them accepted as near-ties "
                   "(BUDGETS.md &sect;6).</p>",
                   r.mismatched_tokens, r.tokens, r.ambiguous_tokens);
  s += "<table class='routing'><tr><th>token</th><th class='l'>kind</th><th class='l'>judged against</th></tr>";
  auto rows = [&](const std::vector<int64_t>& ids, const char* kind, const char* against, bool bad) {
    for (size_t i = 0; i < ids.size() && i < kRoutingRows; ++i)
      s += fmt::format("<tr{}><td>{}</td><td class='l'>{}</td><td class='l'>{}</td></tr>", bad ? " class='failrow'" : "",
                       ids[i], kind, against);
    if (ids.size() > kRoutingRows)
      s += fmt::format("<tr><td>...</td><td class='l' colspan='2'>{} more ({})</td></tr>", ids.size() - kRoutingRows, kind);
  };
  rows(r.mismatched, verdict(false, "", "mismatch").c_str(), "the reference's experts", true);
  rows(r.ambiguous, "near-tie, accepted", "the backend's experts (reference re-run)", false);
  return s + "</table>";
}

std::string token_failures_html(const CompareResult& r) {
  if (r.failing_tokens_unexplained.empty()) return "";
  const size_t n = r.failing_tokens_unexplained.size();
  std::string s = fmt::format("<h3>Token-local failures</h3><p>{} failing token{} that no failing expert explains.</p>"
                              "<table class='tokens'><tr><th>token</th><th>max ratio</th><th>at column</th></tr>",
                              n, n == 1 ? "" : "s");
  size_t shown = 0;
  for (int64_t t : r.failing_tokens_unexplained) {
    if (shown++ == kRoutingRows) break;
    double m = 0;
    int64_t col = -1;
    if (token_worst(r, t, &m, &col))
      s += fmt::format("<tr class='failrow'><td>{}</td><td>{}</td><td>{}</td></tr>", t, num(m), col);
    else
      s += fmt::format("<tr class='failrow'><td>{}</td><td>-</td><td>-</td></tr>", t);
  }
  return s + "</table>";
}

std::string token_scale_html(const CompareResult& r) {
  std::string rows;
  size_t n = 0;
  for (const TokenScale& t : r.token_scale) {
    if (t.ok) continue;
    if (n++ < kRoutingRows)
      rows += fmt::format("<tr class='failrow'><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", t.token, num(t.beta),
                          num(t.se), num(t.detectable));
  }
  if (n == 0) return "";
  return fmt::format("<h3>Token scale test</h3><p>{} token{} whose row, fitted as (1 + beta) times the reference, "
                     "is off by more than the test allows.</p><table class='tokens'><tr><th>token</th><th>beta</th>"
                     "<th>SE</th><th>detectable above</th></tr>",
                     n, n == 1 ? "" : "s") +
         rows + "</table>";
}

std::string expert_row(const ExpertVerdict& v) {
  const bool elem_ok = !v.blamed && v.max_ratio <= 1.0;
  return fmt::format(
      "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} &plusmn; {}</td><td>{}</td><td>{}</td>"
      "<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
      v.pass ? "" : " class='failrow'", v.expert, v.tokens, v.slots, elem_ok ? num(v.max_ratio) : verdict(false, "", num(v.max_ratio).c_str()),
      num(v.rel_l2), num(v.beta), num(v.beta_se), num(v.beta_allow), verdict(v.bias_ok, "ok"), num(v.energy_ratio),
      num(v.energy_limit), verdict(v.energy_ok, "ok"), verdict(v.pass));
}

std::string experts_html(const CompareResult& r) {
  const size_t failing = std::count_if(r.experts.begin(), r.experts.end(), [](auto& v) { return !v.pass; });
  std::string s = fmt::format("<h3>Experts</h3><p>{} local experts with tokens, {} failing; worst first.</p>",
                              r.experts.size(), failing);
  if (r.experts.empty()) return s;
  const std::string head =
      "<tr><th>expert</th><th>tokens</th><th>slots</th><th>max ratio</th><th>rel-L2</th><th>bias &beta; &plusmn; SE</th>"
      "<th>allowance</th><th>bias</th><th>energy ratio</th><th>limit</th><th>energy</th><th>verdict</th></tr>";
  s += "<table class='experts'>" + head;
  std::string folded;
  size_t shown = 0, n_folded = 0;
  for (const ExpertVerdict& v : r.experts) {
    if (v.pass && shown >= kExpertRows) {
      folded += expert_row(v);
      ++n_folded;
      continue;
    }
    ++shown;
    s += expert_row(v);
  }
  s += "</table>";
  if (n_folded)
    s += fmt::format("<details><summary>... {} more experts, all pass</summary><table class='experts'>{}{}</table></details>",
                     n_folded, head, folded);
  return s;
}

std::string metrics_html(const CompareResult& r) {
  const FamiliarMetrics& m = r.metrics;
  std::string s = "<h3>Familiar metrics</h3><p>What engines' own tests compute, on the same data "
                  "(thresholds from their test suites, not derived for this case).</p><table class='metrics'>"
                  "<tr><th class='l'>metric</th><th>value</th><th class='l'>familiar check</th><th>would pass</th></tr>";
  auto row = [&](const char* name, const std::string& value, const char* check, int ok) {
    s += fmt::format("<tr><td class='l'>{}</td><td>{}</td><td class='l'>{}</td><td>{}</td></tr>", name, value, check,
                     ok < 0 ? "" : verdict(ok == 1));
  };
  row("max abs", num(m.max_abs), "", -1);
  row("max rel (|ref| &gt;= 1e-3 max|ref|)", num(m.max_rel), "", -1);
  row("rel-L2", num(m.rel_l2), "", -1);
  row("SQNR", num(m.sqnr_db) + " dB", "", -1);
  row("cosine diff (DeepGEMM calc_diff)", num(m.cos_diff), "DeepGEMM calc_diff &lt; 1e-3", m.deepgemm_pass);
  row("mean-rel", num(m.mean_rel), "SGLang mean-rel &lt; 0.02", m.sglang_pass);
  row("within atol=rtol=0.035", fmt::format("{:.2f}%", 100 * m.allclose_fraction), "vLLM atol=rtol=0.035, every element",
      m.vllm_pass);
  row("NMSE", num(m.nmse), "NMSE &lt; 5e-3 (llama.cpp MoE)", m.nmse_pass);
  row("non-finite elements", std::to_string(m.nonfinite), "", -1);
  s += "</table>";
  const bool all = m.deepgemm_pass && m.sglang_pass && m.vllm_pass && m.nmse_pass;
  if (!r.pass && all) s += "<p class='fail'>Every familiar check passes this output; its budget checks do not.</p>";
  if (r.pass && !all) s += "<p>A familiar check fails although every check against the derived budget passes.</p>";
  return s;
}

// A layer over ranks: a row per rank (against its shard's reference) and the reduction's line.
std::string sharding_html(const CompareResult& r) {
  if (!r.sharded) return "";
  const ShardedVerdict& v = *r.sharded;
  std::string s = fmt::format("<h3>Ranks ({})</h3><p>The checks above judge the whole layer. Each rank's partial output "
                              "against its own shard's reference, and the output against the float32 all-reduce of "
                              "the recorded partials (BUDGETS.md &sect;12): {}.</p>",
                              esc(to_string(v.plan)), verdict(v.pass()));
  s += "<table class='ranks'><tr><th>rank</th><th>max ratio</th><th>elements over</th><th>checks failed</th>"
       "<th class='l'>failing experts</th><th>verdict</th></tr>";
  for (size_t i = 0; i < v.ranks.size(); ++i) {
    const CompareResult& x = v.ranks[i];
    std::string failing;
    for (const int64_t e : failing_expert_ids(x)) failing += (failing.empty() ? "" : ", ") + std::to_string(e);
    s += fmt::format("<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{} of {}</td><td class='l'>{}</td><td>{}</td></tr>",
                     x.pass ? "" : " class='failrow'", i, num(x.max_ratio), x.elements_over, x.checks_failed, x.checks,
                     failing, verdict(x.pass));
  }
  s += fmt::format("</table><p>Reduction: {} element{} outside the float32 all-reduce of the ranks' partials",
                   v.reduction_outside, v.reduction_outside == 1 ? "" : "s");
  if (v.blamed_rank >= 0)
    s += fmt::format("; the residual is rank {}'s partial &times; {:.3f} ({:.0f}% of its energy)", v.blamed_rank,
                     v.blamed_beta, 100 * v.blamed_share);
  return s + ": " + verdict(v.reduction_pass()) + ".</p>";
}

std::string output_html(const CompareResult& r, const OutputData* data, size_t index) {
  const std::string word = verdict_word(r);
  std::string s = fmt::format("<section class='output' id='output-{}'><h2><span class='badge {}'>{}</span> {}</h2>", index,
                              word == "PASS" ? "pass" : "fail", word, esc(r.name));
  s += fmt::format("<p>max ratio <b>{}</b>", num(r.max_ratio));
  if (r.worst_token >= 0) s += fmt::format(" at token {}, column {}", r.worst_token, r.worst_col);
  s += fmt::format("; {} of {} elements over budget; {} of {} checks failed.</p>", r.elements_over, r.elements,
                   r.checks_failed, r.checks);
  s += fmt::format("<p>Budget model <b>{}</b>: {}.</p>", esc(budget_model_name(r.model.acc)),
                   esc(describe_budget_model(r.model)));
  s += fmt::format("<p>Power (BUDGETS.md &sect;10.6): {}.</p>", esc(power_line(r)));
  s += "<figure><figcaption>Max ratio per expert (bars by global expert id; dashed line: the budget)</figcaption>" +
       expert_bars_svg(r) + "</figure>";
  s += "<div class='charts'><figure><figcaption>Error against magnitude</figcaption>" + scatter_svg(r, data, index) +
       "</figure><figure><figcaption>Max ratio per token and hidden block</figcaption>" + heatmap_svg(r) +
       "</figure></div>";
  s += routing_html(r) + token_failures_html(r) + token_scale_html(r) + experts_html(r) + metrics_html(r) +
       sharding_html(r);
  return s + "</section>";
}

}  // namespace

}  // namespace moecheck::report::html

namespace moecheck::report {

std::string render_html(const ReportContext& ctx, const std::vector<CompareResult>& results) {
  using namespace html;
  const Totals t = totals(results);
  std::string s = "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
                  "<meta name='viewport' content='width=device-width, initial-scale=1'>";
  s += fmt::format("<title>moecheck compare {}: {}</title>", t.pass() ? "PASS" : "FAIL",
                   esc(ctx.case_path.empty() ? "(case not named)" : ctx.case_path));
  s += std::string("<style>") + kStyle + "</style></head><body>\n";
  s += header_html(ctx, results) + "\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const OutputData* d = i < ctx.data.size() ? &ctx.data[i] : nullptr;
    s += output_html(results[i], d, i) + "\n";
  }
  s += fmt::format("<footer><p class='summary'>{}</p></footer></body></html>\n", esc(closing_line(t)));
  return s;
}

void write_html_file(const std::string& path, const ReportContext& ctx, const std::vector<CompareResult>& results) {
  write_file_atomically(path, render_html(ctx, results), "--html");
}

}  // namespace moecheck::report
