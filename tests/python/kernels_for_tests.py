"""Kernels as Python callables for the module's gate and shrink tests: tests/exec/numpy_moe_kernel.py
(a numpy float32 kernel of the recipe) correct and with one mutant. Importable by a subprocess
(moecheck.shrink runs them through `python3 -m moecheck.exec_shim kernels_for_tests:NAME`)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "exec"))
import numpy_moe_kernel as _k  # noqa: E402


def correct(case):
    return _k.run_layer(_k.read_case(case.path), "none")


def gate_up_swap(case):
    return _k.run_layer(_k.read_case(case.path), "gate_up_swap")


def output_scale_2pct(case):
    return _k.run_layer(_k.read_case(case.path), "output_scale_2pct")[:2]


def nan_in_last_row(case):  # the kernel returns bf16 bits (uint16)
    out = _k.run_layer(_k.read_case(case.path), "none")[0].copy()
    out[-1, 0] = 0x7FC0  # bf16 bits of a quiet NaN
    return out


def at_most_8_tokens(case):  # a kernel with a size limit: declines larger cases
    import moecheck  # noqa: PLC0415
    if case.tokens > 8:
        raise moecheck.Unsupported("this kernel takes at most 8 tokens")
    return correct(case)


correct.budget_model = gate_up_swap.budget_model = output_scale_2pct.budget_model = "fp32"
nan_in_last_row.budget_model = at_most_8_tokens.budget_model = "fp32"
