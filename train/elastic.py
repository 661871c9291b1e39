"""Elastic layouts: the layout a run trains under when it gets fewer workers than its config asks for.

    parallel = shrink_layout(cfg.parallel, world_size=1, global_batch_sequences=8, micro_batch_sequences=4)
    WorkerLayout(parallel=parallel, nodes=["9f3c...", ...])   # what train_run records per attempt

Only the data-parallel degree shrinks (tp x pp x cp stay: a model shard must still fit its ranks); the
global batch stays the same, so each remaining rank accumulates more micro-batches of the size the
configured layout used. A run's identity leaves out its layout (scalelab.train.identity),
so the smaller attempt continues the same run from its DCP checkpoint, which reshards on load.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from scalelab.errors import ConfigError
from scalelab.parallel.config import ParallelConfig


@dataclass(kw_only=True, slots=True)
class WorkerLayout:
    """How one attempt of a run is laid out: the layout it trains under and each rank's node."""

    parallel: ParallelConfig
    nodes: list[str] = field(default_factory=list)  # node id of rank 0, 1, ... (Ray runs)


def micro_sequences(parallel: ParallelConfig, global_batch_sequences: int, micro_batch_sequences: int) -> int:
    """Sequences per forward/backward: the configured micro-batch, else one rank's share under `parallel`."""
    return micro_batch_sequences or global_batch_sequences // parallel.dp_size


def min_world_size(parallel: ParallelConfig) -> int:
    """The fewest processes the layout can shrink to: one data-parallel replica."""
    return parallel.world_size // parallel.dp_size


def shrink_layout(
    parallel: ParallelConfig, world_size: int, *, global_batch_sequences: int, micro_batch_sequences: int
) -> ParallelConfig:
    """`parallel` with its dp degree cut to fit `world_size` processes, same global and micro batch.

    Raises:
        ConfigError: world_size is not a whole number of model replicas, or the batch does not split.
    """
    if world_size == parallel.world_size:
        return parallel
    per_replica = min_world_size(parallel)
    if world_size > parallel.world_size or world_size % per_replica:
        raise ConfigError(
            "parallel",
            f"{world_size} workers cannot run this layout (tp x pp x cp = {per_replica}, up to {parallel.world_size})",
            f"give the run a multiple of {per_replica} workers",
        )
    dp = world_size // per_replica
    micro = micro_sequences(parallel, global_batch_sequences, micro_batch_sequences)
    if global_batch_sequences % dp or (global_batch_sequences // dp) % micro:
        raise ConfigError(
            "parallel",
            f"dp={dp} does not split the {global_batch_sequences}-sequence batch into micro-batches of {micro}",
            "give the run a number of workers whose dp divides the global batch in whole micro-batches",
        )
    if dp % parallel.dp_shard == 0:  # HSDP: drop whole replicas, keep the shard groups
        shrunk = dataclasses.replace(parallel, dp_replicate=dp // parallel.dp_shard)
    else:
        shrunk = dataclasses.replace(parallel, dp_replicate=1, dp_shard=dp)
    if shrunk.ep > 1 and (shrunk.dp_shard * shrunk.cp) % shrunk.ep:
        raise ConfigError(
            "parallel.ep", f"ep={shrunk.ep} does not divide dp_shard x cp at dp={dp}", "lower parallel.ep"
        )
    return shrunk
