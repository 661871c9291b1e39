"""Check the planner's activation formula against the bytes autograd actually saves (CPU).

    rows = local_rows()             # single process: sizes × seq_len × micro-batch × AC, MoE, pp stages
    rows += spawned_rows()          # a 2-process gloo group: tp2, tp2+sp, cp2 (all-gather), cp2-ring,
                                    # and an MoE under tp2 / tp2+sp
    print(format_rows(rows))        # estimate vs measured, relative error

Measured = distinct storages passed to autograd's saved-tensor hooks during one forward (parameters
and buffers excluded; DTensors by their local shard), i.e. what stays alive until backward. Under
full activation checkpointing that is each block's input (the recompute peak is reported separately
by the planner and not compared here). `experiments/planner_activation.py` prints the table.

It lives in experiments/ (it was scalelab.parallel.planner_validate) because no product code calls it:
it is experiments/planner_activation.py's measurement, which tests/test_planner.py also checks, and
experiments is a package both (and the gloo ranks it spawns) import without path tricks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from torch.utils._python_dispatch import TorchDispatchMode

from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.models.presets import get_preset
from scalelab.parallel.activation_checkpointing import SAVE_OPS, apply_ac
from scalelab.parallel.backend import spawn
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.context_parallel import apply_cp, shard_sequence_batch
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.expert_parallel import apply_ep
from scalelab.parallel.parity import moe_debug_model
from scalelab.parallel.planner import candidate_name
from scalelab.parallel.planner_memory import activation_bytes, measure_saved_bytes
from scalelab.parallel.tp import apply_tp


def _measure_single(cfg, lay: ParallelConfig, mbs: int, seq_len: int, seed: int = 0) -> int:
    model = build_model(cfg, seed=seed)
    apply_ac(model, lay.activation_checkpoint)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (mbs, seq_len + 1), generator=gen)
    if lay.activation_checkpoint != "selective":
        measured, _ = measure_saved_bytes(model, lambda: lm_loss(model, x[:, :-1], x[:, 1:]))
        return measured
    # Selective AC keeps the outputs of its MUST_SAVE ops in its own cache, out of the hooks' sight:
    # count those outputs (inside the blocks) with a dispatch mode, plus what the hooks see.
    with _SacOutputs(model) as sac:
        measured, _ = measure_saved_bytes(model, lambda: lm_loss(model, x[:, :-1], x[:, 1:]))
    return measured + sac.bytes


class _SacOutputs:
    """Bytes of distinct storages produced by selective checkpointing's saved ops inside the blocks."""

    def __init__(self, model):
        owner = self
        self.seen: dict[int, int] = {}
        self.inside = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if owner.inside and func in SAVE_OPS:
                    for t in out if isinstance(out, tuple | list) else [out]:
                        if isinstance(t, torch.Tensor):
                            st = t.untyped_storage()
                            owner.seen[st.data_ptr()] = st.nbytes()
                return out

        self.mode = Mode()
        self.handles = []
        for block in model.layers.values():
            self.handles.append(block.register_forward_pre_hook(lambda m, a: self._enter()))
            self.handles.append(block.register_forward_hook(lambda m, a, o: self._leave()))

    def _enter(self):
        self.inside += 1

    def _leave(self):
        self.inside -= 1

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        for h in self.handles:
            h.remove()


