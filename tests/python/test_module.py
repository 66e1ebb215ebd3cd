"""The Python module (python/moecheck): the same verdicts as `moecheck compare` on the same data,
from numpy arrays, torch tensors and raw bf16 bits; reports; replayable failures; bad input."""
import json
import os
import subprocess

import h5py
import numpy as np
import pytest

import moecheck
from moecheck.testing import assert_moe_close
from conftest import bf16_to_f32, read_output, run_cli


def compare_status(path, name):
    r = run_cli("compare", path, "--output", name, "-q", check=False)
    return {0: "pass", 1: "fail"}.get(r.returncode, f"exit {r.returncode}")


@pytest.mark.parametrize("name", ["emulated", "faulty:gate_up_swap", "faulty:output_scale_2pct"])
def test_judge_agrees_with_compare(tiny_case, name):
    case = moecheck.Case.load(tiny_case)
    o = read_output(tiny_case, name)
    r = moecheck.judge(case, o["output"], topk_ids=o["topk_ids"], expert_outputs=o["expert_outputs"],
                       budget_model="fp32", name=name)
    assert r.status == compare_status(tiny_case, name), r.text()
    assert r.passed == (name == "emulated"), r.text()
    assert r.budget_model == "fp32"


def test_bf16_bits_and_decoded_floats_agree(tiny_case):
    case = moecheck.Case.load(tiny_case)
    bits = read_output(tiny_case, "faulty:output_scale_2pct")["output"]
    assert bits.dtype == np.uint16
    a = json.loads(moecheck.judge(case, bits, budget_model="fp32").to_json())["outputs"][0]
    b = json.loads(moecheck.judge(case, bf16_to_f32(bits), budget_model="fp32").to_json())["outputs"][0]
    assert a["status"] == b["status"] == "fail"
    assert a["max_ratio"] == b["max_ratio"]


def test_a_scaled_output_fails_and_names_its_power(tiny_case):
    case = moecheck.Case.load(tiny_case)
    out = bf16_to_f32(read_output(tiny_case, "emulated")["output"])
    assert moecheck.judge(case, out, budget_model="fp32").passed
    r = moecheck.judge(case, (out * np.float32(1.5)).astype(np.float32), budget_model="fp32")
    assert not r.passed and r.status == "fail"
    doc = json.loads(r.to_json())
    assert doc["outputs"][0]["power"], "every verdict states its power"


def test_default_model_is_an_engine_outputs(tiny_case):
    case = moecheck.Case.load(tiny_case)
    out = read_output(tiny_case, "emulated")["output"]
    assert moecheck.judge(case, out).budget_model == "hopper"


def test_reference_is_the_clis(tiny_case, tmp_path):
    copy = tmp_path / "ref.h5"
    moecheck.Case.load(tiny_case).save(copy)
    run_cli("reference", copy, "--tier", "quantized")
    with h5py.File(copy, "r") as f:
        stored = f["reference/quantized/output"][...]
    mine = moecheck.reference(moecheck.Case.load(copy))
    assert mine.shape == stored.shape and mine.dtype == np.float64
    np.testing.assert_array_equal(mine, stored)


def test_from_arrays_is_the_same_case(tiny_case):
    with h5py.File(tiny_case, "r") as f:
        cfg = {k: (v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v)
               for k, v in f["config"].attrs.items()}
        t = {"hidden_states": f["inputs/hidden_states"][...], "router_logits": f["inputs/router_logits"][...],
             "routing_bias": f["inputs/routing_bias"][...], "w13": f["weights/w13"][...],
             "w13_scale": f["weights/w13_scale"][...], "w2": f["weights/w2"][...], "w2_scale": f["weights/w2_scale"][...]}
        if "expert_ids" in f["weights"]:
            t["expert_ids"] = f["weights/expert_ids"][...]
    cfg.pop("format_version", None)
    built = moecheck.Case.from_arrays(cfg, **t)
    loaded = moecheck.Case.load(tiny_case)
    assert built.input_hash == loaded.input_hash
    assert built.tokens == loaded.tokens == 8
    out = read_output(tiny_case, "faulty:gate_up_swap")["output"]
    assert moecheck.judge(built, out, budget_model="fp32").status == "fail"
    folder = os.path.dirname(built.path)
    del built
    assert not os.path.exists(folder), "the temporary file of from_arrays lives as long as the Case"


