"""Train the NextN (MTP) layer of a trained tiny-chat checkpoint: the draft model of speculative decoding.

The main model is frozen (its FP8 tensors are copied unchanged into the output); one MTP layer
(``model.layers.{num_hidden_layers}``: ``enorm``, ``hnorm``, ``eh_proj``, a MoE decoder layer with its
indexer, ``shared_head.norm``; embedding and head shared with the main model) learns to predict token ``q + 2``
from the main model's post-norm hidden state at ``q`` and the embedding of token ``q + 1``:

* pass 1 (what the draft extend does at inference): the main model's hidden states;
* pass 2 (``--chain`` weight; what chained draft steps do): pass 1's own outputs shifted one position, in place
  of the main model's, so the layer also learns to continue from its own hidden state;
* the indexer learns the KL to the layer's attention (inputs detached, as in ``train_tiny.py``); the last
  ``--sparse-share`` of the steps attend through the indexer's top-``index_topk`` keys.

The decoder layer starts as a copy of the main model's last layer, ``eh_proj`` as ``[small noise | identity]``,
or (``--init-mtp DIR``) as the MTP layer of another checkpoint: a short fine-tune after the main model changed.

Usage: ``python train/train_nextn.py --out OUT [--checkpoint DIR] [--time-budget 240] [--device cuda]``. Writes
``OUT/checkpoint`` (the input checkpoint plus the MTP layer, ``num_nextn_predict_layers`` 1; the MTP copies of
the embedding and head are left out, as the runtime shares the main ones), ``OUT/loss.jsonl``, and prints the
held-out top-1 accuracy of both passes last (pass 1 is the chance that the first draft token is accepted).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_tiny import add_compute_args, autocast_for, load_checkpoint_state, lr_at, make_data, pack  # noqa: E402

from dsa_runtime.model.config_parse import parse_hf_config  # noqa: E402
from dsa_runtime.model.trainable import TrainableDeepseek  # noqa: E402


def init_mtp(cfg, state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """MTP tensors: the last main layer's decoder weights, unit norms, ``eh_proj = [noise | I]``."""
    n, d = cfg.num_hidden_layers, cfg.hidden_size
    src, dst = f"model.layers.{n - 1}.", f"model.layers.{n}."
    out = {dst + k[len(src):]: v.clone() for k, v in state.items() if k.startswith(src)}
    gen = torch.Generator().manual_seed(seed)
    out[dst + "enorm.weight"] = torch.ones(d)
    out[dst + "hnorm.weight"] = torch.ones(d)
    out[dst + "shared_head.norm.weight"] = state["model.norm.weight"].clone()
    out[dst + "eh_proj.weight"] = torch.cat([torch.randn(d, d, generator=gen) * 0.02, torch.eye(d)], dim=1)
    return out


def mtp_state(cfg, folder: str) -> dict[str, torch.Tensor]:
    """The MTP layer of a released checkpoint (fp32), to fine-tune after its main model has changed."""
    prefix = f"model.layers.{cfg.num_hidden_layers}."
    out = {k: v for k, v in load_checkpoint_state(folder).items() if k.startswith(prefix)}
    if not out:
        raise SystemExit(f"--init-mtp {folder}: no MTP layer ({prefix}*) in that checkpoint")
    return out


