"""moecheck from Python: FP8 block-scale MoE outputs judged against a float64 reference and
budgets derived from the arithmetic (reference/BUDGETS.md), in memory.

    import moecheck
    case = moecheck.Case.load("layer.h5")            # or moecheck.Case.from_arrays(config, ...)
    report = moecheck.judge(case, output)            # output: torch/numpy [T, H], bf16 or float32
    assert report.passed, report.text()

    from moecheck.testing import assert_moe_close    # pytest: raises AssertionError with the report

Arrays may be numpy arrays, torch tensors (CPU or CUDA; copied to the host) or ml_dtypes arrays;
bfloat16 as torch.bfloat16, ml_dtypes.bfloat16 or uint16/int16 bits; float8_e4m3fn as the torch
dtype, ml_dtypes or uint8 codes. The encodings and layouts are those of tools/capture
(moecheck.capture here): FlashInfer's [H/128, T] activation scales with act_scale_layout=
"flashinfer", w13 in up/gate order with LayerConfig(gate_up_layout="up_gate").
"""
import json
import os
import shutil
import tempfile

import numpy as np

# moecheck opens case files without HDF5's file locks (golden/case_reader.cpp: read-only use, and
# NFS/Lustre refuse them); h5py in the same process must open them the same way, or HDF5 refuses
# the second open ("file locking flag values don't match").
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")

from . import _moecheck  # noqa: E402
from . import capture  # noqa: E402

__all__ = ["Case", "Report", "InputError", "LayerConfig", "Unsupported", "judge", "reference", "budget_model_names",
           "gate", "shrink"]

InputError = _moecheck.InputError


class Unsupported(Exception):
    """Raised by a kernel (a moecheck.gate callable) for a case it does not implement, e.g. a
    routing method or a recipe it lacks: the case is counted as unsupported, not judged (the exec
    shim turns it into exit status 77, which `--backend exec:CMD` reads the same way)."""
LayerConfig = capture.LayerConfig
Report = _moecheck.Report


def _report_doc(report):
    return json.loads(report.to_json())["outputs"][0]


# The structured facts of a report, as the JSON report has them (tools/report/REPORT-SCHEMA.md).
Report.experts = property(lambda r: _report_doc(r)["experts"],
                          doc="per-expert rows, worst first: expert, tokens, max_ratio, bias and energy tests, status")
Report.worst = property(lambda r: {**_report_doc(r)["worst"], "max_ratio": _report_doc(r)["max_ratio"]},
                        doc="the worst element: token, col and its ratio |observed - reference| / budget")
Report.power = property(lambda r: _report_doc(r)["power"],
                        doc="what the checks could have seen (BUDGETS.md §10.6): smallest detectable scale errors")
Report.__repr__ = lambda r: f"<moecheck.Report {r.name}: {r.status}>"


def budget_model_names():
    """The budget models judge() accepts (reference/budget_model.hpp), one string."""
    return _moecheck.budget_model_names()


class Case:
    """A validated case: a layer's inputs and FP8 weights (golden/FORMAT.md). Load one from a file,
    or build one from tensors; either way every rule of `moecheck inspect` has been applied."""

    def __init__(self, native, owned_dir=None):
        self._native = native
        self._owned_dir = owned_dir  # a temporary directory holding the file of from_arrays

    @classmethod
    def load(cls, path):
        return cls(_moecheck.Case(os.fspath(path)))

    @classmethod
    def from_arrays(cls, config, **tensors):
        """config: a LayerConfig or a dict of its fields; tensors: those of capture.write_case
        (hidden_states, router_logits, routing_bias, w13, w13_scale, w2, w2_scale, ...). The case
        is validated and written to a private temporary file that lives as long as the Case."""
        if isinstance(config, dict):
            config = LayerConfig.from_dict(config)
        tmp = tempfile.mkdtemp(prefix="moecheck-case-")
        try:
            path = capture.write_case(os.path.join(tmp, "case.h5"), config, **tensors)
            return cls(_moecheck.Case(path), owned_dir=tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def save(self, path):
        """Writes the case to path atomically (a temporary in the same directory, then a rename)."""
        return capture.atomic_write(path, lambda tmp: shutil.copyfile(self._native.path, tmp))

    @property
    def path(self):
        return self._native.path

    def arrays(self):
        """The case's tensors as stored (golden/FORMAT.md): hidden_states (float32, or bf16 as
        uint16 bits), router_logits, routing_bias, w13 / w2 (uint8 e4m3 codes), w13_scale /
        w2_scale (float32), expert_ids (the stored experts' global ids), hidden_states_fp8 and
        hidden_states_scale where the case has them (capture.read_arrays)."""
        return capture.read_arrays(self.path)

    def layer_config(self):
        """The /config attributes as a dict (capture.read_config)."""
        return capture.read_config(self.path)

    @property
    def input_hash(self):
        """The 64-bit hash (hex) of the config and every byte the reference reads (FORMAT.md)."""
        return self._native.input_hash

    @property
    def tokens(self):
        return self._native.tokens

    @property
    def hidden_size(self):
        return self._native.hidden_size

    @property
    def top_k(self):
        return self._native.top_k

    @property
    def config(self):
        """One line naming the layer (E, k, H, I, T, routing, recipe)."""
        return self._native.config

    def __repr__(self):
        return f"moecheck.Case({self.config})"

    def __del__(self):
        if getattr(self, "_owned_dir", None):
            shutil.rmtree(self._owned_dir, ignore_errors=True)


def _native_case(case):
    if isinstance(case, Case):
        return case._native
    raise TypeError(f"case must be a moecheck.Case, got {type(case).__name__}")


def _floats(where, x, allow_bf16=True):
    """-> (float32 array, was bf16): bf16 bits are decoded exactly."""
    a = capture._array(where, x)
    a, is_bf16 = capture._float_tensor(where, a, allow_bf16=allow_bf16)
    if is_bf16:
        a = capture._bf16_to_f32(a)
    return np.ascontiguousarray(a, dtype=np.float32), is_bf16


def reference(case, tier="quantized"):
    """The float64 reference output [T, H] of the case (tier "quantized": the recipe's own FP8
    arithmetic in exact arithmetic; "ideal": the unquantized layer)."""
    return _moecheck.reference(_native_case(case), tier)


def judge(case, output, topk_ids=None, topk_weights=None, expert_outputs=None, budget_model=None,
          name="output", allow_vacuous=False, requant_test=True):
    """Judges one output of the case in memory, as `moecheck compare` would after capture:
    every element against its budget, routing, per-expert bias and energy tests, the token scale
    tests, the re-quantization test (requant_test, on by default as in `moecheck compare`).
    budget_model: the model of the arithmetic that produced the output ("fp32" for a
    float32 kernel, "hopper" for FP8 tensor cores; default: an engine output's, hopper).
    Returns a Report (passed, status, text(), to_json(), to_html(path), save_case(path))."""
    native = _native_case(case)
    out, out_bf16 = _floats("output", output)
    ids = None if topk_ids is None else capture._int_tensor("topk_ids", capture._array("topk_ids", topk_ids))
    wts = None if topk_weights is None else _floats("topk_weights", topk_weights)[0]
    eo, eo_bf16 = (None, False) if expert_outputs is None else _floats("expert_outputs", expert_outputs)
    return _moecheck.judge(native, name, out, out_bf16, ids, wts, eo, eo_bf16, budget_model or "",
                           allow_vacuous, requant_test)


from .sweep import gate, shrink  # noqa: E402
