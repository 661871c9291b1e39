"""Per-GPU memory of a layout, for the planner: exact state bytes and an activation formula.

    lay = ParallelConfig(dp_shard=8, tp=2, activation_checkpoint="full")
    state = state_bytes(cfg, lay, seq_len=4096)             # params / grads / optimizer, exact
    act = activation_bytes(cfg, lay, 4096, micro_batch_sequences=1, kernels="torch", act=4)
    measured = measure_saved_bytes(model, tokens)          # bytes autograd keeps for backward

State (exact, the rank holding the most): FSDP2 keeps fp32 sharded parameters even under bf16
compute; gradients have the parameters' local shapes; AdamW holds exp_avg + exp_avg_sq and one fp32
`step` per parameter tensor. Sharding: pipeline stages hold their blocks (+ embedding first, norm and
output last; `scalelab.parallel.pipeline_parallel`'s split), TP splits wq/wk/wv/w1/w3/output rows and
wo/w2 columns and the embedding's vocabulary, EP splits the experts' dim 0 by ep, and FSDP then
chunks dim 0 over dp_shard×cp (experts: over dp_shard×cp/ep) like torch.chunk, rank 0 getting the
largest chunk. Equal to `scalelab.parallel.memory.expected_memory` for dense layouts (tests).

Activations: bytes saved for backward per micro-batch, counted from what each op of the
implementation saves (`kernels`):
  "torch" (the reference ops, what CPU runs; validated against measured saved tensors) per token
  and layer: each RMSNorm saves its fp32 input copy, the rsqrt and the fp32 normalised product
  (4·(2D+1) bytes) plus its output (the next matmul's input, D); SDPA saves q and the (GQA-repeated)
  k and v (3·H·Dh), its output (H·Dh) and the fp32 log-sum-exp (H); SwiGLU saves w1 and w3 outputs,
  silu(w1) and the product (4F). MoE layers: router input is the norm output; logits/probs (E,
  fp32) and the z-loss log-sum-exp, three int64 index sets of k per token, the routing weights,
  the gathered rows (k·D), per routed row 4F_e + 2D (expert output, weighted), shared 4·S·F_e.
  The head (last stage): the final norm, fp32 logits (V, or V/tp with loss parallel), 16 bytes of ids.
  "fused" (the Triton kernels on GPU, from their save_for_backward: RMSNorm saves input + rstd,
  attention q/k/v without repetition + o + lse, SwiGLU its two inputs, fused cross-entropy no
  logits) is the same count with those terms; it is not validated on CPU.
Layout effects: tokens per rank = micro_batch_sequences·seq_len/cp; TP divides heads and F (with
sequence parallel also the norm terms; the all-gathered matmul inputs stay full); the all-gather
CP variant saves the gathered K/V (seq_len, not seq_len/cp); ring saves one K/V block per hop.
Activation checkpointing full: a block keeps only its input (D); selective: the matmul/attention
outputs + the block input. Pipeline: a rank holds its stages' layers for the micro-batches in flight
(1F1B: pp - rank; GPipe: all).
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import stages_per_rank
from scalelab.parallel.pipeline_split import layer_costs, split_layers, stage_ids_for_rank

_COLWISE = (
    "attention.wq",
    "attention.wk",
    "attention.wv",
    "feed_forward.w1",
    "feed_forward.w3",
    "shared_experts.w1",
    "shared_experts.w3",
)
_ROWWISE = ("attention.wo", "feed_forward.w2", "shared_experts.w2")


@dataclass(kw_only=True, slots=True)
class StateBytes:
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    num_param_tensors: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optim_bytes

    def as_dict(self) -> dict:
        return asdict(self)


# --- parameters -------------------------------------------------------------------------------------
def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Every parameter of the single-device model (dense or MoE) with its full shape."""
    return dict(_param_shapes(*config_key(cfg)))


