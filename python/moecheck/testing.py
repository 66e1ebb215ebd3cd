"""pytest helpers: assert_moe_close judges an output and, on failure, raises AssertionError with
moecheck's report, after saving a case that replays the failure (the case with the output in it)
and naming the commands that replay and shrink it."""
import os
import tempfile

from . import Case, judge


def assert_moe_close(case, output, *, save_dir=None, **judge_args):
    """case: a moecheck.Case (or a path to a case file); output and judge_args as moecheck.judge.
    On failure the replayable case is written to save_dir (default $MOECHECK_FAILURE_DIR, else a
    new temporary directory) and its path and the replay commands are in the message."""
    if not isinstance(case, Case):
        case = Case.load(case)
    report = judge(case, output, **judge_args)
    if report.passed:
        return report
    folder = save_dir or os.environ.get("MOECHECK_FAILURE_DIR") or tempfile.mkdtemp(prefix="moecheck-failure-")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{report.name}-failure.h5")
    report.save_case(path)
    model = f" --budget-model {report.budget_model}"
    raise AssertionError(
        f"moecheck: {report.name} {report.status.upper()}\n{report.text()}\n"
        f"replay:  moecheck compare {path} --output {report.name}{model}\n"
        f"shrink:  moecheck shrink {path} --output {report.name}{model} -o {path[:-3]}-min.h5\n")