def test_save_case_replays_through_the_cli(tiny_case, tmp_path):
    case = moecheck.Case.load(tiny_case)
    o = read_output(tiny_case, "faulty:gate_up_swap")
    r = moecheck.judge(case, o["output"], topk_ids=o["topk_ids"], budget_model="fp32", name="mine")
    saved = tmp_path / "replay.h5"
    r.save_case(saved)
    assert compare_status(saved, "mine") == "fail"
    html = tmp_path / "r.html"
    r.to_html(html)
    assert html.read_text().lstrip().lower().startswith("<!doctype html")


def test_assert_moe_close(tiny_case, tmp_path):
    case = moecheck.Case.load(tiny_case)
    assert_moe_close(case, read_output(tiny_case, "emulated")["output"], budget_model="fp32")
    bad = read_output(tiny_case, "faulty:gate_up_swap")["output"]
    with pytest.raises(AssertionError) as e:
        assert_moe_close(tiny_case, bad, budget_model="fp32", save_dir=tmp_path, name="kernel")
    msg = str(e.value)
    assert "FAIL" in msg and "replay:  moecheck compare" in msg and "shrink:" in msg
    saved = tmp_path / "kernel-failure.h5"
    assert saved.exists()
    assert compare_status(saved, "kernel") == "fail"


def test_bad_input_is_named(tiny_case, tmp_path):
    case = moecheck.Case.load(tiny_case)
    out = bf16_to_f32(read_output(tiny_case, "emulated")["output"])
    with pytest.raises(moecheck.InputError, match=r"output: shape must be \[8, "):
        moecheck.judge(case, out[:4])
    with pytest.raises(ValueError, match="budget_model"):
        moecheck.judge(case, out, budget_model="bits:99x")
    with pytest.raises(ValueError, match="float64"):
        moecheck.judge(case, out.astype(np.float64))
    with pytest.raises(moecheck.InputError, match="nothing.h5"):
        moecheck.Case.load(tmp_path / "nothing.h5")
    with pytest.raises(TypeError):
        moecheck.judge(str(tiny_case), out)
    with pytest.raises(moecheck.InputError, match="tier"):
        moecheck.reference(case, tier="exact")


def test_torch_tensors(tiny_case):
    torch = pytest.importorskip("torch", reason="torch is not installed for this python3 (Debian: python3-torch)")
    case = moecheck.Case.load(tiny_case)
    bits = read_output(tiny_case, "faulty:output_scale_2pct")["output"]
    t = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    assert moecheck.judge(case, t, budget_model="fp32").status == "fail"
    good = torch.from_numpy(read_output(tiny_case, "emulated")["output"].view(np.int16)).view(torch.bfloat16)
    assert moecheck.judge(case, good, budget_model="fp32").passed


def test_import_does_not_load_cuda():
    code = "import moecheck, sys; print(any('torch' in m for m in sys.modules)); print(open('/proc/self/maps').read())"
    r = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr
    first, maps = r.stdout.split("\n", 1)
    assert first == "False", "import moecheck must not import torch"
    assert "libcublas" not in maps and "libcudart" not in maps, "import moecheck must not load CUDA libraries"


def test_report_rows(tiny_case):
    case = moecheck.Case.load(tiny_case)
    o = read_output(tiny_case, "faulty:gate_up_swap")
    r = moecheck.judge(case, o["output"], topk_ids=o["topk_ids"], budget_model="fp32", name="k")
    assert r.experts and r.experts[0]["status"] == "fail" and "max_ratio" in r.experts[0]
    assert r.worst["max_ratio"] > 1 and {"token", "col"} <= set(r.worst)
    assert "scale_error" in r.power
    assert repr(r) == "<moecheck.Report k: fail>"
