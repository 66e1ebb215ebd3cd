"""A Python callable as an exec backend of the moecheck binary (`--backend exec:CMD`,
tools/README.md "exec backends"), so that `moecheck shrink`, `gate`, `run` and `faults` can run a
kernel written as a Python function:

    python3 -m moecheck.exec_shim MODULE:FUNCTION {case} {out} [--budget-model M]

imports FUNCTION from MODULE (importable from the current directory or PYTHONPATH), calls it with
the moecheck.Case of {case}, and writes what it returns (the forms moecheck.gate accepts) to {out}
with capture.write_output. Exit 0; 77 with the reason on stderr when the function raises
moecheck.Unsupported (the binary counts the case as unsupported, not judged); 3 with the
traceback when it raises anything else or its output is malformed (the backend's failure)."""
import argparse
import importlib
import sys
import traceback


def resolve(spec):
    """'package.module:function' -> the function (ValueError naming the spec)."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"backend {spec!r}: must be MODULE:FUNCTION (an importable module and a callable in it)")
    obj = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"backend {spec!r}: {name} is not callable")
    return obj


def spec_of(fn):
    """The MODULE:FUNCTION a subprocess can import fn by, or ValueError saying why not."""
    mod, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not mod or not name or "<" in name or mod == "__main__":
        raise ValueError(f"{fn!r} cannot be imported by a subprocess (a lambda, a local function or one "
                         "defined in __main__): pass 'module:function' or define it in a module")
    return f"{mod}:{name}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m moecheck.exec_shim", description=__doc__.split("\n\n")[0])
    ap.add_argument("backend", help="MODULE:FUNCTION")
    ap.add_argument("case")
    ap.add_argument("out")
    ap.add_argument("--budget-model", default=None)
    a = ap.parse_args(argv)
    from . import Case, Unsupported, capture  # noqa: PLC0415
    from .sweep import _as_outputs  # noqa: PLC0415
    try:
        fn = resolve(a.backend)
        outs = _as_outputs(fn(Case.load(a.case)))
        model = a.budget_model or getattr(fn, "budget_model", None)
        capture.write_output(a.out, capture.Output("python", backend=a.backend, budget_model=model, **outs), case=a.case)
    except Unsupported as e:
        print(f"unsupported: {e}", file=sys.stderr)
        return 77
    except Exception:  # noqa: BLE001 (the kernel under test may raise anything)
        traceback.print_exc(limit=-4)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
