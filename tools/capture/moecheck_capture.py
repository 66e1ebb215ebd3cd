"""Writes a moecheck case (golden/FORMAT.md, format version 1) from the tensors an inference
engine has at hand when its FP8 block-scale MoE layer runs: hidden states, router logits, the
routing bias, the FP8 expert weights with their block scales, and the layer's output (optionally
its top-k ids / weights and the per-slot expert outputs). numpy + h5py only: the module never
imports torch itself; from_torch() converts a tensor when torch is already loaded by the caller.

    import moecheck_capture as mc
    cfg = mc.LayerConfig(num_experts=256, top_k=8, hidden_size=7168, intermediate_size=2048,
                         routing="deepseek_v3", n_group=8, topk_group=4, routed_scaling_factor=2.5)
    mc.write_case("layer3.h5", cfg, hidden_states=x, router_logits=logits, routing_bias=bias,
                  w13=w13, w13_scale=w13_s, w2=w2, w2_scale=w2_s,
                  outputs=[mc.Output("sglang", output=y, topk_ids=ids, topk_weights=w)])

Encodings (what each argument may be; anything else is a ValueError naming the tensor):
  float slots (hidden_states, routing_bias, output, topk_weights, expert_outputs): float32, or
    bfloat16 bits as int16/uint16 (torch: t.view(torch.int16).cpu().numpy()), or an
    ml_dtypes.bfloat16 array; float16 is widened to float32 (exact). float64 is refused (it
    would be rounded: say which precision the engine used).
  router_logits: float32 (bfloat16 logits are widened to float32, exactly).
  FP8 slots (w13, w2, hidden_states_fp8): float8_e4m3fn codes as uint8 (torch:
    w.view(torch.uint8).cpu().numpy()) or an ml_dtypes.float8_e4m3fn array.
  scales: float32 dequantization multipliers (value = decode(code) * scale), finite and > 0.
  ids: any integer type, stored as int32.

Layouts converted here: the activation scale of FlashInfer's trtllm_fp8_block_scale_moe is
[ceil(H/G), T] (act_scale_layout="flashinfer"), the case stores [T, ceil(H/G)]. The gate/up
order of w13 is recorded, not permuted: gate_up_layout="up_gate" for FlashInfer's "w31" order.

Slot order and budget model (README.md): `moecheck compare` matches expert_outputs[t, j] to the
reference's slot j (rank order; rank_order() reorders an engine's slots into it), and judges an
output with the model its budget_model names, else "hopper" for any engine's backend name.

Everything is validated before anything is written; the file is written to a temporary in the
target directory and renamed over the target (os.replace), so a failed or interrupted capture
never leaves a partial case (and never clobbers an existing one).
"""
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Optional

import h5py
import numpy as np

FORMAT_VERSION = 1
ROUTING_METHODS = ("deepseek_v3", "renormalize", "softmax_topk", "sigmoid_renormalize", "llama4")
_CHOICES = {"routing": ROUTING_METHODS, "gate_up_layout": ("gate_up", "up_gate"),
            "scale_format": ("f32", "ue8m0"), "intermediate_dtype": ("f32", "bf16"),
            "routing_weight_dtype": ("f32", "bf16"), "combine": ("f32", "bf16_slots", "bf16_expert_order"),
            "act_scale_floor": ("eps", "none"), "quant_divide": ("divide", "reciprocal"),
            "expert_output_dtype": ("f32", "bf16"), "silu_dtype": ("f32", "bf16")}
# Engine recipe presets (golden/FORMAT.md "Engine recipes"): LayerConfig(..., recipe="sglang").
RECIPES = {
    "sglang": {"intermediate_dtype": "bf16", "combine": "bf16_slots"},
    "transformers": {"intermediate_dtype": "bf16", "silu_dtype": "bf16", "expert_output_dtype": "bf16",
                     "routing_weight_dtype": "bf16", "act_scale_floor": "none", "combine": "bf16_expert_order"},
}
_MIN_ACT_EPS = 448.0 * 2.0 ** -149
_CHUNK_BYTES = 4 << 20  # weight chunks: one expert slab, at most 4 MiB (FORMAT.md /weights)

# FlashInfer RoutingMethodType (flashinfer-ai/flashinfer: flashinfer/tllm_enums.py)
# -> the case's routing method. RenormalizeNaive (4) is Renormalize mathematically.
FLASHINFER_ROUTING = {0: "softmax_topk", 1: "renormalize", 2: "deepseek_v3", 3: "llama4",
                      4: "renormalize", 6: "sigmoid_renormalize"}


