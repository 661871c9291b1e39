"""Layout planner: rank parallel layouts by estimated step time under a per-GPU memory limit.

    hw = Hardware(gpu_memory_bytes=80 * 2**30)
    plans = plan_layouts(get_preset("70b"), num_gpus=64, seq_len=8192, global_batch_tokens=2**24, hw=hw)
    plans[0].name, plans[0].parallel, plans[0].step_time_s, plans[0].memory, plans[0].comm_bytes
    consts = calibrate(measurements, consts)          # refit constants from real runs

A candidate is a ParallelConfig (the run config's `parallel:` section) plus the sequences per
micro-batch (train.micro_batch_sequences); its name is the layout grammar's
(scalelab.parallel.layouts) with " mbsN". Searched: dp_replicate × dp_shard × tp × pp × cp =
num_gpus (tp within a node and dividing heads, kv-heads, d_ff and vocab; pp ≤ layers; cp dividing
seq_len/2), ep (MoE: dividing num_experts and dp_shard×cp), sequences per micro-batch, activation
checkpointing none | selective | full.

Memory per GPU (bytes): params/grads/optimizer exact (`planner_memory.state_bytes`, fp32 state
under FSDP2's bf16 compute); activations from the validated formula (`activation_bytes`, bf16
activations, the fused-kernel variant on GPU) × `activation_scale`; buffers = FSDP's gathered bf16
parameters of two blocks (current + prefetch) and one block's fp32 unsharded gradients, the
recompute peak of a checkpointed block, and a fixed `overhead_bytes` (CUDA context, allocator,
NCCL). A layout fits when the total ≤ gpu_memory_bytes.

Step time: compute = exact causal training FLOPs (+ one forward of the matmuls under full AC,
+2% under selective) / (peak × mfu), × (1 + pipeline bubble (pp-1)/(micro-batches × v), v = model
chunks per rank: 2 for interleaved 1F1B and zero-bubble V, else 1); plus the exposed part of each
axis's communication (`planner_time`): every collective an alpha-beta cost (NCCL's latency per
collective and per ring step, bytes over the link's bandwidth × comm_efficiency; intra-node when the
group fits in a node, axes laid out tp innermost, then cp, dp_shard, dp_replicate, pp), counted per
block, unit and micro-batch as the layout issues them; FSDP's prefetched gathers and
reduce-scatters and DDP/HSDP's per-unit all-reduces hide behind at most `fsdp_overlap` × one unit's
compute, the first and last exposed; TP, CP, EP and PP collectives are exposed. The replicate
all-reduce is shrunk by `parallel.grad_compression` (`grad_compression_fraction`).
Every number is an estimate from these constants; `calibrate` refits them from measured runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import polars as pl
from scipy.optimize import least_squares

from scalelab.errors import ConfigError
from scalelab.models.accounting import FlopsPerToken, flops_per_token
from scalelab.models.config import ModelConfig
from scalelab.parallel.config import AC_MODES, ParallelConfig
from scalelab.parallel.dims import ParallelDims, stages_per_rank
from scalelab.parallel.layouts import layout_name
from scalelab.parallel.planner_constants import GIB, CostConstants, Hardware
from scalelab.parallel.planner_memory import (
    activation_bytes,
    config_from_key,
    config_key,
    layer_param_count,
    local_shape,
    param_shapes,
    state_bytes,
)
from scalelab.parallel.planner_time import step_communication


def candidate_name(pcfg: ParallelConfig, micro_batch_sequences: int) -> str:
    """e.g. 'fsdp8xtp2sp+ac mbs1': the layout's name and the sequences per micro-batch."""
    return f"{layout_name(pcfg)} mbs{micro_batch_sequences}"


