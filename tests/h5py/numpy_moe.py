"""A tiny FP8 block-scale MoE layer and a plain numpy float32 "engine" that runs it by the
device recipe (docs/DEVICE-ALGORITHM.md), for tests/h5py/capture_test.py: the stand-in for an
inference engine whose tensors tools/capture/moecheck_capture.py captures. numpy only.

  e4m3_decode / e4m3_encode   float8_e4m3fn from the 256-code table: exact decode; encode is
                              round-to-nearest-even with saturation to +-448 (satfinite)
  make_layer                  random weights quantized to e4m3 with 128x128 block scales
  run_engine                  routing (float32), per-token per-128 activation quantization,
                              GEMM1 with per-block float32 promotion, SiLU * up, re-quantization,
                              GEMM2, weighted combine in float32, bf16 output; `bug=` switches on
                              one deliberate mistake ("rsf_twice", "gate_up_swap")
"""
import numpy as np

E4M3_MAX = 448.0


def _table():
    c = np.arange(256)
    e, m = (c >> 3) & 0xF, c & 7
    mag = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7.0))
    v = np.where(c & 0x80, -mag, mag)
    v[(c & 0x7F) == 0x7F] = np.nan
    return v  # float64, every value exact


E4M3_TABLE = _table()
_POS = E4M3_TABLE[:0x7F]  # codes 0x00..0x7E: the finite magnitudes, ascending


def e4m3_decode(codes):
    """uint8 codes -> float32 values (exact; 0x7F/0xFF -> NaN)."""
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)].astype(np.float32)


