"""``dsa-runtime encode``: chat messages (JSON on stdin) -> prompt text on stdout.

Input: ``{"messages": [...], "tools": [...], "response_format": {...}}`` (``tools`` and ``response_format``
optional; a bare list of messages is accepted too). Request-level tools are attached to the first message,
as the golden check does. The prompt is written exactly, with no trailing newline, so
``dsa-runtime encode < in.json | cmp - expected.txt`` works.

By default the built-in DeepSeek-V3.2 encoder is used; ``--template`` renders through a Jinja chat
template instead (a ``.jinja`` file, a checkpoint directory, its ``tokenizer_config.json``, or a built-in
name: ``deepseek_v3``, ``deepseek_v31``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "encode chat messages (JSON on stdin) into a DeepSeek prompt on stdout"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--thinking-mode",
        choices=("thinking", "chat"),
        default=None,
        help="V3.2: reply starts inside <think> (thinking, default) or not (chat); with --template: "
        "'thinking' sets the template's thinking variable (default off)",
    )
    parser.add_argument("--thinking", action="store_true", help="shorthand for --thinking-mode thinking")
    parser.add_argument(
        "--keep-thinking",
        action="store_true",
        help="V3.2: keep the reasoning of earlier turns (drop_thinking=False; append-only prompts)",
    )
    parser.add_argument("--no-bos", action="store_true", help="do not prepend the BOS token")
    parser.add_argument(
        "--no-generation-prompt",
        action="store_true",
        help="omit the opener that ends the prompt (<｜Assistant｜> + think token)",
    )
    parser.add_argument(
        "--continue-final-message",
        action="store_true",
        help="V3.2: leave the final assistant message open so generation continues it",
    )
    parser.add_argument(
        "--template",
        metavar="PATH_OR_CHECKPOINT_DIR",
        help="render through a Jinja chat template instead of the built-in V3.2 encoder",
    )


def run(args: argparse.Namespace) -> int:
    from dsa_runtime.errors import DSAError

    payload = _read_payload()
    messages, tools, response_format = _split_payload(payload)
    mode = "thinking" if args.thinking else args.thinking_mode
    if args.template:
        from dsa_runtime.parsers.jinja_template import render_chat_template

        if args.keep_thinking or args.continue_final_message:
            raise DSAError(
                "--keep-thinking and --continue-final-message apply to the V3.2 encoder, not --template"
            )
        if response_format is not None:
            raise DSAError("response_format is only supported by the V3.2 encoder, not --template")
        prompt = render_chat_template(
            _load_template(args.template),
            messages,
            tools=tools,
            add_generation_prompt=not args.no_generation_prompt,
            thinking=mode == "thinking",
            bos_token="" if args.no_bos else "<｜begin▁of▁sentence｜>",
        )
    else:
        from dsa_runtime.parsers.encoding_v32 import encode_messages

        prompt = encode_messages(
            messages,
            thinking_mode=mode or "thinking",
            drop_thinking=not args.keep_thinking,
            add_default_bos_token=not args.no_bos,
            tools=tools,
            response_format=response_format,
            add_generation_prompt=not args.no_generation_prompt,
            continue_final_message=args.continue_final_message,
        )
    _write(prompt)
    return 0


def _read_payload() -> Any:
    from dsa_runtime.errors import DSAError

    stream = sys.stdin
    try:
        # Read bytes where possible so the locale's encoding never garbles the special tokens.
        raw = stream.buffer.read().decode("utf-8") if hasattr(stream, "buffer") else stream.read()
    except UnicodeDecodeError as exc:
        raise DSAError(f"stdin is not UTF-8: {exc.reason} at byte {exc.start}") from None
    if not raw.strip():
        raise DSAError('no input: expected {"messages": [...]} JSON on stdin')
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DSAError(
            f"stdin is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None


def _split_payload(payload: Any) -> tuple[list[Any], Any, Any]:
    from dsa_runtime.errors import DSAError

    if isinstance(payload, list):
        return payload, None, None
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        raise DSAError('input must be {"messages": [...], "tools": [...]} or a list of messages')
    tools = payload.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise DSAError("'tools' must be a list")
    return payload["messages"], tools or None, payload.get("response_format")


def _load_template(spec: str) -> str:
    from dsa_runtime.errors import DSAError
    from dsa_runtime.parsers.jinja_template import BUILTIN_TEMPLATES, builtin_template, load_chat_template

    path = Path(spec)
    if path.is_dir():
        return load_chat_template(path)
    if path.is_file():
        if path.name == "tokenizer_config.json":
            return load_chat_template(path.parent)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DSAError(f"{path}: cannot read template: {exc}") from None
    if spec in BUILTIN_TEMPLATES:
        return builtin_template(spec)
    raise DSAError(
        f"{spec}: no such template file or checkpoint directory (built-in: {', '.join(BUILTIN_TEMPLATES)})"
    )


def _write(text: str) -> None:
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is None:
        out.write(text)
        out.flush()
        return
    out.flush()
    buffer.write(text.encode("utf-8"))
    buffer.flush()
