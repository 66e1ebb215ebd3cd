#!/usr/bin/env python3
"""An external FP8 block-scale MoE kernel in plain numpy float32, for `moecheck ... --backend
exec:CMD` (tools/README.md "exec backends"): it reads the case moecheck hands it ({case}, the
format of golden/FORMAT.md), computes the layer by the device algorithm
(docs/DEVICE-ALGORITHM.md; the arithmetic of the emulated backend, kernels/emulated/, step for
step in float32) and writes its output file ({out}) with tools/capture's write_output, judged
with the budget model "fp32".

    python3 numpy_moe_kernel.py CASE OUT [--fault NAME] [--max-tokens N]

What it implements: every routing method (deepseek_v3 with grouped top-k and the correction
bias, renormalize, softmax_topk, sigmoid_renormalize with or without a bias, llama4), f32 and
UE8M0 scales, both gate/up layouts, f32 / bf16 intermediates and routing weights, bf16 or f32
hidden states, the engine's own FP8 activations (hidden_states_fp8), ragged last blocks, EP
shards (local_expert_offset, subset storage), and the engine recipes (combine f32 / bf16_slots /
bf16_expert_order, act_scale_floor, quant_divide, expert_output_dtype, silu_dtype). It declines
(exit 77, the reason on stderr: moecheck counts the case as unsupported) what it does not:
group_size != weight_block, and with --max-tokens N a case of more than N tokens (a stand-in for
a kernel with a size limit).

--fault NAME injects one mistake (a mutant, for `moecheck faults` / a failing gate):
  none               the correct kernel (what {fault} is outside `moecheck faults`)
  gate_up_swap       silu applied to the up half: h = silu(up) * gate
  output_scale_2pct  the combined output multiplied by 1.02 before its bf16 rounding
  last_token_zeroed  the last token's output row is 0
  scaling_factor_missing  routed_scaling_factor not multiplied
  bias_ignored       selection without the correction bias
Any other name: exit 3 ("not implemented"), so that a mutant is never silently the correct kernel.
"""
import argparse
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "capture"))
import moecheck_capture as mc  # noqa: E402

FAULTS = ("none", "gate_up_swap", "output_scale_2pct", "last_token_zeroed", "scaling_factor_missing", "bias_ignored")
F32 = np.float32


class Refused(Exception):
    """A case this kernel does not implement: exit 3 with the message."""


# ---- number formats: the e4m3 and bf16 codecs of tests/h5py/numpy_moe.py ----------------------

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "h5py"))
from numpy_moe import bf16_bits, bf16_value, e4m3_decode, e4m3_encode  # noqa: E402,F401


def bf16_round(x):
    return bf16_value(bf16_bits(x))


def round_to(x, dtype):
    return bf16_round(x) if dtype == "bf16" else x


def ue8m0_ceil(s):
    """The smallest power of two >= s, at least 2^-127 (s > 0)."""
    m, e = np.frexp(s.astype(np.float64))
    p = np.where(m == 0.5, s.astype(np.float64), np.ldexp(1.0, e))
    return np.maximum(p, 2.0 ** -127).astype(F32)


# ---- the case -------------------------------------------------------------------------------

DEFAULTS = {"n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "gate_up_layout": "gate_up",
            "scale_format": "f32", "intermediate_dtype": "f32", "routing_weight_dtype": "f32", "group_size": 128,
            "weight_block": 128, "act_eps": 1e-10, "local_expert_offset": 0, "combine": "f32",
            "act_scale_floor": "eps", "quant_divide": "divide", "expert_output_dtype": "f32", "silu_dtype": "f32"}


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _floats(ds):
    a = ds[()]
    return bf16_value(a) if _text(ds.attrs.get("dtype", "")) == "bfloat16" else a.astype(F32)


def read_case(path):
    with h5py.File(path, "r") as f:
        c = dict(DEFAULTS)
        for n, v in f["config"].attrs.items():
            c[n] = _text(v) if isinstance(v, (str, bytes)) else v.item() if hasattr(v, "item") else v
        c.setdefault("local_num_experts", c["num_experts"])
        inp, w = f["inputs"], f["weights"]
        case = {
            "config": c,
            "hidden": _floats(inp["hidden_states"]),
            "logits": inp["router_logits"][()].astype(F32),
            "bias": _floats(inp["routing_bias"]) if "routing_bias" in inp else None,
            "hidden_fp8": inp["hidden_states_fp8"][()] if "hidden_states_fp8" in inp else None,
            "hidden_scale": inp["hidden_states_scale"][()].astype(F32) if "hidden_states_scale" in inp else None,
            "w13": w["w13"][()], "w13_scale": w["w13_scale"][()].astype(F32),
            "w2": w["w2"][()], "w2_scale": w["w2_scale"][()].astype(F32),
        }
        off, n = int(c["local_expert_offset"]), int(c["local_num_experts"])
        case["expert_ids"] = (w["expert_ids"][()].astype(np.int64) if "expert_ids" in w
                              else np.arange(off, off + n, dtype=np.int64))
    return case


