"""A small FP8 block-scale fused MoE layer in Triton, of the SGLang design, with switchable mutants:
the stand-in for an engine's FP8 tensor-core path in tests/triton/triton_moe_test.py.

Written for moecheck (not copied from an engine); the arithmetic is the public design of SGLang's
Triton fused MoE with DeepSeek-V3 routing, stage by stage:

  route            float32: s = sigmoid(logits); choice = s + bias; per group the sum of its two
                   largest choice scores; the topk_group best groups kept, the others masked with
                   -inf; top_k by choice score (descending: the slot order); weights = s of the
                   chosen experts / their float32 sum, times routed_scaling_factor.
  quant_groups     per row and 128 channels: s = max(amax, 1e-10) / 448 (float32),
                   q = e4m3(clamp(x / s, +-448)) (torch's cast: round to nearest even).
  fused_moe        per (token, slot) pair grouped by expert: for each 128-wide K block,
                   p = tl.dot(a_fp8, w_fp8) (wgmma e4m3 x e4m3 -> float32 on sm_90: the tensor
                   cores' own accumulation inside the block), then acc += p * sa * sw on the CUDA
                   cores in float32 (the per-block promotion); the epilogue optionally multiplies
                   by the routing weight in float32 and stores bf16.
  GEMM1            out bf16 [T*k, 2I] (rows [0, I) gate, [I, 2I) up).
  silu_mul         float32 silu(gate) * up, rounded to bf16 (SGLang's silu_and_mul).
  requant          quant_groups of the bf16 intermediate.
  GEMM2            weight multiplied in the epilogue, bf16 per slot [T, k, H].
  combine          float32 sum of the k bf16 slot outputs in slot order, rounded to bf16.

The case recipe that says this is `recipe="sglang"` (golden/FORMAT.md "Engine recipes").
MUTANTS are the bug classes of the issue tracker's Part 1/5 list, each one line of difference.
"""
import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
EPS = 1e-10
BLOCK = 128  # quantization group along K and weight block: the cases' group_size / weight_block

MUTANTS = (
    "gate_up_swap",          # silu of the up half times the gate half
    "rsf_missing",           # routed_scaling_factor never applied
    "rsf_twice",             # routed_scaling_factor applied twice
    "bias_ignored",          # correction bias missing from the selection
    "act_scale_transposed",  # [T, H/128] activation scales read as if [H/128, T]
    "zero_group_nan",        # no amax floor: an all-zero group quantizes 0/0 = NaN
    "w2_scale_doubled",      # one expert's down-projection scales doubled (the most used live one)
    "output_scale_2pct",     # the float32 output 2% too large before its bf16 rounding
    "no_renormalize",        # routing weights not divided by their sum
    "group_mask_zero",       # excluded groups masked with 0 instead of -inf
    "no_requant",            # GEMM2 reads the bf16 intermediate unquantized (bf16 MMA)
    "last_token_zeroed",     # the last output row never written
)


def route(logits, bias, top_k, n_group, topk_group, rsf, mutant=None, weight_bf16=False):
    scores = torch.sigmoid(logits.float())
    choice = scores.clone() if mutant == "bias_ignored" else scores + bias.float()
    T, E = scores.shape
    if n_group > 1:
        per = E // n_group
        group_score = choice.view(T, n_group, per).topk(min(2, per), dim=-1).values.sum(-1)
        kept = group_score.topk(topk_group, dim=-1).indices
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
        keep = keep.unsqueeze(-1).expand(T, n_group, per).reshape(T, E)
        choice = choice.masked_fill(~keep, 0.0 if mutant == "group_mask_zero" else float("-inf"))
    ids = choice.topk(top_k, dim=-1, sorted=True).indices
    w = scores.gather(1, ids)
    if mutant != "no_renormalize":
        w = w / w.sum(-1, keepdim=True)
    factor = {"rsf_missing": 1.0, "rsf_twice": rsf * rsf}.get(mutant, rsf)
    w = (w * factor).float()
    if weight_bf16:  # routing_weight_dtype = bf16: the final weights rounded once
        w = w.to(torch.bfloat16).float()
    return ids.to(torch.int32), w


