"""A run's model under a parallel layout on this process, shared by training and parallel evaluation.

Built on the meta device and sharded first; then only this rank's shards are allocated and
initialised (the same values as the single-device init), so no rank ever holds the whole model.
"""

from __future__ import annotations

from scalelab.errors import ConfigError
from scalelab.models.llama import build_model
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.parallelize import Parallelized, parallelize
from scalelab.train.config import RunConfig
from scalelab.train.runtime import Runtime


def parallel_model(
    cfg: RunConfig, runtime: Runtime, layout: ParallelConfig, *, seed: int | None, z_loss: float
) -> Parallelized:
    """cfg's model under `layout` (cfg.parallel, or a smaller elastic one) on this process.

    `seed` initialises the shards as the single-device model would; None allocates them only, for
    a checkpoint to overwrite. The layout was validated against the model and the batch with the
    config (build_run_config); here only the process count is checked.
    """
    dims = ParallelDims.from_config(layout)
    if dims.world_size != runtime.world_size:
        raise ConfigError(
            "parallel",
            f"the layout needs {dims.world_size} processes but this job has {runtime.world_size}",
            f"start {dims.world_size} processes (torchrun --nproc_per_node={dims.world_size}) or change the layout",
        )
    par = parallelize(
        build_model(cfg.model, device="meta"),
        dims,
        layout,
        seq_len=cfg.data.seq_len,
        z_loss=z_loss,
        device=runtime.device,
    )
    par.materialize(seed)
    return par
