// Shared pieces of the moecheck command-line tool: exit codes, subcommand registration.
//
// Each subcommand lives in tools/cli/cmd_<name>.cpp and exposes `void register_<name>(CLI::App&)`,
// which adds the subcommand with its options and hands its runner to set_runner(); main()
// parses, runs the selected subcommand's runner and maps exceptions to exit codes:
//   0 ok, 1 check failed, 2 usage or input error (InputError, CLI11 parse errors, anything else
//   unexpected: always a message on stderr prefixed "moecheck: error: ", never an abort).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

namespace moecheck::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitInputError = 2;

// Registers the function that runs `sub` once the command line is parsed; returns an exit code.
void set_runner(CLI::App* sub, std::function<int()> run);

// "moecheck: error: <message>" on stderr.
void print_error(const std::string& message);

// Option checks shared by the subcommands (a bad value exits 2 naming the option):
// a seed is an unsigned 64-bit decimal (CLI11 alone would wrap "-1" to 2^64 - 1);
inline CLI::Validator seed_text() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
          return "must be an unsigned decimal integer (0 .. 2^64-1), got '" + s + "'";
        return "";
      },
      "UINT64");
}
// a file to be written: its directory exists and is writable, and it is not a directory itself
// (checked before any work, so a bad path never costs a run nor leaves a partial file);
CLI::Validator output_file();
// --budget-model's check: the names of reference/budget_model.hpp.
CLI::Validator budget_model_validator();
// --exec-timeout S on a subcommand that takes exec:CMD backends (judge/exec_backend.hpp).
void add_exec_timeout_option(CLI::App* sub);
// --device auto|cpu|cuda on a subcommand that computes references: where their float64 products
// and the budget's run (judge::ReferenceDevice), into `device` (its default stays the caller's).
void add_reference_device_option(CLI::App* sub, std::string& device);
// A path in the source tree this binary was built from (the committed corpora's default
// location: golden/cases, golden/bugs), or `rel` itself when the build did not record one.
inline std::string source_tree_path(const std::string& rel) {
#ifdef MOECHECK_SOURCE_DIR
  return std::string(MOECHECK_SOURCE_DIR) + "/" + rel;
#else
  return rel;
#endif
}
// counts and indices: at least `lo`.
inline CLI::Validator at_least(int64_t lo) { return CLI::Range(lo, std::numeric_limits<int64_t>::max()); }

// Subcommands (one tools/cli/cmd_<name>.cpp each).
void register_inspect(CLI::App& app);
void register_make_case(CLI::App& app);
void register_reference(CLI::App& app);
void register_run(CLI::App& app);
void register_compare(CLI::App& app);
void register_bench(CLI::App& app);
void register_gate(CLI::App& app);
void register_shrink(CLI::App& app);
void register_repro(CLI::App& app);
void register_faults(CLI::App& app);
void register_dump(CLI::App& app);
void register_probe(CLI::App& app);

}  // namespace moecheck::cli