def config_key(cfg) -> tuple[type, tuple]:
    """(class, field values): a model config as a hashable key, so that what depends only on the model
    is computed once per model, not once per candidate layout of the planner's search."""
    return type(cfg), _field_getter(type(cfg))(cfg)


@lru_cache(maxsize=8)
def _field_getter(cls):
    return operator.attrgetter(*(f.name for f in fields(cls)))


def config_from_key(cls, values: tuple):
    """The model config of config_key's (class, values)."""
    return cls(**{f.name: v for f, v in zip(fields(cls), values)})


@lru_cache(maxsize=32)
def _param_shapes(cls, items: tuple) -> tuple:
    cfg = config_from_key(cls, items)
    d, v, hd = cfg.d_model, cfg.vocab_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (v, d)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "attention_norm.weight": (d,),
            p + "attention.wq.weight": (cfg.num_heads * hd, d),
            p + "attention.wk.weight": (cfg.num_kv_heads * hd, d),
            p + "attention.wv.weight": (cfg.num_kv_heads * hd, d),
            p + "attention.wo.weight": (d, cfg.num_heads * hd),
        }
        if cfg.qk_norm:
            shapes |= {p + "attention.q_norm.weight": (hd,), p + "attention.k_norm.weight": (hd,)}
        shapes[p + "ffn_norm.weight"] = (d,)
        if cfg.family == "moe":
            e, f = cfg.num_experts, cfg.expert_d_ff
            shapes |= {
                p + "feed_forward.router.gate.weight": (e, d),
                p + "feed_forward.experts.w1": (e, f, d),
                p + "feed_forward.experts.w2": (e, d, f),
                p + "feed_forward.experts.w3": (e, f, d),
            }
            if cfg.num_shared_experts:
                fs = cfg.num_shared_experts * f
                shapes |= {
                    p + "feed_forward.shared_experts.w1.weight": (fs, d),
                    p + "feed_forward.shared_experts.w2.weight": (d, fs),
                    p + "feed_forward.shared_experts.w3.weight": (fs, d),
                }
        else:
            shapes |= {
                p + "feed_forward.w1.weight": (cfg.d_ff, d),
                p + "feed_forward.w2.weight": (d, cfg.d_ff),
            }
            if cfg.mlp == "swiglu":
                shapes[p + "feed_forward.w3.weight"] = (cfg.d_ff, d)
    shapes["norm.weight"] = (d,)
    if not cfg.tied_embeddings:
        shapes["output.weight"] = (v, d)
    return tuple(shapes.items())


@lru_cache(maxsize=32)
def _shape_groups(cls, items: tuple) -> tuple[tuple, tuple, tuple]:
    """((name, shape) of block 0's parameters, of the embedding's, of the rest outside the blocks).
    Every block has the same parameters: the planner counts block 0's once and multiplies."""
    shapes = _param_shapes(cls, items)
    layer = tuple((n, s) for n, s in shapes if n.startswith("layers.0."))
    first = tuple((n, s) for n, s in shapes if n.startswith("tok_embeddings."))
    last = tuple((n, s) for n, s in shapes if not n.startswith(("layers.", "tok_embeddings.")))
    return layer, first, last