def flashinfer_routing(routing_method_type: int) -> str:
    """FlashInfer's routing_method_type integer -> the case's routing name (ValueError if none)."""
    try:
        return FLASHINFER_ROUTING[int(routing_method_type)]
    except KeyError:
        raise ValueError(f"routing_method_type {routing_method_type}: no routing method of format version 1 "
                         f"matches (known: {sorted(FLASHINFER_ROUTING)})") from None


@dataclass
class LayerConfig:
    """The /config attributes, named exactly as golden/FORMAT.md names them. None = the format's
    default (the attribute is then not written). FlashInfer passes n_group/topk_group as 0/None
    when grouping is off: give 1 (or None)."""
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int  # per expert on this tensor-parallel shard
    routing: str
    n_group: Optional[int] = None
    topk_group: Optional[int] = None
    routed_scaling_factor: Optional[float] = None
    gate_up_layout: Optional[str] = None  # "gate_up" ([w1; w3], vLLM/SGLang) | "up_gate" (FlashInfer w31)
    scale_format: Optional[str] = None
    intermediate_dtype: Optional[str] = None
    routing_weight_dtype: Optional[str] = None
    group_size: Optional[int] = None
    weight_block: Optional[int] = None
    act_eps: Optional[float] = None
    local_expert_offset: Optional[int] = None
    local_num_experts: Optional[int] = None
    # Engine recipe (FORMAT.md "Engine recipes"): where the engine rounds differently.
    combine: Optional[str] = None              # "f32" | "bf16_slots" (SGLang) | "bf16_expert_order" (transformers)
    act_scale_floor: Optional[str] = None      # "eps" | "none" (s = amax / 448, DeepSeek's act_quant)
    quant_divide: Optional[str] = None         # "divide" | "reciprocal" (x * (1 / s))
    expert_output_dtype: Optional[str] = None  # "f32" | "bf16": GEMM2 output before the weight multiply
    silu_dtype: Optional[str] = None           # "f32" | "bf16": silu(gate) before the product with up
    # A preset of RECIPES ("sglang", "transformers") filling the recipe attributes (and
    # intermediate_dtype / routing_weight_dtype) that are not given explicitly; not written itself.
    recipe: Optional[str] = None

    def __post_init__(self):
        if self.recipe is None:
            return
        if self.recipe not in RECIPES:
            _fail("config.recipe", f"must be one of {' | '.join(RECIPES)}, got {self.recipe!r}")
        for k, v in RECIPES[self.recipe].items():
            if getattr(self, k) is None:
                setattr(self, k, v)

    @classmethod
    def from_dict(cls, d):
        """From a mapping of FORMAT.md names (e.g. parsed from an engine's config): an unknown or
        misspelled name is a ValueError, never a silently defaulted attribute."""
        names = list(cls.__dataclass_fields__)
        for n in d:
            if n not in names:
                _fail(f"config.{n}", f"unknown attribute (format version 1 has {', '.join(names)})")
        for n in names[:5]:
            if n not in d:
                _fail(f"config.{n}", "required attribute missing")
        return cls(**d)

    def get(self, name):
        """The value of an attribute with the format's default filled in."""
        v = getattr(self, name)
        if v is not None:
            return v
        return {"n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "gate_up_layout": "gate_up",
                "scale_format": "f32", "intermediate_dtype": "f32", "routing_weight_dtype": "f32",
                "group_size": 128, "weight_block": 128, "act_eps": 1e-10, "local_expert_offset": 0,
                "local_num_experts": self.num_experts, "combine": "f32", "act_scale_floor": "eps",
                "quant_divide": "divide", "expert_output_dtype": "f32", "silu_dtype": "f32"}[name]

    def attributes(self):
        return {k: v for k, v in self.__dict__.items() if v is not None and k != "recipe"}


@dataclass
class Output:
    """One backend run: /outputs/<name>. Slot j of topk_ids / topk_weights / expert_outputs is
    the same (token, expert) pair in all three; see tools/capture/README.md on slot order."""
    name: str
    output: object                        # [T, H]
    topk_ids: object = None               # [T, k] integer
    topk_weights: object = None           # [T, k]
    expert_outputs: object = None         # [T, k, H], slot j's GEMM2 output before weighting
    backend: Optional[str] = None         # e.g. "flashinfer"; compare's budget model follows it
    budget_model: Optional[str] = None    # fp32 | hmma-f32 | hopper | bits:N | trunc:N (README.md)
    device: Optional[str] = None
    created: Optional[str] = None
    attrs: Dict[str, str] = field(default_factory=dict)  # further free-text attributes


def _fail(where, rule):
    raise ValueError(f"{where}: {rule}")


