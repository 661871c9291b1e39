"""Contracts of the parallelism modules against their dense counterparts, one layer at a time.

The parity tests compare whole training steps; these state what each module promises about its own
tensors, so a broken one names the layer and the tensor.

Tensor parallel (scalelab.parallel.tp, world 2, gloo): the debug model under `apply_tp` against the
same model on one device, same batch.
  - column-parallel layers (wq, wk, wv, w1, w3 and the output projection) hold rows
    [r·n/tp, (r+1)·n/tp) of the weight (Shard(0)); row-parallel layers (wo, w2) hold columns
    (Shard(1)); the embedding holds vocabulary rows. The local shard of every weight and of its
    gradient equals the matching chunk of the full layer's.
  - every attention, feed-forward and block output equals the dense one (complete on each rank).
Sequence parallel (+ loss parallel): the same, and the residual stream, the attention and
feed-forward outputs leave each rank as its chunk of the sequence; the norms' gains are
replicated, each rank's gradient of them is Partial (its sequence chunk's share) and their sum is
the dense gradient; the logits are the rank's chunk of the vocabulary.
Tolerances (fp32): parameters exact; activations and gradients rtol 1e-5, atol 1e-7 (row-parallel
sums run in another order: errors of ~1e-8, against gradients of 3e-4 and more here).

Pipeline stage split (scalelab.parallel.pipeline_parallel.Pipeline, one process): every schedule's stages,
composed in stage order, are the dense model: each parameter in exactly one stage, the logits and
every gradient equal to the dense model's exactly (the same operations in the same order).
"""

import contextlib
import copy
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.testing import assert_close

from scalelab.models.llama import build_model
from scalelab.parallel.backend import spawn
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.parity import debug_model
from scalelab.parallel.pipeline_parallel import Pipeline
from scalelab.parallel.step import loss_from_logits
from scalelab.parallel.tp import apply_tp

TP = 2
SEQ_LEN = 16
COLUMN = ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3")
ROW = ("attention.wo", "feed_forward.w2")
ACT = dict(rtol=1e-5, atol=1e-7)  # activations and gradients (see the module docstring)


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _batch(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, cfg.vocab_size, (4, SEQ_LEN + 1), generator=torch.Generator().manual_seed(7))
    return tokens[:, :-1], tokens[:, 1:]


def _shard_dim(name: str) -> int | None:
    """The dim a parameter is split along over tp (None: replicated)."""
    module = name.rsplit(".", 1)[0]
    if module in ("tok_embeddings", "output") or module.endswith(COLUMN):
        return 0  # vocabulary rows / output features
    if module.endswith(ROW):
        return 1  # input features
    return None  # RMSNorm gains


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def _record(model, store: dict) -> None:
    """Every block's, attention's and feed-forward's output of the next forward, into `store`."""
    for i, block in model.layers.items():
        for name, module in (("block", block), ("attention", block.attention), ("feed_forward", block.feed_forward)):
            module.register_forward_hook(lambda m, args, out, key=f"{name}.{i}": store.__setitem__(key, _local(out)))


def _forward_backward(model, tokens, targets, parallel_loss: bool) -> dict:
    outputs: dict = {}
    _record(model, outputs)
    with loss_parallel() if parallel_loss else contextlib.nullcontext():
        logits = model(tokens)
        loss, _ = loss_from_logits(logits, targets)
        loss.backward()
    return {
        "outputs": outputs,
        "logits": _local(logits),
        "params": {n: _local(p) for n, p in model.named_parameters()},
        "grads": {n: _local(p.grad) for n, p in model.named_parameters()},
        "placements": {n: str(p.placements) for n, p in model.named_parameters() if isinstance(p, DTensor)},
        "grad_placements": {n: str(p.grad.placements) for n, p in model.named_parameters() if isinstance(p, DTensor)},
        # a replicated parameter's gradient as the optimizer reads it (a Partial one is summed)
        "reduced_grads": {
            n: p.grad.full_tensor().detach().clone()
            for n, p in model.named_parameters()
            if isinstance(p, DTensor) and all(pl.is_replicate() for pl in p.placements)
        },
    }


def _tp_worker(out_dir: str) -> None:
    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    cfg = debug_model(2)
    tokens, targets = _batch(cfg)
    result = {}
    for sp in (False, True):
        model = build_model(cfg, "cpu", seed=0)
        apply_tp(model, mesh, sequence_parallel=sp, loss_parallel=sp)
        result[sp] = _forward_backward(model, tokens, targets, parallel_loss=sp)
    torch.save(result, Path(out_dir) / f"tp.rank{dist.get_rank()}.pt")


