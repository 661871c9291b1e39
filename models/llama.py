"""Dense Llama-family decoder (pre-norm RMSNorm, RoPE, GQA, SwiGLU), written for ONE device.

Module names follow torchtitan so that `scalelab.parallel` can apply DTensor tensor-parallel plans
and split the model into pipeline stages from outside:

    tok_embeddings              nn.Embedding [V, D]
    layers["0".."L-1"]          TransformerBlock
        attention_norm          RMSNorm [D]
        attention.wq/wk/wv/wo   nn.Linear, no bias ([H*Dh, D], [Hk*Dh, D], [Hk*Dh, D], [D, H*Dh])
        attention.q_norm/k_norm RMSNorm [Dh] (only with qk_norm)
        ffn_norm                RMSNorm [D]
        feed_forward.w1/w2/w3   SwiGLU: w2(silu(w1 x) * w3 x)
        feed_forward (family "moe") MoE: router.gate, experts.w1/w2/w3 [E, ...], shared_experts
                                (see scalelab.models.moe)
    norm                        RMSNorm [D]
    output                      nn.Linear [V, D], no bias; shares tok_embeddings.weight when tied

Under `parametrization: mup | completep` three scalar multipliers (scalelab.models.parametrization)
enter the forward: q x `attention` (attention logits 1/d_head), each residual branch x `residual`
(completep: base_num_layers / L) and the normed hidden state x `output` (logits / width multiplier).
Under `sp` all are 1 and skipped, so the computation is exactly the standard one.

Pipeline stages delete entries of `layers` and set `tok_embeddings`, `norm` or `output` to None;
`forward` then takes / returns hidden states [B, T, D]. Attention counts its heads from the
projection outputs at run time, so column-sharded wq/wk/wv (tensor parallel) just work.

Kernels come from `scalelab.kernels.get_ops(cfg.kernels, device_type)`, resolved for the device the
activations live on (re-resolved when it changes). Each RMSNorm/Attention/FeedForward holds the
namespace in `.ops`; a parallel wrapper may replace e.g. `attention.ops` with its own namespace.

Build: `build_model(cfg, device, seed)` = meta build -> to_empty -> init_weights(seed).
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn as nn

from scalelab.kernels import get_ops
from scalelab.kernels.reference import rope_cos_sin
from scalelab.models import parametrization
from scalelab.models.config import ModelConfig
from scalelab.models.feedforward import FeedForward
from scalelab.models.loss import fused_lm_loss
from scalelab.models.moe import MoE, moe_modules


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a learned gain (init 1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.ops = get_ops("torch")  # replaced by Transformer.set_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Causal GQA self-attention with RoPE (and optional per-head q/k RMSNorm)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q_mult = parametrization.multipliers(cfg).attention
        self.wq = nn.Linear(cfg.d_model, cfg.num_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.ops = get_ops("torch")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, D], cos/sin [T, Dh/2] -> [B, T, D]."""
        bsz, seq_len, _ = x.shape
        # -1: the number of (local) heads comes from the weight shapes, not the config (TP shards).
        q = self.wq(x).view(bsz, seq_len, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq_len, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq_len, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.apply_rope(q, k, cos, sin)
        if self.q_mult != 1.0:  # µP: logits sqrt(hd_base)/hd instead of the kernel's 1/sqrt(hd)
            q = q * self.q_mult
        out = self.ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq_len, -1))


