"""The per-step operations the training loop runs under a layout (one device included).

    ops = ParallelStep(model, dims, pcfg, z_loss=0.0, pipeline=pipe)
    loss = ops.forward_backward(inputs, targets, scale=1 / num_micro)   # same value on every rank
    grad_norm = ops.clip_grad_norm(model, max_norm=1.0)
    loss, metrics = ops.eval_loss(model, inputs, targets)
    row = ops.router_row(model)           # MoE router columns of the global batch ({} for dense)

Without tensor parallel the loss is the fused projection + cross-entropy of
`scalelab.models.loss.lm_loss`, computed inside the model's forward (`model(x, targets=y)`), where
FSDP2 holds `output.weight` gathered (a separate `lm_loss(model.hidden_states ...)` would find it
resharded). Under TP the output projection is column-sharded, so the loss comes from its logits
(vocab-sharded under loss parallel): the same mean cross-entropy (+ z-loss), in fp32.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from scalelab.models.moe import step_row
from scalelab.parallel.backend import SumOverGroup, for_collective
from scalelab.parallel.context_parallel import shard_sequence_batch, token_weighted_mean
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.expert_parallel import global_router_row


def loss_from_logits(
    logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean CE + z_loss * mean logsumexp^2, detached mean CE) of logits [B, T, V].

    `logits` may be a plain tensor, a vocab-sharded DTensor (under `loss_parallel()`) or a replicated
    DTensor (tensor parallel without loss parallel: its local tensor is the whole logits).
    """
    if isinstance(logits, DTensor) and all(p.is_replicate() for p in logits.placements):
        logits = logits.to_local()
    flat = logits.flatten(0, 1).float()
    flat_targets = targets.flatten()
    valid = flat_targets != ignore_index
    n_valid = valid.sum().clamp(min=1)
    loss = F.cross_entropy(flat, flat_targets, ignore_index=ignore_index, reduction="sum") / n_valid
    ce = loss.detach()
    if isinstance(ce, DTensor):
        ce = ce.full_tensor()
    if z_loss:
        if isinstance(flat, DTensor):  # vocab-sharded: logsumexp across the tp ranks by hand
            lse = _sharded_logsumexp(flat)
            loss = loss.to_local()  # replicated scalar; the z-term below is a plain tensor
        else:
            lse = torch.logsumexp(flat, dim=-1)
        loss = loss + z_loss * (lse.pow(2) * valid).sum() / n_valid
    return loss, ce


def _sharded_logsumexp(flat: DTensor) -> torch.Tensor:
    """logsumexp over the last dim of a Shard(-1) DTensor [N, V] -> plain tensor [N] on every rank."""
    mesh = flat.device_mesh
    group = mesh.get_group()
    local = flat.to_local()  # [N, V / tp]; its gradient flows back into the DTensor
    with torch.no_grad():  # the max only stabilises exp(); any constant gives the same value
        shift = for_collective(local.amax(dim=-1))
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    partial = torch.exp(local - shift[:, None]).sum(dim=-1)
    return shift + torch.log(SumOverGroup.apply(partial, group))


