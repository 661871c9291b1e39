"""Parallel layouts applied from outside the model: ParallelDims, parallelize, pipelines, CP, EP.

Dense models (one file per piece):
    config.py         ParallelConfig, the `parallel:` section of a run config (the one layout description)
    dims.py           ParallelDims: the arithmetic vs world size and model shape, the named meshes
    parallelize.py    parallelize(model, dims, parallel_cfg, *, seq_len, z_loss): PP split → TP/SP →
                      CP/EP → AC → compile → FSDP2, one device included; returns a typed Parallelized
    tp.py             tensor + sequence + loss parallel DTensor plans
    activation_checkpointing.py  activation checkpointing (none | full | selective)
    data_parallel.py  FSDP2 fully_shard: ZeRO-3, ZeRO-2, HSDP, DDP; mixed-precision policy
    compression.py    gradient compression (bf16, PowerSGD) of the dp reductions via torch's DDP comm hooks
    pipeline_parallel.py  stages balanced by FLOPs, GPipe / 1F1B / interleaved 1F1B / ZB-V schedules
    step.py           forward_backward / eval loss / global grad-norm clipping / router row under a layout
    backend.py        spawning a local process group, process-group setup, the gloo notes
    memory.py         per-rank bytes of params, grads and optimizer state (exact)
    layouts.py        the layout-name grammar (`fsdp2xtp2sp`, `ep2xtp2`, `cp2-ring`) <-> ParallelConfig
    parity.py         dense, CP and EP layouts against one device (`scalelab parity` and the tests)
MoE and long context: expert_parallel.py, context_parallel.py; the layout planner (it takes a
ParallelConfig plus sequences per micro-batch): planner.py, planner_memory.py (checked against the
bytes autograd saves by experiments/planner_validate.py); its constants per GPU type: hardware.py;
checked against published cluster runs: planner_published.py.
Launching a training run (local processes, torchrun, Ray Train) lives in scalelab.train.launch.
"""
