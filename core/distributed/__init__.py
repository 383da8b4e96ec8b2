"""Tensor parallelism and partial DP attention, with ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Files: ``parallel.py`` (ParallelConfig: tp / dp / dp attention / nodes, and each rank's place), ``sharding.py``
(the one table of how every weight is split, and the slicing both loaders use), ``load.py`` (each rank reads
only its slice from the safetensors shards), ``comm.py`` (process groups and the collectives the model calls,
with timeouts), ``dp.py`` (which attention group serves which sequence, and the token gather / scatter around
the FFN), ``runtime.py`` (worker processes in lockstep behind the ModelRunner interface, the watchdog).
See ``docs/distributed.md``.
"""

from dsa_runtime.distributed.parallel import ParallelConfig, RankInfo

__all__ = ["ParallelConfig", "RankInfo"]
