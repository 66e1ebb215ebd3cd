// JUnit XML rendering (junit.hpp).
#include "tools/sweep/junit.hpp"

#include <fmt/format.h>

#include "tools/report/report.hpp"

namespace moecheck::sweep {

std::string xml_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        // XML 1.0 admits no control characters but tab, newline and carriage return.
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') o += ' ';
        else o += ch;
    }
  }
  return o;
}

std::string render_junit(const std::vector<JunitSuite>& suites, const std::string& run) {
  int total = 0, failures = 0, errors = 0;
  double seconds = 0;
  std::string body;
  for (const JunitSuite& s : suites) {
    int f = 0, e = 0, sk = 0;
    double t = 0;
    std::string cases;
    for (const JunitCase& c : s.cases) {
      t += c.seconds;
      cases += fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\"", xml_escape(c.classname),
                           xml_escape(c.name), c.seconds);
      using R = JunitCase::Result;
      if (c.result == R::pass) {
        cases += "/>\n";
        continue;
      }
      const char* tag = c.result == R::failure ? "failure" : c.result == R::error ? "error" : "skipped";
      f += c.result == R::failure, e += c.result == R::error, sk += c.result == R::skipped;
      cases += fmt::format(">\n      <{} message=\"{}\"", tag, xml_escape(c.message));
      cases += c.text.empty() ? "/>\n" : fmt::format(">{}</{}>\n", xml_escape(c.text), tag);
      cases += "    </testcase>\n";
    }
    body += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3f}\">\n",
                        xml_escape(s.name), s.cases.size(), f, e, sk, t);
    body += cases + "  </testsuite>\n";
    total += int(s.cases.size()), failures += f, errors += e, seconds += t;
  }
  return fmt::format("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"{}\" tests=\"{}\" "
                     "failures=\"{}\" errors=\"{}\" time=\"{:.3f}\">\n{}</testsuites>\n",
                     xml_escape(run), total, failures, errors, seconds, body);
}

void write_junit_file(const std::string& path, const std::vector<JunitSuite>& suites, const std::string& run) {
  report::write_file_atomically(path, render_junit(suites, run), "--junit");
}

}  // namespace moecheck::sweep
