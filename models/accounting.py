"""Exact parameter and training-FLOP accounting for a ModelConfig (no model is built).

Parameters
  num_params(cfg)               every parameter, the tied embedding/output matrix counted once;
                                equals sum(p.numel() for p in Transformer(cfg).parameters()).
  num_params_nonembedding(cfg)  num_params minus the input embedding table (V*D). Convention:
                                the output projection is NOT an embedding and stays counted when
                                untied (as in Porian et al. 2024); with tied embeddings the one
                                shared matrix is the embedding and is removed. Kaplan et al. (2020)
                                used tied GPT-2-style models, so there both conventions agree.

MoE (family "moe"): num_params counts every expert (total parameters);
  num_params_active(cfg)        parameters one token touches: the routed experts count k of E
                                (num_experts_per_tok), shared experts, router and the rest in full.
  FLOPs use the active parameters (the matmul term counts k routed experts + shared + router).

Training FLOPs per token (multiply-add = 2 FLOPs), see `flops_per_token`:
  six_n           6 * num_params(cfg)                   (the default: C = 6 N D)
  six_n_nonembed  6 * num_params_nonembedding(cfg)      (Kaplan's C = 6 N D)
  exact           3 * forward FLOPs, where forward =
                    matmuls: 2 * (every nn.Linear weight, the output layer included even when tied)
                    attention: 2 * 2 * seq_len * num_heads * head_dim  (q k^T and p v) per token,
                               over the full seq_len x seq_len score matrix (no causal 1/2), which
                               is what torch.utils.flop_counter.FlopCounterMode counts and what
                               Chinchilla (Hoffmann et al. 2022, App. F) counts;
                  backward = 2 * forward (grads w.r.t. inputs and weights). Not counted: the
                  embedding lookup, norms, RoPE, softmax, SwiGLU, the loss (all O(D) per token),
                  and flash-attention's recomputation of the scores in backward (hardware FLOPs,
                  not model FLOPs; FlopCounterMode adds 0.5x attention-forward for it on CUDA).
  exact_causal    as exact with the attention term halved (only the causal triangle is useful).
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.models.config import ModelConfig


def _linear_params_per_layer(cfg: ModelConfig, active: bool = False) -> int:
    """Weights of the matmuls of one block; for MoE all experts, or (active) the k a token uses."""
    d, dh = cfg.d_model, cfg.head_dim
    attention = d * cfg.num_heads * dh + 2 * d * cfg.num_kv_heads * dh + cfg.num_heads * dh * d
    if cfg.family != "moe":
        return attention + (3 if cfg.mlp == "swiglu" else 2) * d * cfg.d_ff  # SwiGLU: w1, w2, w3; GELU: w1, w2
    routed = cfg.num_experts_per_tok if active else cfg.num_experts
    router = d * cfg.num_experts
    experts = 3 * d * cfg.expert_d_ff * (routed + cfg.num_shared_experts)
    return attention + router + experts


def _norm_params_per_layer(cfg: ModelConfig) -> int:
    return 2 * cfg.d_model + (2 * cfg.head_dim if cfg.qk_norm else 0)


def num_params(cfg: ModelConfig) -> int:
    """Total parameters; a tied embedding/output matrix counts once."""
    embedding = cfg.vocab_size * cfg.d_model
    output = 0 if cfg.tied_embeddings else cfg.vocab_size * cfg.d_model
    per_layer = _linear_params_per_layer(cfg) + _norm_params_per_layer(cfg)
    return embedding + cfg.num_layers * per_layer + cfg.d_model + output


def num_params_active(cfg: ModelConfig) -> int:
    """Parameters one token uses (MoE: k routed experts of E); equals num_params for dense models."""
    if cfg.family != "moe":
        return num_params(cfg)
    inactive = 3 * cfg.d_model * cfg.expert_d_ff * (cfg.num_experts - cfg.num_experts_per_tok)
    return num_params(cfg) - cfg.num_layers * inactive


def num_params_embedding(cfg: ModelConfig) -> int:
    """The input embedding table, V * D."""
    return cfg.vocab_size * cfg.d_model


def num_params_nonembedding(cfg: ModelConfig) -> int:
    """num_params minus the input embedding table (the untied output layer stays counted)."""
    return num_params(cfg) - num_params_embedding(cfg)


@dataclass(kw_only=True, slots=True, frozen=True)
class FlopsPerToken:
    """Training (forward + backward) FLOPs per token at one sequence length; see module docstring."""

    seq_len: int
    six_n: float  # 6 * num_params (MoE: active parameters)
    six_n_nonembed: float  # 6 * num_params_nonembedding
    matmul: float  # 3 * 2 * (all nn.Linear weights, output layer included; MoE: active experts)
    attention: float  # 3 * 4 * seq_len * num_heads * head_dim * num_layers (full T x T)
    exact: float  # matmul + attention
    exact_causal: float  # matmul + attention / 2


def flops_per_token(cfg: ModelConfig, seq_len: int) -> FlopsPerToken:
    """Training FLOPs per token for sequences of `seq_len` tokens (see module docstring)."""
    linear_weights = cfg.num_layers * _linear_params_per_layer(cfg, active=True) + cfg.vocab_size * cfg.d_model
    matmul = 3 * 2 * linear_weights
    attention = 3 * cfg.num_layers * 4 * seq_len * cfg.num_heads * cfg.head_dim
    return FlopsPerToken(
        seq_len=seq_len,
        six_n=6.0 * num_params_active(cfg),
        six_n_nonembed=6.0 * (num_params_active(cfg) - num_params_embedding(cfg)),
        matmul=float(matmul),
        attention=float(attention),
        exact=float(matmul + attention),
        exact_causal=float(matmul + attention / 2),
    )


def model_summary(cfg: ModelConfig, seq_len: int | None = None) -> dict[str, float | int | str]:
    """One flat row describing `cfg`: shape, parameter counts and FLOPs/token at `seq_len`
    (default cfg.max_seq_len). Used by `scalelab models` and by run records."""
    seq_len = seq_len or cfg.max_seq_len
    flops = flops_per_token(cfg, seq_len)
    return {
        "family": cfg.family,
        "num_layers": cfg.num_layers,
        "d_model": cfg.d_model,
        "num_heads": cfg.num_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "d_ff": cfg.d_ff,
        "vocab_size": cfg.vocab_size,
        "tied_embeddings": cfg.tied_embeddings,
        "num_params": num_params(cfg),
        "num_params_nonembedding": num_params_nonembedding(cfg),
        "num_params_active": num_params_active(cfg),
        "seq_len": seq_len,
        "flops_per_token_6n": flops.six_n,
        "flops_per_token_exact": flops.exact,
        "flops_per_token_exact_causal": flops.exact_causal,
    }
