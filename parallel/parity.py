"""Layout parity: does a parallel layout change the numbers? (`scalelab parity` and the tests)

    spec = ParitySpec(steps=3, optimizer="adamw")
    report = run_parity(["single", "dp2", "fsdp2", "tp2sp", "pp2-1f1b", "fsdp2xtp2"], spec)
    report.ok, report.rows          # per layout: max |Δloss| per step, max |Δparam| at the end,
                                    # max relative |Δ| of the pre-clip gradient norm per step

The same model (seed), the same token batches and the same optimizer run on one device (the
reference, the plain `lm_loss` path) and under each layout, on this machine: one process group
per world size, every layout of that size run inside it one after the other. Each layout also
checks its per-rank memory accounting (`scalelab.parallel.memory`) against the tensors it holds.

Layout names: `x`-joined parts, each an axis and a size, with options:
    single            one process (the reference itself; a sanity row)
    single-accumN     one process, each batch in N accumulation steps: the floating-point noise floor
    dpN               DDP replicas (dp_replicate)         fsdpN     FSDP2 ZeRO-3 (dp_shard)
    fsdpN-zero2       FSDP2 without reshard after forward tpN       tensor parallel
    tpNsp             TP + sequence parallel + loss-parallel cross-entropy
    ppN[-schedule]    pipeline; schedule gpipe | 1f1b (default) | interleaved | zb (zero-bubble V)
    cpN               context parallel (sequence sharded, all-gather KV; scalelab.parallel.context_parallel)
    (expert parallel: its own parity harness, scalelab.parallel.moe_cp_parity)
    +ac / +sac / +compile / +bf16   full / selective activation checkpointing, torch.compile, bf16
e.g. dp2xfsdp2 (HSDP), fsdp2xtp2sp, dp2xpp2xtp2, pp2-zb+ac.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from scalelab.errors import UsageError
from scalelab.models.config import ModelConfig
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.parallel.backend import spawn
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.memory import expected_memory, measured_memory
from scalelab.parallel.parallelize import parallelize

_SCHEDULE_ALIASES = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved": "interleaved-1f1b",
    "interleaved-1f1b": "interleaved-1f1b",
    "zb": "zero-bubble",
    "zbv": "zero-bubble",
    "zero-bubble": "zero-bubble",
}
_PART = re.compile(r"^(dp|fsdp|tp|pp|cp)(\d+)(.*)$")
_ACCUM = re.compile(r"^single(-accum(\d+))?$")


def debug_model(num_layers: int = 4) -> ModelConfig:
    """The tiny dense model the parity checks use (runs a step in milliseconds on CPU)."""
    return ModelConfig(
        vocab_size=256,
        num_layers=num_layers,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        d_ff=128,
        max_seq_len=64,
        kernels="torch",
    )


@dataclass(kw_only=True, slots=True)
class ParitySpec:
    model: ModelConfig = field(default_factory=debug_model)
    steps: int = 3
    seq_len: int = 32
    global_batch_sequences: int = 8
    optimizer: str = "adamw"  # adamw (scalelab's AdamW groups) | sgd
    # AdamW normalises each update (m / sqrt(v)), so reduction-order noise in the tiny gradients of
    # some elements moves them by up to ~3e-3 × lr after 3 steps on ONE device (batch split in two:
    # `single-accum2`), ~2.5e-2 × lr under TP. lr 1e-4 keeps that under the 1e-5 tolerance while
    # an optimizer-state bug still shows (~lr). Adam is blind to gradient scale: SGD checks that.
    # 0 = 1e-4 for adamw, 0.1 for sgd.
    lr: float = 0.0
    grad_clip: float = 1.0  # exercises the sharded/pipelined global grad norm
    z_loss: float = 0.0
    seed: int = 0
    dtype: str = "fp32"  # fp32 | bf16 (autocast on every side, FSDP bf16 params)
    tolerance: float = 1e-5  # max |Δ| allowed in losses and in parameters
    # loop micro-batches per rank and step under the layouts (gradient accumulation, as
    # train.micro_batch_sequences does); the reference always takes the whole batch at once
    accumulation: int = 1


def parse_layout(name: str) -> ParallelConfig:
    """A ParallelConfig from a layout name (see the module docstring); UsageError if malformed."""
    base, *mods = name.strip().split("+")
    cfg = ParallelConfig(sequence_parallel=False, loss_parallel=False, mixed_precision="fp32")
    if _ACCUM.match(base):
        if mods:
            raise UsageError(f"layout {name!r}: single-device layouts take no modifiers")
        return cfg
    if base != "single":
        seen = set()
        for part in base.split("x"):
            m = _PART.match(part)
            if not m:
                raise UsageError(f"layout {name!r}: cannot read {part!r}; use parts like dp2, fsdp2, tp2sp, pp2-1f1b")
            axis, size, opt = m.group(1), int(m.group(2)), m.group(3)
            if axis in seen or size < 1:
                raise UsageError(f"layout {name!r}: {axis} given twice or with size < 1")
            seen.add(axis)
            if axis == "dp" and not opt:
                cfg.dp_replicate = size
            elif axis == "fsdp" and opt in ("", "-zero3", "-zero2"):
                cfg.dp_shard = size
                cfg.fsdp_reshard_after_forward = opt != "-zero2"
            elif axis == "tp" and opt in ("", "sp"):
                cfg.tp = size
                cfg.sequence_parallel = cfg.loss_parallel = opt == "sp"
            elif axis == "cp" and not opt:
                cfg.cp = size
            elif axis == "pp" and (not opt or opt[1:] in _SCHEDULE_ALIASES):
                cfg.pp = size
                cfg.pp_schedule = _SCHEDULE_ALIASES[opt[1:]] if opt else "1f1b"
            else:
                raise UsageError(f"layout {name!r}: unknown option {opt!r} on {axis}")
    for mod in mods:
        if mod in ("ac", "sac"):
            cfg.activation_checkpoint = "full" if mod == "ac" else "selective"
        elif mod == "compile":
            cfg.compile = True
        elif mod == "bf16":
            cfg.mixed_precision = "bf16"
        else:
            raise UsageError(f"layout {name!r}: unknown modifier +{mod}; use +ac, +sac, +compile or +bf16")
    return cfg


def check_layouts(layouts: list[str], spec: ParitySpec) -> dict[str, ParallelConfig]:
    """Parse and validate every layout against the model and batch before anything is spawned."""
    out = {}
    for name in layouts:
        pcfg = parse_layout(name)
        m = _ACCUM.match(name)
        if m and m.group(2) and spec.global_batch_sequences % int(m.group(2)):
            raise UsageError(
                f"layout {name!r}: {m.group(2)} does not divide the batch of {spec.global_batch_sequences} sequences"
            )
        ParallelDims.from_config(
            pcfg,
            world_size=pcfg.world_size,
            model=spec.model,
            seq_len=spec.seq_len,
            global_batch_sequences=spec.global_batch_sequences,
            micro_batch_sequences=_micro(spec, pcfg.dp_replicate * pcfg.dp_shard),
        )
        out[name] = pcfg
    return out


# --- the training steps, shared by the reference and the layouts ------------------------------------
def _batches(spec: ParitySpec) -> list[torch.Tensor]:
    """Token batches [global_batch, seq_len + 1] per step, drawn from the first 32 ids only.

    A skewed unigram distribution is learnable in a few steps (the loss falls from ~ln V toward
    ln 32), so the steps really train; uniform random tokens would leave the loss flat.
    """
    gen = torch.Generator().manual_seed(spec.seed + 1)
    high = min(32, spec.model.vocab_size)
    return [
        torch.randint(0, high, (spec.global_batch_sequences, spec.seq_len + 1), generator=gen)
        for _ in range(spec.steps)
    ]


def _optimizer(model, spec: ParitySpec):
    """SGD, or AdamW with the training recipe's defaults (betas 0.9/0.95, weight decay 0.1 on the
    matrices, none on norms and the embedding) so that decoupled decay is checked under sharding."""
    if spec.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=spec.lr or 0.1)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and "tok_embeddings" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.lr or 1e-4, betas=(0.9, 0.95), eps=1e-8)


def _autocast(spec: ParitySpec):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.dtype == "bf16")


def reference_run(spec: ParitySpec, accumulation: int = 1) -> tuple[list[float], dict[str, torch.Tensor], list[float]]:
    """Losses per step, final parameters and pre-clip gradient norms per step of the single-device
    run (the loop's lm_loss path).

    accumulation > 1 splits each batch into that many micro-batches: same math, another
    summation order, which measures the floor of harmless floating-point differences.
    """
    model = build_model(spec.model, device="cpu", seed=spec.seed)
    opt = _optimizer(model, spec)
    losses, grad_norms = [], []
    for batch in _batches(spec):
        ce = 0.0
        for chunk in batch.split(len(batch) // accumulation):
            with _autocast(spec):
                loss, parts = lm_loss(model, chunk[:, :-1], chunk[:, 1:], z_loss=spec.z_loss)
            (loss / accumulation).backward()
            ce += float(parts["ce"]) / accumulation
        if spec.grad_clip:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)  # the pre-clip norm
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        grad_norms.append(float(norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(ce)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, grad_norms


def _micro(spec: ParitySpec, dp: int) -> int:
    """Sequences per loop micro-batch on a rank (0 = the whole local batch), checked to divide."""
    if spec.accumulation < 1 or (spec.global_batch_sequences // dp) % spec.accumulation:
        raise UsageError(
            f"accumulation {spec.accumulation} does not divide the {spec.global_batch_sequences // dp} "
            "sequences per data-parallel rank"
        )
    return 0 if spec.accumulation == 1 else spec.global_batch_sequences // dp // spec.accumulation


_MESHES: dict = {}  # per worker process: mesh shape -> DeviceMesh


def _run_layout(key: str, pcfg: ParallelConfig, spec: ParitySpec, out_dir: Path) -> None:
    """One layout inside an initialised process group; every rank writes its results file."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    dims = ParallelDims.from_config(
        pcfg,
        world_size=world,
        model=spec.model,
        seq_len=spec.seq_len,
        global_batch_sequences=spec.global_batch_sequences,
        micro_batch_sequences=_micro(spec, pcfg.dp_replicate * pcfg.dp_shard),
    )
    shape = dims.mesh_shape()
    if shape not in _MESHES:  # building a mesh creates process groups: reuse it across jobs
        _MESHES[shape] = dims.build_mesh("cpu")
    dims.mesh = _MESHES[shape]
    model = build_model(spec.model, device="cpu", seed=spec.seed)
    par = parallelize(model, dims, pcfg, seq_len=spec.seq_len, z_loss=spec.z_loss)
    opt = _optimizer(par.model, spec)
    dp_rank, dp_size = dims.dp_coords()
    local = spec.global_batch_sequences // dp_size
    losses, grad_norms, memory = [], [], None
    for i, batch in enumerate(_batches(spec)):
        mine = batch[dp_rank * local : (dp_rank + 1) * local]  # the sampler's contiguous dp chunk
        ce = torch.zeros(())
        for chunk in mine.split(local // spec.accumulation):  # as the loop's micro-batches
            with _autocast(spec):
                ce = ce + par.step.forward_backward(chunk[:, :-1], chunk[:, 1:], 1.0 / spec.accumulation)
        ce = ce / spec.accumulation
        grad_norms.append(par.step.clip_grad_norm(par.model, spec.grad_clip))  # pre-clip global norm
        opt.step()
        if i == spec.steps - 1:
            memory = measured_memory(par.model, opt)
        opt.zero_grad(set_to_none=True)
        value = ce.detach().float().reshape(()).clone()
        dist.all_reduce(value)  # every rank holds its dp group's loss: world mean = dp mean
        losses.append(float(value) / world)
    elapsed = time.perf_counter() - t0
    sd = get_model_state_dict(par.model, options=StateDictOptions(full_state_dict=True))
    sd = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in sd.items()}
    if spec.model.family == "llama":
        expected = expected_memory(
            spec.model, dims, pcfg, dims.coords(), optimizer=spec.optimizer, seq_len=spec.seq_len
        ).as_dict()
    else:  # the formula covers the dense family (MoE state: scalelab.parallel.planner_memory)
        expected, memory = None, None
    torch.save(
        {
            "losses": losses,
            "grad_norms": grad_norms,
            "params": sd,
            "memory": memory.as_dict() if memory is not None else None,
            "expected_memory": expected,
            "seconds": elapsed,
        },
        out_dir / f"{key}.rank{rank}.pt",
    )
    dist.barrier()


