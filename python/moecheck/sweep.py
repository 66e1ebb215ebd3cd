"""moecheck.gate(backend=callable): the gate's property sweep (tools/sweep/gate_sweep.hpp, the same case
i of seed S as `moecheck gate --seed S --case i`) run through a Python callable, each output
judged in memory. The callable is your kernel: it takes a moecheck.Case (case.arrays() and
case.layer_config() give its tensors and /config) and returns the layer's output [T, H], or a
tuple (output, topk_ids[, topk_weights[, expert_outputs]]), or a dict with those keys.

A failing case is saved with the output in it (a replayable case: `moecheck compare FILE --output
python`), printed with the make-case command that rebuilds its inputs and the Python call that
reruns it alone. An exception raised by the callable fails the case (its message is the reason),
except moecheck.Unsupported: the kernel declines the case, which is counted, not judged; a gate
whose cases were all declined is not ok.
A case whose checks could not even see the output zeroed (VACUOUS, BUDGETS.md §10.6) and that
fails no check is counted as not judged, as `moecheck gate` counts it.
"""
import os
import shutil
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from typing import List, Optional

from . import _moecheck

OUTPUT_NAME = "python"


@dataclass
class GateFailure:
    index: int
    reason: str
    case_path: Optional[str]  # the saved case (with the output when there was one)
    make_case: str
    replay: str


@dataclass
class GateResult:
    seed: int
    cases: int = 0
    passed: int = 0
    vacuous: int = 0
    unsupported: int = 0  # cases the callable declined (moecheck.Unsupported)
    unsupported_reasons: dict = field(default_factory=dict)  # reason -> count
    failures: List[GateFailure] = field(default_factory=list)
    work_dir: Optional[str] = None  # where the failing cases are (None when all passed)

    @property
    def judged_nothing(self):
        """Every case declined or not judged, at least one declined: the kernel was never judged."""
        return self.unsupported > 0 and self.passed == 0 and not self.failures

    @property
    def ok(self):
        return not self.failures and not self.judged_nothing

    def text(self):
        lines = [f"moecheck.gate seed {self.seed}: {self.cases} cases, {self.passed} passed, "
                 f"{len(self.failures)} failed, {self.vacuous} vacuous (not judged)"
                 + (f", {self.unsupported} unsupported by the backend (not judged)" if self.unsupported else "")]
        for why, n in sorted(self.unsupported_reasons.items()):
            lines.append(f"  unsupported: {n} x {why}")
        if self.judged_nothing:
            lines.append("  no case was judged: narrow the sweep to what the kernel implements (presets=, recipe=)")
        for f in self.failures:
            lines += [f"  FAIL case {f.index}: {f.reason}", f"    make-case: {f.make_case}", f"    replay:    {f.replay}"]
            if f.case_path:
                lines.append(f"    saved:     {f.case_path}  (moecheck compare {f.case_path} --output {OUTPUT_NAME})")
        return "\n".join(lines)


def _as_outputs(res):
    if isinstance(res, dict):
        unknown = set(res) - {"output", "topk_ids", "topk_weights", "expert_outputs"}
        if unknown or "output" not in res:
            raise ValueError(f"the backend's dict must have 'output' and may have topk_ids, topk_weights, "
                             f"expert_outputs; got keys {sorted(res)}")
        return dict(res)
    if isinstance(res, (tuple, list)):
        if not 1 <= len(res) <= 4:
            raise ValueError(f"the backend returned a tuple of {len(res)}: (output, topk_ids, topk_weights, "
                             "expert_outputs), the last three optional")
        return dict(zip(("output", "topk_ids", "topk_weights", "expert_outputs"), res))
    return {"output": res}


def _first_line(e):
    return f"{type(e).__name__}: {e}".splitlines()[0]