# ---- arrays -------------------------------------------------------------------------------

def from_torch(t):
    """A torch tensor -> a numpy array in this module's encodings (bf16 -> uint16 bits, fp8
    e4m3fn -> uint8 codes, anything else .numpy()), moved to the CPU. Imports torch only here,
    and only when the caller hands a torch tensor (so torch is already loaded)."""
    import torch  # noqa: PLC0415 (optional dependency, never at module import)
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    if t.dtype == getattr(torch, "float8_e4m3fn", None):
        return t.view(torch.uint8).cpu().numpy()
    return t.cpu().numpy()


def _array(where, x):
    if x is None:
        return None
    if type(x).__module__.split(".")[0] == "torch":
        x = from_torch(x)
    if not isinstance(x, np.ndarray):
        _fail(where, f"must be a numpy array (or a torch tensor), got {type(x).__name__}")
    name = x.dtype.name
    if name == "bfloat16" and x.dtype.itemsize == 2:  # ml_dtypes.bfloat16
        x = x.view(np.uint16)
    elif name == "float8_e4m3fn" and x.dtype.itemsize == 1:  # ml_dtypes.float8_e4m3fn
        x = x.view(np.uint8)
    return np.ascontiguousarray(x)


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _float_tensor(where, x, allow_bf16=True):
    """-> (array to store, is_bf16): float32 (native byte order) or uint16 bf16 bits."""
    k, size = x.dtype.kind, x.dtype.itemsize
    if k == "f" and size == 4:
        return x.astype(np.float32, copy=False), False
    if k == "f" and size == 2:  # float16: widened exactly
        return x.astype(np.float32), False
    if k in "iu" and size == 2:  # bf16 bits (torch .view(torch.int16))
        bits = x.view(np.uint16)
        return (bits, True) if allow_bf16 else (_bf16_to_f32(bits), False)
    enc = "float32 or bfloat16 bits as int16/uint16" if allow_bf16 else "float32 (or bfloat16 bits, widened)"
    _fail(where, f"must be {enc}; got {x.dtype}" +
          (" (float64 would be rounded here: pass the precision the engine used)" if k == "f" else ""))


def _fp8_tensor(where, x):
    if x.dtype == np.uint8:
        return x
    hint = " (view it as uint8: torch w.view(torch.uint8))" if x.dtype == np.int8 else ""
    _fail(where, f"must be uint8 holding float8_e4m3fn codes{hint}; got {x.dtype}")


def _f32_tensor(where, x):
    if x.dtype.kind == "f" and x.dtype.itemsize == 4:
        return x.astype(np.float32, copy=False)
    _fail(where, f"must be float32; got {x.dtype}")


def _int_tensor(where, x):
    if x.dtype.kind not in "iu":
        _fail(where, f"must be an integer type; got {x.dtype}")
    if x.size and (x.min() < -2**31 or x.max() >= 2**31):
        _fail(where, "values must fit int32")
    return x.astype(np.int32)


def _shape(where, x, expect, names):
    if x.shape != tuple(expect):
        want = "[" + ", ".join(f"{n} = {v}" for n, v in zip(names, expect)) + "]"
        _fail(where, f"shape must be {want}, got {list(x.shape)}")


def _finite(where, x, is_bf16):
    v = _bf16_to_f32(x) if is_bf16 else x
    bad = ~np.isfinite(v)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        _fail(where, f"must be finite; {int(bad.sum())} values are not (first at {list(first)}: {v[first]})")


def _no_nan_codes(where, codes):
    bad = (codes & 0x7F) == 0x7F
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        _fail(where, f"must not hold the float8_e4m3fn NaN codes 0x7F/0xFF; {int(bad.sum())} codes are NaN "
                     f"(first at {list(first)})")


def _scales(where, s, ue8m0):
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        _fail(where, f"scales must be finite and > 0; {int(bad.sum())} are not (first at {list(first)}: {s[first]})")
    if ue8m0:
        m, e = np.frexp(s)  # s = m 2^e, m in [0.5, 1): a power of two has m == 0.5
        bad = (m != 0.5) | (e - 1 < -127) | (e - 1 > 127)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            _fail(where, f"scale_format = ue8m0 needs powers of two in [2^-127, 2^127]; {int(bad.sum())} scales are "
                         f"not (first at {list(first)}: {s[first]})")


# ---- config -------------------------------------------------------------------------------