def _group_worker(jobs: list[tuple[str, ParallelConfig, ParitySpec]], out_dir: str) -> None:
    # Gathering full parameters for the comparison warns once per 3-D DTensor ("2 sequential
    # all_gathers ... suboptimal"): true, irrelevant here, and it would bury the report.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    for key, pcfg, spec in jobs:
        _run_layout(key, pcfg, spec, Path(out_dir))


# --- driver --------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class LayoutResult:
    layout: str
    optimizer: str
    dtype: str
    world_size: int
    loss_diffs: list[float]  # |loss - reference| per step
    max_loss_diff: float
    max_param_diff: float  # over every element of every parameter (every rank's copy), final step
    worst_param: str
    # |grad norm - reference| / reference per step, before clipping: the sharded/pipelined global
    # norm, and any uniform gradient-scale error that clipping or Adam would normalise away
    max_grad_norm_diff: float
    # max |final - initial| over the reference's parameter elements: a layout that never updates is
    # off by this much, so the parameter check can only catch it if this exceeds the tolerance
    ref_max_update: float
    memory_ok: bool  # accounting == measured on every rank
    memory_per_rank: list[dict]  # measured bytes per rank
    seconds: float  # rank 0's time for build + steps
    tolerance: float
    ok: bool


@dataclass(kw_only=True, slots=True)
class ParityReport:
    specs: list[dict]
    reference_losses: dict[str, list[float]]  # per "optimizer/dtype"
    rows: list[LayoutResult]
    wall_seconds: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def to_json(self) -> str:
        return json.dumps(
            {
                "ok": self.ok,
                "specs": self.specs,
                "reference_losses": self.reference_losses,
                "wall_seconds": self.wall_seconds,
                "layouts": [asdict(r) for r in self.rows],
            },
            indent=2,
        )


