// JUnit XML for CI systems (`moecheck gate --junit FILE`, `moecheck compare --junit FILE`): one <testsuite> per part of a run
// (the sweep, the golden corpus), one <testcase> per case, a <failure> whose message is the
// one-line reason and whose text holds the replay command; <error> for a case that could not be
// judged. The widely read subset of the format (Jenkins / GitLab / GitHub reporters): testsuites >
// testsuite(name, tests, failures, errors, skipped, time) > testcase(classname, name, time).
#pragma once

#include <string>
#include <vector>

namespace moecheck::sweep {

struct JunitCase {
  std::string name, classname;
  double seconds = 0;
  enum class Result { pass, failure, error, skipped } result = Result::pass;
  std::string message;  // one line (failure / error / skipped)
  std::string text;     // body of <failure> / <error>: details, the replay command
};

struct JunitSuite {
  std::string name;
  std::vector<JunitCase> cases;
};

// `run`: the <testsuites> name, the command that ran ("moecheck gate", "moecheck compare").
std::string render_junit(const std::vector<JunitSuite>& suites, const std::string& run = "moecheck gate");
// Atomically (temporary + rename); InputError(path, "--junit", why) when it cannot be written.
void write_junit_file(const std::string& path, const std::vector<JunitSuite>& suites,
                      const std::string& run = "moecheck gate");

// XML escaping of text and attribute values (& < > " ' and control characters).
std::string xml_escape(const std::string& s);

}  // namespace moecheck::sweep
