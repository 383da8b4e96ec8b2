"""Independent float64 oracle of the model's formulas (indexer, sparse MLA, KV layouts, MoE), written for the tests.

Nothing here imports ``dsa_runtime.reference``: the Hadamard matrix is built by Sylvester recursion, scales
and block indices come straight from the formulas, byte layouts are encoded/decoded with ``struct``/numpy,
and the loops are explicit. Torch is used for float64 arithmetic and for the rounding casts themselves
(to e4m3 and bf16), which is what "quantize" means.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

F64 = torch.float64
E4M3 = torch.float8_e4m3fn
FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
BLOCK = 128
NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------------- FP8 scales
def sylvester(n: int) -> torch.Tensor:
    """Unnormalized Sylvester Hadamard matrix: H_1 = [1], H_2m = [[H, H], [H, -H]]."""
    h = torch.ones(1, 1, dtype=F64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotate(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    return x.to(F64) @ sylvester(n).to(x.device) / math.sqrt(n)


def scale_of(amax: float, fmt: str) -> float:
    """One scale from one amax. Scales are stored as fp32, so the quotient is rounded to fp32."""
    s = max(float(amax), AMAX_FLOOR) / FP8_MAX
    s = struct.unpack("<f", struct.pack("<f", s))[0]  # fp32 rounding of the quotient
    if fmt == "ue8m0":
        e = math.ceil(math.log2(s))
        s = 2.0**e
    return s


def quantize_value(x: torch.Tensor, s: float) -> torch.Tensor:
    """e4m3(clamp(x / s, +-448)) returned as float64 e4m3 values (the cast is the rounding step)."""
    return (x.to(F64) / s).clamp(-FP8_MAX, FP8_MAX).to(E4M3).to(F64)


def quantize_rows(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128-block of the last dim, by explicit loops: e4m3 values (as f64) and f64 scales."""
    x = x.to(F64).cpu()
    flat = x.reshape(-1, x.shape[-1])
    nb = x.shape[-1] // BLOCK
    q = torch.empty_like(flat)
    scales = torch.empty(flat.shape[0], nb, dtype=F64)
    for r in range(flat.shape[0]):
        for b in range(nb):
            seg = flat[r, b * BLOCK : (b + 1) * BLOCK]
            s = scale_of(seg.abs().max().item(), fmt)
            scales[r, b] = s
            q[r, b * BLOCK : (b + 1) * BLOCK] = quantize_value(seg, s)
    return q.reshape(x.shape), scales.reshape(*x.shape[:-1], nb)


# ----------------------------------------------------------------------------------------------- indexer
def indexer_quant(q: torch.Tensor, k: torch.Tensor, fmt: str):
    """Rotate and quantize q [T, H, 128] and k [S, 128]: (q8, q_scale [T, H], k8, k_scale [S]) in f64."""
    q8, qs = quantize_rows(rotate(q.cpu()), fmt)
    k8, ks = quantize_rows(rotate(k.cpu()), fmt)
    return q8, qs[..., 0], k8, ks[..., 0]


def indexer_logits(q, head_weights, k, ks, ke, fmt: str) -> torch.Tensor:
    """I[t, s] = sum_h hw[t, h] * H^-0.5 * 128^-0.5 * relu(q^_h . k^_s) on dequantized rotated vectors.

    q [T, H, 128], head_weights [T, H], k [S, 128]; row t sees ks[t] <= s < ke[t]; -inf elsewhere.
    """
    q8, qs, k8, kscale = indexer_quant(q, k, fmt)
    qd = q8 * qs[..., None]
    kd = k8 * kscale[:, None]
    t_total, heads, d = q.shape
    hw = head_weights.to(F64).cpu()
    out = torch.full((t_total, k.shape[0]), NEG_INF, dtype=F64)
    for t in range(t_total):
        for s in range(int(ks[t]), int(ke[t])):
            dots = (qd[t] @ kd[s]).clamp_min(0)  # [H]
            out[t, s] = (hw[t] * dots).sum() * heads**-0.5 * d**-0.5
    return out


# ----------------------------------------------------------------------------------------------- top-k
def topk(logits, starts, ends, k: int) -> list[list[int]]:
    """Per row: the k best in-window columns relative to the start (NaN = -inf, lower column wins), -1 padded."""
    result = []
    for r in range(logits.shape[0]):
        s0, s1 = int(starts[r]), int(ends[r])
        cand = []
        for col in range(s0, s1):
            v = float(logits[r, col])
            cand.append((NEG_INF if math.isnan(v) else v, col))
        cand.sort(key=lambda vc: (-vc[0], vc[1]))
        picked = [col - s0 for _, col in cand[:k]]
        result.append(picked + [-1] * (k - len(picked)))
    return result


