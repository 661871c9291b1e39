"""Parallel layouts applied from outside the model: ParallelDims, parallelize, pipelines, CP, EP.

Dense models (one file per piece):
    config.py         ParallelConfig, the `parallel:` section of a run config
    dims.py           ParallelDims: the arithmetic vs world size and model shape, the named DeviceMesh
    parallelize.py    parallelize(model, dims, cfg, mesh): PP split → TP/SP → AC → compile → FSDP2
    tp.py             tensor + sequence + loss parallel DTensor plans
    checkpointing.py  activation checkpointing (none | full | selective)
    data_parallel.py  FSDP2 fully_shard: ZeRO-3, ZeRO-2, HSDP, DDP; mixed-precision policy
    pipeline.py       stages balanced by FLOPs, GPipe / 1F1B / interleaved 1F1B / ZB-V schedules
    step.py           forward_backward / eval loss / global grad-norm clipping under a layout
    apply.py          apply_parallelism(model, cfg, runtime): the training loop's hook
    launch.py         launch_local (`scalelab run`), spawn, torchrun, ray_train_fn (Ray Train)
    backend.py        process-group setup and the gloo notes
    memory.py         per-rank bytes of params, grads and optimizer state (exact)
    parity.py         layout parity against one device (`scalelab parity` and the tests)
MoE and long context: expert_parallel.py, context_parallel.py, ep_cp_hooks.py (how parallelize applies
them), ep_parity.py / cp_parity.py / moe_cp_parity.py (their parity); the layout planner: planner*.py.
"""