def run_parity(
    layouts: list[str], specs: ParitySpec | list[ParitySpec] | None = None, work_dir: str | Path | None = None
) -> ParityReport:
    """Run every layout under every spec and compare with the single-device reference of that spec."""
    specs = [specs or ParitySpec()] if not isinstance(specs, list) else specs
    return run_parity_jobs([(layouts, spec) for spec in specs], work_dir)


def run_parity_jobs(jobs: list[tuple[list[str], ParitySpec]], work_dir: str | Path | None = None) -> ParityReport:
    """Several (layouts, spec) checks; all multi-process layouts of one world size share one process group."""
    t0 = time.perf_counter()
    parsed = [check_layouts(layouts, spec) for layouts, spec in jobs]  # bad layouts fail before any spawn
    refs = [reference_run(spec) for _, spec in jobs]
    by_world: dict[int, list] = {}
    for k, (_, spec) in enumerate(jobs):
        for name, pcfg in parsed[k].items():
            if not _ACCUM.match(name):
                by_world.setdefault(pcfg.world_size, []).append((f"{k}_{_slug(name)}", pcfg, spec))
    tmp = tempfile.TemporaryDirectory(prefix="scalelab-parity-") if work_dir is None else None
    out = Path(work_dir or tmp.name)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for world, group in sorted(by_world.items()):
            spawn(_group_worker, world, (group, str(out)), backend="gloo")
        for k, (layouts, spec) in enumerate(jobs):
            ref_losses, ref_params, ref_norms = refs[k]
            init = _initial_params(spec)
            for name in layouts:
                m = _ACCUM.match(name)
                if m:
                    t1 = time.perf_counter()
                    n_acc = int(m.group(2) or 1)
                    losses, params, norms = reference_run(spec, n_acc) if n_acc > 1 else refs[k]
                    results = [
                        {
                            "losses": losses,
                            "grad_norms": norms,
                            "params": params,
                            "memory": None,
                            "expected_memory": None,
                            "seconds": time.perf_counter() - t1,
                        }
                    ]
                    rows.append(_compare(name, 1, results, refs[k], init, spec))
                    continue
                world = parsed[k][name].world_size
                key = f"{k}_{_slug(name)}"
                results = [torch.load(out / f"{key}.rank{r}.pt", weights_only=True) for r in range(world)]
                rows.append(_compare(name, world, results, refs[k], init, spec))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return ParityReport(
        specs=[_spec_dict(spec) for _, spec in jobs],
        reference_losses={f"{spec.optimizer}/{spec.dtype}": refs[k][0] for k, (_, spec) in enumerate(jobs)},
        rows=rows,
        wall_seconds=time.perf_counter() - t0,
    )


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _initial_params(spec: ParitySpec) -> dict[str, torch.Tensor]:
    from scalelab.models.llama import build_model

    return build_model(spec.model, device="cpu", seed=spec.seed).state_dict()


