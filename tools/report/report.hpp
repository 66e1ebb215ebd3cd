// The reports of `moecheck compare`: one list of CompareResult (one per judged output of a case,
// reference/moe_compare.hpp) rendered three ways, all carrying the same facts:
//   write_text   terminal report (<= 120 columns; colour only on a tty without NO_COLOR)
//   render_json  the --json document, schema tools/report/REPORT-SCHEMA.md (schema_version 1)
//   render_html  the --html page: one self-contained file (inline SVG and CSS, no script)
// The write_*_file functions put a rendering in place atomically (temporary, then rename), so a
// reader never sees a half-written report.
//
// What every report says about a check (BUDGETS.md): per output, 3 checks per expert (its
// elementwise ratios, its bias test, its energy test), 1 for routing, 1 for token-local failures;
// the closing count "N of M checks exceeded their budget" sums CompareResult::checks_failed and
// CompareResult::checks over the outputs (LAPACK ALASUM style).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "reference/budget_model.hpp"
#include "reference/moe_compare.hpp"
#include "reference/moe_config.hpp"

namespace moecheck::report {

inline constexpr int kSchemaVersion = 1;

// Arrays of one output that CompareResult does not carry. Only the HTML error-vs-magnitude
// scatter uses them; without them it plots ratio against |reference| instead.
struct OutputData {
  // The recorded output [T, H] as compared (Observation::output). With it the scatter shows
  // |observed - reference| against |reference|, and each element's budget, recovered exactly as
  // |observed - reference| / ratio (so near-tie tokens, whose budget the reference recomputed,
  // are right too).
  std::span<const float> observed;
};

// Facts about the run that are the same for every output.
struct ReportContext {
  std::string case_path;     // the case file as given on the command line
  std::string config;        // one line, e.g. config_summary(case config)
  std::string tier = "quantized";
  std::string budget_model;  // e.g. describe_budget_model(CompareOptions::model)
#ifdef MOECHECK_VERSION
  std::string tool_version = MOECHECK_VERSION;
#else
  std::string tool_version = "unknown";
#endif
  double reference_seconds = -1;  // wall time of the reference forward (with budgets); < 0: unknown
  std::string reference_device;   // what ran its products ("this CPU", a GPU); empty: unknown or reused
  std::vector<OutputData> data;   // parallel to the results; may be shorter (missing = none)
};

// One line naming the layer: "E=256 k=8 H=7168 I=2048 T=512 routing=deepseek_v3 ...".
std::string config_summary(const MoeConfig& c, int64_t tokens = -1);
// The budget model's one-line description (reference/budget_model.hpp).
using moecheck::describe_budget_model;

struct Totals {
  int64_t outputs = 0, outputs_failed = 0, outputs_vacuous = 0;
  int64_t checks = 0, checks_failed = 0;
  bool pass() const { return checks_failed == 0 && outputs_failed == 0; }
};
Totals totals(const std::vector<CompareResult>& results);

// "PASS" / "FAIL" / "VACUOUS" (verdict_label in capitals).
std::string verdict_word(const CompareResult& r);
// What the judgement could have seen (CompareResult::power), one line: the smallest detectable
// scale errors, the single-token threshold, the share of elements with budget > |reference|.
std::string power_line(const CompareResult& r);
std::vector<std::string> power_lines(const CompareResult& r);  // the same, its parts

// "N of M checks exceeded their budget" (and ", K outputs vacuous" when some are): the closing
// line of every report.
std::string closing_line(const Totals& t);

// ---- terminal ----------------------------------------------------------------------------
struct TextOptions {
  bool color = false;          // ANSI colours (see color_wanted)
  size_t max_experts = 20;     // passing experts shown per output; failing ones are always shown
  size_t max_token_ids = 8;    // token ids listed per routing category / token-local failures
};
// True when fd is a terminal and NO_COLOR is unset or empty (https://no-color.org).
bool color_wanted(int fd);
void write_text(std::ostream& os, const ReportContext& ctx, const std::vector<CompareResult>& results,
                const TextOptions& opt = {});

// ---- JSON (tools/report/REPORT-SCHEMA.md) ---------------------------------------------------------
std::string render_json(const ReportContext& ctx, const std::vector<CompareResult>& results);
void write_json_file(const std::string& path, const ReportContext& ctx, const std::vector<CompareResult>& results);

// ---- HTML ----------------------------------------------------------------------------------
std::string render_html(const ReportContext& ctx, const std::vector<CompareResult>& results);
void write_html_file(const std::string& path, const ReportContext& ctx, const std::vector<CompareResult>& results);

// ---- shared helpers --------------------------------------------------------------------------
// Writes `content` to `<path>.tmp.<pid>` in the same directory, then renames it over `path`.
// On failure removes the temporary and throws InputError(path, option, reason).
void write_file_atomically(const std::string& path, const std::string& content, const std::string& option);

// A number for people: 3 significant digits, "inf" / "-inf" / "nan" for non-finite values.
std::string num(double x);
// The middle of `s` replaced by "..." so that it is at most `width` characters long.
std::string elide(const std::string& s, size_t width);

// Per-token maximum ratio and its column, from CompareResult::ratio (NaN counts as infinity).
// Returns false when the result kept no ratios.
bool token_worst(const CompareResult& r, int64_t token, double* max_ratio, int64_t* col);

}  // namespace moecheck::report