class TransformerBlock(nn.Module):
    """Pre-norm block: h = x + attn(norm(x)); out = h + ffn(norm(h))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.residual_mult = parametrization.multipliers(cfg).residual
        if cfg.family == "moe":
            self.feed_forward = MoE(cfg)
        else:
            self.feed_forward = FeedForward(cfg.d_model, cfg.d_ff, cfg.mlp)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.residual_mult != 1.0:  # CompleteP: each branch x base_L / L
            h = x + self.residual_mult * self.attention(self.attention_norm(x), cos, sin)
            return h + self.residual_mult * self.feed_forward(self.ffn_norm(h))
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Decoder-only LM. `forward(tokens [B, T] long) -> logits [B, T, V]` (see module docstring)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.num_layers)})
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.output_mult = parametrization.multipliers(cfg).output
        self.tie_weights()
        # Real-valued RoPE tables [max_seq_len, head_dim/2], fp32. Not persistent: they are a pure
        # function of the config, recomputed whenever the model moves or is materialised (_apply).
        cos, sin = rope_cos_sin(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.ops = get_ops("torch")
        self._ops_device: str | None = None
        self.set_kernels(self.rope_cos.device.type)

    # --- kernels, tying and buffers ------------------------------------------------------------
    def set_kernels(self, device_type: str) -> None:
        """Resolve `cfg.kernels` for `device_type` and hand the namespace to every submodule."""
        if device_type == "meta":
            return
        self.ops = get_ops(self.cfg.kernels, device_type)
        self._ops_device = device_type
        for mod in self.modules():
            if isinstance(mod, RMSNorm | Attention | FeedForward):
                override = getattr(mod, "ops_override", None)
                mod.ops = override(self.ops) if override is not None else self.ops

    def tie_weights(self) -> None:
        """With tied_embeddings, make output.weight the same Parameter as tok_embeddings.weight.

        Needed again after `to_empty` (which re-creates each module's parameters separately);
        `build_model` and `init_weights` call it. Call it before sharding (FSDP) when building by hand.
        """
        if self.cfg.tied_embeddings and self.tok_embeddings is not None and self.output is not None:
            if self.output.weight is not self.tok_embeddings.weight:
                self.output.weight = self.tok_embeddings.weight

    def reset_rope(self) -> None:
        """Recompute the RoPE tables (fp32) on the buffers' device."""
        device = self.rope_cos.device
        if device.type == "meta":
            return
        cos, sin = rope_cos_sin(self.cfg.max_seq_len, self.cfg.head_dim, self.cfg.rope_theta, device=device)
        self.rope_cos, self.rope_sin = cos, sin  # assigning to a registered buffer name keeps it a buffer

    def _apply(self, fn, recurse=True):
        # Every .to()/.cuda()/.to_empty()/.half() goes through here: afterwards the RoPE tables are
        # recomputed in fp32 (never left uninitialised or cast to bf16) and kernels re-resolved.
        super()._apply(fn, recurse)
        self.reset_rope()
        self.set_kernels(self.rope_cos.device.type)
        return self

    # --- forward -------------------------------------------------------------------------------
    def _trunk(self, tokens: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        """Embedding (if present) and the blocks present in this (stage of the) model."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        if h.device.type != self._ops_device:
            self.set_kernels(h.device.type)
        seq_len = h.shape[1]
        if positions is None:
            if seq_len > self.cfg.max_seq_len:
                raise ValueError(f"sequence length {seq_len} > max_seq_len={self.cfg.max_seq_len}")
            cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        else:
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        return h

    def hidden_states(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Final normed hidden states [B, T, D] (for a fused linear + cross-entropy on output.weight),
        times the readout multiplier under mup/completep, so `h @ output.weight.T` are the logits.

        Goes through `self(...)`, so module hooks (FSDP2's parameter all-gather) run as for forward.
        """
        return self(tokens, positions, return_hidden=True)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        return_hidden: bool = False,
        targets: torch.Tensor | None = None,
        z_loss: float = 0.0,
    ):
        """tokens [B, T] (or hidden [B, T, D] without tok_embeddings) -> logits [B, T, V] (or hidden).

        positions: optional LongTensor [T] of absolute positions (rows of the RoPE tables), for
        context-parallel shards; default arange(T).
        return_hidden: stop before `output` (the normed hidden states; see hidden_states).
        targets: [B, T] ids -> returns (loss, metrics) of `models.loss.fused_lm_loss` instead of
        logits: the fused output projection + cross-entropy runs inside forward, where FSDP2 holds
        `output.weight` gathered, so sharded layouts never materialise [B, T, V] logits either.
        """
        h = self._trunk(tokens, positions)
        if self.norm is not None:
            h = self.norm(h)
            if self.output_mult != 1.0:  # µP readout: logits / width multiplier (also for the fused loss)
                h = h * self.output_mult
        if targets is not None:
            return fused_lm_loss(h, self.output.weight, targets, self.ops, z_loss)
        if return_hidden or self.output is None:
            return h
        return self.output(h)

    # --- MoE hooks (no-ops for the dense family) ---------------------------------------------------
    def moe_layers(self) -> list[nn.Module]:
        """The MoE feed-forward modules present in this (stage of the) model, in layer order."""
        return moe_modules(self)

    def moe_stats(self) -> list[dict[str, torch.Tensor]]:
        """Router statistics of the last forward, one dict per MoE layer (see models.moe)."""
        return [m.last_stats for m in self.moe_layers() if m.last_stats]

    def set_moe_loss_scale(self, scale: float) -> None:
        """The factor the LM loss is multiplied by before backward (1/accumulation steps ...)."""
        for m in self.moe_layers():
            m.loss_scale = scale

    # --- init ----------------------------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Initialise every parameter in place (after `to_empty` from the meta device).

        Scheme (sp): nn.Linear and nn.Embedding weights ~ N(0, init_std) (embeddings too: a tied
        matrix then also suits the output layer); attention.wo and feed_forward.w2 ~ N(0, init_std /
        sqrt(2 * num_layers)) so the residual stream's variance does not grow with depth
        (GPT-2 / Megatron); RMSNorm weights = 1. RoPE tables are recomputed. mup / completep
        scale these per module (`parametrization.init_std`: hidden / sqrt(width multiplier), a
        zero readout).

        seed: None draws from torch's global RNG (in module order). An int gives every parameter
        its own generator seeded from (seed, parameter name), so a parameter's values do not
        depend on which other modules exist: a pipeline stage holding layers 4..7 gets exactly the
        weights those layers have in the full model. DTensor parameters (TP/FSDP applied before
        init) are drawn full-size on each rank and sliced locally, matching the single-device init.
        """
        self.tie_weights()
        self.reset_rope()
        self.set_kernels(self.rope_cos.device.type)
        done: set[int] = set()
        for wrapped_name, mod in self.named_modules():
            # activation checkpointing wraps blocks (`layers.0._checkpoint_wrapped_module.attention`):
            # seed by the single-device name, so a model wrapped before init gets the same weights
            name = wrapped_name.replace("._checkpoint_wrapped_module", "")
            if isinstance(mod, RMSNorm):
                mod.weight.fill_(1.0)
            elif isinstance(mod, nn.Linear | nn.Embedding):
                if id(mod.weight) in done:  # tied output: already drawn as tok_embeddings
                    continue
                done.add(id(mod.weight))
                # A tied output drawn on its own (a last pipeline stage without tok_embeddings) must
                # still equal the embedding: it is seeded under the embedding's name.
                key = "tok_embeddings" if name == "output" and self.cfg.tied_embeddings else name
                _normal_(mod.weight, parametrization.init_std(self.cfg, name), seed, key)
            elif hasattr(mod, "w1") and isinstance(mod.w1, nn.Parameter):  # MoE GroupedExperts [E, ...]
                for wname in ("w1", "w2", "w3"):
                    std = parametrization.init_std(self.cfg, f"{name}.{wname}")
                    _normal_(getattr(mod, wname), std, seed, f"{name}.{wname}")


def _param_seed(seed: int, name: str) -> int:
    """A 63-bit seed from (run seed, parameter's module name), stable across processes."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _is_dtensor(t: torch.Tensor) -> bool:
    if not torch.distributed.is_available():  # builds without distributed have no DTensor
        return False
    from torch.distributed.tensor import DTensor  # optional: only where torch.distributed is available

    return isinstance(t, DTensor)


def _normal_(weight: torch.Tensor, std: float, seed: int | None, name: str) -> None:
    """weight ~ N(0, std) in place; seeded per name when `seed` is given (see init_weights)."""
    is_dtensor = _is_dtensor(weight)
    local = weight.to_local() if is_dtensor else weight
    if seed is None:
        if is_dtensor:
            weight.normal_(0.0, std)  # DTensor's own RNG tracker keeps shards consistent
        else:
            nn.init.normal_(weight, 0.0, std)
        return
    gen = torch.Generator(device=local.device)
    gen.manual_seed(_param_seed(seed, name))
    full = torch.empty(weight.shape, dtype=weight.dtype, device=local.device)
    full.normal_(0.0, std, generator=gen)
    if is_dtensor:
        from torch.distributed.tensor import distribute_tensor  # optional: a DTensor implies torch.distributed

        # src_data_rank=None: every rank holds the same `full`, so each slices its shard locally.
        local.copy_(distribute_tensor(full, weight.device_mesh, weight.placements, src_data_rank=None).to_local())
    else:
        weight.copy_(full)


def override_ops(module: nn.Module, override) -> None:
    """Make `module` use `override(base_ops)` whenever kernels are (re-)resolved, and now.

    The hook through which parallel code swaps an op from outside (context-parallel attention, the
    torch norm on sequence-parallel DTensors) so that it survives `to_empty`/`.to()`/`init_weights`,
    which re-resolve `cfg.kernels` for the device (e.g. a model sharded on the meta device first)."""
    module.ops_override = override
    module.ops = override(module.ops)


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu", seed: int | None = None) -> Transformer:
    """Build on the meta device, materialise on `device`, and initialise (see init_weights).

    device="meta" returns the uninitialised meta model: a parallel layout shards it first and then
    allocates and initialises only this rank's shards (`Parallelized.materialize`)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    if torch.device(device).type == "meta":
        model.tie_weights()
        return model
    model.to_empty(device=device)
    model.init_weights(seed)
    return model