@pytest.fixture(scope="module")
def tp_ranks() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="scalelab-tp-contract-") as tmp:
        spawn(_tp_worker, TP, (tmp,), backend="gloo")
        return [torch.load(Path(tmp) / f"tp.rank{r}.pt", weights_only=True) for r in range(TP)]


@pytest.fixture(scope="module")
def dense() -> dict:
    cfg = debug_model(2)
    tokens, targets = _batch(cfg)
    return _forward_backward(build_model(cfg, "cpu", seed=0), tokens, targets, parallel_loss=False)


def _chunk(t: torch.Tensor, dim: int | None, rank: int) -> torch.Tensor:
    return t if dim is None else t.chunk(TP, dim=dim)[rank]


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_tp_column_and_row_parallel_shards_hold_the_dense_weights_and_gradients(tp_ranks, dense, sp):
    for rank, result in enumerate(tp_ranks):
        got = result[sp]
        assert set(got["grads"]) == set(dense["grads"])
        for name, full_grad in dense["grads"].items():
            dim = _shard_dim(name)
            grad = got["grads"][name]
            if dim is not None:  # the layer's sharding as the contract states it, its gradient alike
                assert got["placements"].get(name) == got["grad_placements"].get(name) == f"(Shard(dim={dim}),)", name
            elif sp:  # a norm's gain: replicated; each rank's gradient covers its sequence chunk only
                assert got["placements"].get(name) == "(Replicate(),)", name
                assert got["grad_placements"].get(name) == "(Partial(sum),)", name
                grad = got["reduced_grads"][name]
            assert_close(got["params"][name], _chunk(dense["params"][name], dim, rank), rtol=0, atol=0, msg=name)
            assert_close(grad, _chunk(full_grad, dim, rank), **ACT, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_tp_layer_outputs_equal_the_dense_layers(tp_ranks, dense, sp):
    for rank, result in enumerate(tp_ranks):
        got = result[sp]
        assert set(got["outputs"]) == set(dense["outputs"])
        for key, full in dense["outputs"].items():
            # under SP the residual stream and the layers' outputs are this rank's sequence chunk
            want = _chunk(full, 1 if sp else None, rank)
            assert_close(got["outputs"][key], want, **ACT, msg=lambda m, k=f"{key} (rank {rank})": f"{k}: {m}")
        # loss parallel (with SP here): this rank's vocabulary chunk of the logits
        assert_close(got["logits"], _chunk(dense["logits"], -1 if sp else None, rank), **ACT)


class _PipelineAxis:
    """A pipeline axis of `size` ranks seen from `rank`: what Pipeline reads of its mesh to split
    the model (its size, this rank's place); the stages here are called directly, never scheduled."""

    def __init__(self, size: int, rank: int):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def get_local_rank(self) -> int:
        return self._rank

    def get_group(self):
        return None


@pytest.mark.parametrize(
    "pp, schedule",
    [(2, "gpipe"), (2, "1f1b"), (3, "1f1b"), (4, "1f1b"), (2, "interleaved-1f1b"), (2, "zero-bubble")],
)
def test_pipeline_stages_composed_are_the_dense_model(pp, schedule):
    cfg = debug_model(4)
    tokens, targets = _batch(cfg)
    model = build_model(cfg, "cpu", seed=0)
    pcfg = ParallelConfig(pp=pp, pp_schedule=schedule)
    stages = {}
    for rank in range(pp):
        pipe = Pipeline(copy.deepcopy(model), _PipelineAxis(pp, rank), pcfg, torch.device("cpu"), cfg, SEQ_LEN)
        stages.update(zip(pipe.stage_ids, pipe.stage_modules))
    assert sorted(stages) == list(range(len(stages))) and len(stages) >= pp
    names = [n for s in sorted(stages) for n, _ in stages[s].named_parameters()]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # each parameter in one stage

    x = tokens
    for s in sorted(stages):
        x = stages[s](x)
    loss, _ = loss_from_logits(x, targets)
    loss.backward()
    ref_loss, _ = loss_from_logits(model(tokens), targets)
    ref_loss.backward()
    assert_close(x, model(tokens), rtol=0, atol=0)
    dense_grads = dict(model.named_parameters())
    for s, stage in stages.items():
        for name, p in stage.named_parameters():
            assert_close(
                p.grad, dense_grads[name].grad, rtol=0, atol=0, msg=lambda m, n=name, s=s: f"{n} (stage {s}): {m}"
            )
