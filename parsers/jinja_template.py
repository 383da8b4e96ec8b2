"""Render Hugging Face style Jinja chat templates in a sandbox (V3 / V3.1 / R1 checkpoints ship one).

DeepSeek-V3.2 ships no Jinja template (use :mod:`dsa_runtime.parsers.encoding_v32`). For the older models
the checkpoint's own ``chat_template`` is authoritative; ``templates/deepseek_v3.jinja`` and
``templates/deepseek_v31.jinja`` are our fallbacks, written from the published V3 / V3.1 chat formats (the
formats :mod:`dsa_runtime.parsers.v31` parses).

Templates come from checkpoints, i.e. from strangers: they run in Jinja's immutable sandbox, and any access
to an unsafe attribute (``''.__class__`` and the like) raises :class:`ChatTemplateError` instead of quietly
rendering an empty string, so an escape attempt is visible.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import jinja2
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dsa_runtime.errors import DSAError

__all__ = [
    "BUILTIN_TEMPLATES",
    "ChatTemplateError",
    "builtin_template",
    "load_chat_template",
    "render_chat_template",
]

BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"

# Name -> file under parsers/templates (shipped as package data).
BUILTIN_TEMPLATES: dict[str, str] = {
    "deepseek_v3": "deepseek_v3.jinja",
    "deepseek_v31": "deepseek_v31.jinja",
}


class ChatTemplateError(DSAError):
    """A chat template that is missing, does not compile, raised, or tried to leave the sandbox."""


class _TemplateRaised(TemplateError):
    """``raise_exception(...)`` called by the template itself (its message is for the user)."""


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Immutable sandbox whose unsafe attribute access raises instead of yielding ``Undefined``."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:  # type: ignore[override]
        raise SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is not allowed"
        )


def _raise_exception(message: str) -> NoReturn:
    raise _TemplateRaised(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes and writes \\uXXXX; chat templates want plain JSON with the text kept.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> _StrictSandbox:
    # trim_blocks/lstrip_blocks and loopcontrols match what transformers' apply_chat_template uses, so
    # checkpoint templates render here as they do there.
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from None


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    thinking: bool = False,
    bos_token: str = BOS_TOKEN,
    eos_token: str = EOS_TOKEN,
    **extra: Any,
) -> str:
    """Render ``messages`` through a Jinja chat template (the text of the template, not a path).

    ``extra`` is passed to the template as further variables (``chat_template_kwargs``); an
    ``enable_thinking=True`` there also turns ``thinking`` on, as vLLM accepts either name.

    Raises:
        ChatTemplateError: syntax error, ``raise_exception`` from the template, an undefined value used
            in a way that fails, or an attempt to reach Python internals.
    """
    if not isinstance(template, str) or not template:
        raise ChatTemplateError("chat template must be a non-empty string")
    compiled = _compile(template)
    variables = dict(extra)
    variables.update(
        messages=list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        thinking=bool(thinking or extra.get("enable_thinking") is True),
        bos_token=bos_token,
        eos_token=eos_token,
    )
    try:
        return compiled.render(**variables)
    except _TemplateRaised as exc:
        raise ChatTemplateError(f"chat template raised an error: {exc.message}") from None
    except SecurityError as exc:
        raise ChatTemplateError(f"chat template blocked by the sandbox: {exc}") from None
    except UndefinedError as exc:
        raise ChatTemplateError(f"chat template used an undefined value: {exc.message}") from None
    except TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None


def builtin_template(name: str) -> str:
    """Text of a shipped fallback template (``deepseek_v3`` or ``deepseek_v31``)."""
    filename = BUILTIN_TEMPLATES.get(name)
    if filename is None:
        raise ChatTemplateError(
            f"no built-in chat template {name!r} (have: {', '.join(sorted(BUILTIN_TEMPLATES))})"
        )
    return resources.files("dsa_runtime.parsers").joinpath("templates", filename).read_text(encoding="utf-8")


def load_chat_template(checkpoint_dir: str | Path, *, fallback: str | None = None) -> str:
    """The chat template of a checkpoint directory.

    Looks at ``chat_template.jinja`` (newer transformers save it separately), then ``tokenizer_config.json``'s
    ``chat_template``: a string, or a list of ``{"name", "template"}`` from which ``default`` is used.
    When there is none, returns the built-in template named by ``fallback`` or raises.
    """
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise ChatTemplateError(f"{directory}: not a checkpoint directory")
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    config_path = directory / "tokenizer_config.json"
    template: Any = None
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ChatTemplateError(f"{config_path}: cannot read: {exc}") from None
        template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            names = ", ".join(str(n) for n in named)
            raise ChatTemplateError(f"{config_path}: chat_template has no 'default' entry (has: {names})")
        template = named["default"]
    if isinstance(template, str) and template:
        return template
    if fallback is not None:
        return builtin_template(fallback)
    raise ChatTemplateError(
        f"{directory}: no chat template (neither chat_template.jinja nor a 'chat_template' in "
        "tokenizer_config.json); DeepSeek-V3.2 ships none: use the built-in V3.2 encoder, or pass a template"
    )
