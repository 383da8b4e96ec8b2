"""``dsa-runtime generate``: stream one completion (or one chat turn) to the terminal.

Without ``--model`` it runs the embedded trained tiny V3.2 model (``docs/tiny-model.md``) through the whole
path: checkpoint, kernels, paged cache, scheduler, sampler, detokenizer.
"""

from __future__ import annotations

import argparse
import sys
import time

HELP = "generate text from a prompt or one chat message, streamed to the terminal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dsa_runtime.engine.cli_args import add_dataclass_arguments
    from dsa_runtime.engine.config import EngineConfig

    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", metavar="TEXT", help="raw text prompt (BOS is prepended)")
    what.add_argument("--chat", metavar="TEXT", help="one user message, through the model's chat format")
    parser.add_argument(
        "--max-tokens", type=int, default=64, metavar="N", help="tokens to generate (default: 64)"
    )
    parser.add_argument(
        "--temperature", type=float, default=1.0, metavar="T", help="0 = greedy (default: 1.0)"
    )
    parser.add_argument(
        "--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling (default: 1.0)"
    )
    parser.add_argument(
        "--seed", type=int, default=None, metavar="S", help="sampling seed (default: engine seed 0)"
    )
    parser.add_argument(
        "--thinking", action="store_true", help="--chat: ask for reasoning first (thinking mode)"
    )
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    add_dataclass_arguments(parser.add_argument_group("engine options"), EngineConfig, exclude=("seed",))


def run(args: argparse.Namespace) -> int:
    from dsa_runtime.engine.cli_args import config_from_args
    from dsa_runtime.engine.config import EngineConfig
    from dsa_runtime.engine.llm import LLM
    from dsa_runtime.engine.params import SamplingParams

    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
        )
    except ValueError as exc:
        print(f"dsa-runtime: error: {exc}", file=sys.stderr)
        return 2
    config = config_from_args(args, EngineConfig, **({"seed": args.seed} if args.seed is not None else {}))
    started = time.monotonic()
    llm = LLM(engine=_engine(config))
    loaded = time.monotonic()
    out = sys.stdout
    if args.prompt is not None:
        final = _stream_text(llm, args.prompt, params, out)
    else:
        final = _stream_chat(llm, args.chat, args.thinking, params, out)
    done = time.monotonic()
    n = len(final.token_ids)
    first = final.metrics.first_token if final.metrics and final.metrics.first_token else done
    stats = llm.engine.stats()
    spec = f", accept length {stats.spec_accept_length:.2f}" if config.speculative else ""
    print(
        f"[{n} tokens, finish: {final.finish_reason}; load {loaded - started:.1f} s, first token "
        f"{first - loaded:.2f} s, {n / max(done - loaded, 1e-9):.1f} tokens/s{spec}]",
        file=sys.stderr,
    )
    return 0


def _engine(config):
    from dsa_runtime.engine.engine import Engine

    return Engine(config)


def _stream_text(llm, prompt: str, params, out):
    final = None
    for final in llm.stream(prompt, params):
        out.write(final.new_text)
        out.flush()
    out.write("\n")
    return final


def _stream_chat(llm, message: str, thinking: bool, params, out):
    _, ids = llm.chat_prompt([{"role": "user", "content": message}], thinking=thinking)
    parser = llm.chat_parser(thinking).stream()
    dim, reset = ("\x1b[2m", "\x1b[0m") if out.isatty() else ("", "")
    final = None
    shown: list[str] = []  # which parts have started, so reasoning and answer are labelled apart
    for final in llm.stream(ids, params):
        _show(parser.feed(final.new_text), out, dim, reset, shown)
    deltas, _reason = parser.finish(truncated=final is not None and final.finish_reason == "length")
    _show(deltas, out, dim, reset, shown)
    out.write("\n")
    return final


def _show(deltas, out, dim: str, reset: str, shown: list[str]) -> None:
    for delta in deltas:
        if delta.reasoning_content:
            if "reasoning" not in shown:
                shown.append("reasoning")
                out.write("[thinking] ")
            out.write(dim + delta.reasoning_content + reset)
        if delta.content:
            if "reasoning" in shown and "content" not in shown:
                out.write("\n[answer] ")
            if "content" not in shown:
                shown.append("content")
            out.write(delta.content)
        for call in delta.tool_calls:
            if call.name:
                out.write(f"\n[tool call {call.name}] ")
            if call.arguments:
                out.write(call.arguments)
    out.flush()