def _chunk_len(n: int, parts: int, index: int) -> int:
    """Length of torch.chunk(range(n), parts)[index] (0 when that chunk does not exist)."""
    size = -(-n // parts)
    return max(0, min(size, n - index * size))


_EXPERT_F_DIM = {"w1": 1, "w2": 2, "w3": 1}  # routed experts: the hidden dim tp splits


def local_shape(name: str, shape: tuple[int, ...], lay, coords: dict[str, int] | None = None) -> tuple[int, ...]:
    """Shape of parameter `name` on the rank at mesh `coords` (axis -> local rank; None = rank 0 of
    every axis, which holds the largest FSDP shards). `lay` is a ParallelConfig or ParallelDims.

    Tensor parallel splits wq/wk/wv/w1/w3 (also the shared experts') and `output` on dim 0, wo/w2 on
    dim 1, the embedding's rows, and the routed experts' hidden dim; expert parallel splits the
    experts' dim 0 by ep. FSDP2 then chunks dim 0 over dp_shard×cp like torch.chunk; for experts over
    dp_shard×cp/ep, on dim 1 when there are fewer local experts than those ranks.
    """
    coords = coords or {}
    shape = list(shape)
    module, leaf = name.rsplit(".", 1)
    expert = ".experts." in name and ".shared_experts." not in name
    if lay.tp > 1:
        if expert:
            shape[_EXPERT_F_DIM[leaf]] //= lay.tp
        elif module.endswith(_COLWISE) or module in ("output", "tok_embeddings"):
            shape[0] //= lay.tp
        elif module.endswith(_ROWWISE):
            shape[1] //= lay.tp
    fsdp = lay.dp_shard * lay.cp
    index = coords.get("dp_shard", 0) * lay.cp + coords.get("cp", 0)  # flattened, cp inner
    dim = 0
    if expert:
        shape[0] //= lay.ep
        fsdp, index = fsdp // lay.ep, index // lay.ep  # ep is the inner factor of dp_shard×cp
        dim = 0 if shape[0] >= fsdp else 1  # scalelab.parallel.expert_parallel.expert_shard_dim
    if fsdp > 1:
        shape[dim] = _chunk_len(shape[dim], fsdp, index)
    return tuple(shape)


def local_numel(name: str, shape: tuple[int, ...], lay: ParallelConfig) -> int:
    """Elements of parameter `name` on the rank with the largest shard (rank 0 of every axis)."""
    return math.prod(local_shape(name, shape, lay))


def _stages_of_pp_rank(cfg, lay: ParallelConfig, pp_rank: int, seq_len: int) -> tuple[list[list[int]], list[int], int]:
    """(layers of every stage, the stage ids pipeline rank `pp_rank` runs, number of stages)."""
    num_stages = lay.pp * stages_per_rank(lay.pp_schedule)
    costs, first, last = layer_costs(cfg, seq_len)
    stages = _split(tuple(costs), num_stages, first, last)
    return stages, stage_ids_for_rank(pp_rank, lay.pp, lay.pp_schedule), num_stages


@lru_cache(maxsize=1024)
def _pp_ranks_layers(cls, items: tuple, pp: int, schedule: str, seq_len: int) -> tuple[tuple[int, bool, bool], ...]:
    """(blocks held, holds the embedding, holds the final norm/output) of every pipeline rank: they depend
    on the model, pp, the schedule and seq_len only."""
    cfg = config_from_key(cls, items)
    lay = ParallelConfig(pp=pp, pp_schedule=schedule)
    out = []
    for rank in range(pp):
        stages, mine, num_stages = _stages_of_pp_rank(cfg, lay, rank, seq_len)
        out.append((sum(len(stages[s]) for s in mine), 0 in mine, num_stages - 1 in mine))
    return tuple(out)


def params_of_pp_rank(cfg, lay: ParallelConfig, pp_rank: int, seq_len: int) -> list[str]:
    """Parameter names pipeline rank `pp_rank` holds (scalelab.parallel.pipeline_parallel's layer split)."""
    names = list(param_shapes(cfg))
    if lay.pp == 1:
        return names
    stages, mine, num_stages = _stages_of_pp_rank(cfg, lay, pp_rank, seq_len)
    keep = {str(i) for s in mine for i in stages[s]}
    out = []
    for n in names:
        if n.startswith("layers."):
            if n.split(".")[1] in keep:
                out.append(n)
        elif n.startswith("tok_embeddings."):
            if 0 in mine:
                out.append(n)
        elif num_stages - 1 in mine:
            out.append(n)
    return out


@lru_cache(maxsize=1024)
def _split(costs: tuple, num_stages: int, first: float, last: float) -> list[list[int]]:
    return split_layers(list(costs), num_stages, first, last)


class _Shards(NamedTuple):
    """The axes that shard a parameter (all that local_shape reads of a layout)."""

    tp: int
    dp_shard: int
    cp: int
    ep: int


def state_bytes(
    cfg, lay: ParallelConfig, *, seq_len: int, optimizer: str = "adamw", pp_rank: int | None = None
) -> StateBytes:
    """Exact fp32 parameter, gradient and optimizer bytes on the fullest rank (or on `pp_rank`)."""
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"unknown optimizer {optimizer!r}; use adamw or sgd")
    shards = _Shards(tp=lay.tp, dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep)
    param, optim, tensors = _state_bytes(*config_key(cfg), shards, lay.pp, lay.pp_schedule, seq_len, optimizer, pp_rank)
    return StateBytes(param_bytes=param, grad_bytes=param, optim_bytes=optim, num_param_tensors=tensors)


