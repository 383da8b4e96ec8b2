"""Train the embedded tiny-chat model from scratch on generated conversations.

Stages (DeepSeek-V3.2's recipe, preceded by the dense training a from-scratch model needs):

0. ``dense``: every main weight learns next-token prediction on assistant tokens, dense attention (the
   indexer is idle) -- the stand-in for the dense base model DeepSeek starts from;
1. ``warmup``: main weights frozen, only the lightning indexer learns, KL to the dense attention
   distribution (summed over heads);
2. ``sparse``: top-``index_topk`` attention on (index_topk 128 against a 1024-token context); main weights
   learn the LM loss through the sparse attention, the indexer the KL on its selected keys (its inputs are
   detached, so the two losses train disjoint weights).

Usage: ``python train/train_tiny.py --out OUT [--time-budget 380] [--steps N] [--device cuda]``; go on from a
run (``--resume RUN``) or from a released FP8 checkpoint (``--init-checkpoint DIR``: its main model and
tokenizer); ``--invent`` is the share of request entities replaced by invented words (copying), ``--json-share``
the share of JSON-answer conversations, ``--dense-every N`` makes every Nth sparse-stage step dense (sparse
output = dense), ``--shares`` sets the stage lengths, ``--stages sparse`` fine-tunes in the last stage alone.
The commands of the released weights are in docs/tiny-model.md.
Writes ``OUT/checkpoint`` (the FP8 release layout), ``OUT/state-*.safetensors`` (bf16 training state, for
resuming with ``--resume``), ``OUT/loss.jsonl`` and prints a summary table last.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import random
import sys
import time
from pathlib import Path

import torch

from dsa_runtime.loader.presets import preset_config
from dsa_runtime.model.config_parse import parse_hf_config
from dsa_runtime.model.trainable import TrainableDeepseek

# Run as ``python train/train_tiny.py``, Python puts train/ on sys.path, not the checkout that holds the chat
# generator ``train.tinychat`` (which is not installed with the package).
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PRESET = "tiny-chat"
STAGE_SHARES = {"dense": 0.62, "warmup": 0.06, "sparse": 0.32}


def _gen_chunk(args: tuple[int, int, str, float, float]) -> list[tuple[list[int], list[int]]]:
    from tokenizers import Tokenizer

    from train.tinychat.dataset import conversations, render, tokenize

    seed, n, tok_json, invent, json_share = args
    tok = Tokenizer.from_str(tok_json)
    return [tokenize(tok, render(c))
            for c in conversations(n, heldout=False, seed=seed, invent=invent, json_share=json_share)]


def make_data(tok_json: str, n_conv: int, seed: int, workers: int, invent: float = 0.0,
              json_share: float = 0.0) -> list[tuple[list[int], list[int]]]:
    chunk = 2000
    jobs = [(seed * 1_000_003 + i, min(chunk, n_conv - i * chunk), tok_json, invent, json_share)
            for i in range(-(-n_conv // chunk))]
    if workers <= 1:
        parts = [_gen_chunk(j) for j in jobs]
    else:
        with mp.get_context("fork").Pool(workers) as pool:
            parts = pool.map(_gen_chunk, jobs)
    return [x for part in parts for x in part]


def pack(docs, ctx: int, seed: int) -> dict[str, torch.Tensor]:
    """Greedy packing into rows of ``ctx`` tokens: ids, targets, loss mask, positions and doc ids."""
    rng = random.Random(seed)
    docs = [d for d in docs if len(d[0]) <= ctx]
    rng.shuffle(docs)
    rows, cur = [], []
    used = 0
    for d in docs:
        if used + len(d[0]) > ctx:
            rows.append(cur)
            cur, used = [], 0
        cur.append(d)
        used += len(d[0])
    if cur:
        rows.append(cur)
    n = len(rows)
    ids = torch.full((n, ctx + 1), 2, dtype=torch.long)  # pad id 2 (never learnt: mask 0)
    mask = torch.zeros(n, ctx + 1, dtype=torch.bool)
    pos = torch.zeros(n, ctx + 1, dtype=torch.long)
    doc = torch.full((n, ctx + 1), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        o = 0
        for j, (t, m) in enumerate(row):
            ids[r, o:o + len(t)] = torch.tensor(t)
            mask[r, o:o + len(t)] = torch.tensor(m, dtype=torch.bool)
            pos[r, o:o + len(t)] = torch.arange(len(t))
            doc[r, o:o + len(t)] = j
            o += len(t)
        doc[r, o:] = 10_000 + torch.arange(ctx + 1 - o)  # padding attends only to itself
    # Target of token i is token i+1 of the same document; the mask is the target's.
    same = doc[:, 1:] == doc[:, :-1]
    return {"ids": ids[:, :-1], "pos": pos[:, :-1], "doc": doc[:, :-1], "tgt": ids[:, 1:],
            "mask": mask[:, 1:] & same}


def add_compute_args(ap: argparse.ArgumentParser) -> None:
    """``--threads`` and ``--dtype``, as both training scripts take them (see :func:`autocast_for`)."""
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                    help="compute dtype (autocast): default bfloat16 on CUDA, float32 on the CPU")


def autocast_for(dev: torch.device, dtype: str | None) -> torch.autocast:
    """bf16 autocast, or none (fp32). Default: bf16 on CUDA; fp32 on the CPU, where bf16 without bf16
    units was 5x slower per step (AVX2 EPYC, 2 threads)."""
    dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def lr_at(step: int, total: int, peak: float, warm: int) -> float:
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm)))))


def init_state(cfg, seed: int) -> dict[str, torch.Tensor]:
    from dsa_runtime.loader.random_init import random_state_dict

    state = {k: v.float() for k, v in random_state_dict(cfg, seed=seed, fp8=False).items()}
    scale = (2 * cfg.num_hidden_layers) ** -0.5  # residual-branch outputs start small (stable from scratch)
    for k in state:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            state[k] *= scale
        if k.endswith("e_score_correction_bias"):
            state[k].zero_()
    return state


def load_checkpoint_state(folder: str) -> dict[str, torch.Tensor]:
    """fp32 HF-named weights of an FP8 release checkpoint (block scales applied), to start training from."""
    from safetensors.torch import load_file

    from dsa_runtime.reference.fp8 import block_dequant_weight

    raw: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        raw.update(load_file(str(f)))
    state = {}
    for k, v in raw.items():
        if k.endswith("_scale_inv"):
            continue
        state[k] = block_dequant_weight(v, raw[f"{k}_scale_inv"]) if v.dtype == torch.float8_e4m3fn else v.float()
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--conversations", type=int, default=150_000)
    ap.add_argument("--steps", type=int, default=0, help="total steps (0: fit --time-budget)")
    ap.add_argument("--time-budget", type=float, default=380.0, help="seconds of training when --steps is 0")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--workers", type=int, default=max(1, (mp.cpu_count() or 2) - 2))
    ap.add_argument("--resume", default=None, help="folder with state-*.safetensors to start from")
    ap.add_argument("--init-checkpoint", default=None, help="FP8 release checkpoint folder to start from")
    ap.add_argument("--stages", default="dense,warmup,sparse")
    ap.add_argument("--shares", default=None, help="stage shares of the steps, e.g. 0.45,0.15,0.4")
    ap.add_argument("--dense-every", type=int, default=0,
                    help="in the sparse stage, every Nth step runs dense attention (the indexer learns the full "
                         "KL): keeps greedy sparse output equal to dense (0: never)")
    ap.add_argument("--invent", type=float, default=0.35,
                    help="share of entity slots filled with invented words (teaches copying)")
    ap.add_argument("--json-share", type=float, default=0.0,
                    help="share of JSON-answer conversations in the mixture (constrained JSON that ends)")
    add_compute_args(ap)
    ap.add_argument("--no-checkpoint", action="store_true", help="write only the bf16 state and tokenizer.json")
    args = ap.parse_args(argv)
    if not 0 <= args.json_share <= 1 or not 0 <= args.invent <= 1:
        ap.error("--json-share and --invent are shares between 0 and 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from tqdm import tqdm

    from dsa_runtime.loader.export import write_checkpoint
    from train.tinychat.tokenizer import train_chat_tokenizer

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = preset_config(PRESET)
    raw["num_nextn_predict_layers"] = 0  # the main model only: train_nextn.py adds the MTP layer afterwards
    cfg = parse_hf_config(raw)
    t0 = time.time()
    base = args.resume or args.init_checkpoint
    if base:  # the tokenizer it goes on with (what train_chat_tokenizer rebuilds, byte for byte)
        tok_json = (Path(base) / "tokenizer.json").read_text(encoding="utf-8")
    else:
        tok_json = train_chat_tokenizer(cfg.vocab_size).to_str(pretty=True) + "\n"
    docs = make_data(tok_json, args.conversations, args.seed, args.workers, args.invent, args.json_share)
    data = pack(docs, args.ctx, args.seed)
    n_rows = data["ids"].shape[0]
    n_tokens = sum(len(d[0]) for d in docs)
    print(f"data: {len(docs)} conversations, {n_tokens} tokens, {n_rows} rows of {args.ctx} "
          f"({time.time() - t0:.0f}s)", flush=True)

    if args.resume:
        from safetensors.torch import load_file

        state = {}
        for f in sorted(Path(args.resume).glob("state-*.safetensors")):
            state.update({k: v.float() for k, v in load_file(str(f)).items()})
    elif args.init_checkpoint:  # the main model only: an MTP layer, if any, is train_nextn.py's to redo
        state = {k: v for k, v in load_checkpoint_state(args.init_checkpoint).items()
                 if not k.startswith("model.layers.") or int(k.split(".")[2]) < cfg.num_hidden_layers}
    else:
        state = init_state(cfg, args.seed)
    dev = torch.device(args.device)
    model = TrainableDeepseek(cfg, state).to(dev)
    opt_main = torch.optim.AdamW(model.main_parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    opt_idx = torch.optim.AdamW(model.indexer_parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    stages = [s for s in args.stages.split(",") if s]
    autocast = autocast_for(dev, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)

    def batch():
        rows = torch.randint(0, n_rows, (args.batch,), generator=gen)
        return {k: v[rows].to(dev, non_blocking=True) for k, v in data.items()}

    def step_fn(stage: str, step: int, total: int) -> dict[str, float]:
        b = batch()
        lr = lr_at(step, total, args.lr, min(200, total // 10 + 1))
        for o in (opt_main, opt_idx):
            for g in o.param_groups:
                g["lr"] = lr
        sparse = stage == "sparse" and not (args.dense_every and step % args.dense_every == args.dense_every - 1)
        with autocast:
            res = model(b["ids"], b["pos"], b["doc"], sparse=sparse, index_loss=stage != "dense")
        logits = res.logits
        m = b["mask"]
        ce = torch.nn.functional.cross_entropy(logits[m].float(), b["tgt"][m])
        kl = res.index_kl.float()
        opt_main.zero_grad(set_to_none=True)
        opt_idx.zero_grad(set_to_none=True)
        if stage == "warmup":
            kl.backward()
            opt_idx.step()
        else:
            (ce + kl).backward()
            torch.nn.utils.clip_grad_norm_(model.main_parameters(), 1.0)
            opt_main.step()
            if stage == "sparse":
                opt_idx.step()
            model.update_bias(res.expert_load, 1e-3)
        with torch.no_grad():
            acc = (logits[m].argmax(-1) == b["tgt"][m]).float().mean()
        return {"ce": ce.item(), "kl": kl.item(), "acc": acc.item(), "lr": lr}

    total = args.steps
    log = open(out / "loss.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (appended to across stages)
    summary = []
    if not total:  # measure the speed of the slowest stage (sparse) on a few steps, then fit the budget
        probe = 3
        for i in range(probe + 1):
            if i == 1:  # the first step pays for allocations and kernel selection: time the others
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t1 = time.time()
            step_fn("sparse" if "sparse" in stages else stages[0], i, 10_000)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t1) / probe
        total = max(len(stages), int(args.time_budget / per))
        print(f"{per * 1000:.0f} ms/step -> {total} steps", flush=True)
    given = [float(x) for x in args.shares.split(",")] if args.shares else None
    if given and len(given) != len(stages):
        raise SystemExit(f"--shares has {len(given)} values for {len(stages)} stages")
    shares = dict(zip(stages, given, strict=True)) if given else {s: STAGE_SHARES[s] for s in stages}
    norm = sum(shares.values())
    step = 0
    for stage in stages:
        n = max(1, int(total * shares[stage] / norm))
        t_stage = time.time()
        bar = tqdm(range(n), desc=stage, mininterval=5)
        last = {}
        for i in bar:
            last = step_fn(stage, i, n)
            step += 1
            if i % 20 == 0 or i == n - 1:
                log.write(json.dumps({"stage": stage, "step": step, **last}) + "\n")
                bar.set_postfix(ce=f"{last['ce']:.3f}", kl=f"{last['kl']:.3f}", acc=f"{last['acc']:.3f}")
        log.flush()
        summary.append((stage, n, last.get("ce", 0), last.get("kl", 0), last.get("acc", 0), time.time() - t_stage))

    hf = {k: v.float().cpu() for k, v in model.state_dict_hf().items()}
    from safetensors.torch import save_file

    keys = sorted(hf)
    for j in range(4):  # bf16 resume state in 4 files (each well under the 16 MB transfer limit)
        part = {k: hf[k].to(torch.bfloat16).contiguous() for k in keys[j::4]}
        save_file(part, str(out / f"state-{j}.safetensors"))
    (out / "tokenizer.json").write_text(tok_json, encoding="utf-8")
    ck = out / "checkpoint"
    if args.no_checkpoint:
        pass
    elif ck.exists():
        import shutil

        shutil.rmtree(ck)
    if not args.no_checkpoint:
        write_checkpoint(ck, raw, hf, tok_json, num_shards=2)
    print(f"\nwrote {ck}; total {time.time() - t0:.0f}s on {dev}")
    print(f"{'stage':8} {'steps':>6} {'ce':>7} {'kl':>7} {'acc':>6} {'sec':>6}")
    for s, n, ce, kl, acc, sec in summary:
        print(f"{s:8} {n:6d} {ce:7.3f} {kl:7.3f} {acc:6.3f} {sec:6.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
