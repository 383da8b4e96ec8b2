"""What an engine runs on: the runner, tokenizer, page allocator and what the model and build decided."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsa_runtime.model.step import Runner


@dataclass
class EngineParts:
    """What an engine runs on; :func:`dsa_runtime.engine.build.build_parts` makes them from a config.

    ``runner``: a :class:`~dsa_runtime.model.step.Runner`; ``tokenizer.decode(ids, skip_special_tokens)``;
    ``allocator``: ``num_free``, ``alloc(n)``, ``free(pages)``, ``num_used``. ``max_model_len`` is capped by the
    cache capacity here, so the config need not know it.
    """

    runner: Runner
    tokenizer: Any
    allocator: Any
    page_size: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: frozenset[int] = frozenset()
    model_config: Any = None
    model_path: str | None = None  # the checkpoint folder (chat template, served name); None without one
    kernels: Any = None  # the ResolvedKernels the runner uses (the start-up log); None for a stand-in runner
    ep_load: Any = None  # --ep-size: the EPLoad counters read by stats(); None otherwise


def eos_token_ids(model_config: Any, tokenizer: Any, extra: set[int] | None = None) -> frozenset[int]:
    """:attr:`EngineParts.eos_token_ids`: the config's ``eos_token_id``, the tokenizer's ``eos_id`` (no tokenizer:
    None) and ``extra`` (``generation_config.json``'s), the unset ones left out."""
    ids = {model_config.eos_token_id, tokenizer.eos_id if tokenizer is not None else None} | (extra or set())
    return frozenset(i for i in ids if i is not None)
