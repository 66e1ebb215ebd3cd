// Backend "exec:CMD": any kernel, run as an external command (tools/README.md "exec backends",
// golden/FORMAT.md "Output files of exec backends").
//
// One run, as named steps:
//   1. a private scratch directory (mkdtemp under $TMPDIR or /tmp, registered with
//      golden/interrupt's ScratchPath, removed when the run ends however it ends);
//   2. <scratch>/case.h5: the case's /config, /inputs and /weights copied bit for bit (H5Ocopy)
//      with the root attributes of a version-1 case, no /outputs and no /reference;
//   3. CMD run as `/bin/sh -c CMD'` where CMD' is CMD with {case} and {out} replaced by the
//      shell-quoted paths <scratch>/case.h5 and <scratch>/out.h5 and {fault} by "none"; the child
//      gets SIGINT/SIGTERM unblocked with default dispositions (posix_spawn with an empty signal
//      mask and POSIX_SPAWN_SETSIGDEF; golden/interrupt blocks them in moecheck), its own process
//      group, stdin /dev/null, stdout and stderr both into <scratch>/log, moecheck's working
//      directory and environment;
//   4. the wait, bounded by the timeout: past it the group gets SIGTERM, 2 s later SIGKILL;
//      once the command ended, whatever it left running in its group is killed; an interruption
//      of moecheck kills the group (interrupt::ChildGroup) and removes the scratch directory;
//   5. <scratch>/out.h5 read and checked: exactly one group under /outputs, its datasets those
//      of FORMAT.md's /outputs/<name> with the case's shapes (output [T, H] required), the
//      attribute budget_model (optional) a known model name.
// A command that exits with kExecUnsupported (77, the "skipped" of automake and ctest) declines
// the case: BackendUnsupported (backend_run.hpp) with the last line it printed as the reason, no
// verdict. Any other failure of steps 3-5 (non-zero exit, death by a signal, the timeout, no
// output file, a malformed one) throws ExecFailure: the backend's failure, with the command, its exit status and
// the last 4 KiB of what it printed. Bad option values (an empty CMD, no {out}) are InputError
// naming --backend (exit 2).
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "golden/case_problem.hpp"
#include "kernels/backend_output.hpp"

namespace moecheck::judge {

inline constexpr int kExecUnsupported = 77;  // exit status of a command that declines a case

// The backend's failure (exit status, timeout, missing or malformed output): judged as a failure
// of the thing checked, never as bad input. what(): several lines (command, status, output tail).
class ExecFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr std::string_view kExecPrefix = "exec:";
inline bool is_exec_backend(std::string_view backend) { return backend.starts_with(kExecPrefix); }

// The command template of "exec:CMD", checked: CMD not blank and holding {out}. InputError naming
// --backend otherwise.
std::string exec_command_template(const std::string& backend);

// "exec:CMD" with {fault} replaced by `fault` (faults' mutants; the name is a plain identifier).
std::string exec_with_fault(const std::string& backend, std::string_view fault);
// `moecheck faults --backend exec:CMD --faults a,b`: "none" (the correct run) and the mutants a, b
// (names of [A-Za-z0-9_]). InputError when backend is no exec:CMD, CMD lacks {fault} (every
// mutant would be the correct kernel) or the list is empty or holds a bad name.
std::vector<std::string> exec_fault_names(const std::string& backend, const std::string& faults_csv);

// s as one word for /bin/sh: unchanged when it holds only [A-Za-z0-9_./:=@%+,-] (and is not
// empty), else in single quotes with every ' written '\''.
std::string shell_quote(std::string_view s);

// The output name a backend's run is recorded under by default: "exec" for exec:CMD (a command
// line is no output name), else the backend name with '@' written as '+'.
std::string default_output_name(const std::string& backend);

// Seconds an exec command may run (default 600); --exec-timeout on run, gate, shrink, repro and
// faults (cli/cli_common.hpp) sets it for the whole process.
double exec_timeout_seconds();
void set_exec_timeout_seconds(double seconds);

// Runs the command on the case (steps above). expert_outputs = false drops the expert outputs
// the command wrote. The result's budget_model is the output's attribute (empty: the default of
// an engine's output, hopper).
BackendOutput run_exec_backend(const CaseProblem& cp, const std::string& backend, bool expert_outputs);

}  // namespace moecheck::judge