@lru_cache(maxsize=4096)
def _state_bytes(
    cls, items: tuple, shards: _Shards, pp: int, schedule: str, seq_len: int, optimizer: str, pp_rank: int | None
) -> tuple[int, int, int]:
    """(parameter bytes, optimizer bytes, parameter tensors) of state_bytes: one computation per model
    and sharding, which the planner's candidates share across micro-batch sizes and checkpointing."""
    layer_shapes, first_shapes, last_shapes = _shape_groups(cls, items)
    # Every block has the same parameters: count layer 0's once and reuse it (exact).
    layer_numel, layer_tensors = sum(local_numel(n, s, shards) for n, s in layer_shapes), len(layer_shapes)
    first = [local_numel(n, s, shards) for n, s in first_shapes]
    last = [local_numel(n, s, shards) for n, s in last_shapes]
    per_rank = (
        _pp_ranks_layers(cls, items, pp, schedule, seq_len)
        if pp > 1
        else ((config_from_key(cls, items).num_layers, True, True),)
    )
    best = None
    for r in range(pp) if pp_rank is None else [pp_rank]:
        num_layers, has_first, has_last = per_rank[r if pp > 1 else 0]
        numel = num_layers * layer_numel + has_first * sum(first) + has_last * sum(last)
        count = num_layers * layer_tensors + has_first * len(first) + has_last * len(last)
        param = 4 * numel
        optim = 2 * param + 4 * count if optimizer == "adamw" else 0
        if best is None or 2 * param + optim > 2 * best[0] + best[1]:  # StateBytes.total_bytes
            best = (param, optim, count)
    return best


def layer_param_split(cfg, lay: ParallelConfig) -> tuple[int, int]:
    """(dense, expert) parameters of one block on this rank after TP/EP, before FSDP sharding."""
    return _layer_param_split(*config_key(cfg), lay.tp, lay.ep)


@lru_cache(maxsize=1024)
def _layer_param_split(cls, items: tuple, tp: int, ep: int) -> tuple[int, int]:
    unsharded = ParallelConfig(tp=tp, ep=ep)
    dense = expert = 0
    for n, s in _shape_groups(cls, items)[0]:
        if ".experts." in n:
            expert += local_numel(n, s, unsharded)
        else:
            dense += local_numel(n, s, unsharded)
    return dense, expert


def layer_param_count(cfg, lay: ParallelConfig) -> int:
    """Parameters of one block on this rank before FSDP sharding (what FSDP gathers per block)."""
    return sum(layer_param_split(cfg, lay))


# --- activations -------------------------------------------------------------------------------------
def _norm_bytes(d: float, act: int, kernels: str) -> float:
    """Saved by one RMSNorm per token: reference = fp32 input copy + rsqrt + fp32 product (the output
    is counted as the next op's input); fused = the input and rstd."""
    if kernels == "torch":
        # with fp32 activations the "copy" is the input itself, already counted by the caller
        return 4 * (d + 1) + (4 * d if act != 4 else 0)
    return act * d + 4


