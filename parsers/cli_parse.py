"""``dsa-runtime parse``: completion text on stdin -> one JSON message object on stdout.

Prints ``{"content", "reasoning_content", "tool_calls", "finish_reason"}`` (``null`` for absent text; tool
calls as OpenAI objects). With ``--chunk-size N`` or ``--chunks-json`` the text goes through the streaming
parser instead, the object is rebuilt from the deltas, and the deltas are printed too, under ``"deltas"``
(the last ones are those ``finish()`` flushed). Examples::

    printf 'Hi</think>Hello' | dsa-runtime parse --reasoning-parser deepseek-r1
    dsa-runtime parse --tool-parser deepseekv32 --chunk-size 3 < completion.txt
    echo '["Hi", "!\\n\\n<｜DS", "ML｜function_calls>"]' | dsa-runtime parse --chunks-json --truncated
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

HELP = "parse completion text (stdin) into content, reasoning and tool calls, streamed or whole"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tool-parser",
        default="deepseekv32",
        metavar="NAME",
        help="deepseekv32 (default), deepseekv31, deepseekv3 or their aliases; 'none' disables tool parsing",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="deepseek-r1 or deepseek-v3 (default: none, or deepseek-v3 with --thinking)",
    )
    parser.add_argument(
        "--thinking",
        action="store_true",
        help="the request asked for thinking: the output starts in reasoning",
    )
    parser.add_argument(
        "--truncated",
        action="store_true",
        help="generation stopped at the length limit (finish_reason length)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--chunk-size", type=_positive_int, metavar="N", help="stream the text in pieces of N characters"
    )
    mode.add_argument(
        "--chunks-json",
        action="store_true",
        help="stdin is a JSON list of chunk strings, streamed one by one",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from dsa_runtime.parsers.output import OutputParser
    from dsa_runtime.parsers.stream import collect

    parser = OutputParser(
        tool_parser=args.tool_parser, reasoning_parser=args.reasoning_parser, thinking=args.thinking
    )
    raw = _read_stdin()
    if args.chunks_json:
        chunks: list[str] | None = _parse_chunks(raw)
    elif args.chunk_size:
        chunks = [raw[i : i + args.chunk_size] for i in range(0, len(raw), args.chunk_size)]
    else:
        chunks = None

    if chunks is None:
        result: dict[str, Any] = parser.parse(raw, truncated=args.truncated).to_dict()
    else:
        stream = parser.stream()
        deltas = [d for chunk in chunks for d in stream.feed(chunk)]
        tail, finish_reason = stream.finish(args.truncated)
        deltas += tail
        result = collect(deltas, finish_reason, stream.completed_calls).to_dict()
        result["deltas"] = [d.to_dict() for d in deltas]
    _write_json(result)
    return 0


def _read_stdin() -> str:
    from dsa_runtime.errors import DSAError

    # Bytes when possible: text mode would turn "\r\n" into "\n" and change what the parser sees.
    binary = getattr(sys.stdin, "buffer", None)
    if binary is None:
        return sys.stdin.read()
    try:
        return binary.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DSAError(f"stdin is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _parse_chunks(raw: str) -> list[str]:
    from dsa_runtime.errors import DSAError

    try:
        chunks = json.loads(raw)
    except ValueError as exc:
        raise DSAError(f"--chunks-json: stdin is not valid JSON ({exc})") from None
    if not isinstance(chunks, list) or not all(isinstance(c, str) for c in chunks):
        raise DSAError("--chunks-json: stdin must be a JSON list of strings")
    return chunks


def _write_json(obj: dict[str, Any]) -> None:
    text = json.dumps(obj, ensure_ascii=False)
    try:
        sys.stdout.write(text + "\n")
    except UnicodeEncodeError:
        # A terminal that cannot show the characters (or a lone surrogate from --chunks-json): escape them.
        sys.stdout.write(json.dumps(obj, ensure_ascii=True) + "\n")
    sys.stdout.flush()
