"""Fixtures of the Python module's tests (tests/python.cmake runs them with pytest): the moecheck
binary ($MOECHECK_BIN) makes small cases and records backends' outputs in them, so the module is
checked against the CLI's own verdicts."""
import os
import subprocess

import h5py
import numpy as np
import pytest


def _bin():
    b = os.environ.get("MOECHECK_BIN")
    if not b or not os.access(b, os.X_OK):
        pytest.fail("MOECHECK_BIN must name the moecheck binary (tests/python.cmake sets it)")
    return b


def run_cli(*args, check=True, env=None):
    r = subprocess.run([_bin(), *map(str, args)], capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"moecheck {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r


@pytest.fixture(scope="session")
def cli():
    return run_cli


@pytest.fixture(scope="session")
def tiny_case(tmp_path_factory):
    """tiny-deepseek, T = 8, seed 1, with outputs of emulated and two faulty backends."""
    path = tmp_path_factory.mktemp("cases") / "tiny.h5"
    run_cli("make-case", "--preset", "tiny-deepseek", "--tokens", 8, "--seed", 1, "-o", path, "-q")
    for b in ("emulated", "faulty:gate_up_swap", "faulty:output_scale_2pct"):
        run_cli("run", "--backend", b, path, "--expert-outputs")
    return path


def read_output(path, name):
    """An output group's arrays as stored (bf16 as uint16 bits)."""
    with h5py.File(path, "r") as f:
        g = f["outputs"][name]
        return {k: g[k][...] for k in ("output", "topk_ids", "topk_weights", "expert_outputs") if k in g}


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)
