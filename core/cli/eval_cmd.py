"""``dsa-runtime eval``: accuracy of a chat endpoint on a question set, as a table and JSON, with a gate.

Flags follow SGLang's ``few_shot_gsm8k`` and lm-eval: ``--data gsm8k|tinychat-arith|tinychat-tools|FILE``,
``--num-shots``, ``--num-questions``, ``--parallel`` (concurrent clients), ``--max-tokens``, ``--temperature``,
``--seed``, ``--json OUT``, ``--min-accuracy X`` (exit code 1 below it). The endpoint is an OpenAI-compatible
server (``--base-url``, ``--model``, ``--api-key``; needs the ``[eval]`` extra) or, with ``--in-process``, an
engine built here from the engine flags (no server, no port). Exit codes: 0 done (and at or above the gate),
1 below ``--min-accuracy``, 2 bad input or an endpoint that cannot serve.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, fields
from pathlib import Path

HELP = "measure answer accuracy on gsm8k, the tiny model's held-out sets or a JSONL file (a CI gate)"
DEFAULT_BASE_URL = "http://127.0.0.1:30000/v1"
_OWN_FLAGS = ("model", "seed")  # EngineConfig fields whose flags eval defines itself (request-level meaning)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dsa_runtime.engine.cli_args import add_dataclass_arguments
    from dsa_runtime.engine.config import EngineConfig

    parser.add_argument(
        "--data", default="gsm8k", metavar="SET",
        help="gsm8k (downloaded on first use), tinychat-arith, tinychat-tools or a JSONL file of "
             "{question, answer} rows (default: gsm8k)",
    )  # fmt: skip
    parser.add_argument("--num-shots", type=int, default=None, metavar="K",
                        help="few-shot examples per prompt (default: 5; 0 for the tinychat sets)")
    parser.add_argument("--num-questions", type=int, default=None, metavar="N",
                        help="ask the first N questions (default: all)")
    parser.add_argument("--parallel", type=int, default=64, metavar="N",
                        help="concurrent clients (requests in flight; default: 64)")
    parser.add_argument("--max-tokens", type=int, default=512, metavar="N",
                        help="tokens per reply (default: 512)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                        help="0 = greedy (default: 0)")
    parser.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed of every request")
    parser.add_argument("--thinking", action=argparse.BooleanOptionalAction, default=None,
                        help="thinking mode (default: on for tinychat-arith, else off)")
    parser.add_argument("--json", metavar="OUT", default=None,
                        help="write the settings, results and every question's record to this file")
    parser.add_argument("--min-accuracy", type=float, default=None, metavar="X",
                        help="exit with code 1 when accuracy is below X (0-1)")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bar (it goes to stderr)")
    parser.add_argument("--model", default=None, metavar="MODEL",
                        help="the model's name at the endpoint (default: the first it lists); with "
                             "--in-process, its checkpoint directory (default: the embedded model)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--base-url", default=DEFAULT_BASE_URL, metavar="URL",
                       help=f"OpenAI-compatible endpoint (default: {DEFAULT_BASE_URL})")
    where.add_argument("--in-process", action="store_true",
                       help="build the engine in this process from the engine options instead of asking a server")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="the endpoint's key (default: env OPENAI_API_KEY)")
    add_dataclass_arguments(
        parser.add_argument_group("engine options (with --in-process)"), EngineConfig, exclude=_OWN_FLAGS
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from dsa_runtime.evals.clients import Sampling
    from dsa_runtime.evals.datasets import load
    from dsa_runtime.evals.runner import evaluate, summarize, table

    _check(args)
    data = load(args.data)
    num_shots = data.num_shots if args.num_shots is None else args.num_shots
    examples, questions = data.split(num_shots)
    questions = questions[: args.num_questions]
    thinking = data.thinking if args.thinking is None else args.thinking
    sampling = Sampling(args.max_tokens, args.temperature, args.seed, thinking)
    client = _client(args)

    async def go() -> tuple[list, float]:
        await client.start()
        try:
            start = time.perf_counter()
            records = await evaluate(
                client, questions, examples, sampling, args.parallel, progress=not args.disable_tqdm
            )
            return records, time.perf_counter() - start
        finally:
            await client.close()

    records, wall_s = asyncio.run(go())
    results = summarize(records, wall_s)
    endpoint = "in-process" if args.in_process else args.base_url
    print(f"{data.name}: {len(questions)} questions, {num_shots}-shot, thinking {'on' if thinking else 'off'}, "
          f"{client.model} ({endpoint}), parallel {args.parallel}")  # fmt: skip
    print(table(results))
    if args.json:
        settings = {"data": data.name, "model": client.model, "endpoint": endpoint, "num_shots": num_shots,
                    "num_questions": len(questions), "parallel": args.parallel, "max_tokens": args.max_tokens,
                    "temperature": args.temperature, "seed": args.seed, "thinking": thinking}  # fmt: skip
        report = {"settings": settings, "results": results, "records": [asdict(r) for r in records]}
        out = Path(args.json)
        part = out.with_name(f".{out.name}.part{os.getpid()}")
        part.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(part, out)  # whole or not at all
    if args.min_accuracy is not None and results["accuracy"] < args.min_accuracy:
        print(f"dsa-runtime: accuracy {results['accuracy']:.3f} is below --min-accuracy {args.min_accuracy}",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _check(args: argparse.Namespace) -> None:
    """Flag values that cannot work, before any download or model load (ConfigError: one line, exit 2)."""
    from dsa_runtime.engine.config import EngineConfig, flag_of
    from dsa_runtime.errors import ConfigError

    for flag, value, low in (("--num-shots", args.num_shots, 0), ("--num-questions", args.num_questions, 1),
                             ("--parallel", args.parallel, 1), ("--max-tokens", args.max_tokens, 1)):  # fmt: skip
        if value is not None and value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    if args.temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {args.temperature}")
    if args.min_accuracy is not None and not 0 <= args.min_accuracy <= 1:
        raise ConfigError(f"--min-accuracy is a share between 0 and 1, got {args.min_accuracy}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise ConfigError(f"--json {args.json}: no such directory")
    given = [flag_of(f.name) for f in fields(EngineConfig) if hasattr(args, f.name) and f.name not in _OWN_FLAGS]
    if given and not args.in_process:
        raise ConfigError(f"{', '.join(given)}: engine options apply only with --in-process")


def _client(args: argparse.Namespace):
    from dsa_runtime.evals.clients import HTTPClient, InProcessClient

    if args.in_process:
        from dsa_runtime.engine.cli_args import config_from_args
        from dsa_runtime.engine.config import EngineConfig

        return InProcessClient(config_from_args(args, EngineConfig, model=args.model))
    return HTTPClient(args.base_url.rstrip("/"), args.api_key or os.environ.get("OPENAI_API_KEY"), args.model)
