"""Layout parity: does a parallel layout change the numbers? (`scalelab parity` and the tests)

    report = run_parity(["single", "dp2", "fsdp2", "tp2sp", "pp2-1f1b", "cp2-ring"], ParitySpec())
    moe = ParitySpec(model=moe_debug_model(), optimizer="sgd", steps=2, seq_len=16, grad_clip=0.0)
    report = run_parity(["ep2", "ep2xtp2sp", "dp2xep2"], moe)
    report.ok, report.rows     # per layout: |Δloss| per step, |Δgrad| at step 1, |Δparam| at the end

One harness for dense, context- and expert-parallel layouts (names: scalelab.parallel.layouts;
`single-accumN` is the reference in N accumulation steps, the floating-point floor). The same
preset debug model, batches and optimizer run on one device (the reference, the plain `lm_loss`
path) and under each layout through `parallelize` (the training loop's path): one process group
per world size runs every layout of that size. Compared: the loss of every step, every gradient at
the first step (before clipping), every parameter at the end on every rank, and each rank's memory
accounting against the tensors it holds (`scalelab.parallel.memory`; the planner's exact state
bytes for MoE). For MoE also the router: tokens per expert summed over the data-parallel ranks
(exactly) and the mean aux loss; its reference runs the layout's data-parallel slices one after
the other as accumulation micro-batches (each rank routes its own tokens: the same mathematics).
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
from torch.distributed.tensor import DTensor

from scalelab.errors import ConfigError, UsageError
from scalelab.models.config import ModelConfig
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.models.presets import get_preset
from scalelab.parallel.backend import spawn
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.layouts import parse_layout
from scalelab.parallel.memory import expected_memory, measured_memory
from scalelab.parallel.parallelize import parallelize
from scalelab.parallel.planner_memory import state_bytes

# The parity list: the dense layouts that tests/test_parallel_parity.py holds to one device, by
# world size; the golden losses (tests/assets/golden_losses/) pin the numbers of the world 2
# and 4 layouts. `single-accum2` is the floor: one device, the batch in two accumulation steps.
PARITY_LAYOUTS: dict[int, tuple[str, ...]] = {
    2: tuple(
        "single-accum2 dp2 fsdp2 fsdp2-zero2 tp2 tp2sp pp2-gpipe pp2-1f1b pp2-interleaved pp2-zb "
        "tp2sp+sac fsdp2+ac cp2".split()
    ),
    4: tuple("dp2xfsdp2 dp2xtp2 fsdp2xtp2 fsdp2xtp2sp fsdp2xpp2 pp2xtp2sp fsdp2-zero2xpp2-zb fsdp2xcp2".split()),
    8: ("dp2xpp2xtp2sp",),
}

_ACCUM = re.compile(r"^single(-accum(\d+))?$")
PARITY_BASE = ParallelConfig(mixed_precision="fp32", backend="gloo")  # what a layout name leaves unset


def debug_model(num_layers: int = 4) -> ModelConfig:
    """The `debug` preset with `num_layers` blocks (4: pipeline schedules with 2 stages per rank
    need them) and the torch kernels: a step takes milliseconds on CPU."""
    return get_preset("debug", num_layers=num_layers, kernels="torch")


def moe_debug_model(**overrides) -> ModelConfig:
    """The `moe-debug` preset (8 experts, top-2) with a shared expert and both router losses on,
    so that their gradients go through every layout too."""
    fields = dict(num_shared_experts=1, router_aux_loss_weight=0.01, router_z_loss_weight=0.001, kernels="torch")
    return get_preset("moe-debug", **{**fields, **overrides})


@dataclass(kw_only=True, slots=True)
class ParitySpec:
    model: ModelConfig = field(default_factory=debug_model)
    steps: int = 3
    seq_len: int = 32
    global_batch_sequences: int = 8
    optimizer: str = "adamw"  # adamw (the training recipe's decay groups) | sgd
    # AdamW normalises each update (m / sqrt(v)), so reduction-order noise in the tiny gradients of
    # some elements moves them by up to ~3e-3 × lr after 3 steps on ONE device (batch split in two:
    # `single-accum2`), ~2.5e-2 × lr under TP. lr 1e-4 keeps that under the 1e-5 tolerance while
    # an optimizer-state bug still shows (~lr). Adam is blind to gradient scale: SGD checks that.
    # 0 = 1e-4 for adamw, 0.1 for sgd.
    lr: float = 0.0
    grad_clip: float = 1.0  # exercises the sharded/pipelined global grad norm; 0 = no clipping
    z_loss: float = 0.0
    seed: int = 0
    dtype: str = "fp32"  # fp32 | bf16 (autocast on every side, FSDP bf16 params)
    tolerance: float = 1e-5  # max |Δ| allowed in losses, parameters (and fp32 gradients, router aux loss)
    # loop micro-batches per rank and step under the layouts (gradient accumulation, as
    # train.micro_batch_sequences does)
    accumulation: int = 1

    @property
    def moe(self) -> bool:
        return self.model.family == "moe"


def check_layouts(layouts: list[str], spec: ParitySpec) -> dict[str, ParallelConfig]:
    """Parse and validate every layout against the model and batch before anything is spawned."""
    out = {}
    for name in layouts:
        m = _ACCUM.match(name)
        if m:
            if m.group(2) and spec.global_batch_sequences % int(m.group(2)):
                batch = spec.global_batch_sequences
                raise UsageError(f"layout {name!r}: {m.group(2)} does not divide the batch of {batch} sequences")
            out[name] = ParallelConfig()
            continue
        pcfg = parse_layout(name, PARITY_BASE)
        if spec.moe and (pcfg.pp > 1 or pcfg.cp > 1):
            raise UsageError(f"layout {name!r}: the MoE parity reference covers dp, fsdp, ep and tp (not pp or cp)")
        try:
            ParallelDims.from_config(
                pcfg,
                world_size=pcfg.world_size,
                model=spec.model,
                seq_len=spec.seq_len,
                global_batch_sequences=spec.global_batch_sequences,
                micro_batch_sequences=_micro(spec, pcfg.dp_replicate * pcfg.dp_shard),
            )
        except ConfigError as e:
            raise UsageError(f"layout {name!r}: {e}") from None
        out[name] = pcfg
    return out


# --- the training steps, shared by the reference and the layouts ------------------------------------
def parity_batches(spec: ParitySpec) -> list[torch.Tensor]:
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


def parity_optimizer(model, spec: ParitySpec):
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


def _name(param_name: str) -> str:
    """The single-device name of a parameter (activation checkpointing wraps blocks)."""
    return param_name.replace("._checkpoint_wrapped_module", "")


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A parameter, gradient or state tensor gathered whole (a DTensor's full tensor), fp32, on CPU."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().cpu().clone()


def _router(model) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens per expert [layers, E], aux loss [layers]) of the model's last forward."""
    stats = model.moe_stats()
    return (
        torch.stack([s["tokens_per_expert"].double() for s in stats]),
        torch.stack([s["aux_loss"].double() for s in stats]),
    )


