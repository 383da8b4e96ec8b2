"""An independent, plain-torch MLA + lightning-indexer layer written from the model's published math (the
DeepSeek-V3.2 reference inference code's formulation), used as the oracle of the sparse-attention tests. It shares no code with ``dsa_runtime.model`` or the
kernels: weights are dequantised, rotated, Hadamard-transformed and FP8-quantised here, and attention is the
per-head MHA form with an additive mask over the selected keys ([REF]'s formulation), not the absorbed one.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

E4M3 = torch.float8_e4m3fn


def dequant(sd: dict[str, Tensor], prefix: str) -> Tensor:
    """``W = W8 * S[i // 128, j // 128]`` (scale_inv is a multiplier; edge blocks may be partial)."""
    w = sd[f"{prefix}.weight"]
    if w.dtype != E4M3:
        return w.float()
    s = sd[f"{prefix}.weight_scale_inv"].float()
    rows, cols = w.shape
    return w.float() * s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]


def rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def yarn_freqs(cfg) -> Tensor:
    """Section 1: base 10000^(-2i/d), blended towards /factor between the YaRN correction dims."""
    d, base, rs = cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling
    i = torch.arange(d // 2, dtype=torch.float64)
    f = base ** (-2 * i / d)

    def corr(r):
        return d * math.log(rs.original_max_position_embeddings / (2 * math.pi * r)) / (2 * math.log(base))

    low, high = max(math.floor(corr(rs.beta_fast)), 0), min(math.ceil(corr(rs.beta_slow)), d - 1)
    ramp = ((i - low) / (high - low)).clamp(0, 1)
    return f * (1 - ramp) + f / rs.factor * ramp


def rope_pairs(x: Tensor, pos: Tensor, freqs: Tensor, interleaved: bool) -> Tensor:
    """Rotate x ``[T, ..., d]`` as complex numbers: pairs (2i, 2i+1) or (i, i + d/2)."""
    ang = pos.double()[:, None] * freqs[None]
    rot = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)
    rot = rot.view(rot.shape[0], *([1] * (x.dim() - 2)), rot.shape[1])
    d = x.shape[-1]
    if interleaved:
        z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(z * rot).reshape(x.shape)
    z = torch.complex(x[..., : d // 2].float(), x[..., d // 2:].float()) * rot
    return torch.cat([z.real, z.imag], dim=-1)


def fp8_quant(x: Tensor, ue8m0: bool) -> tuple[Tensor, Tensor]:
    """One block over the last dim (128): returns dequantisable e4m3 values (as fp32) and the fp32 scale."""
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448.0
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    return (x / s).clamp(-448, 448).to(E4M3).float(), s.squeeze(-1)


def hadamard(n: int) -> Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / math.sqrt(n)


class MLAOracle:
    """The attention block of ``layer`` for one sequence, from the spec.

    x ``[T, D]``: the normed hidden of positions ``0 .. T-1``. KV values are rounded as the cache stores
    them (bf16, or FP8 with ue8m0 scales). :meth:`row` recomputes one output row for any key mask, so a test
    can accept either side of a top-k near-tie (see :meth:`candidate_masks`).
    """

    def __init__(self, cfg, sd: dict[str, Tensor], layer: int, x: Tensor, kv_fp8: bool = False):
        p = f"model.layers.{layer}.self_attn"
        eps, heads = cfg.rms_norm_eps, cfg.num_attention_heads
        nope, rope, vd, lora = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
        self.cfg, self.heads, self.vd = cfg, heads, vd
        x = x.float()
        t = x.shape[0]
        self.pos = pos = torch.arange(t)
        freqs = yarn_freqs(cfg)
        qr = rms(x @ dequant(sd, f"{p}.q_a_proj").T, sd[f"{p}.q_a_layernorm.weight"], eps)
        q = (qr @ dequant(sd, f"{p}.q_b_proj").T).view(-1, heads, nope + rope)
        q_nope, q_pe = q[..., :nope], rope_pairs(q[..., nope:], pos, freqs, interleaved=True)
        kv = x @ dequant(sd, f"{p}.kv_a_proj_with_mqa").T
        c = rms(kv[:, :lora], sd[f"{p}.kv_a_layernorm.weight"], eps)
        k_pe = rope_pairs(kv[:, lora:], pos, freqs, interleaved=True).bfloat16().float()
        if kv_fp8:
            tiles, s = fp8_quant(c.view(-1, lora // 128, 128), ue8m0=True)
            c = (tiles * s[..., None]).view(-1, lora)
        c = c.bfloat16().float()
        w_kv = dequant(sd, f"{p}.kv_b_proj").view(heads, nope + vd, lora)
        k_nope = torch.einsum("sc,hnc->shn", c, w_kv[:, :nope])
        self.v = torch.einsum("sc,hvc->shv", c, w_kv[:, nope:])
        scores = torch.einsum("thn,shn->hts", q_nope, k_nope) + torch.einsum("thr,sr->hts", q_pe, k_pe)
        mscale = 0.1 * cfg.rope_scaling.mscale_all_dim * math.log(cfg.rope_scaling.factor) + 1.0
        self.scores = scores * (nope + rope) ** -0.5 * mscale**2
        self.wo = dequant(sd, f"{p}.o_proj")
        self.visible = torch.arange(t)[None, :] <= pos[:, None]
        self.logits = indexer_logits(cfg, sd, layer, x, qr, pos) if cfg.index_topk is not None else None

    def row(self, t: int, mask: Tensor) -> Tensor:
        """Output ``[D]`` of row ``t`` attending (MHA form, softmax over ``mask``) to the keys in ``mask``."""
        s = self.scores[:, t].masked_fill(~mask[None], float("-inf"))
        return torch.einsum("hs,shv->hv", s.softmax(-1), self.v).reshape(-1) @ self.wo.T

    def candidate_masks(self, t: int, band: float = 0.01, limit: int = 64) -> list[Tensor]:
        """Key masks row ``t`` may use: the exact top-k, plus the other choices among keys whose indexer
        logits lie within ``band`` x the row's logit range of the k-th value (FP8 rounding of q/k may
        reorder such near-ties; the kernel contract accepts any set with the same values)."""
        visible = self.visible[t]
        k = self.cfg.index_topk
        if self.logits is None or int(visible.sum()) <= k:
            return [visible]
        vals = self.logits[t].masked_fill(~visible, float("-inf"))
        ordered = vals[visible].sort(descending=True).values
        kth = ordered[k - 1]
        width = band * float(ordered[0] - ordered[-1])
        sure = visible & (vals > kth + width)
        tied = (visible & ~sure & (vals >= kth - width)).nonzero().flatten()
        # Best first: the first combination is the exact top-k.
        tied = tied[vals[tied].sort(descending=True, stable=True).indices].tolist()
        need = k - int(sure.sum())
        masks = []
        for combo in itertools.combinations(tied, need):
            m = sure.clone()
            m[list(combo)] = True
            masks.append(m)
            if len(masks) >= limit:
                break
        return masks


def indexer_logits(cfg, sd: dict[str, Tensor], layer: int, x: Tensor, qr: Tensor, pos: Tensor) -> Tensor:
    """Section 3 steps 1-7: ``I[t, s] = k_scale[s] * sum_h w[t, h] relu(q8[t, h] . k8[s])`` -> ``[T, T]``."""
    p = f"model.layers.{layer}.self_attn.indexer"
    n, d, r = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
    ue8m0 = cfg.scale_fmt == "ue8m0"
    freqs = yarn_freqs(cfg)
    q = (qr @ dequant(sd, f"{p}.wq_b").T).view(-1, n, d)
    k = torch.nn.functional.layer_norm(x @ dequant(sd, f"{p}.wk").T, (d,), sd[f"{p}.k_norm.weight"].float(),
                                       sd[f"{p}.k_norm.bias"].float(), cfg.rms_norm_eps)
    q = torch.cat([rope_pairs(q[..., :r], pos, freqs, interleaved=False), q[..., r:]], dim=-1)
    k = torch.cat([rope_pairs(k[..., :r], pos, freqs, interleaved=False), k[..., r:]], dim=-1)
    h = hadamard(d)
    q8, q_s = fp8_quant(q @ h, ue8m0)
    k8, k_s = fp8_quant(k @ h, ue8m0)
    w = (x @ sd[f"{p}.weights_proj.weight"].float().T) * n**-0.5 * q_s * d**-0.5
    return torch.einsum("th,ths->ts", w, torch.einsum("thd,sd->ths", q8, k8).relu()) * k_s[None, :]
