#!/usr/bin/env python3
"""Benchmark of the Python module (issue 16's figures): the median of 20 fresh `import moecheck`
(each in a new interpreter) and of 20 `moecheck.judge` calls on a tiny case, beside the targets
(0.3 s, 20 ms). Prints figures; asserts nothing.

usage: PYTHONPATH=build/python python3 python/bench_module.py --moecheck build/moecheck [--runs 20]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The source folder python/ holds python/moecheck without its extension: import the built package
# (PYTHONPATH) instead.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE]


def median_import(runs):
    code = "import time; t = time.perf_counter(); import moecheck; print(time.perf_counter() - t)"
    times = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        times.append(float(r.stdout))
    return statistics.median(times), min(times), max(times)


def median_judge(moecheck_bin, runs):
    import h5py
    import moecheck
    with tempfile.TemporaryDirectory(prefix="moecheck-bench-") as d:
        path = os.path.join(d, "tiny.h5")
        subprocess.run([moecheck_bin, "make-case", "--preset", "tiny-deepseek", "--tokens", "8", "--seed", "1",
                        "-o", path, "-q"], check=True)
        subprocess.run([moecheck_bin, "run", "--backend", "emulated", path], check=True, capture_output=True)
        case = moecheck.Case.load(path)
        with h5py.File(path, "r") as f:
            out = f["outputs/emulated/output"][...]
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            r = moecheck.judge(case, out, budget_model="fp32")
            times.append(time.perf_counter() - t)
        assert r.passed, r.text()
        return statistics.median(times), min(times), max(times), case.config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moecheck", required=True, help="the moecheck binary (makes the tiny case)")
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    med, lo, hi = median_import(a.runs)
    print(f"import moecheck      median {med * 1e3:7.1f} ms  (min {lo * 1e3:.1f}, max {hi * 1e3:.1f}; "
          f"{a.runs} fresh interpreters)   target < 300 ms")
    med, lo, hi, cfg = median_judge(a.moecheck, a.runs)
    print(f"moecheck.judge       median {med * 1e3:7.1f} ms  (min {lo * 1e3:.1f}, max {hi * 1e3:.1f}; "
          f"{a.runs} calls)   target < 20 ms   case: {cfg}")


if __name__ == "__main__":
    main()