# ---- routing (emulated_routing.cpp) ----------------------------------------------------------

def _seq_sum(x, axis):
    """Float32 sum in index order (a running sum, as the device's loop)."""
    return np.add.accumulate(x, axis=axis, dtype=F32).take(-1, axis=axis)


def route(c, logits, bias, fault):
    T, E, k = logits.shape[0], int(c["num_experts"]), int(c["top_k"])
    method = c["routing"]
    with np.errstate(over="ignore"):
        if method in ("deepseek_v3", "sigmoid_renormalize"):
            gate = F32(1) / (F32(1) + np.exp(-logits))
            sel = gate + bias[None, :] if bias is not None and fault != "bias_ignored" else gate.copy()
        elif method in ("renormalize", "softmax_topk"):
            ex = np.exp(logits - logits.max(axis=1, keepdims=True))
            gate = ex / _seq_sum(ex, 1)[:, None]
            sel = gate.copy()
        elif method == "llama4":
            gate = F32(1) / (F32(1) + np.exp(-logits))
            sel = logits.copy()
        else:
            raise Refused(f"routing {method!r} is not implemented")
    ng, tg = int(c["n_group"]), int(c["topk_group"])
    if method == "deepseek_v3" and ng > 1:
        per = E // ng
        grp = sel.reshape(T, ng, per)
        top2 = -np.sort(-grp, axis=2)[:, :, :2]  # the two largest (equal maxima count twice)
        gscore = top2[:, :, 0] if per == 1 else top2[:, :, 0] + top2[:, :, 1]
        keep = np.argsort(-gscore, axis=1, kind="stable")[:, :tg]
        mask = np.zeros((T, ng), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=1)
        sel = np.where(np.repeat(mask, per, axis=1), sel, F32(-np.inf))
    ids = np.argsort(-sel, axis=1, kind="stable")[:, :k]  # ties to the lower index
    w = np.take_along_axis(gate, ids, axis=1)
    if method in ("deepseek_v3", "renormalize", "sigmoid_renormalize"):
        w = w / _seq_sum(w, 1)[:, None]
    if fault != "scaling_factor_missing":
        w = w * F32(c["routed_scaling_factor"])
    w = round_to(w.astype(F32), c["routing_weight_dtype"])
    return ids.astype(np.int32), w


# ---- quantization (emulated_quant.cpp) ---------------------------------------------------------

