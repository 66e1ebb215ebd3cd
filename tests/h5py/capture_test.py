#!/usr/bin/env python3
"""Tests of tools/capture/moecheck_capture.py (numpy + h5py; CTest runs it with /usr/bin/python3).

usage: capture_test.py --moecheck PATH/TO/moecheck [unittest arguments, e.g. -k Broken]

A numpy float32 "engine" (tests/h5py/numpy_moe.py) runs a tiny FP8 block-scale MoE layer by the
device recipe; the capture module writes what it had at hand into a case; `moecheck inspect`
must accept the case (exit 0) and `moecheck compare` must judge the correct engine within budget
(exit 0) and a deliberately broken engine over it (exit 1). Bad inputs must raise ValueError
naming the tensor and leave no file behind.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import h5py
import numpy as np

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "tools" / "capture"))
import moecheck_capture as mc  # noqa: E402
import numpy_moe as nm  # noqa: E402

MOECHECK = None  # set from --moecheck

T, E, K, H, I = 16, 8, 2, 256, 256
DS = dict(routing="deepseek_v3", n_group=4, topk_group=2, rsf=2.5)


def moecheck(*args):
    r = subprocess.run([MOECHECK, *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


class E4m3Codec(unittest.TestCase):
    def test_every_code_round_trips(self):
        codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
        np.testing.assert_array_equal(nm.e4m3_encode(nm.e4m3_decode(codes)), codes)
        self.assertTrue(np.isnan(nm.e4m3_decode(np.array([0x7F, 0xFF], dtype=np.uint8))).all())
        self.assertEqual(nm.e4m3_decode(np.array([0x7E], dtype=np.uint8))[0], 448.0)
        self.assertEqual(nm.e4m3_decode(np.array([0x01], dtype=np.uint8))[0], 2.0 ** -9)

    def test_midpoints_round_to_the_even_code(self):
        v = nm.E4M3_TABLE[:0x7F]
        mid = (v[:-1] + v[1:]) / 2  # exact in float64
        lower = np.arange(0x7E)
        want = np.where(lower % 2 == 0, lower, lower + 1)
        np.testing.assert_array_equal(nm.e4m3_encode(mid), want)
        np.testing.assert_array_equal(nm.e4m3_encode(-mid), want | 0x80)

    def test_nearest_against_brute_force_and_saturation(self):
        rng = np.random.default_rng(7)
        x = (rng.standard_normal(20000) * np.exp2(rng.integers(-12, 10, 20000))).astype(np.float32)
        got = nm.e4m3_encode(x)
        vals = nm.E4M3_TABLE[got].astype(np.float64)
        finite = nm.E4M3_TABLE[np.array([c for c in range(256) if c & 0x7F != 0x7F])]
        best = np.abs(np.clip(x.astype(np.float64), -448, 448)[:, None] - finite[None, :]).min(axis=1)
        np.testing.assert_array_equal(np.abs(np.clip(x, -448, 448) - vals), best)
        np.testing.assert_array_equal(nm.e4m3_encode(np.array([460.0, 1e6, -np.inf, np.inf])),
                                      [0x7E, 0x7E, 0xFE, 0x7E])


class Capture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="moecheck-capture-")
        cls.dir = Path(cls.tmp.name)
        cls.ds = nm.make_layer(1, T, E, H, I, with_bias=True)
        cls.rn = nm.make_layer(2, T, E, H, I, with_bias=False)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def ds_config(self, **kw):
        return mc.LayerConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="deepseek_v3",
                              n_group=4, topk_group=2, routed_scaling_factor=2.5, **kw)

    def capture_ds(self, name, bug=None, expert_outputs=True, slots="rank", combine="f32", recipe=None, **kw):
        """The deepseek_v3 layer through the numpy engine, captured with two outputs of the same
        data: "numpy" (backend unknown to moecheck: judged with the default "hopper" model) and
        "numpy-fp32" (budget_model = fp32: what the engine does, float32 round-to-nearest sums)."""
        L = self.ds
        out, ids, w, y = nm.run_engine(L, "deepseek_v3", K, 4, 2, 2.5, bug=bug, combine=combine)
        if slots == "ascending":  # an engine that records its slots sorted by id
            order = np.argsort(ids, axis=1)
            t = np.arange(T)[:, None]
            ids, w, y = mc.rank_order(self.ds_config(), L["logits"], L["bias"], ids[t, order], w[t, order],
                                      y[t, order])
        path = self.dir / name
        outputs = [mc.Output(n, output=out.view(np.int16), topk_ids=ids, topk_weights=w,
                             expert_outputs=y if expert_outputs else None, backend="numpy-f32", device="cpu",
                             budget_model=m) for n, m in (("numpy", None), ("numpy-fp32", "fp32"))]
        mc.write_case(path, self.ds_config(**(recipe or {})), hidden_states=nm.bf16_bits(L["hidden"]).view(np.int16),
                      router_logits=L["logits"], routing_bias=L["bias"], w13=L["w13"], w13_scale=L["w13_scale"],
                      w2=L["w2"], w2_scale=L["w2_scale"], source="tests/h5py/capture_test.py", outputs=outputs, **kw)
        return path

    def assert_inspect_ok(self, path):
        rc, text = moecheck("inspect", path)
        self.assertEqual(rc, 0, text)
        self.assertIn("valid", text)

    def test_deepseek_engine_is_within_budget(self):
        path = self.capture_ds("deepseek.h5")
        self.assert_inspect_ok(path)
        rc, text = moecheck("compare", path)
        self.assertEqual(rc, 0, text)
        self.assertIn("PASS  numpy:", text)
        self.assertIn("PASS  numpy-fp32:", text)
        self.assertNotIn(".tmp.", " ".join(os.listdir(self.dir)))

    def test_rank_order_slots_is_within_budget(self):
        """compare matches expert_outputs[t, j] to the reference's slot j: slots recorded in
        ascending-id order go through mc.rank_order first."""
        path = self.capture_ds("deepseek-ascending.h5", slots="ascending")
        rc, text = moecheck("compare", path)
        self.assertEqual(rc, 0, text)

    def test_subset_output_only_is_within_budget(self):
        path = self.capture_ds("deepseek-subset.h5", expert_outputs=False, keep_experts="routed")
        self.assert_inspect_ok(path)
        rc, text = moecheck("compare", path)
        self.assertEqual(rc, 0, text)

    def test_flashinfer_layouts_expert_parallel_is_within_budget(self):
        """FlashInfer-style inputs: w31 (up, gate) order, engine-quantized activations with the
        [H/128, T] scale, rank 1 of 2 (experts 4..7), only the experts its tokens use stored."""
        L = dict(self.rn)
        swap = lambda w: np.concatenate([w[:, I:], w[:, :I]], axis=1)  # noqa: E731
        L["w13"], L["w13_scale"] = swap(L["w13"]), swap(L["w13_scale"])  # I % 128 == 0: blocks swap whole
        local = {k: L[k][4:] for k in ("w13", "w13_scale", "w2", "w2_scale")}
        codes, scales = nm.quantize_groups(L["hidden"])
        eng = dict(L, **local)
        out, ids, w, y = nm.run_engine(eng, "renormalize", K, up_gate=True, local=(4, 4), act=(codes, scales))
        cfg = mc.LayerConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="renormalize",
                             gate_up_layout="up_gate", local_expert_offset=4, local_num_experts=4)
        path = self.dir / "renormalize-ep.h5"
        mc.write_case(path, cfg, hidden_states=L["hidden"], router_logits=L["logits"],
                      hidden_states_fp8=codes, hidden_states_scale=np.ascontiguousarray(scales.T),
                      act_scale_layout="flashinfer", keep_experts="routed", **local,
                      outputs=[mc.Output("flashinfer-like", output=out.view(np.int16), topk_ids=ids),
                               mc.Output("flashinfer-like-fp32", output=out.view(np.int16), topk_ids=ids,
                                         budget_model="fp32")])
        self.assert_inspect_ok(path)
        rc, text = moecheck("inspect", "--json", path)
        experts = json.loads(text)["experts"]
        self.assertTrue(experts["subset"])
        self.assertEqual(experts["ids"], sorted(int(e) for e in np.unique(ids) if 4 <= e < 8))
        rc, text = moecheck("compare", path)
        self.assertEqual(rc, 0, text)

    def test_recipe_engine_is_within_budget(self):
        """An engine that rounds each weighted slot to bf16 before the sum (SGLang's combine),
        captured with combine="bf16_slots": the attribute is written, and the engine passes the
        reference that follows it; captured without it, the default reference fails it."""
        path = self.capture_ds("bf16-slots.h5", combine="bf16_slots", recipe={"combine": "bf16_slots"})
        self.assert_inspect_ok(path)
        with h5py.File(path, "r") as f:
            self.assertEqual(f["config"].attrs["combine"], "bf16_slots")
            self.assertNotIn("silu_dtype", f["config"].attrs)  # not given: not written (default)
        rc, text = moecheck("compare", path, "--output", "numpy-fp32")
        self.assertEqual(rc, 0, text)
        path = self.capture_ds("bf16-slots-unsaid.h5", combine="bf16_slots")
        rc, text = moecheck("compare", path, "--output", "numpy-fp32")
        self.assertEqual(rc, 1, text)

    def test_recipe_presets_fill_unset_attributes(self):
        cfg = self.ds_config(recipe="transformers", routing_weight_dtype="f32")
        attrs = cfg.attributes()
        self.assertNotIn("recipe", attrs)
        self.assertEqual(attrs["combine"], "bf16_expert_order")
        self.assertEqual(attrs["act_scale_floor"], "none")
        self.assertEqual(attrs["routing_weight_dtype"], "f32")  # explicit wins over the preset
        self.assertEqual(self.ds_config(recipe="sglang").attributes()["intermediate_dtype"], "bf16")

    def test_broken_engines_fail_compare(self):
        for bug in ("rsf_twice", "gate_up_swap"):
            with self.subTest(bug=bug):
                path = self.capture_ds(f"broken-{bug}.h5", bug=bug)
                self.assert_inspect_ok(path)
                # Judged as what the engine is (float32 sums): the "hopper" model's worst-case
                # budget on this i.i.d. data is about twice the output itself (see README.md).
                rc, text = moecheck("compare", path, "--output", "numpy-fp32")
                self.assertEqual(rc, 1, text)
                self.assertIn("FAIL  numpy-fp32:", text)

    def good_args(self):
        L = self.ds
        return dict(hidden_states=L["hidden"], router_logits=L["logits"], routing_bias=L["bias"], w13=L["w13"],
                    w13_scale=L["w13_scale"], w2=L["w2"], w2_scale=L["w2_scale"],
                    outputs=[mc.Output("x", output=np.zeros((T, H), np.float32))])

    def test_bad_inputs_leave_no_file(self):
        L = self.ds
        nan_scale = L["w2_scale"].copy()
        nan_scale[3, 1, 0] = np.nan
        nan_code = L["w13"].copy()
        nan_code[2, 5, 7] = 0xFF
        cases = {
            "w13: shape must be": dict(w13=L["w13"][:, :, :128]),
            "w2_scale: scales must be finite and > 0": dict(w2_scale=nan_scale),
            "w13: must not hold the float8_e4m3fn NaN codes": dict(w13=nan_code),
            "w13: must be uint8": dict(w13=L["w13"].astype(np.float32)),
            "w2: must be uint8 holding float8_e4m3fn codes (view it as uint8": dict(w2=L["w2"].view(np.int8)),
            "hidden_states: must be float32 or bfloat16": dict(hidden_states=L["hidden"].astype(np.float64)),
            "router_logits: shape must be [T = 16, num_experts = 8]": dict(router_logits=L["logits"][:, :4]),
            "routing_bias: required for deepseek_v3": dict(routing_bias=None),
            "hidden_states_scale: expects [T = 16, ceil(H/G) = 2], got [2, 16]: FlashInfer":
                dict(hidden_states_fp8=np.zeros((T, H), np.uint8), hidden_states_scale=np.ones((2, T), np.float32)),
            "hidden_states_scale: hidden_states_fp8 and hidden_states_scale come together":
                dict(hidden_states_fp8=np.zeros((T, H), np.uint8)),
            "outputs['x'].output: shape must be": dict(outputs=[mc.Output("x", output=np.zeros((T, H + 1), np.float32))]),
            "outputs['a b']: output names": dict(outputs=[mc.Output("a b", output=np.zeros((T, H), np.float32))]),
            "outputs['x'].budget_model: must be": dict(outputs=[mc.Output("x", output=np.zeros((T, H), np.float32),
                                                                          budget_model="f32")]),
            "keep_experts: experts [9]": dict(keep_experts=[1, 9]),
            "expert_ids: ids must be strictly increasing": dict(expert_ids=np.array([0, 1, 2, 3, 5, 4, 6, 7])),
            "w13: holds 8 experts but local_num_experts": dict(cfg=self.ds_config(local_num_experts=4)),
            "config.top_k: 7 exceeds the 4 experts": dict(cfg=mc.LayerConfig(
                num_experts=E, top_k=7, hidden_size=H, intermediate_size=I, routing="deepseek_v3", n_group=4,
                topk_group=2)),
            "config.routing: must be one of": dict(cfg=mc.LayerConfig(
                num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, routing="deepseek")),
            "w13_scale: scale_format = ue8m0 needs powers of two": dict(cfg=self.ds_config(scale_format="ue8m0")),
            "config.combine: must be one of f32 | bf16_slots | bf16_expert_order":
                dict(cfg=self.ds_config(combine="bf16")),
            "config.quant_divide: reciprocal needs act_scale_floor = eps":
                dict(cfg=self.ds_config(quant_divide="reciprocal", act_scale_floor="none")),
        }
        target = self.dir / "bad.h5"
        target.write_bytes(b"previous contents")
        for rule, change in cases.items():
            with self.subTest(rule=rule):
                args = self.good_args()
                cfg = change.pop("cfg", self.ds_config())
                args.update(change)
                with self.assertRaises(ValueError) as ctx:
                    mc.write_case(target, cfg, **args)
                self.assertTrue(str(ctx.exception).startswith(rule), f"{ctx.exception!s} does not start with {rule!r}")
                self.assertEqual(target.read_bytes(), b"previous contents")
                self.assertEqual([p for p in os.listdir(self.dir) if ".tmp." in p], [])
        with self.assertRaisesRegex(ValueError, r"^config\.routed_scaling_factr: unknown attribute"):
            mc.LayerConfig.from_dict(dict(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I,
                                          routing="renormalize", routed_scaling_factr=2.0))
        with self.assertRaisesRegex(ValueError, r"^config\.routing: required attribute missing"):
            mc.LayerConfig.from_dict(dict(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I))

    def test_failed_write_leaves_no_file(self):
        class Boom(Exception):
            pass

        target = self.dir / "interrupted.h5"
        orig = mc.h5py.Group.create_dataset

        def failing(self_, name, *a, **kw):
            if name == "/weights/w2":
                raise Boom()
            return orig(self_, name, *a, **kw)

        mc.h5py.Group.create_dataset = failing
        try:
            with self.assertRaises(Boom):
                mc.write_case(target, self.ds_config(), **self.good_args())
        finally:
            mc.h5py.Group.create_dataset = orig
        self.assertFalse(target.exists())
        self.assertEqual([p for p in os.listdir(self.dir) if p.startswith("interrupted")], [])


class InputsChanged(unittest.TestCase):
    """An output recorded by `moecheck run` carries the hashes of the inputs it was computed from;
    compare refuses it (exit 2, naming the changed dataset) once an input is edited."""

    def test_compare_refuses_an_output_whose_inputs_changed(self):
        with tempfile.TemporaryDirectory(prefix="moecheck-inputs-") as d:
            case = Path(d) / "c.h5"
            self.assertEqual(moecheck("make-case", "--preset", "tiny-qwen", "--tokens", "4", "--seed", "7", "-o", case)[0], 0)
            self.assertEqual(moecheck("run", case, "--backend", "emulated")[0], 0)
            self.assertEqual(moecheck("compare", case, "-q")[0], 0)
            for dataset in ("inputs/router_logits", "weights/w2_scale"):
                edited = Path(d) / (dataset.replace("/", "_") + ".h5")
                edited.write_bytes(case.read_bytes())
                with h5py.File(edited, "r+") as f:
                    a = f[dataset][...]
                    a.flat[0] = a.flat[0] * 2 if a.flat[0] != 0 else 1
                    f[dataset][...] = a
                rc, text = moecheck("compare", edited, "-q")
                self.assertEqual(rc, 2, text)
                self.assertIn("/outputs/emulated@input_hash", text)
                self.assertIn("/" + dataset.split("/")[0] if dataset.startswith("weights") else "/" + dataset, text)


def main():
    global MOECHECK
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--moecheck":
        sys.exit("usage: capture_test.py --moecheck PATH [unittest arguments]")
    MOECHECK = argv[1]
    unittest.main(argv=[sys.argv[0], *argv[2:]], verbosity=2)


if __name__ == "__main__":
    main()
