"""A differentiable training forward of the DeepSeek V3.2 decoder, on HF-named weights.

Same math as the inference stack (``deepseek.py``, ``mla.py``, ``indexer.py``, ``moe.py``), reusing its
RMSNorm / LayerNorm / rope helpers, but in the non-absorbed MHA form over packed ``[B, T]`` batches with
every weight a trainable fp32 parameter (``nn.ParameterDict`` keyed by the HF name with ``.`` -> ``__``):

* attention: per-head ``k_nope``/``v`` from ``kv_b_proj``, causal and document-diagonal masks (packed rows),
  optionally restricted to the lightning indexer's top-``index_topk`` keys per query (``sparse=True``); a
  query with at most ``index_topk`` visible keys sees them all, as in the runtime;
* indexer: ``I[t, s] = sum_h w[t, h] relu(q[t, h] . k[s])`` without the FP8 / Hadamard rounding of the
  kernels (the Hadamard rotation is orthogonal, so only the FP8 rounding differs); its KL loss against the
  main attention (summed over heads, L1-normalised; DeepSeek-V3.2's warm-up and sparse stages) is
  returned separately, with the indexer's inputs detached so it trains only the indexer;
* MoE: sigmoid scores, grouped ``noaux_tc`` selection with the correction bias (updated outside the
  gradient, aux-loss-free balancing), every expert computed densely and weighted by the routing weights
  (cheap at this size; exact same output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.ops import layer_norm, rms_norm
from dsa_runtime.model.rope import Rope, apply_interleaved, apply_neox


def _key(name: str) -> str:
    return name.replace(".", "__")


@dataclass
class TrainOutput:
    logits: Tensor  # [B, T, vocab] fp32
    index_kl: Tensor  # scalar: mean indexer KL over layers (0 when the indexer is not asked for)
    expert_load: list[Tensor]  # per MoE layer [E] token counts (for the bias update)
    hidden: Tensor | None = None  # [B, T, D] post-final-norm hidden (what the MTP layer reads)


class TrainableDeepseek(nn.Module):
    """Training-mode model. ``state`` holds HF-named tensors (any float dtype, no FP8); with an MTP layer
    (``model.layers.{num_hidden_layers}.*``) :meth:`mtp_forward` trains it (``mtp_parameters``); the main
    forward and the main / indexer parameter lists leave it out."""

    def __init__(self, config: ModelConfig, state: dict[str, Tensor]) -> None:
        super().__init__()
        self.cfg = config
        self.mtp_prefix = f"model__layers__{config.num_hidden_layers}__"
        self.p = nn.ParameterDict({_key(k): nn.Parameter(v.detach().float().clone()) for k, v in state.items()
                                   if not k.endswith("e_score_correction_bias")})
        # The routing bias is not learnt by gradient (DeepSeek's aux-loss-free balancing).
        for k, v in state.items():
            if k.endswith("e_score_correction_bias"):
                self.register_buffer(_key(k), v.detach().float().clone())
        self.rope = Rope(config, "cpu")

    def w(self, name: str) -> Tensor:
        key = _key(name)
        return self.p[key] if key in self.p else getattr(self, key)

    def state_dict_hf(self) -> dict[str, Tensor]:
        """Every tensor under its HF name (fp32, detached)."""
        out = {k.replace("__", "."): v.detach().clone() for k, v in self.p.items()}
        for k, v in self.named_buffers():
            out[k.replace("__", ".")] = v.detach().clone()
        return out

    def indexer_parameters(self) -> list[nn.Parameter]:
        return [v for k, v in self.p.items() if "__indexer__" in k and not k.startswith(self.mtp_prefix)]

    def main_parameters(self) -> list[nn.Parameter]:
        return [v for k, v in self.p.items() if "__indexer__" not in k and not k.startswith(self.mtp_prefix)]

    def mtp_parameters(self) -> list[nn.Parameter]:
        """The MTP layer's parameters (its indexer's included)."""
        return [v for k, v in self.p.items() if k.startswith(self.mtp_prefix)]

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, ids: Tensor, positions: Tensor, doc: Tensor, *, sparse: bool = False,
                index_loss: bool = False) -> TrainOutput:
        """ids / positions / doc ``[B, T]`` int64 (doc: document id of each packed token)."""
        cfg = self.cfg
        b, t = ids.shape
        h = self.w("model.embed_tokens.weight")[ids]
        if self.rope.freqs.device != ids.device:
            self.rope.freqs = self.rope.freqs.to(ids.device)
        turn = self.rope.turns(positions.reshape(-1))
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        visible = causal[None] & (doc[:, :, None] == doc[:, None, :])  # [B, T, T]
        kls, loads = [], []
        for layer in range(cfg.num_hidden_layers):
            h = self._layer(h, layer, turn, visible, sparse, index_loss, kls, loads)
        h = rms_norm(h, self.w("model.norm.weight"), cfg.rms_norm_eps)
        logits = (h @ self.w("lm_head.weight").T).float()
        kl = torch.stack(kls).mean() if kls else logits.new_zeros(())
        return TrainOutput(logits, kl, loads, h)

    def mtp_forward(self, hidden: Tensor, next_ids: Tensor, positions: Tensor, doc: Tensor, *,
                    sparse: bool = False, index_loss: bool = False) -> TrainOutput:
        """The MTP (NextN) layer: ``hidden`` ``[B, T, D]`` (the main model's post-norm hidden, or a previous MTP
        pass's for chained drafting) with the embedding of ``next_ids`` ``[B, T]`` (the token after each
        position) -> logits ``[B, T, vocab]`` predicting the token two ahead, and the MTP's post-norm hidden."""
        cfg = self.cfg
        n = cfg.num_hidden_layers
        pre = f"model.layers.{n}"
        b, t = next_ids.shape
        if self.rope.freqs.device != next_ids.device:
            self.rope.freqs = self.rope.freqs.to(next_ids.device)
        turn = self.rope.turns(positions.reshape(-1))
        causal = torch.ones(t, t, dtype=torch.bool, device=next_ids.device).tril()
        visible = causal[None] & (doc[:, :, None] == doc[:, None, :])
        e = rms_norm(self.w("model.embed_tokens.weight")[next_ids], self.w(f"{pre}.enorm.weight"), cfg.rms_norm_eps)
        hp = rms_norm(hidden, self.w(f"{pre}.hnorm.weight"), cfg.rms_norm_eps)
        z = torch.cat([e, hp.to(e.dtype)], dim=-1) @ self.w(f"{pre}.eh_proj.weight").T
        kls: list[Tensor] = []
        loads: list[Tensor] = []
        g = self._layer(z, n, turn, visible, sparse, index_loss, kls, loads)
        g = rms_norm(g, self.w(f"{pre}.shared_head.norm.weight"), cfg.rms_norm_eps)
        logits = (g @ self.w("lm_head.weight").T).float()
        return TrainOutput(logits, kls[0] if kls else logits.new_zeros(()), loads, g)

    def _layer(self, h: Tensor, layer: int, turn: Tensor, visible: Tensor, sparse: bool,
               index_loss: bool, kls: list[Tensor], loads: list[Tensor]) -> Tensor:
        """One decoder layer ``[B, T, D] -> [B, T, D]``; appends its indexer KL and expert load."""
        cfg = self.cfg
        b, t, _ = h.shape
        pre = f"model.layers.{layer}"
        x = rms_norm(h, self.w(f"{pre}.input_layernorm.weight"), cfg.rms_norm_eps)
        attn, kl = self._attention(x, turn, visible, f"{pre}.self_attn", sparse, index_loss)
        h = h + attn
        if kl is not None:
            kls.append(kl)
        x = rms_norm(h, self.w(f"{pre}.post_attention_layernorm.weight"), cfg.rms_norm_eps)
        if cfg.is_moe_layer(layer):
            y, load = self._moe(x.reshape(b * t, -1), f"{pre}.mlp")
            loads.append(load)
            return h + y.view(b, t, -1)
        return h + self._swiglu(x, f"{pre}.mlp")

    def _swiglu(self, x: Tensor, pre: str) -> Tensor:
        g, u, d = (self.w(f"{pre}.{n}_proj.weight") for n in ("gate", "up", "down"))
        return (nn.functional.silu(x @ g.T) * (x @ u.T)) @ d.T

    def _attention(self, x: Tensor, turn: Tensor, visible: Tensor, pre: str, sparse: bool,
                   index_loss: bool) -> tuple[Tensor, Tensor | None]:
        cfg = self.cfg
        b, t, _ = x.shape
        heads, nope, rope, vd, lora = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                       cfg.v_head_dim, cfg.kv_lora_rank)
        flat = x.reshape(b * t, -1)
        qr = rms_norm(flat @ self.w(f"{pre}.q_a_proj.weight").T, self.w(f"{pre}.q_a_layernorm.weight"),
                      cfg.rms_norm_eps)
        q = (qr @ self.w(f"{pre}.q_b_proj.weight").T).view(b * t, heads, nope + rope)
        q_nope, q_pe = q[..., :nope], apply_interleaved(q[..., nope:], turn)
        kv = flat @ self.w(f"{pre}.kv_a_proj_with_mqa.weight").T
        c = rms_norm(kv[:, :lora], self.w(f"{pre}.kv_a_layernorm.weight"), cfg.rms_norm_eps)
        k_pe = apply_interleaved(kv[:, lora:], turn)  # [BT, rope]
        kvb = (c @ self.w(f"{pre}.kv_b_proj.weight").T).view(b * t, heads, nope + vd)
        k_nope, v = kvb[..., :nope], kvb[..., nope:]
        qn = q_nope.view(b, t, heads, nope).transpose(1, 2)
        kn = k_nope.view(b, t, heads, nope).transpose(1, 2)
        scores = torch.einsum("bhtd,bhsd->bhts", qn, kn)
        scores = scores + torch.einsum("bthr,bsr->bhts", q_pe.view(b, t, heads, rope), k_pe.view(b, t, rope))
        scores = scores.float() * cfg.softmax_scale

        kl = None
        allowed = visible
        if cfg.is_dsa and (sparse or index_loss):
            ilog = self._index_logits(x.detach(), qr.detach().view(b, t, -1), turn, pre)  # [B, T, T]
            ilog = ilog.masked_fill(~visible, float("-inf"))
            if sparse:
                k = min(cfg.index_topk, t)
                top = ilog.topk(k, dim=-1).indices
                picked = torch.zeros_like(visible).scatter_(-1, top, True)
                allowed = visible & picked
            if index_loss:
                with torch.no_grad():
                    target = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1).sum(1)
                    target = target / target.sum(-1, keepdim=True)
                logp = torch.log_softmax(ilog.masked_fill(~allowed, float("-inf")), dim=-1)
                terms = torch.where(target > 0, target * (torch.log(target.clamp_min(1e-30)) - logp), 0.0)
                kl = terms.sum(-1).mean()
        probs = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1).to(v.dtype)
        out = torch.einsum("bhts,bhsd->bthd", probs, v.view(b, t, heads, vd).transpose(1, 2))
        return out.reshape(b, t, heads * vd) @ self.w(f"{pre}.o_proj.weight").T, kl

    def _index_logits(self, x: Tensor, qr: Tensor, turn: Tensor, pre: str) -> Tensor:
        """Lightning indexer scores ``[B, T, T]`` fp32 (no masking)."""
        cfg = self.cfg
        b, t, _ = x.shape
        n, d = cfg.index_n_heads, cfg.index_head_dim
        ip = f"{pre}.indexer"
        # Rope on the first qk_rope_head_dim dims (the turns' width times 2), NeoX pairs.
        q = apply_neox((qr.reshape(b * t, -1) @ self.w(f"{ip}.wq_b.weight").T).view(b * t, n, d), turn)
        k = layer_norm(x.reshape(b * t, -1) @ self.w(f"{ip}.wk.weight").T, self.w(f"{ip}.k_norm.weight"),
                       self.w(f"{ip}.k_norm.bias"), cfg.rms_norm_eps)
        k = apply_neox(k.to(q.dtype), turn).view(b, t, d)
        hw = (x.reshape(b * t, -1).float() @ self.w(f"{ip}.weights_proj.weight").float().T) * (n**-0.5 * d**-0.5)
        s = torch.einsum("bthd,bsd->bths", q.view(b, t, n, d).float(), k.float()).relu()
        return torch.einsum("bths,bth->bts", s, hw.view(b, t, n))

    def _moe(self, x: Tensor, pre: str) -> tuple[Tensor, Tensor]:
        """x ``[N, D]`` -> (output ``[N, D]``, tokens per expert ``[E]``)."""
        cfg = self.cfg
        n_exp, groups = cfg.n_routed_experts, cfg.n_group
        with torch.autocast(device_type=x.device.type, enabled=False):  # the router runs in fp32
            p = torch.sigmoid(x.float() @ self.w(f"{pre}.gate.weight").float().T)  # [N, E]
        with torch.no_grad():
            biased = p + self.w(f"{pre}.gate.e_score_correction_bias")
            grouped = biased.view(-1, groups, n_exp // groups)
            gscore = grouped.topk(min(2, n_exp // groups), dim=-1).values.sum(-1)
            keep = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, gscore.topk(cfg.topk_group, -1).indices, True)
            mask = keep.repeat_interleave(n_exp // groups, dim=1)
            ids = biased.masked_fill(~mask, float("-inf")).topk(cfg.num_experts_per_tok, -1).indices
        wts = torch.gather(p, 1, ids)
        if cfg.norm_topk_prob:
            wts = wts / wts.sum(-1, keepdim=True).clamp_min(1e-20)
        wts = wts * cfg.routed_scaling_factor
        dense = torch.zeros(p.shape, dtype=torch.float32, device=p.device).scatter(1, ids, wts.float())
        names = [f"{pre}.experts.{j}" for j in range(n_exp)]
        w1 = torch.stack([self.w(f"{m}.gate_proj.weight") for m in names])
        w3 = torch.stack([self.w(f"{m}.up_proj.weight") for m in names])
        w2 = torch.stack([self.w(f"{m}.down_proj.weight") for m in names])
        hid = nn.functional.silu(torch.einsum("nd,eid->nei", x, w1)) * torch.einsum("nd,eid->nei", x, w3)
        y = torch.einsum("nei,edi->ned", hid * dense.to(hid.dtype)[..., None], w2).sum(1)
        y = y + self._swiglu(x, f"{pre}.shared_experts")
        load = torch.zeros(n_exp, device=x.device).index_add_(0, ids.reshape(-1),
                                                              torch.ones(ids.numel(), device=x.device))
        return y, load

    @torch.no_grad()
    def update_bias(self, loads: list[Tensor], rate: float, layers: list[int] | None = None) -> None:
        """Aux-loss-free balancing: raise the bias of under-loaded experts, lower the over-loaded ones
        (``layers``: the MoE layers ``loads`` belong to; default the main stack's)."""
        moe_layers = layers if layers is not None else [
            layer for layer in range(self.cfg.num_hidden_layers) if self.cfg.is_moe_layer(layer)]
        for layer, load in zip(moe_layers, loads, strict=True):
            bias = self.w(f"model.layers.{layer}.mlp.gate.e_score_correction_bias")
            bias += rate * torch.sign(load.mean() - load)