def gate(backend, cases=100, seed=1, presets=None, recipe=None, budget_model=None, case=None, save_dir=None,
         max_failures=None, requant_test=True, quiet=False):
    """Runs `cases` sweep cases of `seed` (or only sweep case `case`) through backend(Case) and
    judges each output with budget_model (default: backend.budget_model if the callable has one,
    else an engine output's, hopper). presets: the tiny presets to draw from (default all);
    recipe: an engine recipe or a list of settings pinned on every case (`gate --recipe`, e.g.
    "sglang" for a kernel of that design); requant_test: the re-quantization test (BUDGETS.md
    §10.7; on by default, as in `moecheck compare`). Returns a GateResult (ok, failures, text()); prints progress and each
    failure to stderr unless quiet."""
    from . import Case, InputError, Unsupported, judge  # noqa: PLC0415 (package cycle)

    if not callable(backend):
        raise TypeError(f"backend must be callable (it takes a moecheck.Case), got {type(backend).__name__}")
    model = budget_model or getattr(backend, "budget_model", None)
    presets = list(presets) if presets else []
    recipes = [recipe] if isinstance(recipe, str) else list(recipe or [])
    indices = [int(case)] if case is not None else range(int(cases))
    work = tempfile.mkdtemp(prefix="moecheck-pygate-")
    folder = save_dir or work
    os.makedirs(folder, exist_ok=True)
    result = GateResult(seed=seed)
    bname = getattr(backend, "__name__", type(backend).__name__)
    say = (lambda s: None) if quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    try:
        for i in indices:
            result.cases += 1
            path = os.path.join(work, f"case-{i}.h5")
            make = _moecheck.sweep_case(seed, i, presets, recipes, path)
            replay = (f"moecheck.gate({bname}, seed={seed}, case={i}" + (f", presets={presets}" if presets else "")
                      + (f", recipe={recipes}" if recipes else "") + ")")
            failure = None
            try:
                c = Case.load(path)
            except InputError as e:  # the generator made a case the reader refuses: ours, not yours
                failure = GateFailure(i, f"moecheck could not read its own generated case: {e}", None, make, replay)
            declined = False
            if failure is None:
                try:
                    outs = _as_outputs(backend(c))
                except Unsupported as e:
                    declined = True
                    why = str(e).splitlines()[0] if str(e) else "(no reason given)"
                    result.unsupported += 1
                    result.unsupported_reasons[why] = result.unsupported_reasons.get(why, 0) + 1
                except Exception as e:  # noqa: BLE001 (the kernel under test may raise anything)
                    tb = traceback.format_exc(limit=-3)
                    failure = GateFailure(i, f"the backend raised {_first_line(e)}", None, make, replay)
                    say(tb.rstrip())
            if failure is None and not declined:
                try:
                    r = judge(c, name=OUTPUT_NAME, budget_model=model, allow_vacuous=True, requant_test=requant_test,
                              **outs)
                except (ValueError, TypeError) as e:
                    failure = GateFailure(i, f"the backend's output is malformed: {_first_line(e)}", None, make, replay)
                else:
                    if r.status == "vacuous":
                        result.vacuous += 1
                    elif r.passed:
                        result.passed += 1
                    else:
                        saved = os.path.join(folder, f"case-{i}-failed.h5")
                        r.save_case(saved)
                        failure = GateFailure(i, _reason(r), saved, make, replay)
            if failure is not None:
                result.failures.append(failure)
                say(f"FAIL case {i}: {failure.reason}\n  make-case: {make}\n  replay:    {replay}"
                    + (f"\n  saved:     {failure.case_path}" if failure.case_path else ""))
            if os.path.exists(path):
                os.unlink(path)
            if not quiet and sys.stderr.isatty():
                print(f"\rgate: {result.cases} cases, {len(result.failures)} failed", end="", file=sys.stderr)
            if max_failures is not None and len(result.failures) >= max_failures:
                break
    finally:
        if not quiet and sys.stderr.isatty():
            print(file=sys.stderr)
        if not any(f.case_path and f.case_path.startswith(work) for f in result.failures):
            shutil.rmtree(work, ignore_errors=True)
        else:
            result.work_dir = work
    say(result.text().splitlines()[0])
    return result


def _reason(report):
    import json  # noqa: PLC0415
    o = json.loads(report.to_json())["outputs"][0]
    bad = [f"expert {e['expert']}" for e in o.get("experts", []) if e.get("status") != "pass"][:3]
    ratio = o.get("max_ratio")  # a real, or "inf" / "nan" (REPORT-SCHEMA.md), or null
    ratio = f"{ratio:.3g}" if isinstance(ratio, (int, float)) else str(ratio)
    return f"{report.status}: max ratio {ratio}" + (f"; failing: {', '.join(bad)}" if bad else "")


def shrink(case, backend, out, budget_model=None, control=None, max_attempts=None, moecheck_bin=None,
           quiet=False):
    """Minimizes a failing case through backend, a Python callable, by the binary's delta
    debugging (`moecheck shrink --backend exec:...`): every candidate case is run by
    `python3 -m moecheck.exec_shim MODULE:FUNCTION` in a subprocess, so the callable must be
    importable (defined in a module, not a lambda; or pass the 'module:function' string).
    control: a backend (callable or spec) that must pass on every kept candidate, e.g. the same
    kernel without its suspected bug. Returns the path of the minimal case (written atomically
    by the binary); raises RuntimeError with the binary's output when it fails."""
    import shlex  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    from .exec_shim import spec_of  # noqa: PLC0415

    def command(b):
        spec = b if isinstance(b, str) else spec_of(b)
        model = budget_model or (None if isinstance(b, str) else getattr(b, "budget_model", None))
        cmd = [sys.executable, "-m", "moecheck.exec_shim", spec, "{case}", "{out}"]
        if model:
            cmd += ["--budget-model", model]
        return "exec:" + " ".join(c if c in ("{case}", "{out}") else shlex.quote(c) for c in cmd)

    binary = moecheck_bin or binary_path()
    args = [binary, "shrink", os.fspath(getattr(case, "path", case)), "--backend", command(backend), "-o", os.fspath(out)]
    if control is not None:
        args += ["--control", command(control)]
    if budget_model:
        args += ["--budget-model", budget_model]
    if max_attempts:
        args += ["--max-attempts", str(max_attempts)]
    if quiet:
        args.append("--quiet")
    # The subprocesses import what this interpreter imports: its sys.path as their PYTHONPATH.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
    for b in (backend, control):
        if b is not None:
            spec = b if isinstance(b, str) else spec_of(b)
            probe = subprocess.run([sys.executable, "-c", f"import moecheck.exec_shim as s; s.resolve({spec!r})"],
                                   capture_output=True, text=True, env=env)
            if probe.returncode != 0:
                raise ValueError(f"backend {spec!r} cannot be imported by a subprocess:\n{probe.stderr.strip()}")
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    if not quiet:
        sys.stderr.write(r.stdout + r.stderr)
    if r.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"moecheck shrink exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return os.fspath(out)


def binary_path():
    """The moecheck binary: $MOECHECK_BIN, else the one built beside this package (build/moecheck),
    else `moecheck` on PATH."""
    env = os.environ.get("MOECHECK_BIN")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "moecheck")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("moecheck")
    if not found:
        raise FileNotFoundError("the moecheck binary: set MOECHECK_BIN (it is build/moecheck after README command 1)")
    return found