@dataclass(kw_only=True, slots=True)
class Plan:
    parallel: ParallelConfig
    micro_batch_sequences: int  # sequences per forward/backward on one data-parallel rank
    fits: bool
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # model FLOPs (exact causal) / (peak × step time)
    memory: dict[str, float]  # params, grads, optimizer, activations, buffers, total (bytes per GPU)
    comm_bytes: dict[str, float]  # per GPU per step, by axis
    time_parts: dict[str, float]  # compute, bubble, exposed communication (seconds)

    @property
    def name(self) -> str:
        return candidate_name(self.parallel, self.micro_batch_sequences)

    def as_row(self) -> dict:
        row = {"layout": self.name, **asdict(self.parallel), "micro_batch_sequences": self.micro_batch_sequences}
        row["fits"] = self.fits
        row |= {"step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu}
        row |= {f"mem_{k}_gib": v / GIB for k, v in self.memory.items()}
        row |= {f"comm_{k}_gib": v / GIB for k, v in self.comm_bytes.items()}
        return row


@lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def candidate_layouts(
    cfg, num_gpus: int, seq_len: int, global_batch_sequences: int, hw: Hardware
) -> list[tuple[ParallelConfig, int]]:
    """Every (layout, sequences per micro-batch) the shape rules allow (see the module docstring)."""
    return [(lay, mbs) for lay, mbs in _shaped_layouts(cfg, num_gpus, seq_len, global_batch_sequences, hw)
            if _buildable(lay, cfg)]  # fmt: skip


def _shaped_layouts(
    cfg, num_gpus: int, seq_len: int, global_batch_sequences: int, hw: Hardware
) -> Iterator[tuple[ParallelConfig, int]]:
    """candidate_layouts before the check that `parallelize` builds them, in the same order."""
    tp_ok = [
        t
        for t in _divisors(num_gpus)
        if t <= hw.gpus_per_node
        and all(getattr(cfg, k) % t == 0 for k in ("num_heads", "num_kv_heads", "d_model", "vocab_size"))
        and (cfg.d_ff % t == 0 if cfg.family != "moe" else cfg.expert_d_ff % t == 0)
        and (t == 1 or not cfg.tied_embeddings)
    ]
    for tp in tp_ok:
        for pp in _divisors(num_gpus // tp):
            if pp > cfg.num_layers or (pp > 1 and cfg.tied_embeddings):
                continue
            for cp in _divisors(num_gpus // (tp * pp)):
                if seq_len % (2 * cp) or cp > 16:
                    continue
                dp = num_gpus // (tp * pp * cp)
                if global_batch_sequences % dp:
                    continue
                local = global_batch_sequences // dp
                for dp_shard in _divisors(dp):
                    eps = [1]
                    if cfg.family == "moe":
                        eps = [e for e in _divisors(cfg.num_experts) if (dp_shard * cp) % e == 0]
                    for ep in eps:
                        for mbs in [m for m in _divisors(local) if m <= 64]:
                            if pp > 1 and local // mbs < pp:
                                continue
                            for ac in AC_MODES:
                                lay = ParallelConfig(
                                    dp_replicate=dp // dp_shard,
                                    dp_shard=dp_shard,
                                    tp=tp,
                                    pp=pp,
                                    cp=cp,
                                    ep=ep,
                                    activation_checkpoint=ac,
                                    pp_microbatches=local // mbs if pp > 1 else 0,
                                    sequence_parallel=True,
                                )
                                yield lay, mbs


def _buildable(lay: ParallelConfig, cfg) -> bool:
    """Only layouts `parallelize` builds (ParallelDims.check_supported)."""
    try:
        ParallelDims.from_config(lay).check_supported(cfg)
    except ConfigError:
        return False
    return True


def grad_compression_fraction(cfg, lay: ParallelConfig) -> float:
    """Bytes of the replicate all-reduce under `lay.grad_compression` / uncompressed fp32 bytes.

    bf16: 1/2. powersgd (torch's powerSGD_hook, min_compression_rate 2): each local gradient
    matrix n×m (first dim × the rest) whose rank-r factors are at least 2x smaller sends r·(n+m)
    elements, every other tensor (vectors, small matrices) its n·m; summed over the model's
    parameters on the rank holding the largest shards (`planner_memory.local_shape`).
    """
    method = getattr(lay, "grad_compression", "none")
    if method == "bf16":
        return 0.5
    if method != "powersgd":
        return 1.0
    rank = lay.powersgd_rank
    sent = total = 0
    for name, shape in param_shapes(cfg).items():
        local = local_shape(name, shape, lay)
        n, numel = local[0], math.prod(local)
        m = numel // n if n else 0
        total += numel
        r = min(n, m, rank)
        sent += r * (n + m) if len(local) > 1 and n * m >= 2 * r * (n + m) else numel
    return sent / total if total else 1.0


def _flops_per_token(cfg, seq_len: int) -> FlopsPerToken:
    return _flops_per_token_of(*config_key(cfg), seq_len)


@lru_cache(maxsize=64)
def _flops_per_token_of(cls, values: tuple, seq_len: int) -> FlopsPerToken:
    return flops_per_token(config_from_key(cls, values), seq_len)


def _compute(
    fpt: FlopsPerToken,
    lay: ParallelConfig,
    tokens_step: int,
    num_micro: int,
    hw: Hardware,
    consts: CostConstants,
    virtual_stages: int | None = None,
) -> tuple[float, float, float, float, int]:
    """(model FLOPs, hardware FLOPs, compute seconds, bubble seconds, model chunks per rank) of one
    step. compute + bubble is a lower bound of the step (communication only adds), which
    best_layout relies on: the same expressions, so the same floats, as estimate's."""
    model_flops = fpt.exact_causal * tokens_step
    hw_flops = model_flops
    if lay.activation_checkpoint == "full":
        hw_flops += fpt.matmul / 3 * tokens_step  # one more forward of every matmul
    elif lay.activation_checkpoint == "selective":
        hw_flops *= 1.02
    compute = hw_flops / lay.world_size / (hw.peak_flops * consts.mfu)
    # 1F1B/GPipe idle (pp-1) micro-batch slots per step; interleaved schedules (v chunks per rank)
    # shrink each slot v-fold (Narayanan et al. 2021, §2.2.2)
    v = virtual_stages or stages_per_rank(lay.pp_schedule)
    bubble = compute * (lay.pp - 1) / (num_micro * v) if lay.pp > 1 else 0.0
    return model_flops, hw_flops, compute, bubble, v


def estimate(
    cfg,
    lay: ParallelConfig,
    *,
    micro_batch_sequences: int,
    seq_len: int,
    global_batch_sequences: int,
    hw: Hardware,
    consts: CostConstants,
    virtual_stages: int | None = None,
    overlap_grad_reduce: bool = True,
) -> Plan:
    """Memory, communication and step time of one layout (see the module docstring).

    virtual_stages: model chunks per pipeline rank for the bubble (default: the schedule's, 2 for
    interleaved 1F1B); other frameworks' interleaved schedules take more (Llama 3's V).
    overlap_grad_reduce: False for frameworks whose DDP all-reduces every gradient in one call after
    backward (Megatron-LM before its `overlap_grad_reduce` option); scalelab's DDP/HSDP overlaps."""
    mbs = micro_batch_sequences
    tokens_step = global_batch_sequences * seq_len
    local_sequences = global_batch_sequences // lay.dp_size
    num_micro = local_sequences // mbs
    # --- memory
    state = state_bytes(cfg, lay, seq_len=seq_len)
    saved, transient = activation_bytes(cfg, lay, seq_len, micro_batch_sequences=mbs, kernels="fused", act=2)
    block_params = layer_param_count(cfg, lay)
    buffers = 2 * 2 * block_params + 4 * block_params + transient + consts.overhead_bytes
    if lay.dp_shard * lay.cp == 1:
        buffers -= 2 * 2 * block_params + 4 * block_params  # no FSDP: nothing gathered
    acts = saved * consts.activation_scale
    memory = {
        "params": float(state.param_bytes),
        "grads": float(state.grad_bytes),
        "optimizer": float(state.optim_bytes),
        "activations": float(acts),
        "buffers": float(buffers),
    }
    memory["total"] = sum(memory.values())
    # --- compute
    fpt = _flops_per_token(cfg, seq_len)
    model_flops, hw_flops, compute, bubble, v = _compute(fpt, lay, tokens_step, num_micro, hw, consts, virtual_stages)
    # --- communication: alpha-beta collectives, minus what overlaps compute (scalelab.parallel.planner_time)
    comm = step_communication(
        cfg,
        lay,
        micro_batch_sequences=mbs,
        seq_len=seq_len,
        num_micro=num_micro,
        compute_s=compute,
        forward_share=(model_flops / 3) / hw_flops,
        replicate_grad_bytes=state.grad_bytes * grad_compression_fraction(cfg, lay),
        virtual_stages=v,
        overlap_grad_reduce=overlap_grad_reduce,
        hw=hw,
        consts=consts,
    )
    exposed = comm.exposed_s
    step = compute + bubble + sum(exposed.values())
    time_parts = {"compute": compute, "bubble": bubble} | {f"comm_{k}": v for k, v in exposed.items()}
    return Plan(
        parallel=lay,
        micro_batch_sequences=mbs,
        fits=memory["total"] <= hw.gpu_memory_bytes,
        step_time_s=step,
        tokens_per_s_per_gpu=tokens_step / step / lay.world_size,
        mfu=model_flops / lay.world_size / hw.peak_flops / step,
        memory=memory,
        comm_bytes=comm.bytes,
        time_parts=time_parts,
    )


def plan_layouts(
    cfg,
    *,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    hw: Hardware | None = None,
    consts: CostConstants | None = None,
    include_unfit: bool = False,
) -> list[Plan]:
    """All candidate layouts, fastest first (those that fit memory; then the rest if asked)."""
    hw, consts, sequences = _search_inputs(hw, consts, seq_len, global_batch_tokens)
    plans = [
        estimate(
            cfg, lay, micro_batch_sequences=mbs, seq_len=seq_len, global_batch_sequences=sequences, hw=hw, consts=consts
        )
        for lay, mbs in candidate_layouts(cfg, num_gpus, seq_len, sequences, hw)
    ]
    fit = sorted((p for p in plans if p.fits), key=lambda p: p.step_time_s)
    if not include_unfit:
        return fit
    return fit + sorted((p for p in plans if not p.fits), key=lambda p: p.memory["total"])


def best_layout(
    cfg,
    *,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    hw: Hardware | None = None,
    consts: CostConstants | None = None,
) -> Plan | None:
    """plan_layouts(...)[0], the fastest layout that fits (None when none does), without estimating
    every candidate: a step is at least its compute plus its pipeline bubble (communication only
    adds), so candidates are estimated in the order of that bound until it exceeds the fastest
    fitting step found. Ties go to the earlier candidate, as plan_layouts' stable sort has them."""
    hw, consts, sequences = _search_inputs(hw, consts, seq_len, global_batch_tokens)
    candidates = list(_shaped_layouts(cfg, num_gpus, seq_len, sequences, hw))  # buildable: checked when reached
    fpt = _flops_per_token(cfg, seq_len)
    tokens_step = sequences * seq_len
    bounds = []
    for i, (lay, mbs) in enumerate(candidates):
        num_micro = sequences // lay.dp_size // mbs
        _, _, compute, bubble, _ = _compute(fpt, lay, tokens_step, num_micro, hw, consts)
        bounds.append((compute + bubble, i))
    best, best_i = None, -1
    for bound, i in sorted(bounds):
        if best is not None and bound > best.step_time_s:
            break
        lay, mbs = candidates[i]
        if not _buildable(lay, cfg):
            continue
        p = estimate(cfg, lay, micro_batch_sequences=mbs, seq_len=seq_len, global_batch_sequences=sequences, hw=hw,
                     consts=consts)  # fmt: skip
        if p.fits and (best is None or (p.step_time_s, i) < (best.step_time_s, best_i)):
            best, best_i = p, i
    return best


def _search_inputs(
    hw: Hardware | None, consts: CostConstants | None, seq_len: int, global_batch_tokens: int
) -> tuple[Hardware, CostConstants, int]:
    """(hardware, constants, sequences per step) of a search, the defaults filled in."""
    if global_batch_tokens % seq_len:
        raise ValueError(f"global_batch_tokens={global_batch_tokens} is not a multiple of seq_len={seq_len}")
    return hw or Hardware(), consts or CostConstants(), global_batch_tokens // seq_len


# --- calibration ---------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class Measurement:
    """One measured run: the model, its layout and batch, and what was observed."""

    cfg: object  # ModelConfig
    parallel: ParallelConfig
    micro_batch_sequences: int
    seq_len: int
    global_batch_sequences: int
    step_time_s: float | None = None
    peak_memory_bytes: float | None = None
    hw: Hardware = field(default_factory=Hardware)


def calibrate(measurements: list[Measurement], consts: CostConstants | None = None) -> CostConstants:
    """Refit the constants from measured runs.

    Step time: mfu, comm_efficiency and fsdp_overlap by least squares on log(step time) (bounded;
    with fewer than 3 timed runs only mfu is fitted). Memory: activation_scale and overhead_bytes
    by least squares on measured peak − exact state − FSDP buffers = scale × activations + overhead
    (overhead alone with one run). Returns a new CostConstants; the input is not modified.
    """
    consts = consts or CostConstants()
    timed = [m for m in measurements if m.step_time_s]
    if timed:
        names = ["mfu", "comm_efficiency", "fsdp_overlap"] if len(timed) >= 3 else ["mfu"]
        lo = {"mfu": 0.02, "comm_efficiency": 0.05, "fsdp_overlap": 0.0}
        hi = {"mfu": 1.0, "comm_efficiency": 1.0, "fsdp_overlap": 1.0}

        def residuals(x):
            c = replace(consts, **dict(zip(names, x)))
            return [
                math.log(
                    estimate(
                        m.cfg,
                        m.parallel,
                        micro_batch_sequences=m.micro_batch_sequences,
                        seq_len=m.seq_len,
                        global_batch_sequences=m.global_batch_sequences,
                        hw=m.hw,
                        consts=c,
                    ).step_time_s
                    / m.step_time_s
                )
                for m in timed
            ]

        x0 = [min(max(getattr(consts, n), lo[n] + 1e-3), hi[n] - 1e-3) for n in names]
        fit = least_squares(residuals, x0, bounds=([lo[n] for n in names], [hi[n] for n in names]))
        consts = replace(consts, **dict(zip(names, (float(v) for v in fit.x))))
    sized = [m for m in measurements if m.peak_memory_bytes]
    if sized:
        base = replace(consts, activation_scale=1.0, overhead_bytes=0.0)
        acts, rest = [], []
        for m in sized:
            p = estimate(
                m.cfg,
                m.parallel,
                micro_batch_sequences=m.micro_batch_sequences,
                seq_len=m.seq_len,
                global_batch_sequences=m.global_batch_sequences,
                hw=m.hw,
                consts=base,
            )
            fixed = p.memory["params"] + p.memory["grads"] + p.memory["optimizer"] + p.memory["buffers"]
            acts.append(p.memory["activations"])
            rest.append(m.peak_memory_bytes - fixed)
        if len(sized) >= 2 and len(set(acts)) > 1:
            a = np.stack([np.array(acts), np.ones(len(acts))], axis=1)
            (scale, overhead), *_ = np.linalg.lstsq(a, np.array(rest), rcond=None)
            consts = replace(consts, activation_scale=float(max(scale, 0.1)), overhead_bytes=float(max(overhead, 0.0)))
        else:
            overhead = float(np.mean(np.array(rest) - consts.activation_scale * np.array(acts)))
            consts = replace(consts, overhead_bytes=max(overhead, 0.0))
    return consts


def measurements_from_runs(run_dirs, hw: Hardware | None = None, skip_steps: int = 2) -> list[Measurement]:
    """Measurements from run records: config.json (model, parallel, data.seq_len, train batch) and
    metrics.parquet (median step time from tokens_per_s after `skip_steps` warm-up steps; a
    `peak_memory_bytes` column is used when the records have one)."""
    out = []
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        cfg_dict = json.loads((run_dir / "config.json").read_text())
        metrics = pl.read_parquet(run_dir / "metrics.parquet").filter(pl.col("step") > skip_steps)
        if metrics.is_empty():
            continue
        model = ModelConfig(**cfg_dict["model"])
        par = ParallelConfig(**(cfg_dict.get("parallel") or {}))  # a resolved config.json has every key right
        seq_len = cfg_dict["data"]["seq_len"]
        sequences = cfg_dict["train"]["global_batch_tokens"] // seq_len
        mbs = cfg_dict["train"].get("micro_batch_sequences") or sequences // par.dp_size
        tokens_step = sequences * seq_len
        step_time = float(tokens_step / metrics["tokens_per_s"].median())
        peak = float(metrics["peak_memory_bytes"].max()) if "peak_memory_bytes" in metrics.columns else None
        out.append(
            Measurement(
                cfg=model,
                parallel=par,
                micro_batch_sequences=mbs,
                seq_len=seq_len,
                global_batch_sequences=sequences,
                step_time_s=step_time,
                peak_memory_bytes=peak,
                hw=hw or Hardware(),
            )
        )
    return out
