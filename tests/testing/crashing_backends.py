"""Backends that crash, for the kit's crash isolation: importable, so an isolated worker can rebuild them."""

from __future__ import annotations

import os
import signal

from dsa_runtime.reference.topk import ReferenceTopK
from tests.testing.wrong_backends import make_backend

SEGFAULT_K = 1  # topk/topk/r8/l256/k1/ragged/randn
RAISE_K = 20  # the two ties cases with k = 20


class TopKSegfaults(ReferenceTopK):
    """Dies by SIGSEGV when asked for k = 1 (as a kernel with an out-of-bounds store would); raises for k = 20."""

    def topk(self, logits, row_starts, row_ends, k):
        if k == SEGFAULT_K:
            os.kill(os.getpid(), signal.SIGSEGV)
        if k == RAISE_K:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        return super().topk(logits, row_starts, row_ends, k)


class TopKInterrupted(ReferenceTopK):
    """Acts as if the user pressed Ctrl-C while the k = 20 case runs."""

    def topk(self, logits, row_starts, row_ends, k):
        if k == RAISE_K:
            raise KeyboardInterrupt
        return super().topk(logits, row_starts, row_ends, k)


def make_crashing():
    """Factory reference for the isolated worker: ``tests.testing.crashing_backends:make_crashing``."""
    return make_backend("crashing", {"topk": TopKSegfaults}, families=("topk",))


class TopKHangs(ReferenceTopK):
    """Never returns (a kernel stuck in a spin loop)."""

    def topk(self, logits, row_starts, row_ends, k):
        import time

        time.sleep(600)
        return super().topk(logits, row_starts, row_ends, k)


def make_hanging():
    return make_backend("hanging", {"topk": TopKHangs}, families=("topk",))


class TopKLosesContext(ReferenceTopK):
    """At k = 20, raises as after a device-side assert and leaves the (simulated) device unusable: every later
    liveness probe in this process fails, as a CUDA context does after an illegal memory access."""

    def topk(self, logits, row_starts, row_ends, k):
        if k == RAISE_K:
            from dsa_runtime.testing import runner

            runner._device_alive = lambda dev: False
            raise RuntimeError("CUDA error: device-side assert triggered (simulated)")
        return super().topk(logits, row_starts, row_ends, k)


def make_losing_context():
    return make_backend("losing", {"topk": TopKLosesContext}, families=("topk",))


def make_fails_in_worker():
    """Builds in the parent, raises in a worker process (as a backend whose library fails to load there)."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        raise ImportError("libvendor.so: cannot open shared object file")
    return make_backend("fails_in_worker", {}, families=("topk",))
