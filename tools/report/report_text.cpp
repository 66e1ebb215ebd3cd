// The terminal report of `moecheck compare` (report.hpp): a legend of what the ratio means, then
// per output its verdict line, routing, per-expert table, token-local failures, the familiar
// metrics and, for a layer over ranks, its ranks and reduction, and the closing line "N of M checks exceeded their budget". Every line fits in
// kWidth columns (long names and paths are elided in the middle, long descriptions wrapped).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <sstream>

#include "reference/compare_sharded.hpp"
#include "tools/report/report.hpp"

namespace moecheck::report {

namespace {

constexpr size_t kWidth = 120;

struct Style {
  bool on = false;
  std::string paint(const std::string& s, const char* code) const {
    return on ? std::string("\x1b[") + code + "m" + s + "\x1b[0m" : s;
  }
  std::string bad(const std::string& s) const { return paint(s, "1;31"); }
  std::string good(const std::string& s) const { return paint(s, "32"); }
  std::string head(const std::string& s) const { return paint(s, "1"); }
  // A verdict word padded to `width` first, so colour codes do not disturb the columns.
  std::string verdict(bool ok, const char* yes, const char* no, size_t width = 0) const {
    const std::string w = fmt::format("{:>{}}", ok ? yes : no, width);
    return ok ? good(w) : bad(w);
  }
};

// "label  value", the value word-wrapped to the width with continuation lines aligned; a value
// too long for one line and made of "; "-separated parts starts each part on a new line.
void field(std::ostream& os, const std::string& label, const std::string& value) {
  const std::string lead = fmt::format("  {:<14}", label);
  if (lead.size() + value.size() > kWidth && value.find("; ") != std::string::npos) {
    const size_t cut = value.find("; ");
    field(os, label, value.substr(0, cut + 1));
    field(os, "", value.substr(cut + 2));
    return;
  }
  const size_t room = kWidth - lead.size();
  std::istringstream words(value);
  std::string word, line;
  bool first = true;
  auto flush = [&] {
    os << (first ? lead : std::string(lead.size(), ' ')) << line << '\n';
    first = false;
    line.clear();
  };
  while (words >> word) {
    word = elide(word, room);
    if (!line.empty() && line.size() + 1 + word.size() > room) flush();
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty() || first) flush();
}

// Token ids, as many of `ids` as fit in `room` columns (at most `max`), then a count of the rest.
std::string id_list(const std::vector<int64_t>& ids, size_t max, size_t room) {
  std::string s;
  size_t i = 0;
  for (; i < ids.size() && i < max; ++i) {
    const std::string next = (i ? ", " : "") + std::to_string(ids[i]);
    if (s.size() + next.size() + 18 > room) break;  // 18: room for ", ... (NNNN more)"
    s += next;
  }
  if (i < ids.size()) s += fmt::format("{}... ({} more)", i ? ", " : "", ids.size() - i);
  return s;
}

std::string plural(int64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

void write_header(std::ostream& os, const ReportContext& ctx, const Style& st) {
  os << st.head(fmt::format("moecheck compare (moecheck {})", ctx.tool_version)) << '\n';
  field(os, "case", ctx.case_path.empty() ? "(not named)" : ctx.case_path);
  if (!ctx.config.empty()) field(os, "config", ctx.config);
  field(os, "tier", ctx.tier);
  if (!ctx.budget_model.empty()) field(os, "budget model", ctx.budget_model);
  if (ctx.reference_seconds >= 0)
    field(os, "reference", fmt::format("computed in {:.2f} s{}", ctx.reference_seconds,
                                       ctx.reference_device.empty() ? "" : " on " + ctx.reference_device));
  os << "ratio = |observed - reference| / budget; an element passes when ratio <= 1; budgets: reference/BUDGETS.md\n"
     << "per expert: max ratio of its elements; bias test: fitted relative scale error beta +- SE against the\n"
     << "allowance; energy test: observed / predicted error energy against its limit (BUDGETS.md section 7);\n"
     << "an expert fails when any of the three fails.\n";
}

void write_routing(std::ostream& os, const CompareResult& r, const TextOptions& opt) {
  if (r.mismatched_tokens == 0) {
    os << fmt::format("  routing: no token of {} chose experts other than the reference's\n", r.tokens);
    return;
  }
  os << fmt::format("  routing: {} of {} chose experts other than the reference's; {} accepted as near-ties\n",
                    plural(r.mismatched_tokens, "token", "tokens"), r.tokens, r.ambiguous_tokens);
  const std::string mis = "    mismatches (judged against the reference's experts): ";
  const std::string tie = "    near-ties (judged against the backend's experts):     ";
  if (!r.mismatched.empty()) os << mis << id_list(r.mismatched, opt.max_token_ids, kWidth - mis.size()) << '\n';
  if (!r.ambiguous.empty()) os << tie << id_list(r.ambiguous, opt.max_token_ids, kWidth - tie.size()) << '\n';
}

void write_experts(std::ostream& os, const CompareResult& r, const TextOptions& opt, const Style& st) {
  const int64_t failing = std::count_if(r.experts.begin(), r.experts.end(), [](const ExpertVerdict& v) { return !v.pass; });
  os << fmt::format("  experts: {} with tokens, {} failing (worst first)\n", r.experts.size(), failing);
  if (r.experts.empty()) return;
  os << fmt::format("    {:>6} {:>6} {:>6} {:>10} {:>9} {:>22} {:>9} {:>5} {:>8} {:>7} {:>6} {:>7}\n", "expert", "tokens",
                    "slots", "max ratio", "rel-L2", "bias: beta +- SE", "allow", "bias", "energy", "limit", "energy",
                    "verdict");
  size_t shown = 0, hidden = 0;
  for (const ExpertVerdict& v : r.experts) {
    if (v.pass && shown >= opt.max_experts) {
      ++hidden;
      continue;
    }
    ++shown;
    const std::string beta =
        std::isfinite(v.beta) ? fmt::format("{:+.2e} +- {:.1e}", v.beta, v.beta_se) : num(v.beta) + " +- " + num(v.beta_se);
    const bool elem_ok = !v.blamed && v.max_ratio <= 1.0;
    const std::string ratio = fmt::format("{:>10}", num(v.max_ratio));
    os << fmt::format("    {:>6} {:>6} {:>6} ", v.expert, v.tokens, v.slots) << (elem_ok ? ratio : st.bad(ratio))
       << fmt::format(" {:>9} {:>22} {:>9} ", num(v.rel_l2), beta, num(v.beta_allow))
       << st.verdict(v.bias_ok, "ok", "FAIL", 5)
       << fmt::format(" {:>8} {:>7} ", num(v.energy_ratio), num(v.energy_limit))
       << st.verdict(v.energy_ok, "ok", "FAIL", 6) << ' ' << st.verdict(v.pass, "pass", "FAIL", 7) << '\n';
  }
  if (hidden > 0) os << fmt::format("    ... {} more experts, all pass\n", hidden);
}

void write_token_failures(std::ostream& os, const CompareResult& r, const TextOptions& opt) {
  const auto& toks = r.failing_tokens_unexplained;
  if (toks.empty()) return;
  os << fmt::format("  token-local failures (failing tokens no failing expert explains): {}\n",
                    plural(static_cast<int64_t>(toks.size()), "token", "tokens"));
  for (size_t i = 0; i < toks.size() && i < opt.max_token_ids; ++i) {
    double m = 0;
    int64_t col = -1;
    if (token_worst(r, toks[i], &m, &col))
      os << fmt::format("    token {}: max ratio {} at column {}\n", toks[i], num(m), col);
    else
      os << fmt::format("    token {}\n", toks[i]);
  }
  if (toks.size() > opt.max_token_ids) os << fmt::format("    ... {} more tokens\n", toks.size() - opt.max_token_ids);
}

void write_token_scale(std::ostream& os, const CompareResult& r, const TextOptions& opt) {
  if (!r.output_scale.ok)
    os << fmt::format("  whole-output scale test fails: beta {} +- {} (detectable above {})\n", num(r.output_scale.beta),
                      num(r.output_scale.se), num(r.output_scale.detectable));
  if (!r.requant.ok)
    os << fmt::format("  re-quantization test fails: beta {} +- {} along the intermediate's re-quantization "
                      "(skipped: -1; detectable above {})\n",
                      num(r.requant.beta), num(r.requant.se), num(r.requant.detectable));
  std::vector<const TokenScale*> bad;
  for (const TokenScale& t : r.token_scale)
    if (!t.ok) bad.push_back(&t);
  if (bad.empty()) return;
  os << fmt::format("  token scale test fails on {} (row fitted as (1 + beta) x reference):\n",
                    plural(static_cast<int64_t>(bad.size()), "token", "tokens"));
  for (size_t i = 0; i < bad.size() && i < opt.max_token_ids; ++i)
    os << fmt::format("    token {}: beta {} +- {} (detectable above {})\n", bad[i]->token, num(bad[i]->beta),
                      num(bad[i]->se), num(bad[i]->detectable));
  if (bad.size() > opt.max_token_ids) os << fmt::format("    ... {} more tokens\n", bad.size() - opt.max_token_ids);
}

void write_metrics(std::ostream& os, const CompareResult& r, const Style& st) {
  const FamiliarMetrics& m = r.metrics;
  os << "  familiar metrics (what engines' own tests compute, on the same data):\n";
  os << fmt::format("    max abs {}   max rel {}   rel-L2 {}   SQNR {} dB   non-finite {}\n", num(m.max_abs),
                    num(m.max_rel), num(m.rel_l2), num(m.sqnr_db), m.nonfinite);
  os << fmt::format("    cos diff (calc_diff) {}   mean-rel {}   NMSE {}   within atol=rtol=0.035: {:.2f}% of elements\n",
                    num(m.cos_diff), num(m.mean_rel), num(m.nmse), 100 * m.allclose_fraction);
  auto check = [&](const char* what, bool ok) { return fmt::format("{:<28}", what) + st.verdict(ok, "pass", "FAIL"); };
  os << "    would have passed: " << check("DeepGEMM calc_diff < 1e-3", m.deepgemm_pass) << "    "
     << check("SGLang mean-rel < 0.02", m.sglang_pass) << '\n';
  os << "                       " << check("vLLM atol=rtol=0.035", m.vllm_pass) << "    "
     << check("NMSE < 5e-3", m.nmse_pass) << '\n';
  const bool all_familiar = m.deepgemm_pass && m.sglang_pass && m.vllm_pass && m.nmse_pass;
  if (!r.pass && all_familiar)
    os << "    note: every familiar check passes this output; its budget checks above do not\n";
  if (r.pass && !all_familiar)
    os << "    note: a familiar check fails although every check against the derived budget passes\n";
}

// A layer over ranks: each rank against its shard, the output against their reduction
// (reference/compare_sharded.hpp; the checks above judge the whole layer).
void write_sharding(std::ostream& os, const CompareResult& r, const Style& st) {
  if (!r.sharded) return;
  const ShardedVerdict& v = *r.sharded;
  os << fmt::format("  sharding: {}, judged as one layer above; each rank against its shard, the output against "
                    "their reduction: ",
                    to_string(v.plan))
     << st.verdict(v.pass(), "pass", "FAIL") << '\n';
  std::istringstream lines(v.text());
  for (std::string line; std::getline(lines, line);) os << "  " << line << '\n';
}

void write_output(std::ostream& os, const CompareResult& r, const TextOptions& opt, const Style& st) {
  const std::string name = elide(r.name, 100);
  const std::string bar = "== output " + name + " ";
  os << '\n' << st.head(bar + std::string(bar.size() < 110 ? 110 - bar.size() : 0, '=')) << '\n';
  std::string facts = "max ratio " + num(r.max_ratio);
  if (r.worst_token >= 0) facts += fmt::format(" at token {}, column {}", r.worst_token, r.worst_col);
  facts += fmt::format("; {} of {} elements over budget", r.elements_over, r.elements);
  // "FAIL  name: facts" on one line when it fits, else the facts on the next.
  const bool one_line = 6 + name.size() + 2 + facts.size() <= kWidth;
  const std::string word = verdict_word(r);
  os << st.verdict(word == "PASS", word.c_str(), word.c_str()) << std::string(word.size() < 4 ? 4 - word.size() : 0, ' ')
     << "  " << name << ":" << (one_line ? " " : "\n      ") << facts << '\n';
  os << "  budget model: " << budget_model_name(r.model.acc) << "\n    " << describe_budget_model(r.model) << '\n';
  os << "  power (what this check could have seen):\n";
  for (const std::string& line : power_lines(r)) os << "    " << line << '\n';
  write_routing(os, r, opt);
  write_experts(os, r, opt, st);
  write_token_failures(os, r, opt);
  write_token_scale(os, r, opt);
  write_metrics(os, r, st);
  write_sharding(os, r, st);
  os << fmt::format("  {} of {} checks of this output failed\n", r.checks_failed, r.checks);
}

}  // namespace

void write_text(std::ostream& os, const ReportContext& ctx, const std::vector<CompareResult>& results,
                const TextOptions& opt) {
  const Style st{opt.color};
  write_header(os, ctx, st);
  for (const CompareResult& r : results) write_output(os, r, opt, st);
  os << '\n' << closing_line(totals(results)) << '\n';  // uncoloured: scripts grep it
}

}  // namespace moecheck::report
