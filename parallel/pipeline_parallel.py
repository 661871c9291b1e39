"""Pipeline parallel: split the model into stages by layers and run a torch.distributed.pipelining schedule.

    pipe = build_pipeline(model, pp_mesh, pcfg, device, local_batch_sequences, seq_len)
    pipe.stage_modules          # this rank's model chunks (pruned Transformers), to shard further
    pipe.model_parts            # one module holding them all under the original names (optimizer, DCP)
    loss = pipe.step(inputs, targets, scale, z_loss)       # forward + backward of all micro-batches

Stages are contiguous runs of blocks; the first also holds the embedding, the last the final norm
and the output projection. `split_layers` balances them by training FLOPs per token (or by
parameter count) with an exact min-max partition. Schedules:
    gpipe            all forwards, then all backwards (1 stage per rank)
    1f1b             one-forward-one-backward steady state (1 stage per rank)
    interleaved-1f1b 2 stages per rank, stage s on rank s % pp (smaller bubble)
    zero-bubble      ZB-V: 2 stages per rank in a V (rank r holds s=r and s=2pp-1-r), backward split
                     into input- and weight-gradients to fill the bubble
Each chunk is a pruned copy of the full Transformer (blocks deleted, tok_embeddings / norm /
output set to None), so parameter names, and with them checkpoints, are the single-device ones.
With context parallel (chunks marked by `apply_cp`) each batch is cut to this cp rank's rows, the
chunks supply their own RoPE positions, and the reported loss is averaged over the cp group.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

from scalelab.models.moe import MoE, moe_modules
from scalelab.parallel.backend import for_collective
from scalelab.parallel.dims import num_microbatches, stages_per_rank
from scalelab.parallel.pipeline_split import layer_costs, rank_of_stage, split_layers, stage_ids_for_rank
from scalelab.parallel.step import loss_from_logits

_SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "zero-bubble": ScheduleZBVZeroBubble,
}


def prune_to_stage(model: nn.Module, layer_ids: list[int], first: bool, last: bool) -> nn.Module:
    """Drop the blocks not in `layer_ids` (and embedding / head unless first / last), in place."""
    keep = {str(i) for i in layer_ids}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


class ModelParts(nn.Module):
    """This rank's pipeline chunks seen as one module with the single-device parameter names.

    It shares (does not copy) the chunks' submodules, so `named_parameters()`, the optimizer and
    `get_state_dict` see `layers.5.attention.wq.weight` exactly as on one device. Not callable:
    the pipeline schedule runs the chunks.
    """

    def __init__(self, chunks: list[nn.Module], pp_group=None):
        super().__init__()
        self.tok_embeddings = next((c.tok_embeddings for c in chunks if c.tok_embeddings is not None), None)
        layers = {}
        for c in chunks:
            layers.update(dict(c.layers.items()))
        self.layers = nn.ModuleDict({k: layers[k] for k in sorted(layers, key=int)})
        self.norm = next((c.norm for c in chunks if c.norm is not None), None)
        self.output = next((c.output for c in chunks if c.output is not None), None)
        self.chunks = chunks  # plain list: not registered twice
        self.pp_group = pp_group

    def forward(self, *args, **kwargs):
        raise RuntimeError("a pipelined model runs through its schedule (ParallelStep), not model(x)")

    def moe_layers(self) -> list[nn.Module]:
        return moe_modules(self)

    def moe_stats(self) -> list[dict[str, torch.Tensor]]:
        """Router statistics of every MoE layer of the model from the last pipeline micro-batch,
        gathered from all pipeline ranks: a collective over the pipeline group, which every rank
        calls at logging steps (the training loop's router row), so rank 0 reports every stage."""
        mine = [
            (int(i), {k: v.detach().cpu() for k, v in b.feed_forward.last_stats.items()})
            for i, b in self.layers.items()
            if isinstance(b.feed_forward, MoE) and b.feed_forward.last_stats
        ]
        everyone: list = [None] * dist.get_world_size(self.pp_group)
        dist.all_gather_object(everyone, mine, group=self.pp_group)
        return [stats for _, stats in sorted((i for part in everyone for i in part), key=lambda t: t[0])]


class Pipeline:
    """The stages of this rank, the schedule, and the loss plumbing (see module docstring)."""

    def __init__(self, model: nn.Module, pp_mesh, pcfg, device: torch.device, model_cfg, seq_len: int):
        self.pp = pp_mesh.size()
        self.pp_rank = pp_mesh.get_local_rank()
        self.group = pp_mesh.get_group()
        self.schedule_name = pcfg.pp_schedule
        self.num_stages = self.pp * stages_per_rank(self.schedule_name)
        self.n_microbatches = num_microbatches(pcfg, self.pp)
        self.device = device
        self.d_model = model_cfg.d_model
        costs, first_extra, last_extra = layer_costs(model_cfg, seq_len)
        self.layers_of_stage = split_layers(costs, self.num_stages, first_extra, last_extra)
        self.stage_ids = stage_ids_for_rank(self.pp_rank, self.pp, self.schedule_name)
        chunks = []
        for k, s in enumerate(self.stage_ids):
            chunk = model if k == len(self.stage_ids) - 1 else copy.deepcopy(model)
            chunks.append(prune_to_stage(chunk, self.layers_of_stage[s], s == 0, s == self.num_stages - 1))
        self.stage_modules = chunks
        self._scale = 1.0
        self._z_loss = 0.0
        self._ces: list[torch.Tensor] = []
        self.schedule = None

    def finalize(self) -> ModelParts:
        """Create the PipelineStages and the schedule (after TP/FSDP were applied to the chunks)."""
        self.stages = [
            PipelineStage(m, s, self.num_stages, self.device, group=self.group)
            for m, s in zip(self.stage_modules, self.stage_ids)
        ]
        cls = _SCHEDULES[self.schedule_name]
        stages = self.stages[0] if stages_per_rank(self.schedule_name) == 1 else self.stages
        # scale_grads=False: the schedule would divide the whole .grad by n_microbatches after each
        # step, including gradients accumulated by earlier loop micro-batches; the 1/n goes into
        # the loss instead (_loss), which is exact and accumulation-safe.
        self.schedule = cls(stages, n_microbatches=self.n_microbatches, loss_fn=self._loss, scale_grads=False)
        self.model_parts = ModelParts(self.stage_modules, self.group)
        # context parallel (apply_cp marked the chunks): every stage sees this cp rank's rows of each
        # micro-batch, the chunks supply their own positions, and the loss is averaged over cp
        self.cp = getattr(self.stage_modules[0], "scalelab_cp", None)
        return self.model_parts

    def _cp_rows(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cp is None:
            return inputs, targets
        return self.cp.rows(inputs), self.cp.rows(targets)

    def _cp_mean(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.cp is None else self.cp.mean(loss)

    def _loss(self, output, target):
        loss, ce = loss_from_logits(output, target, self._z_loss)
        self._ces.append(ce.float())
        return loss * (self._scale / self.n_microbatches)

    @property
    def last_stage_rank(self) -> int:
        return rank_of_stage(self.num_stages - 1, self.pp, self.schedule_name)

    def _share_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Broadcast the last stage's loss to every rank of the pipeline group."""
        loss = for_collective(loss.detach().float().reshape(()))
        dist.broadcast(loss, src=dist.get_global_rank(self.group, self.last_stage_rank), group=self.group)
        return loss

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, scale: float, z_loss: float) -> torch.Tensor:
        """One pipelined forward+backward of a batch (split into micro-batches); the mean loss."""
        self._scale, self._z_loss, self._ces = scale, z_loss, []
        inputs, targets = self._cp_rows(inputs, targets)
        for moe in self.model_parts.moe_layers():  # aux losses scaled like each micro-batch's LM loss
            moe.loss_scale = scale / self.n_microbatches
        losses: list[torch.Tensor] = []
        has_first = 0 in self.stage_ids
        has_last = self.num_stages - 1 in self.stage_ids
        args = (inputs,) if has_first else ()
        self.schedule.step(*args, target=targets if has_last else None, losses=losses, return_outputs=False)
        if has_last:
            # cross-entropy alone, as the loop reports it; the last n entries are this step's
            # micro-batches (the schedule's first step may also call the loss while initialising)
            loss = torch.stack(self._ces[-self.n_microbatches :]).mean()
        else:
            loss = torch.zeros((), device=self.device)
        return self._cp_mean(self._share_loss(loss))

    @torch.no_grad()
    def forward_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss without gradients: the stages run in order, activations passed point to point.

        Not through the schedule, whose P2P buffers are sized for the training micro-batch.
        """
        inputs, targets = self._cp_rows(inputs, targets)
        x = inputs
        loss = torch.zeros((), device=self.device)
        for s in range(self.num_stages):
            owner = rank_of_stage(s, self.pp, self.schedule_name)
            prev_owner = rank_of_stage(s - 1, self.pp, self.schedule_name) if s > 0 else owner
            if owner == self.pp_rank:
                if prev_owner != self.pp_rank:
                    x = self._recv(prev_owner, inputs)
                out = self.stage_modules[self.stage_ids.index(s)](x)
                if s == self.num_stages - 1:
                    loss = loss_from_logits(out, targets, 0.0)[1].float()
                else:
                    x = out
                    next_owner = rank_of_stage(s + 1, self.pp, self.schedule_name)
                    if next_owner != self.pp_rank:
                        dist.send(
                            for_collective(x.float()), dist.get_global_rank(self.group, next_owner), group=self.group
                        )
        loss = self._share_loss(loss)
        # token-weighted: evaluation rows may hold their targets on one cp rank's part only
        return loss if self.cp is None else self.cp.token_mean(loss, (targets != -100).sum())

    def _recv(self, src: int, inputs: torch.Tensor) -> torch.Tensor:
        # The stage boundary activation is [B, T_local, D]; T_local = T / tp under sequence parallel
        # (T being this cp rank's rows under context parallel: `inputs` are sharded already).
        seq_local = inputs.shape[1] // self._seq_divisor
        buf = torch.empty((inputs.shape[0], seq_local, self.d_model), dtype=torch.float32, device=self.device)
        dist.recv(buf, dist.get_global_rank(self.group, src), group=self.group)
        return buf

    _seq_divisor = 1  # set to tp by parallelize() under sequence parallel
