// Pieces shared by the three compare reports (report.hpp): the run's one-line descriptions, the
// check totals and closing line, number formatting, and the atomic file write.
#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "golden/case_groups.hpp"
#include "golden/interrupt.hpp"
#include "reference/errors.hpp"
#include "tools/report/report.hpp"

namespace moecheck::report {

std::string config_summary(const MoeConfig& c, int64_t tokens) {
  std::string s = fmt::format("E={} k={} H={} I={}", c.num_experts, c.top_k, c.hidden_size, c.intermediate_size);
  if (tokens >= 0) s += fmt::format(" T={}", tokens);
  s += fmt::format(" routing={}", to_string(c.routing));
  if (c.n_group > 1) s += fmt::format(" groups={}/{}", c.topk_group, c.n_group);
  if (c.routed_scaling_factor != 1.0) s += fmt::format(" scaling={}", c.routed_scaling_factor);
  s += fmt::format(" scales={} intermediate={} weights={}", to_string(c.scale_format), to_string(c.intermediate_dtype),
                   to_string(c.routing_weight_dtype));
  if (c.local_experts() != c.num_experts)
    s += fmt::format(" local={}..{}", c.local_expert_offset, c.local_expert_offset + c.local_experts() - 1);
  return s;
}

Totals totals(const std::vector<CompareResult>& results) {
  Totals t;
  for (const CompareResult& r : results) {
    ++t.outputs;
    t.outputs_failed += !r.pass;
    t.outputs_vacuous += r.power.vacuous;
    t.checks += r.checks;
    t.checks_failed += r.checks_failed;
  }
  return t;
}

std::string closing_line(const Totals& t) {
  std::string s = fmt::format("{} of {} checks exceeded their budget", t.checks_failed, t.checks);
  if (t.outputs_vacuous > 0)
    s += fmt::format("; {} output{} vacuous (the checks would not see it zeroed)", t.outputs_vacuous,
                     t.outputs_vacuous == 1 ? "" : "s");
  return s;
}

std::string verdict_word(const CompareResult& r) {
  std::string s = verdict_label(r);
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

std::vector<std::string> power_lines(const CompareResult& r) {
  const Power& p = r.power;
  return {fmt::format("detects a scale error of the whole output above {} (of any one expert above {})",
                      num(p.scale_output), num(p.scale_any_expert)),
          fmt::format("detects a scale error of one token's row above {} (median token {})", num(p.token_scale),
                      num(p.token_scale_median)),
          fmt::format("detects any change of one token's row above rel-L2 {} (median token {})", num(p.token_rel_l2),
                      num(p.token_rel_l2_median)),
          fmt::format("noise limit (z = {:.2f}) > |reference| on {:.1f}% of elements, worst-case budget on {:.1f}%{}",
                      r.aggregate_z, 100 * p.noise_over_magnitude, 100 * p.over_magnitude,
                      p.vacuous ? "; VACUOUS: the checks would not see this output zeroed" : ""),
          r.requant.fitted
              ? fmt::format("re-quantization test: beta {} along the intermediate's re-quantization (skipped: -1), "
                            "detectable above {}", num(r.requant.beta), num(r.requant.detectable))
              : std::string("re-quantization test: not run (--no-requant-test, or no intermediate to re-quantize)")};
}

std::string power_line(const CompareResult& r) {
  std::string s;
  for (const std::string& l : power_lines(r)) s += (s.empty() ? "" : "; ") + l;
  return s;
}

bool color_wanted(int fd) {
  const char* no_color = std::getenv("NO_COLOR");
  if (no_color != nullptr && no_color[0] != '\0') return false;
  return isatty(fd) == 1;
}

std::string num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return "0";
  const double a = std::fabs(x);
  if (a >= 1e-3 && a < 1e4) return fmt::format("{:.3g}", x);
  return fmt::format("{:.2e}", x);
}

std::string elide(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  if (width < 5) return s.substr(0, width);
  const size_t keep = width - 3, head = keep / 2, tail = keep - head;
  return s.substr(0, head) + "..." + s.substr(s.size() - tail);
}

bool token_worst(const CompareResult& r, int64_t token, double* max_ratio, int64_t* col) {
  if (r.ratio.size() != size_t(r.tokens * r.hidden) || token < 0 || token >= r.tokens) return false;
  double m = -1;
  int64_t at = -1;
  for (int64_t h = 0; h < r.hidden; ++h) {
    const float v = r.ratio[token * r.hidden + h];
    const double x = std::isnan(v) ? INFINITY : double(v);
    if (x > m) m = x, at = h;
  }
  *max_ratio = m < 0 ? 0.0 : m;
  *col = at;
  return true;
}

void write_file_atomically(const std::string& path, const std::string& content, const std::string& option) {
  namespace fs = std::filesystem;
  const std::string tmp = groups::temporary_for(path);
  interrupt::ScratchPath scratch(tmp);
  auto fail = [&](const std::string& why) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw InputError(path, option, "cannot write the report: " + why);
  };
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail(std::string("cannot create ") + tmp + " (" + std::strerror(errno) + ")");
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    f.flush();
    if (!f) fail(std::string("write to ") + tmp + " failed (" + std::strerror(errno) + ")");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("rename " + tmp + " -> " + path + " failed (" + ec.message() + ")");
  scratch.release();
}

}  // namespace moecheck::report
