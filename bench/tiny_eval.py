"""Evaluate the embedded tiny-chat model through the real engine and parsers.

Held-out conversations (``train.tinychat``, held-out entities and tool pairs) are encoded with the
V3.2 encoder, generated greedily by :class:`dsa_runtime.LLM` and read back by the DSML / reasoning parsers:

* ``tool``: the reply's tool calls equal the expected ones (function names and arguments, in order);
* ``dsml``: share of tool-call replies that parse into tool calls whose arguments are valid JSON objects;
* ``arith`` / ``convert`` / ``fact``: the expected value is the last number (or the word) of the answer;
* ``agree``: the same prompts on the same weights with ``index_topk`` >= the context (dense attention):
  share of prompts whose greedy token ids are identical;
* ``latency``: seconds per reply (one request at a time) on this machine;
* ``accept length`` (with ``--speculative-algorithm EAGLE``): mean tokens per MTP verify over the batch run
  (the greedy outputs, and so every score, are those of plain decoding).

``python bench/tiny_eval.py [--model DIR] [--n 40] [--no-dense] [--speculative-algorithm EAGLE] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The held-out chats come from the training generator ``train.tinychat``, in the checkout, not the package.
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

KINDS = {"tool": 1.0, "arith": 0.6, "convert": 0.3, "fact": 0.3}


def held_out(n: int, seed: int, heldout: bool = True, only: str | None = None):
    import random

    from train.tinychat.dialogs import sample

    rng = random.Random(seed)
    items = []
    for kind, share in ({only: 1.0} if only else KINDS).items():
        for _ in range(max(1, int(n * share))):
            mode = "thinking" if kind in ("arith", "convert") else rng.choice(("thinking", "chat"))
            items.append(sample(rng, heldout=heldout, kind=kind, mode=mode))
    return items


def _last_number(text: str | None) -> str | None:
    nums = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return nums[-1] if nums else None


def run(llm, items, max_tokens: int):
    from dsa_runtime import SamplingParams
    from dsa_runtime.engine.chat import parse_completion

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompts = [llm.chat_prompt(c.messages[:1], c.tools, c.mode == "thinking") for c in items]
    outs = llm.generate([ids for _text, ids in prompts], params)
    return [parse_completion(llm.chat_format, text, o, c.mode == "thinking")
            for (text, _ids), o, c in zip(prompts, outs, items, strict=True)]


def score(items, results) -> dict[str, dict[str, float]]:
    tally: dict[str, list[int]] = {}

    def add(key: str, ok: bool) -> None:
        tally.setdefault(key, []).append(int(ok))

    for conv, res in zip(items, results, strict=True):
        if conv.kind == "tool":
            got = []
            valid = bool(res.tool_calls)
            for call in res.tool_calls:
                try:
                    args = json.loads(call.arguments)
                    valid &= isinstance(args, dict)
                except (TypeError, ValueError):
                    args, valid = None, False
                got.append({"name": call.name, "arguments": args})
            add("tool", got == conv.expect["calls"])
            add("dsml", valid)
        elif conv.kind in ("arith", "convert"):
            add(conv.kind, _last_number(res.content) == conv.expect["answer"])
        else:
            add(conv.kind, conv.expect["answer"].lower() in (res.content or "").lower())
    return {k: {"right": sum(v), "total": len(v), "share": sum(v) / len(v)} for k, v in tally.items()}


def dense_copy(model: Path, tmp: Path) -> Path:
    """The same checkpoint with ``index_topk`` = ``max_position_embeddings`` (every query sees every key)."""
    out = tmp / "dense"
    shutil.copytree(model, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["index_topk"] = cfg["max_position_embeddings"]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--n", type=int, default=40, help="tool prompts (the other kinds scale with it)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--no-dense", action="store_true")
    ap.add_argument("--only", choices=sorted(KINDS), default=None, help="evaluate one kind only (n prompts)")
    ap.add_argument("--latency", type=int, default=6, help="single requests timed per kind")
    ap.add_argument("--json", default=None)
    ap.add_argument("--speculative-algorithm", choices=("EAGLE", "NEXTN"), default=None,
                    help="decode with MTP speculation and report the mean accept length")
    ap.add_argument("--speculative-num-steps", type=int, default=None)
    ap.add_argument("--split", choices=("heldout", "train"), default="heldout",
                    help="entities of the held-out lists (default) or of the training lists (fresh draws)")
    args = ap.parse_args(argv)
    import torch

    from dsa_runtime import LLM
    from dsa_runtime.loader import default_model_path

    model = Path(args.model) if args.model else default_model_path()
    items = held_out(args.n, args.seed, args.split == "heldout", args.only)
    spec = {}
    if args.speculative_algorithm:
        spec = {"speculative_algorithm": args.speculative_algorithm,
                "speculative_num_steps": args.speculative_num_steps}
    llm = LLM(model=str(model), **spec)
    t0 = time.time()
    sparse = run(llm, items, args.max_tokens)
    report = {"model": str(model), "split": args.split, "prompts": len(items), "threads": torch.get_num_threads(),
              "batch_seconds": round(time.time() - t0, 1), "scores": score(items, sparse)}
    if spec:
        st = llm.engine.stats()
        report["speculative"] = {
            "num_steps": llm.engine.config.speculative_num_steps, "accept_length": round(st.spec_accept_length, 3),
            "verifies": st.spec_verifies_total, "draft_tokens": st.spec_draft_tokens_total,
            "accepted_tokens": st.spec_accepted_tokens_total}
    lat: list[float] = []
    per_kind: dict[str, list[tuple[float, int, int]]] = {}
    if args.latency:
        run(llm, items[:1], args.max_tokens)  # warm-up (first-call allocations)
    for kind in [args.only] if args.only else KINDS:
        for conv in [c for c in items if c.kind == kind][: args.latency]:
            t = time.time()
            (res,) = run(llm, [conv], args.max_tokens)
            lat.append(time.time() - t)
            per_kind.setdefault(kind, []).append(
                (lat[-1], len(res.output.prompt_token_ids), len(res.output.token_ids)))
    if lat:
        report["latency_s"] = {"median": round(statistics.median(lat), 2), "max": round(max(lat), 2)}
        report["latency_by_kind"] = {
            k: {"median_s": round(statistics.median(x[0] for x in v), 2), "max_s": round(max(x[0] for x in v), 2),
                "prompt_tokens": round(statistics.median(x[1] for x in v)),
                "generated_tokens": round(statistics.median(x[2] for x in v))}
            for k, v in per_kind.items()}
    if not args.no_dense:
        del llm
        with tempfile.TemporaryDirectory() as tmp:
            dense_llm = LLM(model=str(dense_copy(model, Path(tmp))))
            dense = run(dense_llm, items, args.max_tokens)
        same = [a.output.token_ids == b.output.token_ids for a, b in zip(sparse, dense, strict=True)]
        long = [len(a.prompt) for a in sparse]
        report["agree"] = {"same": sum(same), "total": len(same), "share": sum(same) / len(same)}
        report["dense_scores"] = score(items, dense)
        report["prompt_chars_max"] = max(long)
    print(f"{'metric':10} {'right':>6} {'total':>6} {'share':>7}")
    for k, v in report["scores"].items():
        print(f"{k:10} {v['right']:6d} {v['total']:6d} {v['share']:7.1%}")
    if "agree" in report:
        a = report["agree"]
        print(f"{'agree':10} {a['same']:6d} {a['total']:6d} {a['share']:7.1%}")
    if "speculative" in report:
        sp = report["speculative"]
        print(f"accept length {sp['accept_length']:.2f} with {sp['num_steps']} draft steps "
              f"({sp['accepted_tokens']} of {sp['draft_tokens']} draft tokens accepted over {sp['verifies']} verifies)")
    for k, v in report.get("latency_by_kind", {}).items():
        print(f"latency {k:8} median {v['median_s']} s, max {v['max_s']} s ({v['prompt_tokens']} prompt, "
              f"{v['generated_tokens']} generated tokens)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