def _compare(name, world, results, ref, init, spec) -> LayoutResult:
    ref_losses, ref_params, ref_norms = ref
    losses = results[0]["losses"]
    loss_diffs = [abs(a - b) for a, b in zip(losses, ref_losses)]
    norms = results[0]["grad_norms"]
    norm_diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(norms, ref_norms)]
    max_norm = max(norm_diffs) if len(norms) == len(ref_norms) else float("inf")
    ref_max_update = max(float((ref_params[k].float() - v.float()).abs().max()) for k, v in init.items())
    seen: set[str] = set()
    worst, worst_name = 0.0, ""
    for res in results:  # every rank's full parameters: replicas must agree with the reference too
        for key, value in res["params"].items():
            seen.add(key)
            diff = float((value.float() - ref_params[key].float()).abs().max())
            if diff > worst:
                worst, worst_name = diff, key
    missing = sorted(set(ref_params) - seen)
    if missing:
        worst, worst_name = float("inf"), f"missing {missing[0]}"
    memory_ok = all(r["memory"] == r["expected_memory"] for r in results)
    max_loss = max(loss_diffs) if loss_diffs else 0.0
    ok = max_loss <= spec.tolerance and worst <= spec.tolerance and max_norm <= spec.tolerance
    ok = ok and memory_ok and len(losses) == len(ref_losses)
    return LayoutResult(
        layout=name,
        optimizer=spec.optimizer,
        dtype=spec.dtype,
        world_size=world,
        loss_diffs=loss_diffs,
        max_loss_diff=max_loss,
        max_param_diff=worst,
        worst_param=worst_name,
        max_grad_norm_diff=max_norm,
        ref_max_update=ref_max_update,
        memory_ok=memory_ok,
        memory_per_rank=[r["memory"] for r in results if r["memory"] is not None],
        seconds=float(results[0]["seconds"]),
        tolerance=spec.tolerance,
        ok=ok,
    )