def quant_groups(x, floor=True, ue8m0=False, eps=EPS):
    """x [R, C] -> (fp8 [R, C], float32 scales [R, C/128]) (dequantization multipliers). ue8m0:
    the float32 scale rounded up to a power of two (DeepGEMM's UE8M0 scales)."""
    R, C = x.shape
    xg = x.float().view(R, C // BLOCK, BLOCK)
    amax = xg.abs().amax(-1)
    if floor:
        amax = amax.clamp_min(eps)
    s = amax / FP8_MAX
    if ue8m0:
        m, e = torch.frexp(s)  # s = m 2^e, m in [0.5, 1): a power of two when m = 0.5
        s = torch.where((m == 0.5) | (s == 0), s, torch.ldexp(torch.ones_like(s), e))
    q = (xg / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(R, C), s.contiguous()


def align_by_expert(ids, num_experts, block_m):
    """The (token, slot) pairs t*k+j sorted by expert, each expert's run padded to block_m with
    the invalid index T*k; one expert id per block of block_m pairs. ids < 0: pairs this shard
    does not compute (an expert of another EP rank), left out."""
    flat = ids.reshape(-1).long()
    n = flat.numel()
    order = torch.argsort(flat, stable=True)
    order = order[flat[order] >= 0]
    counts = torch.bincount(flat[flat >= 0], minlength=num_experts).tolist()
    rows, experts, start = [], [], 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        pad = -c % block_m
        rows.append(order[start:start + c])
        rows.append(torch.full((pad,), n, dtype=torch.long, device=flat.device))
        experts += [e] * ((c + pad) // block_m)
        start += c
    if not rows:  # no pair computed here
        return torch.empty(0, dtype=torch.int32, device=flat.device), torch.empty(0, dtype=torch.int32, device=flat.device)
    sorted_pairs = torch.cat(rows).to(torch.int32)
    return sorted_pairs, torch.tensor(experts, dtype=torch.int32, device=flat.device)


@triton.jit
def _fused_moe(a_ptr, w_ptr, c_ptr, sa_ptr, sw_ptr, rw_ptr, pairs_ptr, experts_ptr,
               N, K, num_pairs,
               s_am, s_ak, s_we, s_wn, s_wk, s_cm, s_cn, s_sam, s_sak, s_swe, s_swn, s_swk,
               TOP_K: tl.constexpr, A_PER_PAIR: tl.constexpr, MUL_WEIGHT: tl.constexpr,
               BF16_A: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pair = tl.load(pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    expert = tl.load(experts_ptr + pid_m).to(tl.int64)
    row = pair if A_PER_PAIR else pair // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k = kb * BLOCK_K + offs_k
        a = tl.load(a_ptr + row[:, None] * s_am + k[None, :] * s_ak, mask=valid[:, None], other=0.0)
        w = tl.load(w_ptr + expert * s_we + offs_n[None, :] * s_wn + k[:, None] * s_wk)
        if BF16_A:
            w = w.to(tl.bfloat16)  # e4m3 -> bf16 is exact
        p = tl.dot(a, w)  # float32 result of one K block
        sa = tl.load(sa_ptr + row * s_sam + kb * s_sak, mask=valid, other=0.0)
        sw = tl.load(sw_ptr + expert * s_swe + (offs_n // BLOCK_K) * s_swn + kb * s_swk)
        acc += p * sa[:, None] * sw[None, :]
    if MUL_WEIGHT:
        rw = tl.load(rw_ptr + pair, mask=valid, other=0.0)
        acc = acc * rw[:, None]
    tl.store(c_ptr + pair[:, None] * s_cm + offs_n[None, :] * s_cn, acc.to(tl.bfloat16), mask=valid[:, None])


def fused_moe(a, sa, w, sw, pairs, experts, num_pairs, top_k, a_per_pair, weights=None,
              block_m=64, block_n=128):
    """C[pair] = bf16(sum over K blocks of dot * sa * sw (* routing weight)), pairs grouped by expert."""
    E, N, K = w.shape
    assert N % block_n == 0 and K % BLOCK == 0, (N, K)
    c = torch.empty((num_pairs, N), dtype=torch.bfloat16, device=a.device)
    c.fill_(float("nan"))  # poison: every valid pair's row must be written
    rw = weights.reshape(-1) if weights is not None else sa  # unused pointer when not weighting
    grid = (experts.numel(), N // block_n)
    if experts.numel() == 0:
        return c
    _fused_moe[grid](a, w, c, sa, sw, rw, pairs, experts, N, K, num_pairs,
                     a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1),
                     sa.stride(0), sa.stride(1), sw.stride(0), sw.stride(1), sw.stride(2),
                     TOP_K=top_k, A_PER_PAIR=a_per_pair, MUL_WEIGHT=weights is not None,
                     BF16_A=a.dtype == torch.bfloat16, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK,
                     num_warps=4)
    return c


def forward(layer, cfg, mutant=None):
    """layer: dict of CUDA tensors (hidden bf16 or float32 [T, H], logits f32 [T, E], bias f32 [E],
    w13 fp8 [S, 2I, H] (gate rows first), w13_scale f32 [S, 2I/128, H/128], w2 fp8 [S, H, I],
    w2_scale [S, H/128, I/128]; optional "stored_index" int64 [E]: the weights' slot of each global
    expert, -1 for one this shard does not hold). cfg: num_experts, top_k, n_group, topk_group,
    routed_scaling_factor; optional scale_format ("ue8m0": power-of-two activation scales),
    routing_weight_dtype ("bf16"), act_eps. Returns (output bf16 [T, H], topk_ids int32 [T, k]
    global, topk_weights f32 [T, k])."""
    assert mutant is None or mutant in MUTANTS, mutant
    x, E, k = layer["hidden"], cfg["num_experts"], cfg["top_k"]
    T, H = x.shape
    I = layer["w2"].shape[2]
    ue8m0 = cfg.get("scale_format") == "ue8m0"
    eps = cfg.get("act_eps", EPS)
    ids, weights = route(layer["logits"], layer["bias"], k, cfg["n_group"], cfg["topk_group"],
                         cfg["routed_scaling_factor"], mutant, weight_bf16=cfg.get("routing_weight_dtype") == "bf16")
    stored = layer.get("stored_index")
    slot_ids = ids if stored is None else stored[ids.long()].to(torch.int32)  # -1: not computed here
    a, sa = quant_groups(x, floor=mutant != "zero_group_nan", ue8m0=ue8m0, eps=eps)
    if mutant == "act_scale_transposed":
        sa = sa.reshape(-1).view(sa.shape[1], T).t().contiguous()
    w13, w2, sw2 = layer["w13"], layer["w2"], layer["w2_scale"]
    if mutant == "gate_up_swap":
        w13 = torch.cat([w13[:, I:], w13[:, :I]], dim=1).contiguous()
        sw13 = torch.cat([layer["w13_scale"][:, I // BLOCK:], layer["w13_scale"][:, :I // BLOCK]], dim=1).contiguous()
    else:
        sw13 = layer["w13_scale"]
    if mutant == "w2_scale_doubled":
        sw2 = sw2.clone()
        sw2[most_used_expert(slot_ids, sw2)] *= 2
    pairs, experts = align_by_expert(slot_ids, w13.shape[0], 64)
    g1 = fused_moe(a, sa, w13, sw13, pairs, experts, T * k, k, a_per_pair=False)
    h = (torch.nn.functional.silu(g1[:, :I].float()) * g1[:, I:].float()).to(torch.bfloat16)
    if mutant == "no_requant":
        q, sq = h, torch.ones((T * k, I // BLOCK), dtype=torch.float32, device=x.device)
    else:
        q, sq = quant_groups(h, ue8m0=ue8m0, eps=eps)
    y = fused_moe(q, sq, w2, sw2, pairs, experts, T * k, k, a_per_pair=True, weights=weights)
    y = y.view(T, k, H).float()
    y = torch.where((slot_ids >= 0).unsqueeze(-1), y, torch.zeros_like(y))  # other shards' slots add 0
    out = y[:, 0].clone()
    for j in range(1, k):  # float32, slot order
        out += y[:, j]
    if mutant == "output_scale_2pct":
        out *= 1.02
    out = out.to(torch.bfloat16)
    if mutant == "last_token_zeroed":
        out[T - 1] = 0
    return out, ids, weights


def most_used_expert(ids, w2_scale):
    """The expert with the most (token, slot) pairs (the lowest id among equals), among those
    whose down-projection is not dead (block scales > 1e-20: the generator's dead experts have
    scales <= ~1e-23 and outputs that underflow, so doubling them changes nothing)."""
    flat = ids.reshape(-1).long()
    counts = torch.bincount(flat[flat >= 0], minlength=w2_scale.shape[0])
    counts[w2_scale.flatten(1).amax(1) <= 1e-20] = -1
    return int(counts.argmax())