def shift_targets(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(next ids ``x_{q+1}``, targets ``x_{q+2}``, their loss mask) of packed rows ``[B, T]``."""
    tgt, mask, doc = batch["tgt"], batch["mask"], batch["doc"]
    tgt2 = torch.cat([tgt[:, 1:], tgt[:, -1:]], dim=1)
    valid = torch.cat([mask[:, 1:] & (doc[:, 1:] == doc[:, :-1]), torch.zeros_like(mask[:, :1])], dim=1)
    return tgt, tgt2, valid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", default=None, help="trained main model (default: the embedded tiny-chat)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--conversations", type=int, default=60_000)
    ap.add_argument("--steps", type=int, default=0, help="total steps (0: fit --time-budget)")
    ap.add_argument("--time-budget", type=float, default=240.0, help="seconds of training when --steps is 0")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--chain", type=float, default=0.5, help="weight of the chained (pass 2) loss")
    ap.add_argument("--sparse-share", type=float, default=0.3, help="share of steps with sparse attention")
    ap.add_argument("--workers", type=int, default=max(1, (mp.cpu_count() or 2) - 2))
    ap.add_argument("--json-share", type=float, default=0.0, help="share of JSON-answer conversations")
    ap.add_argument("--init-mtp", default=None,
                    help="checkpoint whose MTP layer to start from (default: a copy of the last main layer)")
    add_compute_args(ap)
    args = ap.parse_args(argv)
    if not 0 <= args.json_share <= 1:
        ap.error("--json-share is a share between 0 and 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from safetensors.torch import load_file
    from tqdm import tqdm

    from dsa_runtime.loader import default_model_path
    from dsa_runtime.loader.export import quantize_state
    from dsa_runtime.loader.make_checkpoint import _write_json, write_shards

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    src = Path(args.checkpoint) if args.checkpoint else default_model_path()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    raw["num_nextn_predict_layers"] = 1
    cfg = parse_hf_config(raw)
    tok_json = (src / "tokenizer.json").read_text(encoding="utf-8")
    t0 = time.time()
    docs = make_data(tok_json, args.conversations, args.seed + 7, args.workers, 0.35, args.json_share)
    data = pack(docs, args.ctx, args.seed)
    n_rows = data["ids"].shape[0]
    held = max(2, n_rows // 50)
    print(f"data: {len(docs)} conversations, {n_rows} rows of {args.ctx} ({time.time() - t0:.0f}s)", flush=True)

    state = load_checkpoint_state(str(src))
    state.update(init_mtp(cfg, state, args.seed) if args.init_mtp is None else mtp_state(cfg, args.init_mtp))
    dev = torch.device(args.device)
    model = TrainableDeepseek(cfg, state).to(dev)
    for p in model.parameters():
        p.requires_grad_(False)
    params = model.mtp_parameters()
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    autocast = autocast_for(dev, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    mtp_layer = [cfg.num_hidden_layers]

    def batch(rows=None):
        if rows is None:
            rows = torch.randint(held, n_rows, (args.batch,), generator=gen)
        return {k: v[rows].to(dev, non_blocking=True) for k, v in data.items()}

    def losses(b, sparse: bool):
        nxt, tgt2, valid = shift_targets(b)
        with autocast:
            with torch.no_grad():
                main_out = model(b["ids"], b["pos"], b["doc"], sparse=True)
            first = model.mtp_forward(main_out.hidden, nxt, b["pos"], b["doc"], sparse=sparse, index_loss=True)
            prev = torch.cat([main_out.hidden[:, :1], first.hidden[:, :-1]], dim=1)
            second = model.mtp_forward(prev, nxt, b["pos"], b["doc"], sparse=sparse)
        ce1 = torch.nn.functional.cross_entropy(first.logits[valid].float(), tgt2[valid])
        ce2 = torch.nn.functional.cross_entropy(second.logits[valid].float(), tgt2[valid])
        acc1 = (first.logits[valid].argmax(-1) == tgt2[valid]).float().mean()
        acc2 = (second.logits[valid].argmax(-1) == tgt2[valid]).float().mean()
        return ce1, ce2, first.index_kl.float(), first.expert_load + second.expert_load, acc1, acc2

    def step_fn(step: int, total: int) -> dict[str, float]:
        lr = lr_at(step, total, args.lr, min(100, total // 10 + 1))
        for g in opt.param_groups:
            g["lr"] = lr
        sparse = step >= total * (1 - args.sparse_share)
        ce1, ce2, kl, loads, acc1, acc2 = losses(batch(), sparse)
        opt.zero_grad(set_to_none=True)
        (ce1 + args.chain * ce2 + kl).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        model.update_bias([sum(loads)], 1e-3, mtp_layer)
        return {"ce1": ce1.item(), "ce2": ce2.item(), "kl": kl.item(), "acc1": acc1.item(), "acc2": acc2.item(),
                "lr": lr, "sparse": sparse}

    total = args.steps
    if not total:
        for i in range(3):
            if i == 1:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t1 = time.time()
            step_fn(0, 10_000)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t1) / 2
        total = max(2, int(args.time_budget / per))
        print(f"{per * 1000:.0f} ms/step -> {total} steps", flush=True)
    log = open(out / "loss.jsonl", "w", encoding="utf-8")  # noqa: SIM115
    bar = tqdm(range(total), desc="nextn", mininterval=5)
    for i in bar:
        last = step_fn(i, total)
        if i % 20 == 0 or i == total - 1:
            log.write(json.dumps({"step": i, **last}) + "\n")
            bar.set_postfix(ce1=f"{last['ce1']:.3f}", acc1=f"{last['acc1']:.3f}", acc2=f"{last['acc2']:.3f}")
    log.close()

    # Held-out rows: top-1 accuracy of the first and the chained draft.
    accs = []
    with torch.no_grad():
        for start in range(0, held, args.batch):
            rows = torch.arange(start, min(held, start + args.batch))
            _, _, _, _, a1, a2 = losses(batch(rows), True)
            accs.append((a1.item(), a2.item(), len(rows)))
    n = sum(w for _, _, w in accs)
    acc1 = sum(a * w for a, _, w in accs) / n
    acc2 = sum(a * w for _, a, w in accs) / n

    # The checkpoint: the input's tensors byte for byte, plus the quantised MTP layer.
    hf = {k: v.float().cpu() for k, v in model.state_dict_hf().items()}
    mtp_prefix = f"model.layers.{cfg.num_hidden_layers}."
    tensors = {k: v for k, v in quantize_state(raw, hf).items() if k.startswith(mtp_prefix)}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    target = out / "checkpoint"
    if target.exists():
        shutil.rmtree(target)
    tmp = Path(tempfile.mkdtemp(prefix=".checkpoint.tmp-", dir=out))
    try:
        _write_json(tmp / "config.json", raw)
        for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / name, tmp / name)
        write_shards(tmp, tensors, 2)
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in target.iterdir())
    print(f"\nwrote {target} ({size / 1e6:.1f} MB); total {time.time() - t0:.0f}s on {dev}")
    print(f"{'steps':>6} {'ce1':>7} {'ce2':>7} {'held-out acc1':>14} {'held-out acc2':>14} "
          f"{'expected accept length (3 steps)':>33}")
    # If the chained drafts were accepted independently: 1 + a1 + a1*a2 + a1*a2^2.
    expect = 1 + acc1 + acc1 * acc2 + acc1 * acc2 * acc2
    print(f"{total:6d} {last['ce1']:7.3f} {last['ce2']:7.3f} {acc1:14.3f} {acc2:14.3f} {expect:33.2f}")
    return 0 if math.isfinite(last["ce1"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