def _spec_dict(spec: ParitySpec) -> dict:
    d = {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "model"}
    d["model"] = asdict(spec.model)
    return d


def format_report(report: ParityReport) -> str:
    """A fixed-width table: one row per (layout, spec); `s` is rank 0's build + steps time."""
    lines = [
        f"{'layout':<22} {'optim':<6} {'dtype':<5} {'world':>5} {'max|Δloss|':>11} {'max|Δparam|':>12} "
        f"{'rel|Δgnorm|':>12} {'memory':>7} {'s':>6}  result  |Δloss| per step",
        "-" * 125,
    ]
    for r in report.rows:
        mem = "-" if not r.memory_per_rank else "ok" if r.memory_ok else "WRONG"  # "-": one process, not checked
        per_step = " ".join(f"{d:.1e}" for d in r.loss_diffs)
        lines.append(
            f"{r.layout:<22} {r.optimizer:<6} {r.dtype:<5} {r.world_size:>5} {r.max_loss_diff:>11.2e} "
            f"{r.max_param_diff:>12.2e} {r.max_grad_norm_diff:>12.2e} {mem:>7} {r.seconds:>6.2f}  "
            f"{'ok  ' if r.ok else 'FAIL'}    {per_step}"
        )
    for s in report.specs:
        lines.append(
            f"{s['optimizer']}: {s['steps']} steps, lr {s['lr'] or ('1e-4' if s['optimizer'] == 'adamw' else '0.1')}, "
            f"{s['dtype']}, grad clip {s['grad_clip'] or 'off'}, {s['accumulation']} loop micro-batch(es), "
            f"tolerance {s['tolerance']:.0e}"
        )
    lines.append(f"wall time {report.wall_seconds:.1f} s")
    return "\n".join(lines)