def _measure_first_stage(cfg, lay: ParallelConfig, mbs: int, seq_len: int) -> int:
    """Pipeline rank 0 of pp=2 (1F1B): the first half of the blocks, no head, pp micro-batches."""
    model = build_model(cfg, seed=0)
    for i in range(cfg.num_layers // 2, cfg.num_layers):
        del model.layers[str(i)]
    model.norm = model.output = None
    apply_ac(model, lay.activation_checkpoint)
    total = 0
    for _ in range(lay.pp):  # 1F1B keeps pp micro-batches in flight on the first stage
        x = torch.randint(0, cfg.vocab_size, (mbs, seq_len))
        measured, _out = measure_saved_bytes(model, lambda x=x: model(x))
        total += measured
    return total


def _measure_last_stage(cfg, lay: ParallelConfig, mbs: int, seq_len: int) -> int:
    """Pipeline rank 1 of pp=2 (1F1B): the second half of the blocks and the head (final norm,
    output, cross-entropy from logits as scalelab.parallel.pipeline_parallel computes it), one micro-batch."""
    model = build_model(cfg, seed=0)
    for i in range(cfg.num_layers // 2):
        del model.layers[str(i)]
    model.tok_embeddings = None
    apply_ac(model, lay.activation_checkpoint)
    h = torch.randn(mbs, seq_len, cfg.d_model, requires_grad=True)
    y = torch.randint(0, cfg.vocab_size, (mbs, seq_len))

    def run():
        return F.cross_entropy(model(h).flatten(0, 1).float(), y.flatten())

    measured, _ = measure_saved_bytes(model, run)
    return measured


def _row(model_name, cfg, lay: ParallelConfig, mbs: int, seq_len: int, measured: int, pp_stage: str = "first") -> dict:
    est, _ = activation_bytes(cfg, lay, seq_len, micro_batch_sequences=mbs, kernels="torch", act=4, pp_stage=pp_stage)
    return dict(
        model=model_name,
        seq_len=seq_len,
        layout=candidate_name(lay, mbs) + (f" ({pp_stage} stage)" if lay.pp > 1 else ""),
        estimate_bytes=int(est),
        measured_bytes=int(measured),
        rel_error=est / measured - 1.0,
    )


def local_rows(quick: bool = False) -> list[dict]:
    """Single-process combinations (quick: a subset for the tests)."""
    rows = []
    sizes = ("debug", "tiny-1m") if quick else ("debug", "tiny-1m", "tiny-3m")
    seqs = (64,) if quick else (64, 128)
    for name in sizes:
        cfg = get_preset(name, kernels="torch")
        for seq_len in seqs:
            for ac in ("none", "full", "selective") if not quick else ("none", "full"):
                for mbs in (1, 2) if not quick else (2,):
                    lay = ParallelConfig(activation_checkpoint=ac)
                    rows.append(_row(name, cfg, lay, mbs, seq_len, _measure_single(cfg, lay, mbs, seq_len)))
    moe = moe_debug_model()
    for seq_len in (32,) if quick else (32, 64):
        lay = ParallelConfig()
        rows.append(_row("moe-debug", moe, lay, 2, seq_len, _measure_single(moe, lay, 2, seq_len)))
    cfg = get_preset("tiny-1m", kernels="torch")
    for ac in ("none",) if quick else ("none", "full"):
        lay = ParallelConfig(pp=2, activation_checkpoint=ac)
        rows.append(_row("tiny-1m", cfg, lay, 1, 128, _measure_first_stage(cfg, lay, 1, 128)))
        rows.append(_row("tiny-1m", cfg, lay, 1, 128, _measure_last_stage(cfg, lay, 1, 128), pp_stage="last"))
    return rows


# --- tensor / context parallel, measured on rank 0 of a 2-process group ---------------------------------
_SPAWNED_MBS = 2  # sequences per micro-batch of every spawned measurement
_SPAWNED = (
    ("tp2", ParallelConfig(tp=2, sequence_parallel=False)),
    ("tp2sp", ParallelConfig(tp=2, sequence_parallel=True)),
    ("tp2sp+ac", ParallelConfig(tp=2, sequence_parallel=True, activation_checkpoint="full")),
    ("cp2", ParallelConfig(cp=2)),
    ("cp2-ring", ParallelConfig(cp=2, cp_variant="ring")),
)


def _spawned_worker(model_name: str, seq_len: int, out_dir: str) -> None:
    cfg = get_preset(model_name, kernels="torch")
    results = {}
    for label, lay in _SPAWNED:
        model = build_model(cfg, seed=0)
        x = torch.randint(0, cfg.vocab_size, (_SPAWNED_MBS, seq_len + 1), generator=torch.Generator())
        tokens, targets, positions = x[:, :-1], x[:, 1:], None
        ctx = None
        if lay.tp > 1:
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
            apply_tp(model, mesh["tp"], sequence_parallel=lay.sequence_parallel, loss_parallel=lay.sequence_parallel)
            ctx = loss_parallel if lay.sequence_parallel else None
        else:
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
            apply_cp(model, mesh["cp"], lay.cp_variant)
            tokens, targets, positions = shard_sequence_batch(tokens, targets, dist.get_rank(), 2)
        apply_ac(model, lay.activation_checkpoint)

        def run(model=model, tokens=tokens, targets=targets, positions=positions, ctx=ctx):
            if ctx is None:
                logits = model(tokens, positions)
                return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
            with ctx():
                logits = model(tokens, positions)
                return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

        measured, loss = measure_saved_bytes(model, run)
        with ctx() if ctx else torch.enable_grad():
            loss.backward()
        results[label] = measured
    results.update(_moe_tp_measurements(seq_len))
    if dist.get_rank() == 0:
        torch.save(results, Path(out_dir) / "spawned.pt")
    dist.barrier()


# MoE blocks under TP (router replicated, shared experts column/row-parallel, routed experts split by
# hidden width over tp): a wider MoE than the parity one, so the experts' internals dominate.
def _moe_tp_cfg():
    return moe_debug_model(moe_d_ff=128, max_seq_len=256)


_SPAWNED_MOE = (
    ("moe-tp2", ParallelConfig(tp=2, sequence_parallel=False)),
    ("moe-tp2sp", ParallelConfig(tp=2, sequence_parallel=True)),
)


def _moe_tp_measurements(seq_len: int) -> dict[str, int]:
    cfg = _moe_tp_cfg()
    dims = ParallelDims(tp=2)
    dims.build_mesh("cpu")
    out = {}
    for label, lay in _SPAWNED_MOE:
        model = build_model(cfg, seed=0)
        apply_tp(
            model, dims.mesh_for("tp"), sequence_parallel=lay.sequence_parallel, loss_parallel=lay.sequence_parallel
        )
        apply_ep(model, dims.ep_mesh)  # no FSDP: its gathered parameters would count as saved
        x = torch.randint(0, cfg.vocab_size, (_SPAWNED_MBS, seq_len + 1), generator=torch.Generator())

        def run(model=model, x=x):
            logits = model(x[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())

        with loss_parallel() if lay.sequence_parallel else torch.enable_grad():
            measured, loss = measure_saved_bytes(model, run)
            loss.backward()
        out[label] = measured
    return out


def spawned_rows(model_name: str = "tiny-1m", seq_len: int = 128) -> list[dict]:
    cfg = get_preset(model_name, kernels="torch")
    with tempfile.TemporaryDirectory(prefix="scalelab-act-") as tmp:
        spawn(_spawned_worker, 2, (model_name, seq_len, tmp), backend="gloo")
        measured = torch.load(Path(tmp) / "spawned.pt", weights_only=True)
    rows = [_row(model_name, cfg, lay, _SPAWNED_MBS, seq_len, measured[label]) for label, lay in _SPAWNED]
    moe = _moe_tp_cfg()
    return rows + [_row("moe-tp", moe, lay, _SPAWNED_MBS, seq_len, measured[label]) for label, lay in _SPAWNED_MOE]


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'model':<10} {'seq':>5} {'layout':<20} {'estimate':>12} {'measured':>12} {'error':>8}", "-" * 72]
    for r in rows:
        lines.append(
            f"{r['model']:<10} {r['seq_len']:>5} {r['layout']:<20} {r['estimate_bytes']:>12,} "
            f"{r['measured_bytes']:>12,} {r['rel_error']:>+8.2%}"
        )
    worst = max(abs(r["rel_error"]) for r in rows)
    lines.append(f"{len(rows)} combinations; worst |error| {worst:.2%}")
    return "\n".join(lines)