def page_transform(indices, page_table, row_to_batch, page_size: int) -> list[list[int]]:
    out = []
    for r, row in enumerate(indices.tolist()):
        b = int(row_to_batch[r])
        out.append(
            [-1 if p < 0 else int(page_table[b, p // page_size]) * page_size + p % page_size for p in row]
        )
    return out


# ----------------------------------------------------------------------------------------------- attention
def sparse_attention(q, kv_rows, indices, sm_scale: float, d_v: int = 512):
    """q [M, H, 576], kv_rows [S, 576] (f64 rows), indices [M, K]; invalid = <0 or >= S.

    Returns out [M, H, d_v] f64 and natural-log lse [M, H] (+inf, zeros for an empty selection).
    """
    q = q.to(F64).cpu()
    kv_rows = kv_rows.to(F64).cpu()
    m_total, heads, _ = q.shape
    out = torch.zeros(m_total, heads, d_v, dtype=F64)
    lse = torch.full((m_total, heads), float("inf"), dtype=F64)
    for m in range(m_total):
        chosen = [i for i in indices[m].tolist() if 0 <= i < kv_rows.shape[0]]
        if not chosen:
            continue
        rows = kv_rows[chosen]  # duplicates kept on purpose
        for h in range(heads):
            scores = (rows @ q[m, h]) * sm_scale
            top = scores.max()
            weights = torch.exp(scores - top)
            total = weights.sum()
            lse[m, h] = top + torch.log(total)
            out[m, h] = (weights / total) @ rows[:, :d_v]
    return out, lse


def bf16_bits_to_f64(bits: np.ndarray) -> torch.Tensor:
    """bf16 is the top half of an fp32: shift the 16 bits up and reinterpret."""
    return torch.from_numpy((bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64))


def decode_656(row: bytes) -> torch.Tensor:
    """One 656-byte MLA row -> 576 f64 values, decoding every field by its byte offset."""
    assert len(row) == 656
    c8 = torch.frombuffer(bytearray(row[:512]), dtype=torch.uint8).view(E4M3).to(F64)
    scales = struct.unpack("<4f", row[512:528])
    c = torch.cat([c8[128 * j : 128 * j + 128] * scales[j] for j in range(4)])
    k_pe = bf16_bits_to_f64(np.frombuffer(row[528:656], dtype="<u2"))
    return torch.cat([c, k_pe])


def encode_656(c, k_pe, fmt: str) -> bytes:
    """One MLA row -> 656 bytes: e4m3 of c per 128-tile, the 4 scales as little-endian fp32, k_pe bf16."""
    c = c.to(F64).cpu()
    body, scales = b"", []
    for j in range(4):
        seg = c[128 * j : 128 * j + 128]
        s = scale_of(seg.abs().max().item(), fmt)
        scales.append(s)
        body += quantize_value(seg, s).to(E4M3).view(torch.uint8).numpy().tobytes()
    rope = k_pe.cpu().to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    return body + struct.pack("<4f", *scales) + rope


# ----------------------------------------------------------------------------------------------- index-K pages
def index_k_offsets(slot: int, page_size: int) -> tuple[int, int, int]:
    """(page, key byte offset, scale byte offset) of a slot inside an index_k_132 page."""
    page, off = divmod(slot, page_size)
    return page, 128 * off, 128 * page_size + 4 * off


def store_index_k(cache: np.ndarray, slots, k8_bytes: np.ndarray, scales) -> None:
    page_size = cache.shape[1] // 132
    for i, slot in enumerate(int(s) for s in slots):
        if slot == -1:
            continue
        page, ko, so = index_k_offsets(slot, page_size)
        cache[page, ko : ko + 128] = k8_bytes[i]
        cache[page, so : so + 4] = np.frombuffer(struct.pack("<f", float(scales[i])), dtype=np.uint8)


# ----------------------------------------------------------------------------------------------- MoE
def route(logits, bias, top_k: int, n_group: int, topk_group: int, scale: float, renormalize: bool = True):
    """noaux_tc routing token by token: returns per-token lists of (expert id, weight) pairs."""
    logits = logits.to(F64).cpu()
    bias = bias.to(F64).cpu()
    n_exp = logits.shape[1]
    gsize = n_exp // n_group
    result = []
    for t in range(logits.shape[0]):
        p = [1.0 / (1.0 + math.exp(-float(x))) for x in logits[t]]
        b = [p[e] + float(bias[e]) for e in range(n_exp)]
        gscore = []
        for g in range(n_group):
            members = sorted(b[g * gsize : (g + 1) * gsize], reverse=True)
            gscore.append(sum(members[:2]))
        groups = sorted(range(n_group), key=lambda g: (-gscore[g], g))[:topk_group]
        cands = [e for g in groups for e in range(g * gsize, (g + 1) * gsize)]
        chosen = sorted(cands, key=lambda e: (-b[e], e))[:top_k]
        w = [p[e] for e in chosen]
        if renormalize:
            total = sum(w)
            w = [x / total for x in w]
        result.append([(e, x * scale) for e, x in zip(chosen, w, strict=True)])
    return result


def dequant_blocks(w8, scale) -> torch.Tensor:
    """W[i, j] = W8[i, j] * S[i // 128, j // 128], indexing every element's block explicitly."""
    w = w8.to(F64).cpu()
    s = scale.to(F64).cpu()
    rows = torch.arange(w.shape[-2]) // BLOCK
    cols = torch.arange(w.shape[-1]) // BLOCK
    per_element = s[..., rows[:, None], cols[None, :]]
    return w * per_element


def swiglu(x, w13, w2) -> torch.Tensor:
    inter = w13.shape[0] // 2
    gate, up = w13[:inter] @ x, w13[inter:] @ x
    return w2 @ (gate / (1.0 + torch.exp(-gate)) * up)


def experts(x, weights, ids, w13, w2, shared=None) -> torch.Tensor:
    """out[t] = sum_j w[t, j] * E_ids(x[t]) (+ shared(x[t])); w13/w2 given as f64 [E, ...] weights."""
    x = x.to(F64).cpu()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e == -1:
                continue
            out[t] += float(weights[t, j]) * swiglu(x[t], w13[e], w2[e])
        if shared is not None:
            out[t] += swiglu(x[t], shared[0][0], shared[1][0])
    return out
