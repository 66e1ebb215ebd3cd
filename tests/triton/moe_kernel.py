"""The Triton FP8 fused MoE of tests/triton/fp8_moe.py as a kernel moecheck can drive: a callable
per variant (`correct` and one per mutant of fp8_moe.MUTANTS) that takes a moecheck.Case and
returns (output, topk_ids, topk_weights), for moecheck.gate() in Python and for
`--backend 'exec:python3 -m moecheck.exec_shim moe_kernel:correct {case} {out}'` (the module must
be importable: PYTHONPATH=tests/triton).

The design is SGLang's (recipe "sglang": bf16 intermediate, bf16 slot products summed in float32)
with DeepSeek-V3 routing; it adapts to what the gate's sweep varies within that design (f32 or
UE8M0 scales, gate/up order, bf16 or float32 hidden states, bf16 routing weights, bf16 biases,
EP shards and routed-only storage, TP-sharded I in whole 128 blocks) and raises ValueError for
what it does not implement (another routing method or recipe, ragged blocks, an engine's own FP8
activations), which the gate reports as the kernel's failure: run it with presets of DeepSeek-V3
routing and recipe sglang (tests/triton/gate_triton.py)."""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "capture"))
import fp8_moe  # noqa: E402
import moecheck_capture as mc  # noqa: E402

BUDGET_MODEL = "hopper"  # FP8 tensor cores


def _config(c, I):
    wanted = {"routing": "deepseek_v3", "intermediate_dtype": "bf16", "combine": "bf16_slots",
              "silu_dtype": "f32", "expert_output_dtype": "f32", "act_scale_floor": "eps",
              "quant_divide": "divide", "group_size": 128, "weight_block": 128}
    for key, want in wanted.items():
        if c.get(key, want) != want:
            raise ValueError(f"not implemented: {key} = {c[key]!r} (this kernel is the sglang recipe: {key} = {want!r})")
    if int(c["hidden_size"]) % 128 or I % 128:
        raise ValueError(f"not implemented: H = {c['hidden_size']}, I = {I} (whole 128-wide blocks only)")


def _layer(case, device):
    a, c = case.arrays(), case.layer_config()
    I = a["w2"].shape[2]
    _config(c, I)
    if "hidden_states_fp8" in a:
        raise ValueError("not implemented: the engine's own FP8 activations (hidden_states_fp8)")
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(device)  # noqa: E731
    bf16 = lambda bits: t(bits.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    hidden = a["hidden_states"]
    w13, s13 = a["w13"], a["w13_scale"]
    if c.get("gate_up_layout") == "up_gate":  # stored [up; gate]: the kernel takes gate rows first
        w13 = np.concatenate([w13[:, I:], w13[:, :I]], axis=1)
        s13 = np.concatenate([s13[:, I // 128:], s13[:, :I // 128]], axis=1)
    E = int(c["num_experts"])
    off, nloc = int(c.get("local_expert_offset", 0)), int(c.get("local_num_experts", E))
    stored = np.full(E, -1, dtype=np.int64)
    for slot, e in enumerate(a["expert_ids"]):
        if off <= e < off + nloc:
            stored[int(e)] = slot
    bias = a.get("routing_bias")
    layer = {
        "hidden": bf16(hidden) if hidden.dtype == np.uint16 else t(hidden.astype(np.float32)),
        "logits": t(a["router_logits"].astype(np.float32)),
        "bias": (bf16(bias).float() if bias.dtype == np.uint16 else t(bias.astype(np.float32))),
        "w13": t(w13).view(torch.float8_e4m3fn), "w13_scale": t(s13.astype(np.float32)),
        "w2": t(a["w2"]).view(torch.float8_e4m3fn), "w2_scale": t(a["w2_scale"].astype(np.float32)),
        "stored_index": t(stored),
    }
    cfg = {k: c[k] for k in ("num_experts", "top_k", "n_group", "topk_group", "routed_scaling_factor")}
    cfg.update({k: c[k] for k in ("scale_format", "routing_weight_dtype", "act_eps") if k in c})
    return layer, cfg


def run(case, mutant=None, device="cuda"):
    layer, cfg = _layer(case, device)
    out, ids, w = fp8_moe.forward(layer, cfg, mutant)
    torch.cuda.synchronize()
    return out.cpu(), ids.cpu().numpy(), w.cpu().numpy()


def _variant(mutant):
    def kernel(case):
        return run(case, mutant)
    kernel.__name__ = kernel.__qualname__ = mutant or "correct"
    kernel.budget_model = BUDGET_MODEL
    return kernel


correct = _variant(None)
for _m in fp8_moe.MUTANTS:
    globals()[_m] = _variant(_m)
VARIANTS = {"correct": correct, **{m: globals()[m] for m in fp8_moe.MUTANTS}}


class CaseFile:
    """A case file read with h5py alone (tools/capture), for hosts where the moecheck module
    cannot be imported: what the kernel reads of a moecheck.Case."""

    def __init__(self, path):
        self.path = path

    def arrays(self):
        return mc.read_arrays(self.path)

    def layer_config(self):
        return mc.read_config(self.path)


def main():
    """python3 moe_kernel.py CASE OUT [--variant NAME]: the exec backend without the module."""
    import argparse  # noqa: PLC0415
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("case")
    ap.add_argument("out")
    ap.add_argument("--variant", default="correct", choices=sorted(VARIANTS))
    a = ap.parse_args()
    try:
        out, ids, w = VARIANTS[a.variant](CaseFile(a.case))
    except ValueError as e:
        print(f"moe_kernel: {e}", file=sys.stderr)
        return 3
    mc.write_output(a.out, mc.Output(a.variant, output=out, topk_ids=ids, topk_weights=w, backend="triton-fp8-test",
                                     budget_model=BUDGET_MODEL, device=torch.cuda.get_device_name()), case=a.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
