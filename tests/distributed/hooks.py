"""Functions the TP tests run on every rank (``RankSpec.setup`` / ``hooks``, ``DistributedRunner.collect``)."""

from __future__ import annotations

import hashlib

import torch


def register_only64() -> None:
    """Add the 64-heads-only test backend to this process's plugin manager."""
    from dsa_runtime.plugin_manager import get_manager
    from tests.core.fake_plugins import plugin_registering
    from tests.model.test_head_padding import only64_backend

    manager = get_manager()
    if "only64" not in manager.backends:
        manager.add_plugin(plugin_registering(only64_backend()), "fakes")
        manager.collect()


def record_topk(runner) -> None:
    """Wrap the resolved top-k methods so every selected index tensor is kept (in call order)."""
    runner.topk_log = []
    view = runner.kernels.topk
    for name in ("topk", "topk_transform"):
        fn = getattr(view, name)

        def wrapped(*args, _fn=fn, **kwargs):
            out = _fn(*args, **kwargs)
            runner.topk_log.append(out.detach().cpu().clone())
            return out

        setattr(view, name, wrapped)


def topk_digest(runner) -> tuple[int, str]:
    """(number of top-k calls, sha256 of all their indices) on this rank."""
    h = hashlib.sha256()
    for t in runner.topk_log:
        h.update(t.to(torch.int64).numpy().tobytes())
    return len(runner.topk_log), h.hexdigest()


def bytes_loaded(runner) -> int:
    return int(runner.bytes_loaded)


def sparse_reasons(runner) -> str:
    return runner.kernels.choices["sparse_attn.prefill"].reason + " | " + runner.kernels.choices["sparse_attn.decode"].reason


def count_ep_calls(runner) -> None:
    """Count this rank's world all-reduces and expert-parallel MoE layer calls from now on."""
    tp = runner.tp
    runner.ep_counts = {"world_reduces": 0, "ep_moe": 0}
    reduce = tp.all_reduce_world

    def counted_reduce(x):
        runner.ep_counts["world_reduces"] += 1
        return reduce(x)

    tp.all_reduce_world = counted_reduce
    for layer in runner.model.layers:
        if layer.ffn.ep is not None:
            forward = layer.ffn.forward_ep

            def counted(*args, _fn=forward, **kwargs):
                runner.ep_counts["ep_moe"] += 1
                return _fn(*args, **kwargs)

            layer.ffn.forward_ep = counted


def ep_report(runner) -> dict:
    """This rank's expert placement and the counts of :func:`count_ep_calls`."""
    moe = [layer.ffn for layer in runner.model.layers if layer.ffn.ep is not None]
    return {"experts": [m.experts.w13.shape[0] for m in moe], "ep_rank": moe[0].ep.rank if moe else None,
            "backend": runner.kernels.backend_of("moe_comm.dispatch"), **runner.ep_counts}
