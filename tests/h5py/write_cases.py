#!/usr/bin/env python3
"""Writes the h5py side of the case-format tests (numpy + h5py only).

usage: write_cases.py FORMAT_MD OUT_DIR

  format_example.py / .h5   the example of golden/FORMAT.md, extracted verbatim from between the
                            <!-- h5py-example:begin/end --> markers and run as a user would run it
  vlen_strings.h5           every string attribute as h5py's default variable-length UTF-8 str,
                            int64 / float64 numbers, float32 hidden states
  fixed_strings.h5          every string attribute as fixed-length ASCII (numpy bytes_), integer
                            attributes of assorted widths (int16, uint8, uint64, int32), an integer
                            routed_scaling_factor and a float32 act_eps; bf16 hidden states that
                            need rounding (RNE), big-endian float32 logits, int64 expert_ids

The C++ test (tests/golden_h5py_test.cpp) reads every file back and checks every value; the
formulas below are repeated there.
"""
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

BEGIN = "<!-- h5py-example:begin -->"
END = "<!-- h5py-example:end -->"


def extract_example(format_md):
    text = Path(format_md).read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        sys.exit(f"write_cases.py: {format_md} must contain exactly one {BEGIN} ... {END} block")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    if not (block.startswith("```python\n") and block.endswith("```")):
        sys.exit("write_cases.py: the example block must be one ```python fenced code block")
    return block[len("```python\n"):-len("```")]


def bf16_bits_rne(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_variant(path, fixed):
    """E=4 top_k=2 H=128 I=128 T=3, renormalize routing (no bias)."""
    T, E, K, H, I = 3, 4, 2, 128, 128
    s = (lambda v: np.bytes_(v)) if fixed else (lambda v: v)
    with h5py.File(path, "w") as f:
        f.attrs["format"] = s("moecheck.case")
        f.attrs["format_version"] = np.int32(1) if fixed else 1
        f.attrs["source"] = s("tests/h5py/write_cases.py")
        c = f.create_group("config")
        c.attrs["routing"] = s("renormalize")
        c.attrs["gate_up_layout"] = s("up_gate")
        c.attrs["intermediate_dtype"] = s("bf16")
        if fixed:
            c.attrs["num_experts"] = np.int16(E)
            c.attrs["top_k"] = np.uint8(K)
            c.attrs["hidden_size"] = np.uint64(H)
            c.attrs["intermediate_size"] = np.int32(I)
            c.attrs["routed_scaling_factor"] = np.int8(2)  # a real attribute of integer type
            c.attrs["act_eps"] = np.float32(1e-10)
            c.attrs["local_num_experts"] = np.uint16(E)
        else:
            c.attrs.update(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I,
                           routed_scaling_factor=1.5, act_eps=1e-6)
        n = np.arange(T * H).reshape(T, H)
        inputs = f.create_group("inputs")
        if fixed:
            hidden = ((n % 31 - 15) / 3).astype(np.float32)  # not bf16-exact: tests RNE
            d = inputs.create_dataset("hidden_states", data=bf16_bits_rne(hidden))
            d.attrs["dtype"] = s("bfloat16")
        else:
            inputs.create_dataset("hidden_states", data=((n % 31 - 15) / 3).astype(np.float32))
        logits = ((np.arange(T * E).reshape(T, E) % 5) - 2.5).astype(np.float32)
        inputs.create_dataset("router_logits", data=logits.astype(">f4") if fixed else logits)
        w = f.create_group("weights")
        for name, shape in (("w13", (E, 2 * I, H)), ("w2", (E, H, I))):
            i = np.arange(np.prod(shape)).reshape(shape)
            codes = w.create_dataset(name, data=((i * 5) % 0x7F).astype(np.uint8))
            codes.attrs["dtype"] = s("float8_e4m3fn")
            blocks = (shape[0], -(-shape[1] // 128), -(-shape[2] // 128))
            w.create_dataset(name + "_scale", data=np.full(blocks, 0.125, dtype=np.float32))
        w.create_dataset("expert_ids", data=np.arange(E, dtype=np.int64))
        out = f.create_group("outputs").create_group("engine")
        out.attrs["backend"] = s("flashinfer")
        out.attrs["device"] = s("NVIDIA H200")
        out.create_dataset("output", data=np.full((T, H), 0.5, dtype=np.float32))
        out.create_dataset("topk_ids", data=np.tile(np.array([1, 3], dtype=np.int32), (T, 1)))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: write_cases.py FORMAT_MD OUT_DIR")
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    example = out / "format_example.py"
    example.write_text(extract_example(sys.argv[1]), encoding="utf-8")
    subprocess.run([sys.executable, str(example), str(out / "format_example.h5")], check=True)
    write_variant(out / "vlen_strings.h5", fixed=False)
    write_variant(out / "fixed_strings.h5", fixed=True)


if __name__ == "__main__":
    main()