def global_grad_norm(params: list[torch.Tensor], pp_group=None) -> torch.Tensor:
    """The 2-norm of all gradients of the whole model, whatever their sharding.

    Gradients are grouped by (mesh, placements): within a group torch's `get_total_norm` gives a
    DTensor whose `full_tensor()` is that group's norm over all shards; plain tensors are complete
    on every rank. Pipeline stages hold disjoint parameters, so their squared norms are summed over
    the pp group.
    """
    groups: dict = {}
    for p in params:
        if p.grad is None:
            continue
        g = p.grad
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else None
        groups.setdefault(key, []).append(g)
    device = params[0].device if params else torch.device("cpu")
    total_sq = torch.zeros((), dtype=torch.float32, device=device)
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq = total_sq + norm.float().pow(2)
    if pp_group is not None:
        total_sq = for_collective(total_sq)
        dist.all_reduce(total_sq, group=pp_group)
    return total_sq.sqrt()


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float, pp_group=None) -> float:
    """Like torch.nn.utils.clip_grad_norm_ (same coefficient), for sharded and pipelined models."""
    norm = global_grad_norm(params, pp_group)
    if max_norm > 0:
        coef = float(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return float(norm)


class ParallelStep:
    """forward_backward / eval_loss / clip_grad_norm / router_row for one parallelized model (see module doc)."""

    def __init__(self, model, dims: ParallelDims, pcfg, *, z_loss: float = 0.0, pipeline=None):
        self.model = model
        self.dims = dims
        self.z_loss = z_loss
        self.pipeline = pipeline  # scalelab.parallel.pipeline_parallel.Pipeline or None
        self.loss_parallel = dims.tp > 1 and pcfg.loss_parallel
        # Without TP the output layer is whole on each rank (FSDP gathers it inside forward): the
        # fused projection + cross-entropy then runs in the model's forward, never building logits.
        self.fused_loss = dims.tp == 1
        self.pp_group = dims.group("pp") if dims.pp > 1 else None
        self.cp_group = dims.group("cp") if dims.cp > 1 else None

    def _loss_ctx(self):
        return loss_parallel() if self.loss_parallel else contextlib.nullcontext()

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Backpropagate scale × mean loss of this batch; returns the detached mean CE (all ranks)."""
        if self.pipeline is not None:
            with self._loss_ctx():
                loss = self.pipeline.step(inputs, targets, scale, self.z_loss)
            return loss
        inputs, targets, kwargs = self._shard(inputs, targets)
        with self._loss_ctx():
            loss, ce = self._loss(self.model, inputs, targets, kwargs, self.z_loss)
            (loss * scale).backward()
        return self._mean_over_cp(ce)

    def _loss(self, model, inputs, targets, kwargs, z_loss: float):
        """(loss to backpropagate, detached mean CE) of this rank's rows."""
        if self.fused_loss:
            loss, metrics = model(inputs, targets=targets, z_loss=z_loss, **kwargs)
            return loss, metrics["ce"]
        return loss_from_logits(model(inputs, **kwargs), targets, z_loss)

    def _shard(self, inputs, targets):
        """This context-parallel rank's rows and positions (the batch as is without cp)."""
        if self.cp_group is None:
            return inputs, targets, {}
        cp_rank = self.dims.mesh_for("cp").get_local_rank()
        inputs, targets, positions = shard_sequence_batch(inputs, targets, cp_rank, self.dims.cp)
        return inputs, targets, {"positions": positions}

    def _mean_over_cp(self, value: torch.Tensor) -> torch.Tensor:
        """Average a detached per-rank mean over the cp group (equal token counts per rank)."""
        if self.cp_group is None:
            return value
        out = value.detach().float().reshape(()).clone().contiguous()
        dist.all_reduce(out, group=self.cp_group)
        return out / self.dims.cp

    @torch.no_grad()
    def eval_loss(self, model, inputs: torch.Tensor, targets: torch.Tensor):
        """(mean cross-entropy, metrics) without gradients or z-loss: the validation loss."""
        if self.pipeline is not None:
            with self._loss_ctx():
                loss = self.pipeline.forward_loss(inputs, targets)
        else:
            inputs, targets, kwargs = self._shard(inputs, targets)
            with self._loss_ctx():
                _, ce = self._loss(model, inputs, targets, kwargs, 0.0)  # ce: a plain tensor
            if self.cp_group is not None:
                ce = token_weighted_mean(ce, (targets != -100).sum(), self.cp_group)
            loss = ce
        return loss, {"ce": loss}

    def clip_grad_norm(self, model, max_norm: float) -> float:
        """The global gradient norm before clipping (clipped to max_norm when > 0)."""
        # Expert shards are DTensors over (dp_mod_ep, ep, tp): their norm is complete like any other.
        return clip_grad_norm_(list(model.parameters()), max_norm, self.pp_group)

    def router_row(self, model) -> dict[str, float]:
        """MoE router columns of the global batch for the run records ({} for dense models).

        Under a layout this is a collective: every rank must call it at the same steps.
        """
        if self.dims.world_size == 1:
            return step_row(model)
        return global_router_row(model, self.dims)