def layer_activation_bytes(
    cfg, lay: ParallelConfig, seq_len: int, kernels: str = "torch", act: int = 4, *, micro_batch_sequences: int = 1
) -> float:
    """Bytes one block saves for backward per token of this rank (no checkpointing)."""
    d, hd, tp = cfg.d_model, cfg.head_dim, lay.tp
    heads, kv = cfg.num_heads / tp, cfg.num_kv_heads / tp
    sp = tp if (tp > 1 and lay.sequence_parallel) else 1
    total = act * d / sp  # the block input x (saved by the first norm)
    total += _norm_bytes(d / sp, act, kernels) + act * d  # attention_norm (+ its output, gathered)
    kv_width = heads if kernels == "torch" else kv  # the reference repeats K/V heads for GQA
    q_bytes = act * heads * hd
    kv_bytes = 2 * act * kv_width * hd
    if lay.cp > 1 and lay.cp_variant == "ring":
        # ring attention (one autograd function, flash-style backward): only the local q, k, v (K/V
        # heads not repeated), the output and the merged lse; hops are recomputed in backward
        total += q_bytes + 2 * act * kv * hd + act * heads * hd + 4 * heads
    else:
        if lay.cp > 1:
            kv_bytes *= lay.cp  # all-gather: every rank keeps the whole sequence's K/V
            # and SDPA's fp32 [rows, seq_len] causal mask, shared by the micro-batch's sequences
            total += 4 * seq_len / micro_batch_sequences
        total += q_bytes + kv_bytes + act * heads * hd + 4 * heads  # q, k, v, out, lse
    total += act * d / sp  # h = x + attn (saved by ffn_norm)
    total += _norm_bytes(d / sp, act, kernels) + act * d  # ffn_norm (+ output)
    if cfg.family == "moe":
        e, k, fe = cfg.num_experts, cfg.num_experts_per_tok, cfg.expert_d_ff
        ff_act = 4 if kernels == "torch" else 2
        total += 2 * 4 * e + 4 + 3 * 8 * k + 4 * k  # logits, probs, lse (fp32); 3 int64 index sets; weights
        # gathered rows, expert internals (hidden width split over tp), outputs, weighted
        total += k * act * (d + ff_act * fe / tp + 2 * d)
        total += act * ff_act * cfg.num_shared_experts * fe / tp
    else:
        total += act * (4 if kernels == "torch" else 2) * cfg.d_ff / tp
    return total


def head_activation_bytes(cfg, lay: ParallelConfig, kernels: str = "torch", act: int = 4) -> float:
    """Bytes per token the last stage saves after the blocks (final norm, logits, token ids)."""
    d = cfg.d_model
    sp = lay.tp if (lay.tp > 1 and lay.sequence_parallel) else 1
    total = act * d / sp + _norm_bytes(d / sp, act, kernels) + act * d + 16
    # Logits exist unless the fused projection + cross-entropy runs: with the torch reference, and in
    # the layouts that compute the loss from logits (TP: vocab-sharded logits; the last pipeline
    # stage; scalelab.parallel.step / pipeline). Then cross-entropy keeps its fp32 log-softmax output,
    # vocab-sharded under loss parallel (tied to sequence parallel here).
    if kernels == "torch" or lay.tp > 1 or lay.pp > 1:
        total += 4 * cfg.vocab_size / (lay.tp if lay.sequence_parallel else 1)
    return total


def checkpointed_layer_bytes(cfg, lay: ParallelConfig, seq_len: int, act: int = 4) -> float:
    """Per token and block under selective checkpointing: matmul/attention outputs + the input."""
    d, hd, tp = cfg.d_model, cfg.head_dim, lay.tp
    heads, kv = cfg.num_heads / tp, cfg.num_kv_heads / tp
    if cfg.family == "moe":  # routed copies' w1/w3/w2 outputs, shared experts', fp32 router logits
        k, fe = cfg.num_experts_per_tok, cfg.expert_d_ff
        ffn = k * (2 * fe / tp + d) + cfg.num_shared_experts * (2 * fe / tp) + d + 4 / act * cfg.num_experts
    else:
        ffn = (2 if cfg.mlp == "swiglu" else 1) * cfg.d_ff / tp + d  # w1 (w3), w2 outputs
    mm = heads * hd + 2 * kv * hd + d + ffn  # + q, k, v, wo outputs
    return act * (d + mm + heads * hd) + 4 * heads


