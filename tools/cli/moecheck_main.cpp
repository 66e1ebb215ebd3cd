// moecheck: the command-line tool. Parses the command line (CLI11), runs the selected
// subcommand and turns every failure into an exit code and a message (cli_common.hpp).
#include <exception>
#include <fmt/format.h>
#include <filesystem>
#include <iostream>
#include <map>
#include <unistd.h>

#include "golden/interrupt.hpp"
#include "reference/budget_model.hpp"
#include "reference/errors.hpp"
#include "tools/cli/cli_common.hpp"
#include "tools/judge/exec_backend.hpp"
#include "tools/judge/reference_store.hpp"

namespace moecheck::cli {

namespace {
std::map<const CLI::App*, std::function<int()>>& runners() {
  static std::map<const CLI::App*, std::function<int()>> r;
  return r;
}
}  // namespace

void set_runner(CLI::App* sub, std::function<int()> run) { runners()[sub] = std::move(run); }

void print_error(const std::string& message) { std::cerr << "moecheck: error: " << message << std::endl; }

CLI::Validator output_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        namespace fs = std::filesystem;
        std::error_code ec;
        if (path.empty()) return "an empty path";
        if (fs::is_directory(path, ec)) return "'" + path + "' is a directory, not a file";
        const fs::path dir = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
        if (!fs::is_directory(dir, ec)) return "cannot write '" + path + "': directory '" + dir.string() + "' does not exist";
        if (access(dir.c_str(), W_OK) != 0) return "cannot write '" + path + "': directory '" + dir.string() + "' is not writable";
        return "";
      },
      "FILE");
}

CLI::Validator budget_model_validator() {
  return CLI::Validator(
      [](std::string& s) {
        try {
          parse_budget_model(s);
          return std::string();
        } catch (const InputError& e) {
          return e.rule();
        }
      },
      "MODEL");
}

void add_reference_device_option(CLI::App* sub, std::string& device) {
  sub->add_option("--device", device,
                  fmt::format("where the references' float64 products and the budget's run: auto (the GPU when one "
                              "is usable and a case's products reach {:g} GFLOP, the default), cpu, or cuda "
                              "(BUDGETS.md §11)",
                              judge::ReferenceDevice::kAutoGpuFlops * 1e-9))
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

void add_exec_timeout_option(CLI::App* sub) {
  sub->add_option_function<double>(
         "--exec-timeout", [](const double& seconds) { judge::set_exec_timeout_seconds(seconds); },
         "exec:CMD backends: seconds the command may run before it is killed (default 600)")
      ->check(CLI::Range(1e-3, 1e7));
}

}  // namespace moecheck::cli

int main(int argc, char** argv) {
  using namespace moecheck;
  interrupt::install();  // before any thread starts (interrupt.hpp)
  try {
    CLI::App app{"moecheck: float64 reference and error budgets for FP8 block-scale MoE layers", "moecheck"};
    app.set_version_flag("--version", std::string("moecheck ") + MOECHECK_VERSION);
    app.require_subcommand(1);
    app.footer("Exit codes: 0 ok, 1 check failed, 2 usage or input error. See tools/README.md.");
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
      return std::string("moecheck: error: ") + e.what() + "\nRun with --help for more information.\n";
    });
    cli::register_inspect(app);
    cli::register_make_case(app);
    cli::register_reference(app);
    cli::register_run(app);
    cli::register_compare(app);
    cli::register_bench(app);
    cli::register_gate(app);
    cli::register_shrink(app);
    cli::register_repro(app);
    cli::register_faults(app);
    cli::register_dump(app);
    cli::register_probe(app);
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // --help and --version come here too, with exit code 0; every real parse error gives 2.
      return app.exit(e) == 0 ? cli::kExitOk : cli::kExitInputError;
    }
    // The deepest selected subcommand with a runner (`moecheck bench reference` nests).
    for (const CLI::App* sub = &app; sub;) {
      const auto subs = sub->get_subcommands();
      const CLI::App* next = subs.empty() ? nullptr : subs.front();
      if (next) {
        const auto deeper = next->get_subcommands();
        const auto it = cli::runners().find(next);
        if (deeper.empty() && it != cli::runners().end()) {
          interrupt::set_stage(sub == &app ? next->get_name() : sub->get_name() + " " + next->get_name());
          return it->second();
        }
      }
      sub = next;
    }
    cli::print_error("no subcommand given (see moecheck --help)");
    return cli::kExitInputError;
  } catch (const InputError& e) {
    cli::print_error(e.what());
  } catch (const std::exception& e) {
    cli::print_error(std::string("unexpected failure: ") + e.what());
  } catch (...) {
    cli::print_error("unexpected failure (unknown exception)");
  }
  return cli::kExitInputError;
}
