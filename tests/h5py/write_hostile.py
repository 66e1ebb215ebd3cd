#!/usr/bin/env python3
"""Writes hostile and malformed case files with h5py for tests/golden_hostile_files_test.cpp.

usage: write_hostile.py OUT_DIR

Each file starts from one valid case (E=8 top_k=2 H=256 I=256 T=4, deepseek_v3 with n_group 2)
and breaks one thing. OUT_DIR/manifest.tsv lists "file<TAB>where" per line: `moecheck inspect`
must exit 2 (not crash) and name the file and `where` (a dataset or group@attribute) on stderr.
valid.h5 is listed with where "-": it must give exit 0.
"""
import sys
from pathlib import Path

import h5py
import numpy as np

T, E, K, H, I = 4, 8, 2, 256, 256


def write_valid(path, edit=None, libver=None):
    with h5py.File(path, "w", libver=libver) as f:
        f.attrs["format"] = "moecheck.case"
        f.attrs["format_version"] = 1
        c = f.create_group("config")
        c.attrs.update(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I,
                       routing="deepseek_v3", n_group=2, topk_group=1, routed_scaling_factor=2.5)
        inp = f.create_group("inputs")
        hs = inp.create_dataset("hidden_states", data=np.full((T, H), 0x3F80, dtype=np.uint16))
        hs.attrs["dtype"] = "bfloat16"
        inp.create_dataset("router_logits", data=np.linspace(-1, 1, T * E, dtype=np.float32).reshape(T, E))
        inp.create_dataset("routing_bias", data=np.zeros(E, dtype=np.float32))
        w = f.create_group("weights")
        for name, shape in (("w13", (E, 2 * I, H)), ("w2", (E, H, I))):
            d = w.create_dataset(name, data=np.full(shape, 0x38, dtype=np.uint8), chunks=(1,) + shape[1:])
            d.attrs["dtype"] = "float8_e4m3fn"
            w.create_dataset(name + "_scale", data=np.full((E, shape[1] // 128, shape[2] // 128), 0.01,
                                                           dtype=np.float32))
        if edit:
            edit(f)


def replace(f, path, **kw):
    attrs = dict(f[path].attrs) if path in f else {}
    keep_dtype = kw.pop("keep_dtype", True)
    del f[path]
    d = f.create_dataset(path, **kw)
    if keep_dtype and "dtype" in attrs:
        d.attrs["dtype"] = attrs["dtype"]
    return d


def poke(f, path, index, value):
    a = f[path][...]
    a[index] = value
    f[path][...] = a


CASES = [
    # name, where, edit
    ("valid.h5", "-", None),
    ("wrong_format.h5", "/@format", lambda f: f.attrs.__setitem__("format", "hdf5.case")),
    ("format_version_2.h5", "/@format_version", lambda f: f.attrs.__setitem__("format_version", 2)),
    ("no_format.h5", "/@format", lambda f: f.attrs.__delitem__("format")),
    ("float64_codes.h5", "/weights/w13",
     lambda f: replace(f, "weights/w13", data=np.zeros((E, 2 * I, H)), keep_dtype=False)),
    ("int8_logits.h5", "/inputs/router_logits",
     lambda f: replace(f, "inputs/router_logits", data=np.zeros((T, E), dtype=np.int8))),
    ("rank1_hidden.h5", "/inputs/hidden_states",
     lambda f: replace(f, "inputs/hidden_states", data=np.zeros(T * H, dtype=np.uint16))),
    ("rank4_w2.h5", "/weights/w2",
     lambda f: replace(f, "weights/w2", data=np.zeros((E, H, I, 1), dtype=np.uint8))),
    # 2^40 x 7168 float32 declared, nothing written: must be refused before any allocation.
    ("absurd_tokens.h5", "/inputs/hidden_states",
     lambda f: replace(f, "inputs/hidden_states", shape=(2 ** 40, 7168), dtype=np.float32, chunks=(1, 7168),
                       keep_dtype=False)),
    ("absurd_expert_rows.h5", "/weights/w13",
     lambda f: replace(f, "weights/w13", shape=(E, 2 ** 40, H), dtype=np.uint8, chunks=(1, 1024, H))),
    ("huge_hidden_size.h5", "/config@hidden_size", lambda f: f["config"].attrs.__setitem__("hidden_size", 10 ** 12)),
    ("huge_experts.h5", "/config@num_experts", lambda f: f["config"].attrs.__setitem__("num_experts", 2 ** 62)),
    ("negative_top_k.h5", "/config@top_k", lambda f: f["config"].attrs.__setitem__("top_k", -3)),
    ("uint64_max_attr.h5", "/config@intermediate_size",
     lambda f: f["config"].attrs.__setitem__("intermediate_size", np.uint64(2 ** 64 - 1))),
    ("string_array_attr.h5", "/config@routing",
     lambda f: f["config"].attrs.__setitem__("routing", ["deepseek_v3", "renormalize", "llama4"])),
    ("fixed_string_array_attr.h5", "/config@routing",
     lambda f: f["config"].attrs.__setitem__("routing", np.array([b"deepseek_v3", b"llama4"]))),
    ("huge_string_attr.h5", "/config@routing",
     lambda f: f["config"].attrs.create("routing", np.bytes_(b"x" * (2 << 20)))),
    ("compound_logits.h5", "/inputs/router_logits",
     lambda f: replace(f, "inputs/router_logits", data=np.zeros((T, E), dtype=[("a", "<f4"), ("b", "<i4")]))),
    ("opaque_bf16.h5", "/inputs/hidden_states",
     lambda f: replace(f, "inputs/hidden_states", data=np.zeros((T, H), dtype="V2"), keep_dtype=False)),
    ("nan_scales.h5", "/weights/w13_scale", lambda f: poke(f, "weights/w13_scale", (3, 1, 0), np.nan)),
    ("negative_scales.h5", "/weights/w2_scale", lambda f: poke(f, "weights/w2_scale", (0, 0, 1), -0.01)),
    ("inf_scales.h5", "/weights/w2_scale", lambda f: poke(f, "weights/w2_scale", (7, 1, 1), np.inf)),
    ("nan_coded_weights.h5", "/weights/w13", lambda f: poke(f, "weights/w13", (5, 100, 7), 0x7F)),
    ("nan_coded_weights_neg.h5", "/weights/w2", lambda f: poke(f, "weights/w2", (0, 0, 0), 0xFF)),
    ("nan_logits.h5", "/inputs/router_logits", lambda f: poke(f, "inputs/router_logits", (2, 3), np.nan)),
    ("inf_hidden.h5", "/inputs/hidden_states", lambda f: poke(f, "inputs/hidden_states", (1, 1), 0x7F80)),
    ("inconsistent_tokens.h5", "/inputs/router_logits",
     lambda f: replace(f, "inputs/router_logits", data=np.zeros((T + 1, E), dtype=np.float32))),
    ("inconsistent_experts.h5", "/weights/w2",
     lambda f: replace(f, "weights/w2", data=np.zeros((E - 1, H, I), dtype=np.uint8))),
    ("inconsistent_scale_blocks.h5", "/weights/w13_scale",
     lambda f: replace(f, "weights/w13_scale", data=np.ones((E, 2, 2), dtype=np.float32))),
    ("missing_w2.h5", "/weights/w2", lambda f: f["weights"].__delitem__("w2")),
    ("missing_logits.h5", "/inputs/router_logits", lambda f: f["inputs"].__delitem__("router_logits")),
    ("missing_bias.h5", "/inputs/routing_bias", lambda f: f["inputs"].__delitem__("routing_bias")),
    ("missing_weights_group.h5", "/weights", lambda f: f.__delitem__("weights")),
    ("top_k_above_e.h5", "/config@top_k", lambda f: f["config"].attrs.__setitem__("top_k", 9)),
    ("e_not_divisible.h5", "/config@n_group", lambda f: f["config"].attrs.__setitem__("n_group", 3)),
    ("bias_for_renormalize.h5", "/inputs/routing_bias",
     lambda f: (f["config"].attrs.__setitem__("routing", "renormalize"), f["config"].attrs.__setitem__("n_group", 1))),
    ("external_link.h5", "/inputs/routing_bias",
     lambda f: (f["inputs"].__delitem__("routing_bias"),
                f["inputs"].__setitem__("routing_bias", h5py.ExternalLink("/etc/passwd", "/bias")))),
    ("soft_link.h5", "/weights/w2",
     lambda f: (f["weights"].__delitem__("w2"), f["weights"].__setitem__("w2", h5py.SoftLink("/weights/w13")))),
    ("external_storage.h5", "/inputs/router_logits",
     lambda f: replace(f, "inputs/router_logits", shape=(T, E), dtype=np.float32,
                       external=[("external.bin", 0, T * E * 4)])),
    ("unknown_config_attr.h5", "/config@topk", lambda f: f["config"].attrs.__setitem__("topk", 2)),
    ("unknown_weights_dataset.h5", "/weights/w1",
     lambda f: f["weights"].create_dataset("w1", data=np.zeros(3, dtype=np.uint8))),
    ("bad_expert_ids.h5", "/weights/expert_ids",
     lambda f: f["weights"].create_dataset("expert_ids", data=np.array([0, 2, 1, 3, 4, 5, 6, 7], dtype=np.int32))),
    ("output_wrong_shape.h5", "/outputs/x/output",
     lambda f: f.create_group("outputs/x").create_dataset("output", data=np.zeros((T, H + 1), dtype=np.float32))),
]


NEWER_FORMAT = {"huge_string_attr.h5"}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: write_hostile.py OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, where, edit in CASES:
        # Attributes over 64 KiB need the newer object header format (dense attribute storage).
        write_valid(out / name, edit, libver="latest" if name in NEWER_FORMAT else None)
        lines.append(f"{name}\t{where}\n")
    (out / "manifest.tsv").write_text("".join(lines), encoding="utf-8")


if __name__ == "__main__":
    main()
