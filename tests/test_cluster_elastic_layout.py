"""The layouts an elastic run shrinks to (scalelab.train.elastic) and the watchdog's limit; no Ray.

The end-to-end behaviour (a node lost, the run continuing at dp=1) is in test_cluster_multinode_s3.py.
"""

import pytest

from scalelab.errors import ConfigError
from scalelab.parallel.config import ParallelConfig
from scalelab.train.elastic import micro_sequences, min_world_size, shrink_layout
from scalelab.train.watchdog import HangPolicy


def test_dp_shrinks_and_the_micro_batch_stays():
    fsdp4 = ParallelConfig(dp_shard=4)
    got = shrink_layout(fsdp4, 2, global_batch_sequences=16, micro_batch_sequences=0)
    assert (got.dp_replicate, got.dp_shard) == (1, 2)
    # the configured layout's micro-batch (16 / 4 = 4 sequences) is what each remaining rank repeats
    assert micro_sequences(fsdp4, 16, 0) == 4 and micro_sequences(got, 16, 0) == 8
    assert shrink_layout(fsdp4, 4, global_batch_sequences=16, micro_batch_sequences=0) is fsdp4


def test_hsdp_drops_whole_replicas_and_tp_stays():
    hsdp = ParallelConfig(dp_replicate=2, dp_shard=2, tp=2)
    assert min_world_size(hsdp) == 2
    got = shrink_layout(hsdp, 4, global_batch_sequences=8, micro_batch_sequences=0)
    assert (got.dp_replicate, got.dp_shard, got.tp) == (1, 2, 2)


@pytest.mark.parametrize(
    "world, why",
    [(3, "multiple of 2"), (10, "up to 8"), (6, "does not split")],
)
def test_worlds_that_cannot_run_the_layout_are_refused(world, why):
    layout = ParallelConfig(dp_shard=4, tp=2)
    with pytest.raises(ConfigError, match=why):
        shrink_layout(layout, world, global_batch_sequences=8, micro_batch_sequences=0)


def test_hang_limit_is_a_multiple_of_the_median_with_a_floor():
    policy = HangPolicy(factor=10.0, min_s=3.0)
    assert policy.limit_s(0.01) == 3.0 and policy.limit_s(1.0) == 10.0