def e4m3_encode(x):
    """float32/float64 values -> uint8 codes, nearest, ties to the even code, |x| > 448 -> 448.
    The midpoint between two neighbouring codes is exact in float64, so the comparison is too."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 1, 0x7E)  # _POS[hi - 1] < a <= _POS[hi] (mostly)
    lo = hi - 1
    dlo, dhi = a - _POS[lo], _POS[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(a == 0, 0, pick)
    codes = (pick | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)
    codes[np.isnan(x)] = 0x7F
    return codes


def bf16_bits(x):
    """float32 -> bfloat16 bits (uint16), round to nearest even; NaN -> the quiet NaN 0x7FC0."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bits[np.isnan(np.asarray(x, dtype=np.float32))] = 0x7FC0
    return bits


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantize_groups(x, g=128, eps=1e-10):
    """Per row, per group of g columns: s = fl32(max(amax, eps) / 448), q = e4m3(fl32(x / s)).
    x float32 [R, C] -> codes [R, C], scales float32 [R, ceil(C/g)] (dequantization multipliers)."""
    R, C = x.shape
    nb = -(-C // g)
    codes = np.empty((R, C), dtype=np.uint8)
    scales = np.empty((R, nb), dtype=np.float32)
    for b in range(nb):
        blk = x[:, b * g:(b + 1) * g]
        amax = np.abs(blk).max(axis=1)
        s = np.where(amax.astype(np.float64) >= eps, amax / np.float32(E4M3_MAX), np.float32(eps / E4M3_MAX))
        s = s.astype(np.float32)
        scales[:, b] = s
        codes[:, b * g:(b + 1) * g] = e4m3_encode((blk / s[:, None]).astype(np.float32))
    return codes, scales


def quantize_weight(w, B=128):
    """float32 [R, C] -> e4m3 codes and a float32 scale per BxB block (amax / 448)."""
    R, C = w.shape
    s = np.empty((-(-R // B), -(-C // B)), dtype=np.float32)
    codes = np.empty((R, C), dtype=np.uint8)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = w[i * B:(i + 1) * B, j * B:(j + 1) * B]
            s[i, j] = np.float32(max(float(np.abs(blk).max()), 1e-10) / E4M3_MAX)
            codes[i * B:(i + 1) * B, j * B:(j + 1) * B] = e4m3_encode(blk / s[i, j])
    return codes, s


def make_layer(seed, T, E, H, I, with_bias):
    """Inputs and quantized weights of one layer, all experts; w13 rows [0, I) gate, [I, 2I) up."""
    rng = np.random.default_rng(seed)
    layer = {
        # bf16-exact, as an engine's bf16 activations are: stored as bf16 or float32, the same values
        "hidden": bf16_value(bf16_bits(rng.standard_normal((T, H)).astype(np.float32))),
        "logits": (rng.standard_normal((T, E)) * 2).astype(np.float32),
        "bias": (rng.standard_normal(E) * 0.1).astype(np.float32) if with_bias else None,
    }
    w13, s13, w2, s2 = [], [], [], []
    for _ in range(E):
        c, s = quantize_weight((rng.standard_normal((2 * I, H)) * 0.05).astype(np.float32))
        w13.append(c), s13.append(s)
        c, s = quantize_weight((rng.standard_normal((H, I)) * 0.05).astype(np.float32))
        w2.append(c), s2.append(s)
    layer.update(w13=np.stack(w13), w13_scale=np.stack(s13), w2=np.stack(w2), w2_scale=np.stack(s2))
    return layer


def route(logits, bias, routing, top_k, n_group=1, topk_group=1, rsf=1.0):
    """float32 routing; ids in rank order (descending selection score, ties to the lower id)."""
    T, E = logits.shape
    if routing == "deepseek_v3":
        gate = (np.float32(1) / (np.float32(1) + np.exp(-logits))).astype(np.float32)
        sel = gate + bias if bias is not None else gate.copy()
    elif routing == "renormalize":
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        gate = (z / z.sum(axis=1, keepdims=True)).astype(np.float32)
        sel = gate.copy()
    else:
        raise ValueError(routing)
    sel = sel.astype(np.float32)
    ids = np.empty((T, top_k), dtype=np.int32)
    weights = np.empty((T, top_k), dtype=np.float32)
    per = E // n_group
    for t in range(T):
        s = sel[t].copy()
        if routing == "deepseek_v3" and n_group > 1:
            g = s.reshape(n_group, per)
            top2 = np.sort(g, axis=1)[:, -2:].sum(axis=1) if per > 1 else g[:, 0]
            kept = []
            gs = top2.copy()
            for _ in range(topk_group):
                j = int(np.argmax(gs))  # first index on ties
                kept.append(j)
                gs[j] = -np.inf
            for j in range(n_group):
                if j not in kept:
                    s[j * per:(j + 1) * per] = -np.inf
        for j in range(top_k):
            e = int(np.argmax(s))
            ids[t, j] = e
            s[e] = -np.inf
        gsel = gate[t, ids[t]]
        total = np.float32(0)
        for v in gsel:
            total = np.float32(total + v)
        weights[t] = (gsel / total).astype(np.float32) * np.float32(rsf)
    return ids, weights


def block_gemm(a_codes, a_scales, w_codes, w_scales, G=128):
    """C = sum over K blocks b, ascending, of fl32(sa[:, b] * sw[n/G, b]) * (A_b @ W_b^T),
    accumulated in float32 (the device's per-block promotion, DEVICE-ALGORITHM.md §3)."""
    a = e4m3_decode(a_codes)
    w = e4m3_decode(w_codes)
    M, K = a.shape
    N = w.shape[0]
    acc = np.zeros((M, N), dtype=np.float32)
    sw_rows = np.repeat(w_scales, G, axis=0)[:N]  # [N, KB]
    for b in range(-(-K // G)):
        p = a[:, b * G:(b + 1) * G] @ w[:, b * G:(b + 1) * G].T  # float32 sums (any order)
        s = (a_scales[:, b][:, None] * sw_rows[:, b][None, :]).astype(np.float32)  # fl32(sa * sw)
        # The FFMA fl32(acc + s * p): s * p is exact in float64 (24 + 24 bits), the sum is rounded
        # to float64 and then to float32 (a double rounding, off from one FFMA in rare ties only).
        acc = (acc.astype(np.float64) + s.astype(np.float64) * p.astype(np.float64)).astype(np.float32)
    return acc


def run_engine(layer, routing, top_k, n_group=1, topk_group=1, rsf=1.0, up_gate=False, local=None, bug=None,
               act=None, combine="f32"):
    """The layer's forward. local = (offset, count) for expert parallelism (slots of other experts
    contribute nothing); up_gate: the w13 arrays hold [up; gate] (FlashInfer w31); act = (codes,
    scales [T, H/128]) when the engine quantized the activations itself; combine = "bf16_slots":
    each slot's float32 w * y rounded to bf16 before the float32 sum (SGLang, FORMAT.md recipes).
    Returns output bf16 bits [T, H], topk ids/weights [T, k], expert_outputs float32 [T, k, H]."""
    x = layer["hidden"]
    T, H = x.shape
    I = layer["w2"].shape[2]
    ids, w = route(layer["logits"], layer["bias"], routing, top_k, n_group, topk_group, rsf)
    if bug == "rsf_twice":
        w = (w * np.float32(rsf)).astype(np.float32)
    a_codes, a_scales = act if act is not None else quantize_groups(x)
    off, cnt = local if local is not None else (0, layer["w13"].shape[0])
    y = np.zeros((T, top_k, H), dtype=np.float32)
    for e in np.unique(ids):
        if not off <= e < off + cnt:
            continue
        slot = e - off if local is not None else e
        tok, j = np.nonzero(ids == e)
        x1 = block_gemm(a_codes[tok], a_scales[tok], layer["w13"][slot], layer["w13_scale"][slot])
        gate_first = not up_gate
        if bug == "gate_up_swap":
            gate_first = not gate_first
        g, u = (x1[:, :I], x1[:, I:]) if gate_first else (x1[:, I:], x1[:, :I])
        h = (g / (np.float32(1) + np.exp(-g)) * u).astype(np.float32)
        hc, hs = quantize_groups(h)
        y[tok, j] = block_gemm(hc, hs, layer["w2"][slot], layer["w2_scale"][slot])
    out = np.zeros((T, H), dtype=np.float32)
    for j in range(top_k):
        local_slot = (ids[:, j] >= off) & (ids[:, j] < off + cnt)
        p = (w[:, j, None] * y[:, j]).astype(np.float32)
        if combine == "bf16_slots":
            p = bf16_value(bf16_bits(p))
        out = (out + np.where(local_slot[:, None], p, 0)).astype(np.float32)
    return bf16_bits(out), ids, w, y
