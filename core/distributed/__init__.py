"""Tensor parallelism and partial DP attention, with ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Files: ``parallel.py`` (ParallelConfig: tp / dp / dp attention / nodes, and each rank's place), ``sharding.py``
(the one table of how every weight is split, and the slicing both loaders use), ``load.py`` (each rank reads
only its slice from the safetensors shards), ``comm.py`` (process groups and the collectives the model calls,
with timeouts), ``dp.py`` (which attention group serves which sequence, and the token gather / scatter around
the FFN), ``runtime.py`` (rank 0's driver of the worker processes in lockstep, behind the Runner protocol, and
the watchdog), ``worker.py`` (what every rank runs: its build, its message loop), ``wire.py`` (a step as int64
tensors), ``engine_build.py`` (the engine's entry). See ``docs/distributed.md``.
"""

from dsa_runtime.distributed.parallel import ParallelConfig, RankInfo

__all__ = ["ParallelConfig", "RankInfo"]