def activation_bytes(
    cfg,
    lay: ParallelConfig,
    seq_len: int,
    *,
    micro_batch_sequences: int,
    kernels: str = "torch",
    act: int = 4,
    pp_stage: str = "fullest",
) -> tuple[float, float]:
    """(saved, transient): bytes saved for backward on the fullest pipeline rank with all its
    micro-batches (of `micro_batch_sequences` sequences per data-parallel rank) in flight, and the
    extra bytes live while one checkpointed block is recomputed.
    pp_stage: "first" or "last" picks that pipeline rank instead of the fuller one."""
    tokens = micro_batch_sequences * seq_len / lay.cp
    layers = cfg.num_layers
    if lay.pp > 1:
        layers = math.ceil(cfg.num_layers / (lay.pp * stages_per_rank(lay.pp_schedule))) * stages_per_rank(
            lay.pp_schedule
        )
    if lay.activation_checkpoint == "full":
        sp = lay.tp if (lay.tp > 1 and lay.sequence_parallel) else 1
        per_layer = act * cfg.d_model / sp
        recompute = layer_activation_bytes(
            cfg, lay, seq_len, kernels, act, micro_batch_sequences=micro_batch_sequences
        )  # one block live in backward
    elif lay.activation_checkpoint == "selective":
        per_layer = checkpointed_layer_bytes(cfg, lay, seq_len, act)
        recompute = (
            layer_activation_bytes(cfg, lay, seq_len, kernels, act, micro_batch_sequences=micro_batch_sequences)
            - per_layer
        )
    else:
        per_layer, recompute = (
            layer_activation_bytes(cfg, lay, seq_len, kernels, act, micro_batch_sequences=micro_batch_sequences),
            0.0,
        )
    head = head_activation_bytes(cfg, lay, kernels, act)
    if lay.pp == 1:
        return tokens * (layers * per_layer + head), tokens * recompute
    # The first stage keeps pp micro-batches in flight (all of them under GPipe); the last stage
    # fewer, but also the head (logits) of each micro-batch in flight: the fuller of the two.
    micro = lay.pp_microbatches or 2 * lay.pp
    first = micro if lay.pp_schedule == "gpipe" else lay.pp
    last = micro if lay.pp_schedule == "gpipe" else 1
    by_stage = {"first": layers * per_layer * first, "last": (layers * per_layer + head) * last}
    saved = tokens * (max(by_stage.values()) if pp_stage == "fullest" else by_stage[pp_stage])
    return saved, tokens * recompute


def measure_saved_bytes(model: torch.nn.Module, run) -> tuple[int, object]:
    """Bytes of distinct storages autograd saves for backward while `run()` executes the forward
    (parameters and buffers excluded; DTensors counted by their local shard). Returns (bytes, run()).
    Under activation checkpointing this sees what the checkpoint keeps (the block inputs)."""

    def plain(t) -> list[torch.Tensor]:
        """The plain tensors holding the data of `t` (DTensor and async-collective wrappers unwrapped)."""
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            return [x for n in names if isinstance(getattr(t, n), torch.Tensor) for x in plain(getattr(t, n))]
        return [t] if isinstance(t, torch.Tensor) else []

    skip = {x.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()] for x in plain(t)}
    seen: dict[int, int] = {}

    def pack(t):
        for x in plain(t):
            storage = x.untyped_storage()
            key = storage.data_ptr()
            if key not in skip and key not in seen:
                seen[key] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return sum(seen.values()), out
