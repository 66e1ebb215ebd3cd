// Tests of the `moecheck compare` reports (tools/report/report.hpp) on hand-built compare results
// (tests/report_test_data.hpp): the terminal report's key lines and width, colour only when
// asked, the JSON document's schema (tools/report/REPORT-SCHEMA.md) and its non-finite encoding, the
// HTML page's structure, escaping and size, a layer over ranks in all three, and the atomic writes.
// The page in a real browser is tests/report_browser_test.cpp.
//
// Sections: text, colour, json, html, sharding, files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "reference/compare_sharded.hpp"
#include "reference/errors.hpp"
#include "tests/report_test_data.hpp"
#include "tools/report/report.hpp"

namespace moecheck {
namespace {

using namespace moecheck::testing;
using report::ReportContext;
using Json = nlohmann::json;

ReportContext context() {
  ReportContext ctx;
  ctx.case_path = "golden/cases/dsv3_512.h5";
  ctx.config = "E=256 k=8 H=7168 I=2048 T=512 routing=deepseek_v3 groups=4/8 scaling=2.5 scales=f32 intermediate=f32 "
               "weights=f32";
  ctx.budget_model = report::describe_budget_model(BudgetModel{AccumulatorModel::hopper_tensor_core()});
  ctx.reference_seconds = 12.5;
  ctx.reference_device = "this CPU";
  return ctx;
}

// A layer over two TP ranks whose rank 1 fails and whose reduction counts it twice: every report
// names the rank; a one-device output's JSON has no "sharding" key (its report is unchanged).
CompareResult sharded_result() {
  CompareResult r = failing_result();
  auto v = std::make_shared<ShardedVerdict>();
  v->plan = {ShardKind::tp, 2};
  v->ranks = {passing_result(), failing_result()};
  v->ranks[0].name = "rank 0", v->ranks[1].name = "rank 1";
  v->reduction_outside = 3, v->blamed_rank = 1, v->blamed_beta = 1.0, v->blamed_share = 0.99;
  r.sharded = v;
  return r;
}

std::string text_of(const std::vector<CompareResult>& rs, report::TextOptions opt = {},
                    const ReportContext& ctx = context()) {
  std::ostringstream os;
  report::write_text(os, ctx, rs, opt);
  return os.str();
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) v.push_back(l);
  return v;
}

// The report line that shows expert `id` in the per-expert table (starts with its id).
std::string expert_line(const std::string& text, int64_t id) {
  const std::regex re("^ {4} *" + std::to_string(id) + " .*");
  for (const std::string& l : lines_of(text))
    if (std::regex_match(l, re)) return l;
  return "";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// ---- text ----------------------------------------------------------------------------------
TEST(ReportText, HeaderVerdictsAndClosingLine) {
  const std::string t = text_of({passing_result(), failing_result()});
  EXPECT_NE(t.find("ratio = |observed - reference| / budget; an element passes when ratio <= 1; budgets: "
                   "reference/BUDGETS.md\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("PASS  emulated: max ratio"), std::string::npos) << t;
  EXPECT_NE(t.find("FAIL  cuda: max ratio 12.5 at token 7, column 100; 40 of 12288 elements over budget"),
            std::string::npos)
      << t;
  // Closing line: summed over the outputs (0 of 14 and 5 of 92), and the last line.
  const auto lines = lines_of(t);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "5 of 106 checks exceeded their budget") << t;
  EXPECT_EQ(lines_of(text_of({passing_result()})).back(), "0 of 14 checks exceeded their budget");
}

TEST(ReportText, FailingExpertsRoutingAndFamiliarMetrics) {
  const std::string t = text_of({failing_result()});
  const std::string e117 = expert_line(t, 117), e104 = expert_line(t, 104);
  ASSERT_FALSE(e117.empty()) << t;
  EXPECT_NE(e117.find("12.5"), std::string::npos) << e117;
  EXPECT_EQ(count(e117, "FAIL"), 3u) << "bias, energy and verdict: " << e117;
  ASSERT_FALSE(e104.empty()) << t;
  EXPECT_EQ(count(e104, "FAIL"), 2u) << "bias and verdict: " << e104;
  // Failing experts first, then the 18 worst passing ones, then a count of the rest.
  EXPECT_NE(t.find("    ... 10 more experts, all pass\n"), std::string::npos) << t;
  EXPECT_NE(t.find("experts: 30 with tokens, 2 failing"), std::string::npos) << t;
  EXPECT_NE(t.find("routing: 3 tokens of 32 chose experts other than the reference's; 1 accepted as near-ties"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("mismatches (judged against the reference's experts): 3, 9\n"), std::string::npos) << t;
  EXPECT_NE(t.find("near-ties (judged against the backend's experts):     5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("DeepGEMM calc_diff < 1e-3   pass"), std::string::npos) << t;
  EXPECT_NE(t.find("note: every familiar check passes this output; its budget checks above do not"), std::string::npos)
      << t;
}

TEST(ReportText, EveryFailingExpertIsShown) {
  const CompareResult r = many_failing_result();
  const std::string t = text_of({r});
  for (int64_t e = 100; e < 125; ++e) EXPECT_FALSE(expert_line(t, e).empty()) << "expert " << e << " missing:\n" << t;
  EXPECT_NE(t.find("    ... 5 more experts, all pass\n"), std::string::npos) << t;
  EXPECT_NE(t.find("29 of 92 checks exceeded their budget"), std::string::npos);
}

TEST(ReportText, NonFiniteValuesAndTokenLocalFailures) {
  const std::string t = text_of({nonfinite_result()});
  EXPECT_NE(t.find("max ratio inf at token 2, column 5"), std::string::npos) << t;
  EXPECT_NE(t.find("token-local failures (failing tokens no failing expert explains): 1 token\n"), std::string::npos) << t;
  EXPECT_NE(t.find("    token 2: max ratio inf at column 5\n"), std::string::npos) << t;
  EXPECT_NE(t.find("SQNR inf dB"), std::string::npos) << t;
  EXPECT_NE(t.find("rel-L2 nan"), std::string::npos) << t;
  const std::string e1 = expert_line(t, 1);
  EXPECT_NE(e1.find(" inf "), std::string::npos) << e1;
  EXPECT_NE(e1.find(" nan "), std::string::npos) << e1;
}

TEST(ReportText, EveryLineFitsIn120Columns) {
  ReportContext ctx = context();
  ctx.case_path = "/very/long/path/" + std::string(200, 'p') + "/case.h5";
  ctx.config += " " + std::string(150, 'c');
  CompareResult r = failing_result();
  r.name = "faulty:" + std::string(150, 'n');
  for (int64_t t = 0; t < 40; ++t) r.mismatched.push_back(1000000 + t), r.failing_tokens_unexplained.push_back(t);
  CompareResult sharded = sharded_result();
  auto v = std::make_shared<ShardedVerdict>(*sharded.sharded);
  for (int64_t rank = 2; rank < 4096; ++rank) v->ranks.push_back(v->ranks[1]), v->ranks.back().name = fmt::format("rank {}", rank);
  v->ranks.back().worst_token = 16777215, v->ranks.back().worst_col = 16777215, v->reduction_outside = 1 << 30;
  for (int64_t e = 0; e < 300; ++e) v->ranks.back().experts.push_back(v->ranks.back().experts.front());
  sharded.sharded = v;
  const std::string t = text_of({r, nonfinite_result(), passing_result(), sharded}, {}, ctx);
  for (const std::string& l : lines_of(t)) EXPECT_LE(l.size(), 120u) << "too long: " << l;
  EXPECT_NE(t.find("..."), std::string::npos);
}

// ---- colour --------------------------------------------------------------------------------
TEST(ReportColour, OnlyWhenAsked) {
  const std::string plain = text_of({failing_result()});
  EXPECT_EQ(plain.find('\x1b'), std::string::npos);
  report::TextOptions o;
  o.color = true;
  const std::string coloured = text_of({failing_result()}, o);
  EXPECT_NE(coloured.find("\x1b[1;31mFAIL\x1b[0m"), std::string::npos);
  EXPECT_EQ(lines_of(coloured).back(), "5 of 92 checks exceeded their budget");
}

// color_wanted: a terminal (a pseudo-terminal here) without NO_COLOR; never a pipe.
TEST(ReportColour, TerminalAndNoColor) {
  const char* saved = std::getenv("NO_COLOR");
  const std::string keep = saved ? saved : "";
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0) << "no pseudo-terminal available";
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  const int tty = open(ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(tty, 0);
  unsetenv("NO_COLOR");
  EXPECT_TRUE(report::color_wanted(tty));
  EXPECT_FALSE(report::color_wanted(pipefd[1]));
  setenv("NO_COLOR", "", 1);  // present but empty: no effect (no-color.org)
  EXPECT_TRUE(report::color_wanted(tty));
  setenv("NO_COLOR", "1", 1);
  EXPECT_FALSE(report::color_wanted(tty));
  if (saved) setenv("NO_COLOR", keep.c_str(), 1);
  else unsetenv("NO_COLOR");
  close(tty), close(master), close(pipefd[0]), close(pipefd[1]);
}

// ---- json ----------------------------------------------------------------------------------
TEST(ReportJson, SchemaKeysAndValues) {
  const Json doc = Json::parse(report::render_json(context(), {passing_result(), failing_result()}));
  for (const char* key : {"schema_version", "tool_version", "case", "config", "tier", "budget_model",
                          "reference_seconds", "reference_device", "status", "checks", "checks_failed", "summary",
                          "outputs"})
    EXPECT_TRUE(doc.contains(key)) << key;
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["tool_version"], MOECHECK_VERSION);
  EXPECT_EQ(doc["case"], "golden/cases/dsv3_512.h5");
  EXPECT_EQ(doc["status"], "fail");
  EXPECT_EQ(doc["checks"], 106);
  EXPECT_EQ(doc["checks_failed"], 5);
  EXPECT_EQ(doc["summary"], "5 of 106 checks exceeded their budget");
  ASSERT_EQ(doc["outputs"].size(), 2u);
  const Json& o = doc["outputs"][1];
  for (const char* key : {"name", "status", "max_ratio", "worst", "elements", "elements_over", "routing", "experts",
                          "token_failures", "metrics"})
    EXPECT_TRUE(o.contains(key)) << key;
  EXPECT_EQ(o["status"], "fail");
  EXPECT_EQ(doc["outputs"][0]["status"], "pass");
  EXPECT_EQ(o["max_ratio"], 12.5);
  EXPECT_EQ(o["worst"], (Json{{"token", 7}, {"col", 100}}));
  EXPECT_EQ(o["elements"], 12288);
  EXPECT_EQ(o["elements_over"], 40);
  EXPECT_EQ(o["routing"],
            (Json{{"mismatched_tokens", 3}, {"ambiguous_tokens", 1}, {"mismatched", Json::array({3, 9})}, {"ambiguous", Json::array({5})}}));
  ASSERT_EQ(o["experts"].size(), 30u);
  const Json& e = o["experts"][0];
  EXPECT_EQ(e["expert"], 117);
  EXPECT_EQ(e["status"], "fail");
  for (const char* key : {"expert", "tokens", "slots", "max_ratio", "rel_l2", "bias", "energy", "status"})
    EXPECT_TRUE(e.contains(key)) << key;
  for (const char* key : {"beta", "se", "allow", "ok"}) EXPECT_TRUE(e["bias"].contains(key)) << key;
  for (const char* key : {"ratio", "limit", "ok"}) EXPECT_TRUE(e["energy"].contains(key)) << key;
  EXPECT_EQ(e["bias"]["ok"], false);
  EXPECT_EQ(e["bias"]["beta"], 1.21e-2);
  EXPECT_EQ(e["energy"]["ok"], false);
  EXPECT_EQ(o["experts"][1]["expert"], 104);
  const Json& m = o["metrics"];
  for (const char* key : {"max_abs", "max_rel", "rel_l2", "sqnr_db", "cos_diff", "mean_rel", "nmse",
                          "allclose_fraction", "nonfinite", "familiar_checks"})
    EXPECT_TRUE(m.contains(key)) << key;
  for (const char* key : {"deepgemm_calc_diff", "sglang_mean_rel", "vllm_assert_close", "nmse"})
    EXPECT_TRUE(m["familiar_checks"][key].is_boolean()) << key;
  EXPECT_EQ(m["sqnr_db"], 58.4);
}

TEST(ReportJson, NonFiniteNumbersAreStrings) {
  const std::string text = report::render_json(context(), {nonfinite_result()});
  const Json doc = Json::parse(text);  // would throw on a bare Infinity / NaN
  const Json& o = doc["outputs"][0];
  EXPECT_EQ(o["max_ratio"], "inf");
  EXPECT_EQ(o["metrics"]["sqnr_db"], "inf");
  EXPECT_EQ(o["metrics"]["rel_l2"], "nan");
  EXPECT_EQ(o["experts"][0]["max_ratio"], "inf");
  EXPECT_EQ(o["experts"][0]["energy"]["ratio"], "nan");
  EXPECT_EQ(o["token_failures"], (Json::array({{{"token", 2}, {"max_ratio", "inf"}, {"col", 5}}})));
  EXPECT_EQ(text.find(": null"), std::string::npos) << "no null stands in for a number (all known here)";
}

// ---- html ----------------------------------------------------------------------------------
TEST(ReportHtml, StructureEscapingAndCharts) {
  CompareResult evil = failing_result();
  evil.name = "<script>alert(1)</script> & \"q\"";
  ReportContext ctx = context();
  ctx.case_path = "cases/<b>x</b>.h5";
  const std::string h = report::render_html(ctx, {passing_result(), evil, nonfinite_result()});
  EXPECT_EQ(h.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(h.substr(h.size() - 8), "</html>\n");
  EXPECT_EQ(h.find("<script"), std::string::npos) << "no script, and names are escaped";
  EXPECT_EQ(h.find("<b>x</b>"), std::string::npos);
  EXPECT_NE(h.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot;"), std::string::npos);
  EXPECT_NE(h.find("cases/&lt;b&gt;x&lt;/b&gt;.h5"), std::string::npos);
  for (const char* tag : {"svg", "section", "table", "figure", "details", "g", "p", "h2", "h3"})
    EXPECT_EQ(count(h, std::string("<") + tag + ">") + count(h, std::string("<") + tag + " "),
              count(h, std::string("</") + tag + ">"))
        << "unbalanced <" << tag << ">";
  EXPECT_EQ(count(h, "<svg class='bars'"), 3u);
  EXPECT_EQ(count(h, "<svg class='scatter'"), 3u);
  EXPECT_EQ(count(h, "<svg class='heatmap'"), 3u);
  EXPECT_EQ(count(h, "<rect class='bar' "), 4u + 30u + 3u);
  EXPECT_EQ(count(h, "class='mark-bias'"), 2u);
  EXPECT_EQ(count(h, "class='mark-energy'"), 2u);  // expert 117 and the non-finite output's expert 1
  EXPECT_NE(h.find("<summary>... 10 more experts, all pass</summary>"), std::string::npos);
  EXPECT_EQ(count(h, "8 of 117 checks exceeded their budget"), 2u) << "header and footer";
  EXPECT_EQ(report::render_html(ctx, {evil}), report::render_html(ctx, {evil})) << "deterministic";
}

// The bar chart of a broken output: ratios of 1e25 do not push the budget line (ratio 1) below
// the axis, and an expert blamed by its tokens in a combined-output-only run is drawn over
// budget even when its own max ratio reads <= 1.
TEST(ReportHtml, BarsKeepTheBudgetLineAndColourBlamedExperts) {
  CompareResult r = failing_result();
  r.experts[0].max_ratio = 1e25;                      // far over (expert 117 sorts first)
  ExpertVerdict& quiet = r.experts.back();
  quiet.max_ratio = 0.5, quiet.blamed = true, quiet.pass = false;
  const std::string h = report::render_html(context(), {r});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(h, m, std::regex("y1='([0-9.]+)' x2='[0-9.]+' y2='[0-9.]+' class='budget-line'")));
  const double y = std::stod(m[1]);
  EXPECT_GT(y, 34.0) << "the budget line sits below the plot's top";
  EXPECT_LT(y, 250.0) << "the budget line sits above the plot's floor, not on it";
  auto fill_of = [&](int64_t expert) {
    std::smatch f;
    const std::regex re("data-expert='" + std::to_string(expert) + "'[^>]*fill='([^']+)'");
    return std::regex_search(h, f, re) ? f[1].str() : std::string();
  };
  EXPECT_EQ(fill_of(quiet.expert), fill_of(r.experts[0].expert)) << "a blamed expert is drawn over budget";
  EXPECT_NE(fill_of(quiet.expert), fill_of(r.experts[5].expert)) << "and unlike a passing one";
}

// The 512-token, 7168-column case of the brief: <= 4000 scatter points, <= 256 heatmap rows,
// and a page under 2 MB.
TEST(ReportHtml, LargeCaseStaysSmall) {
  const BigCase b = big_result();
  ReportContext ctx = context();
  ctx.data = {{b.observed}};
  const std::string h = report::render_html(ctx, {b.result});
  EXPECT_LT(h.size(), 2u << 20) << "page of " << h.size() << " bytes";
  size_t points = 0;  // "M x y h0" segments of the two point clouds (std::regex would overflow the stack)
  for (const std::string cls : {"class='pts-ok' d='", "class='pts-over' d='"}) {
    const size_t from = h.find(cls);
    ASSERT_NE(from, std::string::npos) << cls;
    points += count(h.substr(from + cls.size(), h.find('\'', from + cls.size()) - from - cls.size()), "h0");
  }
  EXPECT_LE(points, 4000u);
  EXPECT_GE(points, 3900u) << "the subsample should use the allowance";
  EXPECT_NE(h.find("viewBox='0 0 56 256' preserveAspectRatio='none'"), std::string::npos) << "56 blocks x 256 rows";
  std::cout << "page: " << h.size() << " bytes, " << points << " scatter points\n";
}

// ---- files ---------------------------------------------------------------------------------
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "moecheck-report-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// ---- sharding ------------------------------------------------------------------------------
TEST(ReportSharding, TheRanksAndTheReductionInEveryReport) {
  std::ostringstream text;
  report::write_text(text, context(), {passing_result(), sharded_result()});
  for (const char* line : {"  sharding: tp 2, judged as one layer above", "    rank 0: PASS", "    rank 1: FAIL",
                           "      failing experts ", "    reduction: FAIL (3 elements outside the float32 all-reduce of the ranks' partials)\n"
                           "      the residual is rank 1's partial x 1.000 (99% of its energy)\n"})
    EXPECT_NE(text.str().find(line), std::string::npos) << line << "\n" << text.str();
  EXPECT_EQ(text.str().find("sharding:"), text.str().rfind("sharding:")) << "only the sharded output has it";

  const Json doc = Json::parse(report::render_json(context(), {passing_result(), sharded_result()}));
  EXPECT_FALSE(doc["outputs"][0].contains("sharding"));
  const Json& s = doc["outputs"][1]["sharding"];
  EXPECT_EQ(s["shard"], "tp 2");
  EXPECT_EQ(s["status"], "fail");
  EXPECT_EQ(s["failing_ranks"], Json::array({1}));
  ASSERT_EQ(s["ranks"].size(), 2u);
  EXPECT_EQ(s["ranks"][1]["status"], "fail");
  EXPECT_EQ(s["ranks"][1]["max_ratio"], 12.5);
  EXPECT_EQ(s["reduction"], (Json{{"status", "fail"}, {"elements_outside", 3}, {"blamed_rank", 1}, {"beta", 1.0}, {"share", 0.99}}));

  const std::string h = report::render_html(context(), {sharded_result()});
  EXPECT_NE(h.find("<h3>Ranks (tp 2)</h3>"), std::string::npos);
  EXPECT_NE(h.find("the residual is rank 1's partial &times; 1.000"), std::string::npos);
}

TEST(ReportFiles, WrittenAtomicallyAndReplaced) {
  TempDir d;
  const auto json = d.path / "r.json", page = d.path / "r.html";
  { std::ofstream(json) << "old"; }
  report::write_json_file(json.string(), context(), {failing_result()});
  report::write_html_file(page.string(), context(), {failing_result()});
  EXPECT_EQ(Json::parse(slurp(json))["checks_failed"], 5);
  EXPECT_EQ(slurp(page), report::render_html(context(), {failing_result()}));
  size_t entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.path)) ++entries, (void)e;
  EXPECT_EQ(entries, 2u) << "no temporary left behind";
}

TEST(ReportFiles, UnwritablePathIsAnInputError) {
  TempDir d;
  const auto bad = d.path / "missing-dir" / "r.json";
  try {
    report::write_json_file(bad.string(), context(), {passing_result()});
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), bad.string());
    EXPECT_EQ(e.where(), "--json");
  }
  EXPECT_FALSE(std::filesystem::exists(bad));
  EXPECT_TRUE(std::filesystem::is_empty(d.path));
}

}  // namespace
}  // namespace moecheck
