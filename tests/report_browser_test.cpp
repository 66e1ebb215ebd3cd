// The HTML compare report in a real browser: Debian's chromium, headless, renders the page of a
// realistic compare (compare_output on a small layer with injected faults, report_test_data.hpp)
// to a screenshot and dumps the DOM it built. The test fails, not skips, when chromium is
// missing: the HTML report is part of the product and must be checked where it is built.
//
// Artifacts (kept for people to look at) in ${MOECHECK_BINARY_DIR}/report_test/:
//   realistic.html .json .txt   the three reports of the same results
//   realistic.png               the screenshot (1280 x 2000)
//   realistic.dom.html          the DOM chromium rendered
//   chromium-*.log              chromium's own messages (printed when a run fails)
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/report_test_data.hpp"
#include "tools/report/report.hpp"

namespace moecheck {
namespace {

namespace fs = std::filesystem;
using namespace moecheck::testing;

constexpr const char* kChromium = "/usr/bin/chromium";

const Realistic& data() {
  static const Realistic r = realistic();
  return r;
}

report::ReportContext context_of(const Realistic& R) {
  report::ReportContext ctx;
  ctx.case_path = "golden/cases/report-demo.h5";
  ctx.config = report::config_summary(R.config, R.tokens);
  ctx.budget_model = report::describe_budget_model(BudgetModel{});
  ctx.reference_seconds = R.reference_seconds;
  for (const auto& o : R.observed) ctx.data.push_back({o});
  return ctx;
}

fs::path artifacts() {
  const char* bin = std::getenv("MOECHECK_BINARY_DIR");
  const fs::path dir = fs::path(bin ? bin : ".") / "report_test";
  fs::create_directories(dir);
  return dir;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// One headless chromium run on `page` with `mode` (--screenshot=... or --dump-dom), bounded by
// timeout(1); stdout to `out`, stderr to `log`. Returns the exit status (124: timed out).
int run_chromium(const fs::path& page, const std::string& mode, const fs::path& out, const fs::path& log) {
  std::string profile = (fs::temp_directory_path() / "moecheck-chromium-XXXXXX").string();
  if (mkdtemp(profile.data()) == nullptr) return -1;
  const std::string cmd = "timeout 60 " + std::string(kChromium) +
                          " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                          " --disable-background-networking --disable-component-update --disable-sync"
                          " --user-data-dir=" + quote(profile) + " " + mode +
                          " --window-size=1280,2000 " + quote("file://" + fs::absolute(page).string()) + " >" +
                          quote(out.string()) + " 2>" + quote(log.string());
  const int st = std::system(cmd.c_str());
  std::error_code ec;
  fs::remove_all(profile, ec);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The big-endian width and height of a PNG's IHDR chunk; false when `bytes` is no PNG.
bool png_size(const std::string& bytes, uint32_t* w, uint32_t* h) {
  static const std::string sig = "\x89PNG\r\n\x1a\n";
  if (bytes.size() < 24 || bytes.compare(0, 8, sig) != 0 || bytes.compare(12, 4, "IHDR") != 0) return false;
  auto be = [&](size_t at) {
    return uint32_t(uint8_t(bytes[at])) << 24 | uint32_t(uint8_t(bytes[at + 1])) << 16 |
           uint32_t(uint8_t(bytes[at + 2])) << 8 | uint32_t(uint8_t(bytes[at + 3]));
  };
  *w = be(16), *h = be(20);
  return true;
}

// The realistic results show the faults injected into them (else the screenshot shows nothing).
TEST(ReportRealistic, ResultsShowTheInjectedFaults) {
  const Realistic& R = data();
  ASSERT_EQ(R.results.size(), 3u);
  const CompareResult& scaled = R.results[0];
  const CompareResult& nan = R.results[1];
  const CompareResult& good = R.results[2];
  EXPECT_FALSE(scaled.pass);
  ASSERT_FALSE(scaled.experts.empty());
  EXPECT_EQ(scaled.experts.front().expert, R.scaled_expert) << "the worst expert carries the 1.2% scale error";
  EXPECT_FALSE(scaled.experts.front().pass);
  EXPECT_FALSE(scaled.experts.front().bias_ok);
  EXPECT_TRUE(scaled.experts.size() < 2 || scaled.experts[1].pass) << "only that expert fails";
  EXPECT_TRUE(scaled.failing_tokens_unexplained.empty());
  EXPECT_EQ(scaled.mismatched, std::vector<int64_t>{R.mismatch_token});
  EXPECT_FALSE(nan.pass);
  EXPECT_EQ(nan.failing_tokens_unexplained, std::vector<int64_t>{R.nan_token});
  EXPECT_TRUE(good.pass) << good.checks_failed << " checks failed on noise within 0.05 of each budget";
  for (const CompareResult& r : R.results) EXPECT_EQ(r.ambiguous, std::vector<int64_t>{R.tie_token}) << r.name;
}

TEST(ReportBrowser, ChromiumRendersThePage) {
  ASSERT_EQ(access(kChromium, X_OK), 0)
      << kChromium << " is missing: install Debian's chromium (tools/install-deps.sh installs it: "
      << "apt-get install chromium); the HTML report test needs a real browser";
  const Realistic& R = data();
  const report::ReportContext ctx = context_of(R);
  const fs::path dir = artifacts();
  const fs::path page = dir / "realistic.html", png = dir / "realistic.png", dom = dir / "realistic.dom.html";
  report::write_html_file(page.string(), ctx, R.results);
  report::write_json_file((dir / "realistic.json").string(), ctx, R.results);
  {
    std::ofstream txt(dir / "realistic.txt");
    report::write_text(txt, ctx, R.results);
  }
  fs::remove(png);

  const int shot = run_chromium(page, "--screenshot=" + quote(png.string()), dir / "chromium-screenshot.out",
                                dir / "chromium-screenshot.log");
  ASSERT_EQ(shot, 0) << "chromium --screenshot exited " << shot << (shot == 124 ? " (timed out after 60 s)" : "")
                     << "; its log:\n" << slurp(dir / "chromium-screenshot.log");
  ASSERT_TRUE(fs::exists(png)) << "no screenshot; chromium's log:\n" << slurp(dir / "chromium-screenshot.log");
  const std::string bytes = slurp(png);
  uint32_t w = 0, h = 0;
  ASSERT_TRUE(png_size(bytes, &w, &h)) << png << " is not a PNG";
  EXPECT_EQ(w, 1280u);
  EXPECT_EQ(h, 2000u);
  // A blank 1280x2000 page compresses to a few kB; charts, tables and text take far more.
  EXPECT_GT(bytes.size(), 60000u) << "screenshot of " << bytes.size() << " bytes: did the page render?";

  const int dumped = run_chromium(page, "--dump-dom", dom, dir / "chromium-dom.log");
  ASSERT_EQ(dumped, 0) << "chromium --dump-dom exited " << dumped << "; its log:\n" << slurp(dir / "chromium-dom.log");
  const std::string d = slurp(dom);
  ASSERT_FALSE(d.empty());
  // One of each chart per output, one bar per expert, every expert id in the chart and table.
  EXPECT_EQ(count(d, "<svg class=\"bars\""), 3u);
  EXPECT_EQ(count(d, "<svg class=\"scatter\""), 3u);
  EXPECT_EQ(count(d, "<svg class=\"heatmap\""), 3u);
  size_t experts = 0;
  for (const CompareResult& r : R.results) {
    experts += r.experts.size();
    for (const ExpertVerdict& v : r.experts) {
      EXPECT_NE(d.find("data-expert=\"" + std::to_string(v.expert) + "\""), std::string::npos) << v.expert;
      const std::string row = (v.pass ? "<tr><td>" : "<tr class=\"failrow\"><td>") + std::to_string(v.expert) + "</td>";
      EXPECT_NE(d.find(row), std::string::npos) << "table row of expert " << v.expert;
    }
  }
  EXPECT_EQ(count(d, "<rect class=\"bar\""), experts);
  EXPECT_NE(d.find("class=\"pts-over\""), std::string::npos);
  EXPECT_NE(d.find("class=\"mark-bias\""), std::string::npos);
  EXPECT_NE(d.find(report::closing_line(report::totals(R.results))), std::string::npos);
  std::cout << "artifacts in " << dir << " (screenshot " << bytes.size() << " bytes, page " << fs::file_size(page)
            << " bytes)\n";
}

}  // namespace
}  // namespace moecheck
