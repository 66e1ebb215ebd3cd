#!/usr/bin/env python3
"""GPU check (issue 16): the Triton FP8 fused MoE of tests/triton (moe_kernel.py) gated as a user's
kernel, correct and with every mutant of fp8_moe.MUTANTS, through both ways moecheck offers:

  python  moecheck.gate(moe_kernel.<variant>, ...) in memory (needs the moecheck module importable)
  exec    moecheck gate --backend 'exec:python3 moe_kernel.py {case} {out} --variant V' (the binary)

on the gate's sweep restricted to the kernel's design (presets of DeepSeek-V3 routing, recipe
sglang). Expected: the correct kernel fails no case; every mutant fails at least one (a mutant that
leaves every output of the sweep bit-identical would be reported "not triggered"). Prints a table;
exit 0 ok, 1 an expectation broken, 77 skipped (no torch / Triton / sm_90 GPU).

usage: gate_triton.py --moecheck CMD [--cases N] [--exec-cases N] [--seed S] [--exec-variants a,b]
"""
import argparse
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = ["tiny-deepseek", "small-deepseek", "tiny-kimi"]
RECIPE = "sglang"


def python_gate(variants, cases, seed):
    import moecheck
    import moe_kernel
    rows = {}
    for name in variants:
        t = time.time()
        r = moecheck.gate(moe_kernel.VARIANTS[name], cases=cases, seed=seed, presets=PRESETS, recipe=RECIPE,
                          quiet=True)
        rows[name] = (len(r.failures), r.cases, r.vacuous, time.time() - t,
                      r.failures[0].reason if r.failures else "")
        print(f"python {name:22s} {len(r.failures):3d} of {r.cases} failed, {r.vacuous} vacuous "
              f"({time.time() - t:.1f} s)" + (f"  first: case {r.failures[0].index}: {r.failures[0].reason}"
                                              if r.failures else ""), flush=True)
    return rows


def exec_gate(cmd, variants, cases, seed):
    rows = {}
    kernel = os.path.join(HERE, "moe_kernel.py")
    for name in variants:
        backend = f"exec:{shlex.quote(sys.executable)} {shlex.quote(kernel)} {{case}} {{out}} --variant {name}"
        t = time.time()
        r = subprocess.run([*cmd, "gate", "--backend", backend, "--cases", str(cases), "--seed", str(seed),
                            "--presets", ",".join(PRESETS), "--recipe", RECIPE, "--no-golden", "-q", "--shrink", "0"],
                           capture_output=True, text=True)
        line = next((l for l in r.stdout.splitlines() if l.startswith("sweep:")), r.stdout[-300:] + r.stderr[-300:])
        rows[name] = (r.returncode, line, time.time() - t)
        print(f"exec   {name:22s} exit {r.returncode}: {line} ({time.time() - t:.1f} s)", flush=True)
        if r.returncode not in (0, 1):
            print(r.stdout[-2000:], r.stderr[-2000:], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moecheck", required=True, help="the moecheck command (split like a shell line)")
    ap.add_argument("--cases", type=int, default=30)
    ap.add_argument("--exec-cases", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--exec-variants", default="correct,gate_up_swap,output_scale_2pct,last_token_zeroed")
    a = ap.parse_args()
    try:
        import torch
        import triton  # noqa: F401
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
            print("SKIP: needs an sm_90 GPU visible to torch")
            return 77
    except ImportError as e:
        print(f"SKIP: {e}")
        return 77
    sys.path.insert(0, HERE)
    import fp8_moe
    variants = ["correct", *fp8_moe.MUTANTS]
    ok = True
    try:
        import moecheck  # noqa: F401
        have_module = True
    except ImportError as e:
        print(f"python: the moecheck module cannot be imported here ({e}); only the exec path runs", flush=True)
        have_module = False
    if have_module:
        rows = python_gate(variants, a.cases, a.seed)
        for name, (failed, cases, vac, _, _) in rows.items():
            good = failed == 0 if name == "correct" else failed > 0
            ok &= good
            if not good:
                print(f"EXPECTATION BROKEN: python {name}: {failed} of {cases} failed", flush=True)
    ev = [v for v in a.exec_variants.split(",") if v]
    for name, (rc, line, _) in exec_gate(shlex.split(a.moecheck), ev, a.exec_cases, a.seed).items():
        good = rc == 0 if name == "correct" else rc == 1
        ok &= good
        if not good:
            print(f"EXPECTATION BROKEN: exec {name}: exit {rc}", flush=True)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