def _check_config(c):
    if not isinstance(c, LayerConfig):
        _fail("config", f"must be a LayerConfig, got {type(c).__name__}")
    where = lambda n: f"config.{n}"  # noqa: E731
    for n in ("num_experts", "top_k", "hidden_size", "intermediate_size", "n_group", "topk_group", "group_size",
              "weight_block", "local_expert_offset", "local_num_experts"):
        v = getattr(c, n)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
            _fail(where(n), f"must be an integer, got {v!r}")
    for n in ("routed_scaling_factor", "act_eps"):
        v = getattr(c, n)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))):
            _fail(where(n), f"must be a number, got {v!r}")
    for n, allowed in _CHOICES.items():
        v = getattr(c, n)
        if v is not None and v not in allowed:
            _fail(where(n), f"must be one of {' | '.join(allowed)}, got {v!r}")
    E, k = c.num_experts, c.top_k
    if not 1 <= E <= 65536:
        _fail(where("num_experts"), f"must be in [1, 65536], got {E}")
    for n in ("hidden_size", "intermediate_size"):
        if not 1 <= getattr(c, n) <= 2**24:
            _fail(where(n), f"must be in [1, 2^24], got {getattr(c, n)}")
    if not 1 <= k <= E:
        _fail(where("top_k"), f"must be in [1, num_experts = {E}], got {k}")
    if c.routing == "llama4" and k != 1:
        _fail(where("top_k"), f"llama4 routing is top-1, got {k}")
    ng, tg = c.get("n_group"), c.get("topk_group")
    if ng < 1:
        _fail(where("n_group"), f"must be >= 1, got {ng}")
    if E % ng:
        _fail(where("n_group"), f"num_experts = {E} must be divisible by n_group = {ng}")
    if (ng > 1 or tg > 1) and c.routing != "deepseek_v3":
        _fail(where("n_group"), f"grouped top-k (n_group = {ng}, topk_group = {tg}) is only defined for "
                                "deepseek_v3 routing")
    if not 1 <= tg <= ng:
        _fail(where("topk_group"), f"must be in [1, n_group = {ng}], got {tg}")
    if k > tg * (E // ng):
        _fail(where("top_k"), f"{k} exceeds the {tg * (E // ng)} experts of the topk_group = {tg} kept groups")
    rsf = c.get("routed_scaling_factor")
    if not (np.isfinite(rsf) and rsf > 0):
        _fail(where("routed_scaling_factor"), f"must be finite and > 0, got {rsf}")
    for n in ("group_size", "weight_block"):
        if not 1 <= c.get(n) <= 4096:
            _fail(where(n), f"must be in [1, 4096], got {c.get(n)}")
    eps = c.get("act_eps")
    if not _MIN_ACT_EPS <= eps <= 1:
        _fail(where("act_eps"), f"must be in [448 * 2^-149, 1], got {eps}")
    if c.get("quant_divide") == "reciprocal":
        if c.get("act_scale_floor") == "none":
            _fail(where("quant_divide"), "reciprocal needs act_scale_floor = eps (without a floor 1/s overflows for "
                                         "tiny groups)")
        if eps < 448.0 * 2.0 ** -126:
            _fail(where("act_eps"), f"quant_divide = reciprocal needs act_eps >= 448 * 2^-126 (so that 1/s is "
                                    f"finite), got {eps}")
    off, nloc = c.get("local_expert_offset"), c.get("local_num_experts")
    if off < 0:
        _fail(where("local_expert_offset"), f"must be >= 0, got {off}")
    if nloc < 1:
        _fail(where("local_num_experts"), f"must be >= 1, got {nloc}")
    if off + nloc > E:
        _fail(where("local_num_experts"), f"local_expert_offset + local_num_experts = {off + nloc} exceeds "
                                          f"num_experts = {E}")


def _ceil(a, b):
    return -(-a // b)


def rank_order(config, router_logits, routing_bias, topk_ids, *per_slot):
    """Reorders each token's k slots into the reference's rank order: descending selection score
    (sigmoid(logit) + bias for deepseek_v3 / sigmoid_renormalize, the logit for the softmax
    methods and llama4: monotone in the probability), ties to the lower id; computed in float64
    (reference/moe_routing.hpp). Returns (topk_ids, *per_slot) permuted alike ([T, k, ...]
    arrays). `moecheck compare` judges expert_outputs[t, j] against the reference's slot j
    (tools/capture/README.md); an engine that records its slots in another order (ascending ids,
    say) passes them through this first. Ties in float64 that float32 broke otherwise are rare;
    near-tie tokens whose expert set differs from the reference's keep their order."""
    ids = _int_tensor("topk_ids", _array("topk_ids", topk_ids)).astype(np.int64)
    lg, _ = _float_tensor("router_logits", _array("router_logits", router_logits), allow_bf16=False)
    lg = lg.astype(np.float64)
    if config.routing in ("deepseek_v3", "sigmoid_renormalize"):
        sel = 1.0 / (1.0 + np.exp(-lg))
        if routing_bias is not None:
            b, b_bf16 = _float_tensor("routing_bias", _array("routing_bias", routing_bias))
            sel = sel + (_bf16_to_f32(b) if b_bf16 else b).astype(np.float64)
    else:
        sel = lg
    if ids.ndim != 2 or ids.shape[0] != sel.shape[0] or ids.size and (ids.min() < 0 or ids.max() >= sel.shape[1]):
        _fail("topk_ids", f"must be [T = {sel.shape[0]}, k] ids in [0, {sel.shape[1]})")
    t = np.arange(ids.shape[0])[:, None]
    order = np.lexsort((ids, -sel[t, ids]), axis=-1)  # primary: -sel, secondary: id
    res = [ids[t, order].astype(np.int32)]
    for a in per_slot:
        a = _array("per_slot", a)
        if a.shape[:2] != ids.shape:
            _fail("per_slot", f"arrays must start with [T, k] = {list(ids.shape)}, got {list(a.shape)}")
        res.append(a[t, order])
    return tuple(res)


def _output_plan(o, T, k, H):
    """Validates one Output against [T, H] / [T, k] / [T, k, H]; returns ({path: (array, attrs)},
    the group's attributes). Raises ValueError ("outputs['name'].<field>: <rule>")."""
    if not isinstance(o, Output):
        _fail("outputs", f"must hold Output objects, got {type(o).__name__}")
    w = f"outputs[{o.name!r}]"
    ok = isinstance(o.name, str) and 1 <= len(o.name) <= 128 and all(
        ch.isascii() and (ch.isalnum() or ch in "_.:+-") for ch in o.name)
    if not ok:
        _fail(w, "output names are 1-128 characters of A-Z a-z 0-9 _ . : + -")
    data = {}
    y = _array(f"{w}.output", o.output)
    if y is None:
        _fail(f"{w}.output", "required")
    y, y_bf16 = _float_tensor(f"{w}.output", y)
    _shape(f"{w}.output", y, (T, H), ("T", "H"))
    data[f"/outputs/{o.name}/output"] = (y, {"dtype": "bfloat16"} if y_bf16 else {})
    if o.topk_ids is not None:
        ids = _int_tensor(f"{w}.topk_ids", _array(f"{w}.topk_ids", o.topk_ids))
        _shape(f"{w}.topk_ids", ids, (T, k), ("T", "top_k"))
        data[f"/outputs/{o.name}/topk_ids"] = (ids, {})
    if o.topk_weights is not None:
        tw, tw_bf16 = _float_tensor(f"{w}.topk_weights", _array(f"{w}.topk_weights", o.topk_weights))
        _shape(f"{w}.topk_weights", tw, (T, k), ("T", "top_k"))
        data[f"/outputs/{o.name}/topk_weights"] = (tw, {"dtype": "bfloat16"} if tw_bf16 else {})
    if o.expert_outputs is not None:
        eo, eo_bf16 = _float_tensor(f"{w}.expert_outputs", _array(f"{w}.expert_outputs", o.expert_outputs))
        _shape(f"{w}.expert_outputs", eo, (T, k, H), ("T", "top_k", "H"))
        data[f"/outputs/{o.name}/expert_outputs"] = (eo, {"dtype": "bfloat16"} if eo_bf16 else {})
    if o.budget_model is not None and not re.fullmatch(r"fp32|hmma-f32|hopper|(bits|trunc):[0-9]+", o.budget_model):
        _fail(f"{w}.budget_model", f"must be fp32 | hmma-f32 | hopper | bits:N | trunc:N, got {o.budget_model!r}")
    attrs = {n: v for n, v in (("backend", o.backend), ("device", o.device), ("created", o.created),
                               ("budget_model", o.budget_model)) if v is not None}
    attrs.update(o.attrs)
    for n, v in attrs.items():
        if not isinstance(n, str) or not isinstance(v, str):
            _fail(f"{w}.attrs", f"attributes are free text (str -> str), got {n!r}: {v!r}")
    return data, attrs


# ---- the case -----------------------------------------------------------------------------

def prepare_case(config, *, hidden_states, router_logits, w13, w13_scale, w2, w2_scale, routing_bias=None,
                 expert_ids=None, keep_experts=None, hidden_states_fp8=None, hidden_states_scale=None,
                 act_scale_layout="token_major", outputs=(), description=None, source=None, extra=None):
    """Validates and converts everything write_case() takes; returns the case as a plan
    {path in the file: (array, attributes)} plus root/config attributes. Raises ValueError
    ("<tensor>: <rule>") on the first problem. Nothing is written."""
    _check_config(config)
    c = config
    E, k, H, I = c.num_experts, c.top_k, c.hidden_size, c.intermediate_size
    G, B = c.get("group_size"), c.get("weight_block")
    off, nloc = c.get("local_expert_offset"), c.get("local_num_experts")
    ue8m0 = c.get("scale_format") == "ue8m0"
    data = {}  # "/group/name" -> (array, {attr: value})
    if act_scale_layout not in ("token_major", "flashinfer"):
        _fail("act_scale_layout", f"must be 'token_major' ([T, H/G]) or 'flashinfer' ([H/G, T]), "
                                  f"got {act_scale_layout!r}")

    # inputs
    x = _array("hidden_states", hidden_states)
    if x is None:
        _fail("hidden_states", "required")
    xs, x_bf16 = _float_tensor("hidden_states", x)
    if xs.ndim != 2 or not 1 <= xs.shape[0] <= 2**24:
        _fail("hidden_states", f"must be [T, H = {H}] with T in [1, 2^24], got {list(xs.shape)}")
    T = xs.shape[0]
    _shape("hidden_states", xs, (T, H), ("T", "H"))
    _finite("hidden_states", xs, x_bf16)
    data["/inputs/hidden_states"] = (xs, {"dtype": "bfloat16"} if x_bf16 else {})
    lg = _array("router_logits", router_logits)
    if lg is None:
        _fail("router_logits", "required")
    lg, _ = _float_tensor("router_logits", lg, allow_bf16=False)
    _shape("router_logits", lg, (T, E), ("T", "num_experts"))
    _finite("router_logits", lg, False)
    data["/inputs/router_logits"] = (lg, {})
    b = _array("routing_bias", routing_bias)
    if b is None and c.routing == "deepseek_v3":
        _fail("routing_bias", "required for deepseek_v3 routing (e_score_correction_bias)")
    if b is not None:
        if c.routing not in ("deepseek_v3", "sigmoid_renormalize"):
            _fail("routing_bias", f"routing = {c.routing} takes no routing bias (only deepseek_v3 and "
                                  "sigmoid_renormalize do); a stored one would be refused")
        b, b_bf16 = _float_tensor("routing_bias", b)
        _shape("routing_bias", b, (E,), ("num_experts",))
        _finite("routing_bias", b, b_bf16)
        data["/inputs/routing_bias"] = (b, {"dtype": "bfloat16"} if b_bf16 else {})
    q, qs = _array("hidden_states_fp8", hidden_states_fp8), _array("hidden_states_scale", hidden_states_scale)
    if (q is None) != (qs is None):
        _fail("hidden_states_fp8" if q is None else "hidden_states_scale",
              "hidden_states_fp8 and hidden_states_scale come together (both or neither)")
    if q is not None:
        q = _fp8_tensor("hidden_states_fp8", q)
        _shape("hidden_states_fp8", q, (T, H), ("T", "H"))
        _no_nan_codes("hidden_states_fp8", q)
        qs = _f32_tensor("hidden_states_scale", qs)
        nb = _ceil(H, G)
        if act_scale_layout == "flashinfer":
            if qs.shape != (nb, T) and qs.shape == (T, nb):
                _fail("hidden_states_scale", f"act_scale_layout = 'flashinfer' expects [ceil(H/G) = {nb}, T = {T}], "
                                             f"got {list(qs.shape)} (already token-major? pass 'token_major')")
            _shape("hidden_states_scale", qs, (nb, T), ("ceil(H/G)", "T"))
            qs = np.ascontiguousarray(qs.T)
        else:
            if qs.shape != (T, nb) and qs.shape == (nb, T):
                _fail("hidden_states_scale", f"expects [T = {T}, ceil(H/G) = {nb}], got {list(qs.shape)}: FlashInfer's "
                                             "transposed layout? pass act_scale_layout='flashinfer'")
            _shape("hidden_states_scale", qs, (T, nb), ("T", "ceil(H/G)"))
        _scales("hidden_states_scale", qs, ue8m0)
        data["/inputs/hidden_states_fp8"] = (q, {"dtype": "float8_e4m3fn"})
        data["/inputs/hidden_states_scale"] = (qs, {})

    # outputs (validated before the weights: keep_experts="routed" reads their topk_ids)
    outs = list(outputs)
    names = set()
    routed = set()
    out_attrs = {}
    for o in outs:
        if not isinstance(o, Output):
            _fail("outputs", f"must hold Output objects, got {type(o).__name__}")
        if o.name in names:
            _fail(f"outputs[{o.name!r}]", "two outputs with the same name")
        names.add(o.name)
        odata, attrs = _output_plan(o, T, k, H)
        data.update(odata)
        if o.topk_ids is not None:
            routed.update(int(i) for i in np.unique(odata[f"/outputs/{o.name}/topk_ids"][0]))
        out_attrs[f"/outputs/{o.name}"] = attrs

    # weights: slots of the given arrays -> global expert ids
    given = _array("expert_ids", expert_ids)
    w13a, w2a = _array("w13", w13), _array("w2", w2)
    s13a, s2a = _array("w13_scale", w13_scale), _array("w2_scale", w2_scale)
    for n, v in (("w13", w13a), ("w13_scale", s13a), ("w2", w2a), ("w2_scale", s2a)):
        if v is None:
            _fail(n, "required")
    w13a, w2a = _fp8_tensor("w13", w13a), _fp8_tensor("w2", w2a)
    s13a, s2a = _f32_tensor("w13_scale", s13a), _f32_tensor("w2_scale", s2a)
    if w13a.ndim == 4 or w2a.ndim == 4:
        _fail("w13" if w13a.ndim == 4 else "w2", "4-D weights (FlashInfer BlockMajorK / shuffled layout) are not part "
                                                 "of the format: capture the unshuffled [E, rows, cols] weights")
    if w13a.ndim != 3:
        _fail("w13", f"must have rank 3 [E_slots, 2I = {2 * I}, H = {H}], got {list(w13a.shape)}")
    S = w13a.shape[0]
    if given is None:
        ids = np.arange(off, off + nloc, dtype=np.int64)
        if S != nloc:
            _fail("w13", f"holds {S} experts but local_num_experts = {nloc}: pass expert_ids for a subset")
    else:
        ids = _int_tensor("expert_ids", given).astype(np.int64)
        _shape("expert_ids", ids, (S,), ("experts in w13",))
        if np.any(np.diff(ids) <= 0):
            _fail("expert_ids", "ids must be strictly increasing")
        if ids.size and (ids[0] < off or ids[-1] >= off + nloc):
            _fail("expert_ids", f"ids must be inside the local experts [{off}, {off + nloc})")
    _shape("w13", w13a, (S, 2 * I, H), ("E_slots", "2I", "H"))
    _shape("w13_scale", s13a, (S, _ceil(2 * I, B), _ceil(H, B)), ("E_slots", "ceil(2I/B)", "ceil(H/B)"))
    _shape("w2", w2a, (S, H, I), ("E_slots", "H", "I"))
    _shape("w2_scale", s2a, (S, _ceil(H, B), _ceil(I, B)), ("E_slots", "ceil(H/B)", "ceil(I/B)"))

    if keep_experts is None:
        keep = ids
    else:
        if isinstance(keep_experts, str):
            if keep_experts != "routed":
                _fail("keep_experts", f"must be None, 'routed' or a list of global expert ids, got {keep_experts!r}")
            if not any(o.topk_ids is not None for o in outs):
                _fail("keep_experts", "'routed' needs an output with topk_ids")
            want = sorted(e for e in routed if off <= e < off + nloc)
        else:
            want = sorted(set(int(e) for e in keep_experts))
        if not want:
            _fail("keep_experts", "selects no expert (a case stores at least one)")
        missing = sorted(set(want) - set(int(i) for i in ids))
        if missing:
            _fail("keep_experts", f"experts {missing[:8]} are not among the given weights' experts")
        keep = np.array(want, dtype=np.int64)
    slot = np.searchsorted(ids, keep)
    w13a, s13a, w2a, s2a = w13a[slot], s13a[slot], w2a[slot], s2a[slot]
    _no_nan_codes("w13", w13a)
    _no_nan_codes("w2", w2a)
    _scales("w13_scale", s13a, ue8m0)
    _scales("w2_scale", s2a, ue8m0)
    data["/weights/w13"] = (w13a, {"dtype": "float8_e4m3fn"})
    data["/weights/w13_scale"] = (s13a, {})
    data["/weights/w2"] = (w2a, {"dtype": "float8_e4m3fn"})
    data["/weights/w2_scale"] = (s2a, {})
    if keep_experts is not None or given is not None:
        data["/weights/expert_ids"] = (keep.astype(np.int32), {})

    for n, v in (extra or {}).items():
        a = _array(f"extra[{n!r}]", v)
        if not isinstance(n, str) or not n or "/" in n:
            _fail(f"extra[{n!r}]", "names are non-empty strings without '/'")
        if a is None or a.dtype.kind not in "biufS":
            _fail(f"extra[{n!r}]", "must be a numeric (or bytes) array")
        data[f"/extra/{n}"] = (a, {})
    root = {"format": "moecheck.case", "format_version": FORMAT_VERSION}
    for n, v in (("description", description), ("source", source)):
        if v is not None:
            if not isinstance(v, str):
                _fail(n, f"must be a string, got {type(v).__name__}")
            root[n] = v
    return {"root": root, "config": c.attributes(), "data": data, "groups": out_attrs}


def _chunks(a):
    """One expert slab per chunk (FORMAT.md), rows cut so that a chunk stays <= 4 MiB."""
    if a.ndim != 3 or a.nbytes <= _CHUNK_BYTES:
        return None
    row = a.shape[2] * a.itemsize
    rows = max(1, min(a.shape[1], _CHUNK_BYTES // max(row, 1)))
    return (1, rows, a.shape[2])


def write_case(path, config, **tensors):
    """Validates (prepare_case), then writes the case to `path` atomically: a temporary
    <path>.tmp.<pid> in the same directory, renamed over `path` only when complete."""
    plan = prepare_case(config, **tensors)

    def fill(f):
        f.attrs.update(plan["root"])
        f.create_group("config").attrs.update(plan["config"])
        for g in ("inputs", "weights"):
            f.create_group(g)
        for p, attrs in plan["groups"].items():
            f.require_group(p).attrs.update(attrs)
        for p, (a, attrs) in plan["data"].items():
            d = f.create_dataset(p, data=a, chunks=_chunks(a) if p.startswith("/weights/") else None)
            d.attrs.update(attrs)
    return _atomic_h5(path, fill)


def atomic_write(path, write):
    """write(tmp) fills <path>.tmp.<pid> (same directory), which is then renamed over path; on any
    error or interruption the temporary is removed and path is left as it was."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _atomic_h5(path, fill):
    """Writes an HDF5 file through fill(h5py.File) atomically (atomic_write)."""
    def write(tmp):
        with h5py.File(tmp, "w") as f:
            fill(f)
    return atomic_write(path, write)


def write_output(path, output, case=None):
    """Writes the output file of an exec backend (`moecheck ... --backend exec:CMD`, tools/README.md):
    one group /outputs/<output.name> in the case format (golden/FORMAT.md "Output files of exec
    backends"), nothing else. `case`: the {case} file the kernel read; the shapes are then checked
    against its T, top_k and H (without it, T and H come from output.output and k from topk_ids).
    Validated like write_case (ValueError naming the field), written atomically."""
    if not isinstance(output, Output):
        _fail("output", f"must be an Output, got {type(output).__name__}")
    if case is not None:
        with h5py.File(case, "r") as f:
            c = f["config"].attrs
            T, k, H = f["inputs/hidden_states"].shape[0], int(c["top_k"]), int(c["hidden_size"])
    else:
        y = _array("output.output", output.output)
        if y is None or y.ndim != 2:
            _fail(f"outputs[{output.name!r}].output", "required, [T, H]")
        T, H = y.shape
        ids = _array("output.topk_ids", output.topk_ids)
        tw = _array("output.topk_weights", output.topk_weights)
        k = ids.shape[1] if ids is not None and ids.ndim == 2 else tw.shape[1] if tw is not None and tw.ndim == 2 else 0
    data, attrs = _output_plan(output, T, k, H)

    def fill(f):
        f.create_group(f"outputs/{output.name}").attrs.update(attrs)
        for p, (a, a_attrs) in data.items():
            f.create_dataset(p, data=a).attrs.update(a_attrs)
    return _atomic_h5(path, fill)


# ---- reading a case back (what a kernel run as an exec backend needs) ------------------------

def read_config(path):
    """The case's /config attributes as a dict (text as str, numbers as Python numbers)."""
    with h5py.File(path, "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v.item() if hasattr(v, "item") else v)
                for k, v in f["config"].attrs.items()}


def read_arrays(path):
    """The case's tensors as stored (FORMAT.md): every dataset of /inputs and /weights by name
    (hidden_states float32, or bf16 as uint16 bits; w13 / w2 uint8 e4m3 codes; scales float32),
    with expert_ids (the stored experts' global ids) filled in when the case stores every local
    expert."""
    with h5py.File(path, "r") as f:
        a = {n: f["inputs"][n][...] for n in f["inputs"]}
        a.update({n: f["weights"][n][...] for n in f["weights"]})
        if "expert_ids" not in a:
            off = int(f["config"].attrs.get("local_expert_offset", 0))
            a["expert_ids"] = np.arange(off, off + a["w13"].shape[0], dtype=np.int32)
    return a
