"""Chat messages -> prompt token ids, in the format of the served model family.

V3.2 uses the built-in V3.2 encoder (the model ships no Jinja template); V3.2-Exp, V3.1, V3 and R1 use the
checkpoint's ``chat_template`` when it has one, else our fallback template for the family.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dsa_runtime.errors import DSAError
from dsa_runtime.server.config import ModelFlavor
from dsa_runtime.server.errors import bad_request, context_exceeded


def _text_of(content: Any, where: str) -> Any:
    """OpenAI content parts (``[{"type": "text", "text": ...}]``) joined into one string."""
    if not isinstance(content, list):
        return content
    pieces = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}: only text content parts are supported", param="messages")
        pieces.append(part["text"])
    return "".join(pieces)


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain-text contents, ``reasoning`` accepted for ``reasoning_content``; shapes checked."""
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if not isinstance(role, str):
            raise bad_request(f"{where}: 'role' must be a string", param=f"messages.{i}.role")
        m = dict(message)
        if "content" in m:
            m["content"] = _text_of(m["content"], where)
        if m.get("reasoning_content") is None and isinstance(m.get("reasoning"), str):
            m["reasoning_content"] = m["reasoning"]
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise bad_request(f"{where}: 'tool_calls' must be a list", param=f"messages.{i}.tool_calls")
        out.append(m)
    return out


class PromptBuilder:
    """Renders and tokenizes chat prompts for one model flavor.

    Args:
        flavor: the model family (encoder name: ``deepseekv32`` or a built-in template name).
        tokenizer: ``encode(text, add_special_tokens=False) -> list[int]``.
        model_dir: checkpoint directory whose ``chat_template`` wins over the built-in template.
    """

    def __init__(self, flavor: ModelFlavor, tokenizer: Any, model_dir: str | None = None) -> None:
        self.flavor = flavor
        self.tokenizer = tokenizer
        self._template: str | None = None
        if flavor.encoder != "deepseekv32":
            from dsa_runtime.parsers.jinja_template import builtin_template, load_chat_template

            try:
                self._template = (
                    load_chat_template(model_dir, fallback=flavor.encoder)
                    if model_dir
                    else builtin_template(flavor.encoder)
                )
            except DSAError:
                self._template = builtin_template(flavor.encoder)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        thinking: bool,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text; an encoding problem in the messages is a 400 naming the message."""
        msgs = normalize_messages(messages)
        try:
            if self._template is None:
                from dsa_runtime.parsers.encoding_v32 import encode_messages

                continue_final = bool(msgs and msgs[-1].get("role") == "assistant" and msgs[-1].get("prefix"))
                return encode_messages(
                    msgs,
                    "thinking" if thinking else "chat",
                    tools=tools or None,
                    add_generation_prompt=add_generation_prompt and not continue_final,
                    continue_final_message=continue_final,
                )
            from dsa_runtime.parsers.jinja_template import render_chat_template

            return render_chat_template(
                self._template, msgs, tools=tools or None, add_generation_prompt=add_generation_prompt,
                thinking=thinking,
            )
        except DSAError as exc:
            raise bad_request(str(exc), param="messages") from None

    def encode(self, text: str, *, max_len: int | None = None, param: str = "messages") -> list[int]:
        """Token ids of ``text`` (no BOS), with the GIL released while a Hugging Face tokenizer works.

        With ``max_len``, a text of ``max_len`` tokens or more (no room left for output) is the context-length
        400 naming ``param``, raised before the ids become a Python list: for a multi-MB prompt that list
        alone holds the GIL for tens of milliseconds.
        """
        encoding = _encode_without_gil(self.tokenizer, text)
        if encoding is None:  # not a Hugging Face tokenizer (the tests' scripted one)
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            _check_fits(len(ids), max_len, param)
            return ids
        _check_fits(len(encoding), max_len, param)
        return encoding.ids


def _encode_without_gil(tokenizer: Any, text: str) -> Any:
    """The ``tokenizers.Encoding`` of ``text`` (no special tokens added), or None without such a backend.

    ``tokenizers``' ``encode`` holds the GIL for the whole encoding (6 s for 7 MB), which stalls every thread,
    the event loop included, even when called off the loop; ``encode_batch_fast`` releases it and skips only
    the offsets, so the ids are the same as :meth:`dsa_runtime.loader.tokenizer.Tokenizer.encode`'s.
    """
    encode_batch = getattr(getattr(tokenizer, "backend", None), "encode_batch_fast", None)
    if encode_batch is None:
        return None
    return encode_batch([text], add_special_tokens=False)[0]


def _check_fits(count: int, max_len: int | None, param: str) -> None:
    if max_len is not None and count >= max_len:
        raise context_exceeded(max_len, count, param)
