"""The embedded default model and the random tiny-v32 model.

:func:`default_model_path` is the trained ``tiny-chat`` checkpoint shipped inside the package
(``dsa_runtime/loader/data/tiny-chat``, FP8, ~14 MB; ``docs/tiny-model.md``): it answers, thinks and calls
tools. :func:`random_model_path` is the tiny-v32 preset (seed 0) with random weights, created on first use
in the user cache folder (tests and kernel work that need a model but no sensible text).

Location: ``$XDG_CACHE_HOME/dsa-runtime/tiny-v32-<hash>`` (``~/.cache`` when unset), where the hash covers
everything the files depend on (package and ``tokenizers`` versions, the preset, the corpus, the generator
format), so an upgrade makes a fresh copy instead of reusing stale files. Creation prints one line on stderr.
Concurrent first use is safe: writers serialize on a lock file where ``fcntl`` exists, and the checkpoint
appears under its final name only through one atomic rename in any case.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from dsa_runtime.loader.presets import DEFAULT_PRESET, preset_config

# Bump when the generator's output for the same inputs changes (tensor order, init scales, file layout).
GENERATOR_FORMAT = 1
DEFAULT_SEED = 0


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/dsa-runtime`` or ``~/.cache/dsa-runtime``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "dsa-runtime"


def version_hash() -> str:
    """12 hex digits identifying the default model's exact bytes."""
    import tokenizers

    from dsa_runtime import __version__
    from dsa_runtime.loader.tokenizer_train import corpus_text

    key = json.dumps(
        {
            "dsa_runtime": __version__,
            "tokenizers": tokenizers.__version__,
            "format": GENERATOR_FORMAT,
            "seed": DEFAULT_SEED,
            "config": preset_config(DEFAULT_PRESET),
            "corpus": hashlib.sha256(corpus_text().encode("utf-8")).hexdigest(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the atomic rename alone keeps the result consistent
        yield
        return
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _complete(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors.index.json").is_file()


EMBEDDED_MODEL = "tiny-chat"


def embedded_model_path() -> Path:
    """Folder of the trained checkpoint shipped with the package (``LoadError`` if it is missing)."""
    from importlib import resources

    from dsa_runtime.loader.errors import LoadError

    path = Path(str(resources.files("dsa_runtime.loader").joinpath("data", EMBEDDED_MODEL)))
    if not _complete(path):
        raise LoadError(f"{path}: the embedded {EMBEDDED_MODEL} checkpoint is missing from this installation")
    return path


def default_model_path() -> Path:
    """The checkpoint ``generate`` / ``serve`` / ``LLM()`` use without ``--model``: the embedded trained model."""
    return embedded_model_path()


def random_model_path() -> Path:
    """Path of the random tiny-v32 checkpoint, generating it (a few seconds, ~8 MB) the first time."""
    from dsa_runtime.loader.make_checkpoint import make_checkpoint

    root = cache_root()
    target = root / f"{DEFAULT_PRESET}-{version_hash()}"
    if _complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{target.name}.lock"):
        if _complete(target):  # another process made it while we waited
            return target
        print(
            f"dsa-runtime: creating the random test model ({DEFAULT_PRESET}, random weights) in {target}",
            file=sys.stderr,
        )
        try:
            make_checkpoint(target, DEFAULT_PRESET, seed=DEFAULT_SEED)
        except OSError:
            # Without flock another process may have renamed its copy into place first: use it.
            if not _complete(target):
                raise
    return target
