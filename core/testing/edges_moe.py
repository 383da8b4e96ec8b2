"""MoE routing edges that single-change mutants slipped through.

* ``underflow``: router logits near ``-200``, so every ``sigmoid`` is exactly 0 in fp32 and the choice is
  made by the correction bias alone; renormalising divides 0 by 0, and the contract says the weights are 0
  (never NaN);
* ``norenorm/s2.5``: no renormalisation, with a scaling factor other than 1 (which must still be applied);
* ``near_tie_bf16``: two experts with equal logits whose correction biases differ by 1e-4, below bf16's
  resolution at 0.09: in fp32 the higher-index expert wins; a kernel that rounds the bias to bf16 sees a
  tie and picks the lower index.
"""

from __future__ import annotations

import dataclasses

import torch

from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, Inputs
from dsa_runtime.testing.cases_moe import _route_case

_BETA = 0.09375  # 3 * 2**-5: exact in bf16, whose spacing there is 2**-11 (4.9e-4)
_DELTA = 1e-4  # below half that spacing: bf16(_BETA + _DELTA) == _BETA


def _rebuild(base: Case, variant: str, build, what: str) -> Case:
    head = base.id.rsplit("/", 1)[0]
    return dataclasses.replace(base, id=f"{head}/{variant}", build=build, description=f"{base.description}; {what}")


def _underflow(gen: torch.Generator, dev: torch.device, tokens: int, n_exp: int) -> Inputs:
    logits = -200.0 + data.randn(gen, (tokens, n_exp), dev)
    return {"logits": logits, "bias": data.uniform(gen, (n_exp,), dev, -0.3, 0.3)}


def _near_tie(gen: torch.Generator, dev: torch.device, tokens: int, n_exp: int) -> Inputs:
    """Experts 0-2 far ahead, experts 4 and 5 tied in logit just behind them, the rest far behind: the
    4th choice (top_k = 4) is 5 in fp32 (bias larger by 1e-4), 4 after rounding the bias to bf16."""
    logits = -6.0 + data.randn(gen, (tokens, n_exp), dev) * 0.1
    logits[:, :3] = 6.0 + data.randn(gen, (tokens, 3), dev) * 0.1
    tie = data.randn(gen, (tokens,), dev) * 0.5
    logits[:, 4], logits[:, 5] = tie, tie
    bias = torch.zeros(n_exp, device=dev)
    bias[4], bias[5] = _BETA, _BETA + _DELTA
    return {"logits": logits.contiguous(), "bias": bias}


def cases() -> list[Case]:
    return [
        _rebuild(_route_case(7, 64, 8, 4, 8, True, 2.5, "random", "quick"), "underflow",
                 lambda g, d: _underflow(g, d, 7, 64), "every sigmoid underflows to 0"),
        _rebuild(_route_case(5, 16, 1, 1, 4, False, 2.5, "random", "quick"), "underflow",
                 lambda g, d: _underflow(g, d, 5, 16), "every sigmoid underflows to 0"),
        _route_case(9, 64, 8, 4, 8, False, 2.5, "random", "quick"),
        _rebuild(_route_case(6, 16, 1, 1, 4, True, 2.5, "random", "quick"), "near_tie_bf16",
                 lambda g, d: _near_tie(g, d, 6, 16), "bias difference below bf16 precision decides"),
    ]
