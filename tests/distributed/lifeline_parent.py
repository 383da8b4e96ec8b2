"""A parent for test_worker_lifeline: starts a worker-like child on the lifeline, prints its pid, then waits to
be killed."""

from __future__ import annotations

import sys
import time


def child(lifeline) -> None:
    import threading

    from dsa_runtime.distributed.worker import _watch_parent

    threading.Thread(target=_watch_parent, args=(lifeline,), daemon=True).start()
    time.sleep(600)


if __name__ == "__main__":
    from dsa_runtime.processes import context, start

    ctx = context()
    watched, lifeline = ctx.Pipe(duplex=False)
    proc = start(child, watched, ctx=ctx)
    watched.close()
    print(proc.pid, flush=True)
    time.sleep(600)
    sys.exit(1)