def reference_run(spec: ParitySpec, accumulation: int = 1) -> dict:
    """The single-device run (the loop's lm_loss path): losses, first-step gradients, final params
    (and for MoE the router counts and aux loss per step).

    accumulation > 1 splits each batch into that many micro-batches in order: for a dense model
    the same math in another summation order (the floor of harmless floating-point differences);
    for an MoE model what a layout's data-parallel ranks compute.
    """
    model = build_model(spec.model, device="cpu", seed=spec.seed)
    if spec.moe:
        model.set_moe_loss_scale(1.0 / accumulation)
    opt = parity_optimizer(model, spec)
    initial = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    out: dict = {"losses": [], "grads": {}, "grad_norms": [], "tokens_per_expert": [], "aux_loss": []}
    for step, batch in enumerate(parity_batches(spec)):
        ce, counts, aux = 0.0, 0.0, 0.0
        for chunk in batch.split(len(batch) // accumulation):
            with _autocast(spec):
                loss, parts = lm_loss(model, chunk[:, :-1], chunk[:, 1:], z_loss=spec.z_loss)
            (loss / accumulation).backward()
            ce += float(parts["ce"]) / accumulation
            if spec.moe:
                c, a = _router(model)
                counts, aux = counts + c, aux + a / accumulation
        if step == 0:
            out["grads"] = {n: full_tensor(p.grad) for n, p in model.named_parameters()}
        if spec.grad_clip:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)  # the pre-clip norm
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        out["grad_norms"].append(float(norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["losses"].append(ce)
        if spec.moe:
            out["tokens_per_expert"].append(counts)
            out["aux_loss"].append(aux)
    out["params"] = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    # how far the run moved a parameter: a layout that never updates is off by this much
    out["max_update"] = max(float((out["params"][k] - v).abs().max()) for k, v in initial.items())
    return out


def _micro(spec: ParitySpec, dp: int) -> int:
    """Sequences per loop micro-batch on a rank (0 = the whole local batch), checked to divide."""
    if spec.accumulation < 1 or (spec.global_batch_sequences // dp) % spec.accumulation:
        raise UsageError(
            f"accumulation {spec.accumulation} does not divide the {spec.global_batch_sequences // dp} "
            "sequences per data-parallel rank"
        )
    return 0 if spec.accumulation == 1 else spec.global_batch_sequences // dp // spec.accumulation


def _reference_chunks(spec: ParitySpec, pcfg: ParallelConfig) -> int:
    """Accumulation steps of the reference a layout is compared with (see reference_run)."""
    return pcfg.dp_replicate * pcfg.dp_shard * spec.accumulation if spec.moe else 1


_MESHES: dict = {}  # per worker process: mesh shape -> DeviceMesh


def _run_layout(key: str, pcfg: ParallelConfig, spec: ParitySpec, out_dir: Path) -> None:
    """One layout inside an initialised process group; every rank writes its results file."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    dims = ParallelDims.from_config(pcfg, world_size=world)
    shape = dims.mesh_shape()
    if shape not in _MESHES:  # building a mesh creates process groups: reuse it across jobs
        _MESHES[shape] = dims.build_mesh("cpu")
    dims.mesh = _MESHES[shape]
    par = parallelize(
        build_model(spec.model, device="cpu", seed=spec.seed), dims, pcfg, seq_len=spec.seq_len, z_loss=spec.z_loss
    )
    model = par.model
    if spec.moe:
        model.set_moe_loss_scale(1.0 / spec.accumulation)
    opt = parity_optimizer(model, spec)
    local = spec.global_batch_sequences // par.dp_size
    out: dict = {"losses": [], "grads": {}, "grad_norms": [], "tokens_per_expert": [], "aux_loss": [], "memory": None}
    for step, batch in enumerate(parity_batches(spec)):
        mine = batch[par.dp_rank * local : (par.dp_rank + 1) * local]  # the sampler's contiguous dp chunk
        ce, counts, aux = torch.zeros(()), 0.0, 0.0
        for chunk in mine.split(local // spec.accumulation):  # as the loop's micro-batches
            with _autocast(spec):
                ce = ce + par.step.forward_backward(chunk[:, :-1], chunk[:, 1:], 1.0 / spec.accumulation)
            if spec.moe:
                c, a = _router(model)
                counts, aux = counts + c, aux + a / spec.accumulation
        if step == 0:  # before clipping; a collective per sharded gradient
            out["grads"] = {_name(n): full_tensor(p.grad) for n, p in model.named_parameters() if p.grad is not None}
        out["grad_norms"].append(par.step.clip_grad_norm(model, spec.grad_clip))  # pre-clip global norm
        opt.step()
        if step == spec.steps - 1:
            out["memory"] = measured_memory(model, opt).as_dict()
        opt.zero_grad(set_to_none=True)
        value = (ce / spec.accumulation).detach().float().reshape(()).clone()
        dist.all_reduce(value)  # every rank holds its dp group's loss: world mean = dp mean
        out["losses"].append(float(value) / world)
        if spec.moe:  # tp and pp ranks hold copies of their dp rank's statistics
            packed = torch.cat([counts, aux[:, None]], dim=1).contiguous()
            dist.all_reduce(packed)
            out["tokens_per_expert"].append(packed[:, :-1] / (dims.tp * dims.pp))
            out["aux_loss"].append(packed[:, -1] / world)
    out["seconds"] = time.perf_counter() - t0
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    out["params"] = {k: full_tensor(v) for k, v in sd.items()}
    if not spec.moe:
        expected = expected_memory(spec.model, pcfg, dims.coords(), optimizer=spec.optimizer, seq_len=spec.seq_len)
        out["expected_memory"] = expected.as_dict()
    elif rank == 0:  # the planner's exact state accounting of the fullest rank (rank 0: the largest shards)
        out["expected_memory"] = state_bytes(spec.model, pcfg, seq_len=spec.seq_len, optimizer=spec.optimizer).as_dict()
    else:
        out["memory"] = out["expected_memory"] = None
    torch.save(out, out_dir / f"{key}.rank{rank}.pt")
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
    model: str  # dense | moe
    optimizer: str
    dtype: str
    world_size: int
    losses: list[float]  # the layout's loss per step (rank 0's: every rank holds the dp mean)
    grad_norms: list[float]  # the layout's global gradient norm per step, before clipping
    loss_diffs: list[float]  # |loss - reference| per step
    max_loss_diff: float
    max_grad_diff: float  # first step, before clipping, over every element of every gradient
    grad_scale: float  # the largest |gradient| of the reference (for relative checks)
    worst_grad: str
    max_param_diff: float  # over every element of every parameter (every rank's copy), final step
    # |grad norm - reference| / reference per step, before clipping: the sharded/pipelined global
    # norm, and any uniform gradient-scale error that clipping or Adam would normalise away
    max_grad_norm_diff: float
    # max |final - initial| over the reference's parameters: the parameter check can only catch a
    # layout that never updates when this exceeds the tolerance
    ref_max_update: float
    worst_param: str
    router_ok: bool | None  # MoE: tokens per expert equal, aux loss within tolerance (None: dense)
    max_aux_diff: float | None
    memory_ok: bool  # accounting == measured on every rank that reports it
    memory_per_rank: list[dict]  # measured bytes per rank
    seconds: float  # rank 0's time for build + steps
    tolerance: float
    ok: bool


@dataclass(kw_only=True, slots=True)
class ParityReport:
    specs: list[dict]
    reference_losses: dict[str, list[float]]  # per "optimizer/dtype" (MoE: "moe/optimizer/dtype")
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
    by_world: dict[int, list] = {}
    for k, (_, spec) in enumerate(jobs):
        for name, pcfg in parsed[k].items():
            if not _ACCUM.match(name):
                by_world.setdefault(pcfg.world_size, []).append((f"{k}_{_slug(name)}", pcfg, spec))
    tmp = tempfile.TemporaryDirectory(prefix="scalelab-parity-") if work_dir is None else None
    out = Path(work_dir or tmp.name)
    out.mkdir(parents=True, exist_ok=True)
    refs: dict[tuple[int, int], dict] = {}  # (job, reference accumulation) -> reference_run

    def reference(k: int, chunks: int) -> dict:
        if (k, chunks) not in refs:
            refs[(k, chunks)] = reference_run(jobs[k][1], chunks)
        return refs[(k, chunks)]

    rows = []
    try:
        for world, group in sorted(by_world.items()):
            spawn(_group_worker, world, (group, str(out)), backend="gloo")
        for k, (layouts, spec) in enumerate(jobs):
            for name in layouts:
                m = _ACCUM.match(name)
                if m:
                    t1 = time.perf_counter()
                    got = dict(reference(k, int(m.group(2) or 1)), memory=None, expected_memory=None)
                    got["seconds"] = time.perf_counter() - t1
                    rows.append(_compare(name, 1, [got], reference(k, 1), spec))
                    continue
                pcfg = parsed[k][name]
                key = f"{k}_{_slug(name)}"
                results = [torch.load(out / f"{key}.rank{r}.pt", weights_only=True) for r in range(pcfg.world_size)]
                rows.append(_compare(name, pcfg.world_size, results, reference(k, _reference_chunks(spec, pcfg)), spec))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return ParityReport(
        specs=[_spec_dict(spec) for _, spec in jobs],
        reference_losses={_spec_label(spec): reference(k, 1)["losses"] for k, (_, spec) in enumerate(jobs)},
        rows=rows,
        wall_seconds=time.perf_counter() - t0,
    )


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _max_diff(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor], seen: set[str]) -> tuple[float, str]:
    worst, where = 0.0, ""
    for key, value in got.items():
        seen.add(key)
        diff = float((value.float() - ref[key].float()).abs().max())
        if diff > worst:
            worst, where = diff, key
    return worst, where


def _compare(name: str, world: int, results: list[dict], ref: dict, spec: ParitySpec) -> LayoutResult:
    losses = results[0]["losses"]
    loss_diffs = [abs(a - b) for a, b in zip(losses, ref["losses"])]
    grad, worst_grad, param, worst_param = 0.0, "", 0.0, ""
    grads_seen: set[str] = set()
    params_seen: set[str] = set()
    for res in results:  # every rank's tensors: replicas must agree with the reference too
        d, w = _max_diff(ref["grads"], res["grads"], grads_seen)
        if d > grad:
            grad, worst_grad = d, w
        d, w = _max_diff(ref["params"], res["params"], params_seen)
        if d > param:
            param, worst_param = d, w
    for seen, table in ((params_seen, ref["params"]), (grads_seen, ref["grads"])):
        missing = sorted(set(table) - seen)
        if missing:
            param, worst_param = float("inf"), f"missing {missing[0]}"
    router_ok = aux_diff = None
    if spec.moe:
        got_counts, got_aux = results[0]["tokens_per_expert"], results[0]["aux_loss"]
        router_ok = all(torch.equal(a, b) for a, b in zip(ref["tokens_per_expert"], got_counts))
        aux_diff = max(float((a - b).abs().max()) for a, b in zip(ref["aux_loss"], got_aux))
        router_ok = router_ok and aux_diff <= spec.tolerance and len(got_counts) == len(ref["tokens_per_expert"])
    memory_ok = all(r["memory"] == r["expected_memory"] for r in results)
    max_loss = max(loss_diffs) if loss_diffs else 0.0
    norms = results[0]["grad_norms"]
    norm_diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(norms, ref["grad_norms"])]
    max_norm = max(norm_diffs) if len(norms) == len(ref["grad_norms"]) else float("inf")
    # fp32 gradients are held to the tolerance; under bf16 only the loss and parameters are
    grad_ok = spec.dtype != "fp32" or grad <= spec.tolerance
    ok = (
        max_loss <= spec.tolerance
        and param <= spec.tolerance
        and grad_ok
        and max_norm <= spec.tolerance
        and memory_ok
        and router_ok is not False
        and len(losses) == len(ref["losses"])
    )
    return LayoutResult(
        layout=name,
        model=spec.model.family if spec.moe else "dense",
        optimizer=spec.optimizer,
        dtype=spec.dtype,
        world_size=world,
        losses=list(losses),
        grad_norms=list(norms),
        loss_diffs=loss_diffs,
        max_loss_diff=max_loss,
        max_grad_diff=grad,
        grad_scale=max(float(g.abs().max()) for g in ref["grads"].values()),
        worst_grad=worst_grad,
        max_param_diff=param,
        max_grad_norm_diff=max_norm,
        ref_max_update=ref["max_update"],
        worst_param=worst_param,
        router_ok=router_ok,
        max_aux_diff=aux_diff,
        memory_ok=memory_ok,
        memory_per_rank=[r["memory"] for r in results if r["memory"] is not None],
        seconds=float(results[0]["seconds"]),
        tolerance=spec.tolerance,
        ok=ok,
    )


def _spec_label(spec: ParitySpec) -> str:
    """ "optimizer/dtype" ("moe/optimizer/dtype" for an MoE model): the key of its reference losses."""
    return f"{'moe/' if spec.moe else ''}{spec.optimizer}/{spec.dtype}"


def _spec_dict(spec: ParitySpec) -> dict:
    d = {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "model"}
    d["model"] = asdict(spec.model)
    return d


def format_report(report: ParityReport) -> str:
    """A fixed-width table: one row per (layout, spec); `s` is rank 0's build + steps time."""
    lines = [
        f"{'layout':<22} {'model':<5} {'optim':<6} {'dtype':<5} {'world':>5} {'max|Δloss|':>11} {'max|Δgrad|':>11} "
        f"{'max|Δparam|':>12} {'rel|Δnorm|':>11} {'router':>6} {'memory':>7} {'s':>6}  result  |Δloss| per step",
        "-" * 144,
    ]
    for r in report.rows:
        mem = "-" if not r.memory_per_rank else "ok" if r.memory_ok else "WRONG"  # "-": one process, not checked
        router = "-" if r.router_ok is None else "ok" if r.router_ok else "WRONG"
        per_step = " ".join(f"{d:.1e}" for d in r.loss_diffs)
        lines.append(
            f"{r.layout:<22} {r.model:<5} {r.optimizer:<6} {r.dtype:<5} {r.world_size:>5} {r.max_loss_diff:>11.2e} "
            f"{r.max_grad_diff:>11.2e} {r.max_param_diff:>12.2e} {r.max_grad_norm_diff:>11.2e} {router:>6} {mem:>7} "
            f"{r.seconds:>6.2f}  "
            f"{'ok  ' if r.ok else 'FAIL'}    {per_step}"
        )
    for s in report.specs:
        lr = s["lr"] or ("1e-4" if s["optimizer"] == "adamw" else "0.1")
        lines.append(
            f"{s['model']['family']}: {s['optimizer']}, {s['steps']} steps, lr {lr}, clip {s['grad_clip']}, "
            f"{s['dtype']}, {s['accumulation']} loop micro-batch(es), tolerance {s['tolerance']:.0e}"
        )
    lines.append(f"wall time {report.wall_seconds:.1f} s")
    return "\n".join(lines)
