// Error types shared by every part of moecheck.
//
// Contract: anything wrong with what a user handed us (a file, a dataset, a flag) is an
// InputError naming the file, the dataset (or option) and the rule it broke; the CLI maps it
// to exit code 2. Internal invariant violations are std::logic_error (a bug in moecheck).
#pragma once

#include <stdexcept>
#include <string>

namespace moecheck {

class InputError : public std::runtime_error {
 public:
  // file: path of the offending file ("" when not about a file); where: dataset path,
  // attribute ("/config@top_k") or option ("--tokens"); rule: what was expected.
  InputError(std::string file, std::string where, std::string rule)
      : std::runtime_error(compose(file, where, rule)),
        file_(std::move(file)), where_(std::move(where)), rule_(std::move(rule)) {}

  const std::string& file() const { return file_; }
  const std::string& where() const { return where_; }
  const std::string& rule() const { return rule_; }

 private:
  static std::string compose(const std::string& file, const std::string& where, const std::string& rule) {
    std::string s;
    if (!file.empty()) s += file + ": ";
    if (!where.empty()) s += where + ": ";
    return s + rule;
  }
  std::string file_, where_, rule_;
};

}  // namespace moecheck