def quantize_rows(x, c):
    """Per-row groups of G along the last axis: codes [n, K], scales [n, ceil(K/G)]."""
    G = int(c["group_size"])
    n, K = x.shape
    nb = -(-K // G)
    pad = np.zeros((n, nb * G), dtype=F32)
    pad[:, :K] = x
    amax = np.abs(pad.reshape(n, nb, G)).max(axis=2)
    if c["act_scale_floor"] == "none":
        s = (amax / F32(448)).astype(F32)
    else:
        eps = float(c["act_eps"])
        s = np.where(amax.astype(np.float64) >= eps, amax / F32(448), F32(eps / 448.0)).astype(F32)
    if c["scale_format"] == "ue8m0":
        s = np.where(s != 0, ue8m0_ceil(np.where(s != 0, s, F32(1))), F32(0)).astype(F32)
    sx = np.repeat(s, G, axis=1)[:, :K]
    with np.errstate(divide="ignore", invalid="ignore"):
        if c["quant_divide"] == "reciprocal":
            q = x * (F32(1) / sx)
        else:
            q = x / sx
    codes = e4m3_encode(q.astype(F32))
    codes[sx == 0] = 0  # act_scale_floor = none: a zero group codes 0
    return codes, s


# ---- the block-scaled GEMM (emulated_gemm.cpp) ---------------------------------------------------

def block_gemm(a, sa, w_codes, sw, G):
    """C[m, n] = sum over K blocks b of fl32(sa[m, b] * sw[n // G, b]) * p_b[m, n], p_b the float32
    block sum (products of e4m3 values are exact in float32)."""
    M, K = a.shape
    N = w_codes.shape[0]
    w = e4m3_decode(w_codes)
    rows = np.arange(N) // G
    acc = np.zeros((M, N), dtype=F32)
    for b in range(-(-K // G)):
        blk = slice(b * G, min(K, (b + 1) * G))
        p = (a[:, blk] @ w[:, blk].T).astype(F32)
        scale = (sa[:, b][:, None] * sw[rows, b][None, :]).astype(F32)
        acc = (acc + scale * p).astype(F32)
    return acc


# ---- the layer (emulated_moe.cpp) ----------------------------------------------------------------

def run_layer(case, fault):
    c = case["config"]
    if int(c["group_size"]) != int(c["weight_block"]):
        raise Refused(f"group_size = {c['group_size']} != weight_block = {c['weight_block']} is not implemented")
    T, H, I, k = case["hidden"].shape[0], int(c["hidden_size"]), int(c["intermediate_size"]), int(c["top_k"])
    G = int(c["group_size"])
    ids, weights = route(c, case["logits"], case["bias"], fault)
    if case["hidden_fp8"] is not None:
        act_codes, act_scales = case["hidden_fp8"], case["hidden_scale"]
    else:
        act_codes, act_scales = quantize_rows(case["hidden"], c)
    act = e4m3_decode(act_codes)
    off, nloc = int(c["local_expert_offset"]), int(c["local_num_experts"])
    slot_of = {int(e): s for s, e in enumerate(case["expert_ids"])}
    y = np.zeros((T, k, H), dtype=F32)
    local = (ids >= off) & (ids < off + nloc)
    gate_first = (c["gate_up_layout"] == "gate_up") != (fault == "gate_up_swap")
    for e in np.unique(ids[local]):
        if int(e) not in slot_of:
            raise Refused(f"a token routes to local expert {e}, which the case does not store")
        s = slot_of[int(e)]
        t, j = np.nonzero(ids == e)
        x = round_to(block_gemm(act[t], act_scales[t], case["w13"][s], case["w13_scale"][s], G),
                     c["intermediate_dtype"])
        g, u = (x[:, :I], x[:, I:]) if gate_first else (x[:, I:], x[:, :I])
        with np.errstate(over="ignore"):
            silu = round_to((g / (F32(1) + np.exp(-g))).astype(F32), c["silu_dtype"])
        h = round_to((silu * u).astype(F32), c["intermediate_dtype"])
        hc, hs = quantize_rows(h, c)
        ye = block_gemm(e4m3_decode(hc), hs, case["w2"][s], case["w2_scale"][s], G)
        y[t, j] = round_to(ye, c["expert_output_dtype"])
    # combine (emulated_combine.cpp), non-local slots add nothing
    how = c["combine"]
    order = np.argsort(ids, axis=1, kind="stable") if how == "bf16_expert_order" else np.tile(np.arange(k), (T, 1))
    acc = np.zeros((T, H), dtype=F32)
    rows = np.arange(T)
    for jj in range(k):
        j = order[:, jj]
        p = (weights[rows, j][:, None] * y[rows, j]).astype(F32)
        p = np.where(local[rows, j][:, None], p, F32(0))
        if how == "f32":
            acc = (acc + p).astype(F32)
        elif how == "bf16_slots":
            acc = (acc + bf16_round(p)).astype(F32)
        else:
            acc = np.where(local[rows, j][:, None], bf16_round((acc + bf16_round(p)).astype(F32)), acc)
    out = bf16_bits(acc)
    if fault == "output_scale_2pct":
        out = bf16_bits((bf16_value(out) * F32(1.02)).astype(F32))
    if fault == "last_token_zeroed":
        out[T - 1] = 0
    return out, ids, weights, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case")
    ap.add_argument("out")
    ap.add_argument("--fault", default="none", help="one of " + ", ".join(FAULTS))
    ap.add_argument("--max-tokens", type=int, default=None, help="decline (exit 77) a case of more tokens")
    a = ap.parse_args()
    if a.fault not in FAULTS:  # a mutant must never silently be the correct kernel: a failure
        print(f"numpy_moe_kernel: fault {a.fault!r} is not implemented (it has {', '.join(FAULTS)})", file=sys.stderr)
        return 3
    try:
        case = read_case(a.case)
        T = case["logits"].shape[0]
        if a.max_tokens is not None and T > a.max_tokens:
            raise Refused(f"this kernel takes at most {a.max_tokens} tokens")
        out, ids, weights, y = run_layer(case, a.fault)
    except Refused as e:
        print(f"numpy_moe_kernel: unsupported: {e}", file=sys.stderr)
        return 77
    name = "numpy" if a.fault == "none" else f"numpy.{a.fault}"
    mc.write_output(a.out, mc.Output(name, output=out, topk_ids=ids, topk_weights=weights, expert_outputs=y,
                                     backend="numpy_moe_kernel", budget_model="fp32", device="cpu (numpy float32)"),
                    case=a.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
